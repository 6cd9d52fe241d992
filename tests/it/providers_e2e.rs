//! End-to-end tests of the providers beside OpenAI (issue 4): Anthropic Message Batches
//! against the simulator's Anthropic dialect, the generic REST batch contract and a
//! synchronous chat server against fakes written here, and an operator's pause. Each runs
//! the real binary with no primary provider (`--provider` omitted), routed by `[routing]
//! default` to the provider under test, over real HTTP, with SIGKILLs where a crash point
//! is named. The shared rig and checks are here; the tests are in `providers_e2e_*.rs`.

use std::collections::BTreeSet;
use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::time::{Duration, Instant};

use commitpoint::simulator::{Dialect, Faults, Simulator, SimulatorConfig, Stats};
use serde_json::Value;

use crate::provider::SETTLE;
use crate::util::{Api, Server, temp_dir};

/// The one API key every fake and the simulator expect, and where the server reads it.
pub const KEY: &str = "sk-e2e-provider";
pub const KEY_ENV: &str = "E2E_PROVIDER_KEY";

pub use crate::provider::ONE_BATCH;

/// Writes `config.toml` into `dir`: the provider sections, and routing of all work to `provider`.
pub fn write_config(dir: &Path, sections: &str, provider: &str) -> String {
    let path = dir.join("config.toml");
    std::fs::write(&path, format!("{sections}\n[routing]\ndefault = \"{provider}\"\n")).expect("write config");
    path.display().to_string()
}

/// `serve --config CONFIG` with no primary provider: batches wait at most 200 ms and jobs
/// are polled every 100 ms unless `extra` sets those flags; the crash point is armed if given.
pub fn serve(dir: &Path, config: &str, extra: &[&str], failpoint: Option<&str>) -> Server {
    let mut args = vec!["--config", config];
    for (flag, value) in [("--batch-max-wait", "200ms"), ("--poll-interval", "100ms")] {
        if !extra.contains(&flag) {
            args.extend([flag, value]);
        }
    }
    args.extend_from_slice(extra);
    let mut env = vec![(KEY_ENV, KEY)];
    if let Some(point) = failpoint {
        env.push(("COMMITPOINT_FAILPOINTS", point));
    }
    Server::start_with_env(dir, &args, &env)
}

/// Waits for the server to kill itself at `point`; asserts it died of SIGKILL there.
pub fn expect_crash(server: &mut Server, point: &str) {
    let (status, stderr) = server.wait_exit(SETTLE).unwrap_or_else(|| panic!("the server never reached {point}"));
    assert_eq!(status.signal(), Some(9), "killed by SIGKILL at {point}: {status:?}\n{stderr}");
    assert!(stderr.contains(&format!("failpoint {point} reached")), "{stderr}");
}

/// The provider named by every ledger entry of each extraction: all must be `provider`.
pub async fn assert_billed_by(api: &Api, ids: &BTreeSet<String>, provider: &str) {
    for id in ids {
        let reply = api.get(&format!("/v1/extractions/{id}/costs")).await;
        assert_eq!(reply.status, 200, "{:#}", reply.body);
        let attempts = reply.body["attempts"].as_array().expect("attempts");
        assert!(!attempts.is_empty(), "{id} has no ledger entry: {:#}", reply.body);
        for attempt in attempts {
            assert_eq!(attempt["provider"], Value::from(provider), "{attempt:#}");
        }
    }
}

/// The simulator speaking Anthropic's Message Batches, and a data directory whose config
/// routes everything to `[providers.anthropic]` pointed at it.
pub struct AnthropicRig {
    pub sim: Simulator,
    pub dir: tempfile::TempDir,
    config: String,
}

impl AnthropicRig {
    pub async fn start(complete_after: Duration, faults: Faults) -> AnthropicRig {
        let config = SimulatorConfig {
            dialect: Dialect::Anthropic,
            api_key: Some(KEY.into()),
            complete_after,
            faults,
            ..SimulatorConfig::default()
        };
        let sim = Simulator::start("127.0.0.1:0".parse().expect("loopback address"), config)
            .await
            .expect("start the simulator");
        let dir = temp_dir();
        let sections = format!(
            "[providers.anthropic]\nbase_url = \"{}\"\nmodel = \"claude-e2e\"\nmax_tokens = 1024\napi_key_env = \"{KEY_ENV}\"\n",
            sim.base_url()
        );
        let config = write_config(dir.path(), &sections, "anthropic");
        AnthropicRig { sim, dir, config }
    }

    pub fn serve(&self, extra: &[&str], failpoint: Option<&str>) -> Server {
        serve(self.dir.path(), &self.config, extra, failpoint)
    }

    pub fn stats(&self) -> Stats {
        self.sim.stats()
    }

    pub fn db(&self) -> std::path::PathBuf {
        self.dir.path().join("commitpoint.redb")
    }

    /// Waits (bounded) until the simulator's counters satisfy `done`; returns them.
    pub async fn wait_stats(&self, what: &str, done: impl Fn(&Stats) -> bool) -> Stats {
        let deadline = Instant::now() + SETTLE;
        loop {
            let stats = self.stats();
            if done(&stats) {
                return stats;
            }
            assert!(Instant::now() < deadline, "timed out waiting for {what}; simulator stats: {stats:#?}");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
}
