//! The real `commitpoint` binary as a child process: `serve` on `127.0.0.1:0` until its
//! "listening" line, SIGTERM, SIGKILL, and bounded runs of one-shot subcommands.
//!
//! Every child is owned by a guard that SIGKILLs it on drop, so a failing assertion never
//! leaves a server behind, and every wait has a timeout. Pipes are drained on threads, so
//! a child never blocks on a full pipe.

use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::sync::mpsc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

pub const BIN: &str = env!("CARGO_BIN_EXE_commitpoint");
const STARTUP_TIMEOUT: Duration = Duration::from_secs(30);
const EXIT_TIMEOUT: Duration = Duration::from_secs(30);
const LISTENING: &str = "commitpoint listening on ";

/// A running `commitpoint serve`. Dropping it SIGKILLs the process.
pub struct Server {
    child: Option<Child>,
    stderr: Option<JoinHandle<String>>,
    pub url: String,
    pub data_dir: PathBuf,
}

impl Server {
    /// Spawns `cmd` (a `serve` on `127.0.0.1:0` over `data_dir`) and waits for the line
    /// that names its address; panics with the server's stderr if none comes.
    pub fn spawn(mut cmd: Command, data_dir: &Path) -> Server {
        super::postgres::apply(&mut cmd, data_dir);
        Self::spawn_as_given(cmd, data_dir)
    }

    /// [`Server::spawn`] without the PostgreSQL switch: the store is whatever `cmd` says
    /// (redb unless it names a database), for tests that need both backends at once.
    pub fn spawn_as_given(mut cmd: Command, data_dir: &Path) -> Server {
        let mut child = cmd.stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().expect("spawn commitpoint serve");
        let stdout = child.stdout.take().expect("piped stdout");
        let stderr = drain(child.stderr.take().expect("piped stderr"));
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            let mut reader = BufReader::new(stdout);
            let mut line = String::new();
            let _ = reader.read_line(&mut line);
            let _ = tx.send(line);
            // Keep the pipe open and drained for the life of the process.
            let _ = std::io::copy(&mut reader, &mut std::io::sink());
        });
        let mut server =
            Server { child: Some(child), stderr: Some(stderr), url: String::new(), data_dir: data_dir.to_path_buf() };
        let line = rx.recv_timeout(STARTUP_TIMEOUT).unwrap_or_default();
        match line.trim_end().strip_prefix(LISTENING) {
            Some(url) if url.starts_with("http://127.0.0.1:") => {
                server.url = url.to_string();
                server
            }
            _ => {
                let stderr = server.kill9();
                panic!("serve did not report its address (stdout line {line:?}); stderr:\n{stderr}");
            }
        }
    }

    pub fn db_path(&self) -> PathBuf {
        db_path(&self.data_dir)
    }

    /// The server's process id (signals sent by tests and by the CLI under test).
    pub fn pid(&self) -> u32 {
        self.child.as_ref().map(Child::id).expect("server still owned")
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

    /// SIGTERM, then waits for the exit. Returns the status and everything on stderr.
    pub fn terminate(mut self) -> (ExitStatus, String) {
        let sent = Command::new("kill").args(["-TERM", &self.pid().to_string()]).status().expect("run kill -TERM");
        assert!(sent.success(), "kill -TERM failed");
        let mut child = self.child.take().expect("server still owned");
        let status = wait_timeout(&mut child, EXIT_TIMEOUT).unwrap_or_else(|| {
            let _ = child.kill();
            let _ = child.wait();
            panic!("the server did not stop within {EXIT_TIMEOUT:?} of SIGTERM")
        });
        (status, self.collect_stderr())
    }

    /// SIGKILL (no chance to clean up) and reap. Returns stderr.
    pub fn kill9(&mut self) -> String {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        self.collect_stderr()
    }

    /// Waits for the process to exit by itself (a crash point killed it), reaps it and
    /// returns its status and stderr; `None` if it is still running after `timeout`.
    pub fn wait_exit(&mut self, timeout: Duration) -> Option<(ExitStatus, String)> {
        let status = wait_timeout(self.child.as_mut()?, timeout)?;
        self.child = None;
        Some((status, self.collect_stderr()))
    }

    fn collect_stderr(&mut self) -> String {
        self.stderr.take().map(|h| h.join().unwrap_or_default()).unwrap_or_default()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// Where `serve --data-dir DIR` keeps its database.
pub fn db_path(data_dir: &Path) -> PathBuf {
    data_dir.join("commitpoint.redb")
}

/// Runs a command to completion with captured output; after `timeout` it is killed and
/// `Err` says so, with what it printed until then.
pub fn run_bounded(mut cmd: Command, timeout: Duration) -> Result<Output, String> {
    let mut child =
        cmd.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().expect("spawn command");
    let stdout = drain(child.stdout.take().expect("piped stdout"));
    let stderr = drain(child.stderr.take().expect("piped stderr"));
    let status = wait_timeout(&mut child, timeout);
    if status.is_none() {
        let _ = child.kill();
        let _ = child.wait();
    }
    let (stdout, stderr) = (stdout.join().unwrap_or_default(), stderr.join().unwrap_or_default());
    match status {
        Some(status) => Ok(Output { status, stdout: stdout.into_bytes(), stderr: stderr.into_bytes() }),
        None => Err(format!("{cmd:?} did not finish within {timeout:?}\nstdout:\n{stdout}\nstderr:\n{stderr}")),
    }
}

/// Reads a pipe to the end on a thread, so the child never blocks on a full pipe.
pub fn drain<R: Read + Send + 'static>(mut pipe: R) -> JoinHandle<String> {
    std::thread::spawn(move || {
        let mut bytes = Vec::new();
        let _ = pipe.read_to_end(&mut bytes);
        String::from_utf8_lossy(&bytes).into_owned()
    })
}

pub fn wait_timeout(child: &mut Child, timeout: Duration) -> Option<ExitStatus> {
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
