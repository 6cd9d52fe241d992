//! The three `serve` processes on one database: starting (with retries while a refusal is
//! a legitimate answer), SIGKILL, and noticing a process that exited by itself.

use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

use crate::support::postgres::STORE_URL_ENV;
use crate::support::process::{BIN, Server};

pub const INSTANCES: usize = 3;
pub const SIM_KEY: &str = "sk-multi";
/// The slots whose instances have `[providers.openai]`. One drives at a time (its term of
/// the provider's lease, docs/SCALE-OUT.md); the other stands by and takes over when the
/// driver is killed or paused past its lease.
/// The third has no provider: intake, claims and reads only.
pub const DRIVERS: [usize; 2] = [0, 1];
/// How long a start may keep being refused (the killed driver's session not yet gone, the
/// database restarting) before the test fails.
const START_DEADLINE: Duration = Duration::from_secs(40);

/// The base URLs of the instances that are up now, for clients and workers.
#[derive(Debug, Default)]
pub struct Live {
    urls: RwLock<[Option<String>; INSTANCES]>,
}

impl Live {
    pub fn get(&self, slot: usize) -> Option<String> {
        self.urls.read().map(|u| u[slot].clone()).unwrap_or_default()
    }

    fn set(&self, slot: usize, url: Option<String>) {
        if let Ok(mut urls) = self.urls.write() {
            urls[slot] = url;
        }
    }

    pub fn any(&self) -> Vec<String> {
        self.urls.read().map(|u| u.iter().flatten().cloned().collect()).unwrap_or_default()
    }
}

/// What a start went through, for the failover figures.
#[derive(Debug, Clone)]
pub struct Started {
    pub slot: usize,
    pub took: Duration,
    pub refusals: Vec<String>,
}

struct Slot {
    dir: tempfile::TempDir,
    server: Option<Server>,
}

pub struct Fleet {
    slots: Vec<Slot>,
    pub live: Arc<Live>,
    store_url: String,
    config: PathBuf,
    sim_url: String,
    /// Every ended process's stderr, written out when the fleet is dropped.
    logs: String,
    seed: u64,
}

/// Every instance's stderr goes to `target/tmp/multi-instance/seed-<seed>.log` when the
/// run ends, passed or failed (running instances are killed first).
impl Drop for Fleet {
    fn drop(&mut self) {
        for slot in 0..INSTANCES {
            self.kill(slot, "end of the run");
        }
        let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("multi-instance");
        let path = dir.join(format!("seed-{}.log", self.seed));
        match std::fs::create_dir_all(&dir).and_then(|()| std::fs::write(&path, &self.logs)) {
            Ok(()) => eprintln!("instances' logs: {}", path.display()),
            Err(e) => eprintln!("cannot write the instances' logs to {}: {e}", path.display()),
        }
    }
}

impl Fleet {
    pub fn new(store_url: String, config: PathBuf, sim_url: String, seed: u64) -> Fleet {
        let slots = (0..INSTANCES)
            .map(|_| Slot {
                dir: tempfile::Builder::new().prefix("commitpoint-multi-").tempdir().expect("temp dir"),
                server: None,
            })
            .collect();
        Fleet { slots, live: Arc::default(), store_url, config, sim_url, logs: String::new(), seed }
    }

    fn command(&self, slot: usize) -> Command {
        let mut cmd = Command::new(BIN);
        cmd.arg("serve")
            .arg("--data-dir")
            .arg(self.slots[slot].dir.path())
            .arg("--config")
            .arg(&self.config)
            .args(["--listen", "127.0.0.1:0"])
            .env(STORE_URL_ENV, &self.store_url)
            .env(crate::config::SINK_SECRET_ENV, crate::config::SINK_SECRET)
            .env("COMMITPOINT_LOG", "info")
            .env_remove("COMMITPOINT_FAILPOINTS")
            .env_remove("COMMITPOINT_CONFIG")
            .stdin(Stdio::null());
        if DRIVERS.contains(&slot) {
            cmd.args(["--provider", "openai", "--provider-base-url", &self.sim_url, "--provider-key-env", "MULTI_KEY"])
                .args(["--batch-max-size", "24", "--batch-max-wait", "300ms", "--poll-interval", "100ms"])
                .env("MULTI_KEY", SIM_KEY);
        }
        cmd
    }

