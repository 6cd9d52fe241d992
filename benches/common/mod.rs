//! What both benchmarks share: the release binary as a guarded child process (its log in
//! a file, its address from the "listening" line, SIGTERM with a deadline), a bounded
//! `commitpoint verify`, and what they read about the machine from /proc. Included by each
//! bench with `#[path = "common/mod.rs"] mod common;`. A bench never panics: every failure
//! is an error in its report.

// Each bench uses its own part of this module.
#![allow(dead_code)]

pub mod figures;
pub mod http;
pub mod postgres;
pub mod preload;
pub mod stats;
pub mod workers;

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

pub type BoxError = Box<dyn std::error::Error + Send + Sync>;
pub type Result<T, E = BoxError> = std::result::Result<T, E>;

pub const BINARY: &str = env!("CARGO_BIN_EXE_commitpoint");
const READY_PREFIX: &str = "commitpoint listening on http://";
const STARTUP_TIMEOUT: Duration = Duration::from_secs(60);
const SHUTDOWN_TIMEOUT: Duration = Duration::from_secs(60);
/// Linux reports process CPU time in USER_HZ ticks, fixed at 100 per second for userspace.
const USER_HZ: f64 = 100.0;

/// Every bench's `main`: a configuration error exits 2; then `run` on a runtime of
/// `workers` threads, whose `Ok(false)` (a failed check) or error exits 1.
pub fn bench_main<F>(name: &str, workers: usize, run: impl FnOnce() -> Result<F>) -> std::process::ExitCode
where
    F: std::future::Future<Output = Result<bool>>,
{
    use std::process::ExitCode;
    let future = match run() {
        Ok(f) => f,
        Err(e) => {
            eprintln!("{name} bench: {e}");
            return ExitCode::from(2);
        }
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread().worker_threads(workers).enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("{name} bench: cannot start the tokio runtime: {e}");
            return ExitCode::from(2);
        }
    };
    match runtime.block_on(future) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::from(1),
        Err(e) => {
            eprintln!("{name} bench: {e}");
            ExitCode::from(1)
        }
    }
}

/// A set, non-blank environment variable.
pub fn env_var(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.trim().is_empty())
}

/// A running `commitpoint serve`; dropping it SIGKILLs it unless it was stopped.
#[derive(Debug)]
pub struct ServerProcess {
    child: Child,
    pub addr: SocketAddr,
    log_path: PathBuf,
    stopped: bool,
}

impl ServerProcess {
    /// Spawns `cmd` (a `serve … --listen 127.0.0.1:0`) with stderr to `log_path` and waits
    /// for the line that names its address.
    pub fn start(mut cmd: Command, log_path: &Path) -> Result<Self> {
        let log = std::fs::File::create(log_path)?;
        let mut child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::from(log))
            .spawn()
            .map_err(|e| format!("cannot start {BINARY}: {e}"))?;
        let stdout = child.stdout.take();
        // From here on, dropping `server` kills the child.
        let mut server = ServerProcess {
            child,
            addr: SocketAddr::from(([127, 0, 0, 1], 0)),
            log_path: log_path.to_path_buf(),
            stopped: false,
        };
        let Some(stdout) = stdout else {
            return Err("the server's stdout was not captured".into());
        };
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            let mut reader = BufReader::new(stdout);
            let mut line = String::new();
            let first = reader.read_line(&mut line).map(|_| line);
            let _ = tx.send(first);
            // Keep draining so a later print never blocks or kills the server.
            let _ = std::io::copy(&mut reader, &mut std::io::sink());
        });
        let line = match rx.recv_timeout(STARTUP_TIMEOUT) {
            Ok(Ok(line)) => line,
            Ok(Err(e)) => return Err(format!("reading the server's stdout: {e}").into()),
            Err(_) => {
                return Err(format!(
                    "the server printed no ready line within {STARTUP_TIMEOUT:?}; log tail:\n{}",
                    server.log_tail()
                )
                .into());
            }
        };
        let Some(addr) = line.trim().strip_prefix(READY_PREFIX) else {
            server.stop_quietly();
            return Err(format!(
                "unexpected first stdout line {line:?} (did the server exit?); log tail:\n{}",
                server.log_tail()
            )
            .into());
        };
        server.addr =
            addr.trim_end_matches('/').parse().map_err(|e| format!("cannot parse the address in {line:?}: {e}"))?;
        Ok(server)
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn check_alive(&mut self) -> Result<()> {
        if let Some(status) = self.child.try_wait()? {
            self.stopped = true;
            return Err(format!("the server exited unexpectedly ({status}); log tail:\n{}", self.log_tail()).into());
        }
        Ok(())
    }

    /// SIGTERM via `kill -TERM`, then wait for a graceful exit (killed after a timeout).
    pub fn stop(&mut self) -> Result<(ExitStatus, Duration)> {
        let start = Instant::now();
        let sent = Command::new("kill").args(["-TERM", &self.pid().to_string()]).status();
        if !sent.is_ok_and(|s| s.success()) {
            let _ = self.child.kill();
        }
        loop {
            if let Some(status) = self.child.try_wait()? {
                self.stopped = true;
                return Ok((status, start.elapsed()));
            }
            if start.elapsed() > SHUTDOWN_TIMEOUT {
                let _ = self.child.kill();
                let status = self.child.wait()?;
                self.stopped = true;
                return Err(format!(
                    "the server did not exit within {SHUTDOWN_TIMEOUT:?} of SIGTERM (killed: {status})"
                )
                .into());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// SIGKILL and reap, unless already stopped.
    pub fn stop_quietly(&mut self) {
        if !self.stopped {
            let _ = self.child.kill();
            let _ = self.child.wait();
            self.stopped = true;
        }
    }

    pub fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(&self.log_path).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(20)..].join("\n")
    }

    pub fn log_problems(&self) -> Vec<String> {
        let text = std::fs::read_to_string(&self.log_path).unwrap_or_default();
        text.lines().filter(|l| l.contains("ERROR") || l.contains("WARN")).map(str::to_string).collect()
    }
}

