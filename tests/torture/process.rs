//! The real `commitpoint` binary as a child process: `serve` on `127.0.0.1:0`, SIGKILL,
//! SIGTERM, and the offline `verify`. Every child is killed when its guard is dropped, and
//! every wait is bounded.

use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

pub const BIN: &str = env!("CARGO_BIN_EXE_commitpoint");
/// The key the simulator is given and the server sends (any key would do; one is set so
/// the server's provider configuration is the production one).
pub const SIM_KEY: &str = "sk-torture";
const STARTUP_TIMEOUT: Duration = Duration::from_secs(30);
const EXIT_TIMEOUT: Duration = Duration::from_secs(30);
const VERIFY_TIMEOUT: Duration = Duration::from_secs(120);

/// A running `commitpoint serve`; dropping it SIGKILLs it.
pub struct Serve {
    child: Option<Child>,
    stderr: Option<JoinHandle<String>>,
    pub url: String,
}

impl Serve {
    /// `serve --provider openai` against the simulator at `sim_base_url`, batches of at most
    /// 8 members formed within 200 ms and jobs polled every 100 ms, so that a round of about
    /// a second sees batches formed, submitted, polled and ingested; `config` adds prices,
    /// the outbox sink and the webhook endpoint.
    pub fn start(data_dir: &Path, sim_base_url: &str, config: &Path) -> Serve {
        let mut cmd = Command::new(BIN);
        cmd.arg("serve")
            .arg("--data-dir")
            .arg(data_dir)
            .arg("--config")
            .arg(config)
            .args(["--listen", "127.0.0.1:0", "--provider", "openai", "--provider-base-url", sim_base_url])
            .args(["--provider-key-env", "TORTURE_SIM_KEY", "--batch-max-size", "8", "--batch-max-wait", "200ms"])
            .args(["--poll-interval", "100ms"])
            .env("TORTURE_SIM_KEY", SIM_KEY)
            .env(crate::config::SINK_SECRET_ENV, crate::config::SINK_SECRET)
            .env("COMMITPOINT_LOG", "info")
            .env_remove("COMMITPOINT_FAILPOINTS")
            .env_remove("COMMITPOINT_CONFIG")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = cmd.spawn().expect("spawn commitpoint serve");
        let stdout = child.stdout.take().expect("piped stdout");
        let stderr = drain(child.stderr.take().expect("piped stderr"));
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            let mut reader = BufReader::new(stdout);
            let mut line = String::new();
            let _ = reader.read_line(&mut line);
            let _ = tx.send(line);
            let _ = std::io::copy(&mut reader, &mut std::io::sink());
        });
        let mut serve = Serve { child: Some(child), stderr: Some(stderr), url: String::new() };
        let line = rx.recv_timeout(STARTUP_TIMEOUT).unwrap_or_default();
        match line.trim_end().strip_prefix("commitpoint listening on ") {
            Some(url) if url.starts_with("http://127.0.0.1:") => {
                serve.url = url.to_string();
                serve
            }
            _ => {
                let stderr = serve.kill9();
                panic!("serve did not report its address (stdout line {line:?}); stderr:\n{stderr}");
            }
        }
    }

    /// Panics (with the server's stderr) if the process already exited on its own.
    pub fn assert_alive(&mut self, what: &str) {
        let exited = self.child.as_mut().and_then(|c| c.try_wait().ok().flatten());
        if let Some(status) = exited {
            self.child = None;
            let stderr = self.collect_stderr();
            panic!("the server exited by itself ({status:?}) {what}; stderr:\n{stderr}");
        }
    }

    /// SIGKILL and reap; returns stderr.
    pub fn kill9(&mut self) -> String {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        self.collect_stderr()
    }

    /// SIGTERM and wait for the exit; returns the status and stderr.
    pub fn terminate(mut self) -> (ExitStatus, String) {
        let mut child = self.child.take().expect("server still owned");
        let sent = Command::new("kill").args(["-TERM", &child.id().to_string()]).status().expect("run kill -TERM");
        assert!(sent.success(), "kill -TERM failed");
        let status = wait_timeout(&mut child, EXIT_TIMEOUT).unwrap_or_else(|| {
            let _ = child.kill();
            let _ = child.wait();
            panic!("the server did not stop within {EXIT_TIMEOUT:?} of SIGTERM")
        });
        (status, self.collect_stderr())
    }

    fn collect_stderr(&mut self) -> String {
        self.stderr.take().map(|h| h.join().unwrap_or_default()).unwrap_or_default()
    }
}