    /// Starts `slot`, retrying a refused start until [`START_DEADLINE`]; returns what it
    /// took. The instance is live for clients once this returns.
    pub fn start(&mut self, slot: usize) -> Started {
        assert!(self.slots[slot].server.is_none(), "slot {slot} is already running");
        let began = Instant::now();
        let mut refusals = Vec::new();
        loop {
            match Server::try_spawn(self.command(slot), self.slots[slot].dir.path()) {
                Ok(server) => {
                    self.live.set(slot, Some(server.url.clone()));
                    self.slots[slot].server = Some(server);
                    return Started { slot, took: began.elapsed(), refusals };
                }
                Err(failure) => {
                    let reason = failure.lines().rev().find(|l| l.contains("commitpoint:")).unwrap_or("").to_string();
                    self.logs.push_str(&format!("===== slot {slot}: start refused =====\n{failure}\n"));
                    assert!(
                        began.elapsed() < START_DEADLINE,
                        "slot {slot} did not start within {START_DEADLINE:?}; the last attempt:\n{failure}"
                    );
                    refusals.push(reason);
                    std::thread::sleep(Duration::from_millis(100));
                }
            }
        }
    }

    /// The slot whose process has `pid`, if it runs.
    pub fn slot_of(&self, pid: u32) -> Option<usize> {
        (0..INSTANCES).find(|&slot| self.slots[slot].server.as_ref().is_some_and(|s| s.pid() == pid))
    }

    /// SIGSTOPs `slot` (taken out of the clients' list, as a load balancer's health check
    /// would) and returns its pid.
    pub fn pause(&mut self, slot: usize) -> Option<u32> {
        let pid = self.slots[slot].server.as_ref()?.pid();
        self.live.set(slot, None);
        signal(pid, Signal::SIGSTOP);
        Some(pid)
    }

    /// SIGCONTs `slot` if it still runs (a kill may have ended it meanwhile) and puts it
    /// back in the clients' list.
    pub fn resume(&mut self, slot: usize) {
        if let Some(server) = &self.slots[slot].server {
            signal(server.pid(), Signal::SIGCONT);
            self.live.set(slot, Some(server.url.clone()));
        }
    }

    /// SIGKILLs `slot` (taken out of the clients' list first).
    pub fn kill(&mut self, slot: usize, why: &str) {
        self.live.set(slot, None);
        if let Some(mut server) = self.slots[slot].server.take() {
            let stderr = server.kill9();
            self.logs.push_str(&format!("===== slot {slot}: SIGKILL ({why}) =====\n{stderr}\n"));
        }
    }

    /// The slots whose process exited by itself since the last look, with status and
    /// stderr; they are out of the clients' list.
    pub fn exited(&mut self) -> Vec<(usize, ExitStatus, String)> {
        let mut out = Vec::new();
        for slot in 0..INSTANCES {
            let ended = self.slots[slot].server.as_mut().and_then(|s| s.wait_exit(Duration::ZERO));
            if let Some((status, stderr)) = ended {
                self.live.set(slot, None);
                self.slots[slot].server = None;
                self.logs.push_str(&format!("===== slot {slot}: exited by itself ({status}) =====\n{stderr}\n"));
                out.push((slot, status, stderr));
            }
        }
        out
    }

    /// SIGTERM to every instance: each must stop cleanly (exit 0).
    pub fn stop_all(&mut self) {
        for slot in 0..INSTANCES {
            self.live.set(slot, None);
            if let Some(server) = self.slots[slot].server.take() {
                let (status, stderr) = server.terminate();
                self.logs.push_str(&format!("===== slot {slot}: SIGTERM ({status}) =====\n{stderr}\n"));
                assert_eq!(status.code(), Some(0), "slot {slot} did not stop cleanly on SIGTERM:\n{stderr}");
            }
        }
    }
}

fn signal(pid: u32, signal: Signal) {
    let pid = Pid::from_raw(i32::try_from(pid).expect("a pid fits an i32"));
    kill(pid, signal).unwrap_or_else(|e| panic!("{signal} to {pid}: {e}"));
}