impl Drop for ServerProcess {
    fn drop(&mut self) {
        self.stop_quietly();
    }
}

/// Runs `commitpoint verify DB`, killed after `timeout`: its stdout if it exits 0,
/// otherwise what went wrong.
pub fn run_verify(db: &Path, timeout: Duration) -> Result<String, String> {
    let mut child = Command::new(BINARY)
        .arg("verify")
        .arg(db)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("cannot run verify: {e}"))?;
    let started = Instant::now();
    loop {
        match child.try_wait() {
            Ok(Some(_)) => break,
            Ok(None) if started.elapsed() > timeout => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(format!("verify did not finish within {timeout:?}"));
            }
            Ok(None) => std::thread::sleep(Duration::from_millis(50)),
            Err(e) => return Err(format!("waiting for verify: {e}")),
        }
    }
    let output = child.wait_with_output().map_err(|e| format!("reading verify's output: {e}"))?;
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    if !output.status.success() {
        let stderr = String::from_utf8_lossy(&output.stderr);
        return Err(format!("verify exited with {}: {}{}", output.status, stdout.trim(), stderr.trim()));
    }
    Ok(stdout)
}

#[derive(Debug, Clone)]
pub struct Filesystem {
    pub mount_point: String,
    pub fs_type: String,
    pub device: String,
}

impl Filesystem {
    /// fsync costs nothing there, so figures overstate a disk.
    pub fn is_ram(&self) -> bool {
        matches!(self.fs_type.as_str(), "tmpfs" | "ramfs")
    }

    /// "ext4 on /dev/sda1 at /", or "unknown filesystem".
    pub fn describe(fs: Option<&Filesystem>) -> String {
        fs.map_or_else(
            || "unknown filesystem".to_string(),
            |fs| format!("{} on {} at {}", fs.fs_type, fs.device, fs.mount_point),
        )
    }
}

/// The mount that holds `path` (longest matching mount point in /proc/mounts).
pub fn filesystem_of(path: &Path) -> Option<Filesystem> {
    let path = std::fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf());
    let mounts = std::fs::read_to_string("/proc/mounts").ok()?;
    mounts
        .lines()
        .filter_map(|line| {
            let mut fields = line.split_whitespace();
            let device = fields.next()?;
            let mount_point = fields.next()?.replace("\\040", " ");
            let fs_type = fields.next()?;
            path.starts_with(&mount_point).then(|| Filesystem {
                mount_point,
                fs_type: fs_type.to_string(),
                device: device.to_string(),
            })
        })
        .max_by_key(|fs| fs.mount_point.len())
}

/// User + system CPU seconds consumed so far by a process (all its threads); `pid` may be
/// `self`.
pub fn process_cpu_secs(pid: &str) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the parenthesised command name; utime and stime are fields 14 and 15.
    let rest = &stat[stat.rfind(')')? + 2..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let utime: f64 = fields.get(11)?.parse().ok()?;
    let stime: f64 = fields.get(12)?.parse().ok()?;
    Some((utime + stime) / USER_HZ)
}

/// The 1, 5 and 15 minute load averages.
pub fn load_average() -> String {
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    load.split_whitespace().take(3).collect::<Vec<_>>().join(" ")
}