impl Drop for Serve {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

pub fn db_path(data_dir: &Path) -> PathBuf {
    data_dir.join("commitpoint.redb")
}

/// `commitpoint verify FILE` must exit 0 and say every invariant holds; returns its report.
pub fn assert_verifies(db: &Path, when: &str, log: &str) -> String {
    verify(db, when, log).unwrap_or_else(|failure| panic!("{failure}"))
}

/// Runs `commitpoint verify FILE`: `Ok(report)` when it exits 0 and says every invariant
/// holds. Otherwise the file and `log` (every server's stderr so far) are kept under the
/// target directory and `Err` describes the failure, with the log's tail.
pub fn verify(db: &Path, when: &str, log: &str) -> Result<String, String> {
    let mut child = Command::new(BIN)
        .arg("verify")
        .arg(db)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn commitpoint verify");
    let stdout = drain(child.stdout.take().expect("piped stdout"));
    let stderr = drain(child.stderr.take().expect("piped stderr"));
    let status = wait_timeout(&mut child, VERIFY_TIMEOUT);
    if status.is_none() {
        let _ = child.kill();
        let _ = child.wait();
    }
    let (out, err) = (stdout.join().unwrap_or_default(), stderr.join().unwrap_or_default());
    let status = status.unwrap_or_else(|| panic!("verify {when} did not finish within {VERIFY_TIMEOUT:?}"));
    if status.code() != Some(0) || !out.contains("ok: every invariant holds") {
        let kept = keep(db, log);
        return Err(format!(
            "verify {when} failed ({status:?}); kept {kept}\nstdout:\n{out}\nstderr:\n{err}\n\
             server log (tail):\n{}",
            tail(log, 60)
        ));
    }
    Ok(out)
}

/// Copies a database that failed verification, and the logs, to where they outlive the
/// temp directory; returns where.
fn keep(db: &Path, log: &str) -> String {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("torture-failures");
    let stem = dir.join(format!("{}-round{}", std::process::id(), crate::context::round()));
    let (file, logs) = (stem.with_extension("redb"), stem.with_extension("log"));
    let kept =
        std::fs::create_dir_all(&dir).and_then(|()| std::fs::copy(db, &file)).and_then(|_| std::fs::write(&logs, log));
    match kept {
        Ok(()) => format!("{} and {}", file.display(), logs.display()),
        Err(e) => format!("nothing (cannot copy: {e})"),
    }
}

fn tail(text: &str, lines: usize) -> String {
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

/// The number on the report line `name: N` (e.g. `extractions: 12`, `  committed: 3`).
pub fn report_count(report: &str, name: &str) -> u64 {
    report.lines().find_map(|l| l.trim().strip_prefix(name)?.strip_prefix(": ")?.trim().parse().ok()).unwrap_or(0)
}

fn drain<R: Read + Send + 'static>(mut pipe: R) -> JoinHandle<String> {
    std::thread::spawn(move || {
        let mut bytes = Vec::new();
        let _ = pipe.read_to_end(&mut bytes);
        String::from_utf8_lossy(&bytes).into_owned()
    })
}

fn wait_timeout(child: &mut Child, timeout: Duration) -> Option<ExitStatus> {
    let deadline = Instant::now() + timeout;
    loop {
        if let Ok(Some(status)) = child.try_wait() {
            return Some(status);
        }
        if Instant::now() >= deadline {
            return None;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}
