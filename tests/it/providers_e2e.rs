//! End-to-end tests of the providers beside OpenAI (issue 4): Anthropic Message Batches
//! against the simulator's Anthropic dialect, the generic REST batch contract and a
//! synchronous chat server against fakes written here, and an operator's pause. Each runs
//! the real binary with no primary provider (`--provider` omitted), routed by `[routing]
//! default` to the provider under test, over real HTTP, with SIGKILLs where a crash point
//! is named. The shared rig and checks are here; the tests are in `providers_e2e_*.rs`.

use std::collections::BTreeSet;
use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::time::Duration;

use commitpoint::simulator::{Dialect, Faults, Simulator, SimulatorConfig, Stats};
use serde_json::Value;

use crate::provider::{
    CORPUS, SETTLE, assert_all_committed_with_model_findings, assert_recovered_once, assert_report_counts,
    assert_submitted, counter, finish, health, intake_corpus, settle, wait_stats,
};
use crate::util::{Api, Server, assert_verifies, temp_dir};

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
    serve_with_env(dir, config, extra, failpoint, &[])
}

/// [`serve`] with `env` added to the server's environment.
pub fn serve_with_env(
    dir: &Path,
    config: &str,
    extra: &[&str],
    failpoint: Option<&str>,
    env: &[(&str, &str)],
) -> Server {
    let mut args = vec!["--config", config];
    for (flag, value) in [("--batch-max-wait", "200ms"), ("--poll-interval", "100ms")] {
        if !extra.contains(&flag) {
            args.extend([flag, value]);
        }
    }
    args.extend_from_slice(extra);
    let mut all_env = vec![(KEY_ENV, KEY)];
    all_env.extend_from_slice(env);
    if let Some(point) = failpoint {
        all_env.push(("COMMITPOINT_FAILPOINTS", point));
    }
    Server::start_with_env(dir, &args, &all_env)
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

/// How a provider's answers are priced: a batch carries the discount (half the list price).
#[derive(Clone, Copy, Debug)]
pub enum Pricing {
    Batch,
    Synchronous,
}

/// Every ledger entry of every extraction: billed by `provider`, with input tokens, and
/// charged `per_token` micro-dollars a token (input, output), halved for a batch. A charge
/// shows which provider's prices it was made at when the rigs give each provider its own.
pub async fn assert_charged(
    api: &Api,
    ids: &BTreeSet<String>,
    provider: &str,
    per_token: (u64, u64),
    pricing: Pricing,
) {
    assert_billed_by(api, ids, provider).await;
    for id in ids {
        let reply = api.get(&format!("/v1/extractions/{id}/costs")).await;
        for entry in reply.body["attempts"].as_array().expect("attempts") {
            let tokens = |k: &str| entry[k].as_u64().unwrap_or(0);
            assert!(tokens("input_tokens") > 0, "{entry:#}");
            let list = tokens("input_tokens") * per_token.0 + tokens("output_tokens") * per_token.1;
            let expected = match pricing {
                Pricing::Batch => list / 2,
                Pricing::Synchronous => list,
            };
            let cost = tokens("cost_micros");
            assert!(cost > 0 && cost.abs_diff(expected) <= 1, "{pricing:?} at {per_token:?} a token: {entry:#}");
        }
    }
}

/// A simulator speaking one provider's dialect, a data directory, and a config routing all
/// work to the provider under test: the rig every simulated provider's end-to-end tests
/// share, so that each scenario is written once and run against each dialect.
pub struct SimRig {
    pub sim: Simulator,
    pub dir: tempfile::TempDir,
    config: String,
    /// What the server needs in its environment beside the shared key (cloud credentials,
    /// the metadata server's host).
    env: Vec<(&'static str, String)>,
}

impl SimRig {
    /// Starts the simulator with `config`, then writes the config file whose provider
    /// tables `sections` makes for it (given the data directory, for files such as keys).
    pub async fn start(
        config: SimulatorConfig,
        provider: &str,
        sections: impl FnOnce(&Simulator, &Path) -> String,
    ) -> SimRig {
        let sim = Simulator::start("127.0.0.1:0".parse().expect("loopback address"), config)
            .await
            .expect("start the simulator");
        let dir = temp_dir();
        let config = write_config(dir.path(), &sections(&sim, dir.path()), provider);
        SimRig { sim, dir, config, env: Vec::new() }
    }

    /// Every server of this rig starts with `name=value` in its environment.
    pub fn with_env(mut self, name: &'static str, value: impl Into<String>) -> SimRig {
        self.env.push((name, value.into()));
        self
    }

    /// [`serve`] on this rig's data directory and config, with its environment.
    pub fn serve(&self, extra: &[&str], failpoint: Option<&str>) -> Server {
        let env: Vec<(&str, &str)> = self.env.iter().map(|(name, value)| (*name, value.as_str())).collect();
        serve_with_env(self.dir.path(), &self.config, extra, failpoint, &env)
    }

    pub fn config_path(&self) -> &str {
        &self.config
    }

    pub fn stats(&self) -> Stats {
        self.sim.stats()
    }

    pub fn db(&self) -> std::path::PathBuf {
        self.dir.path().join("commitpoint.redb")
    }

    /// Waits (bounded) until the simulator's counters satisfy `done`; returns them.
    pub async fn wait_stats(&self, what: &str, done: impl Fn(&Stats) -> bool) -> Stats {
        wait_stats(&self.sim, what, done).await
    }
}

/// The simulator speaking Anthropic's Message Batches, routed to as `[providers.anthropic]`.
pub async fn anthropic_rig(complete_after: Duration, faults: Faults) -> SimRig {
    let config = SimulatorConfig {
        dialect: Dialect::Anthropic,
        api_key: Some(KEY.into()),
        complete_after,
        faults,
        ..SimulatorConfig::default()
    };
    SimRig::start(config, "anthropic", |sim, _| {
        format!(
            "[providers.anthropic]\nbase_url = \"{}\"\nmodel = \"claude-e2e\"\nmax_tokens = 1024\napi_key_env = \"{KEY_ENV}\"\n",
            sim.base_url()
        )
    })
    .await
}

/// The crash point between a provider's create and storing the job's id.
const AFTER_CREATE: &str = "after-submit-before-job-id";

/// Killed after the create, before the job's id was stored: one job exists and every member
/// is `submitted` on disk. The restart is the caller's (see [`the_job_is_found_again`]).
pub async fn kill_after_the_create(rig: &SimRig) {
    let mut server = rig.serve(ONE_BATCH, Some(AFTER_CREATE));
    intake_corpus(&server.api()).await;
    expect_crash(&mut server, AFTER_CREATE);
    let stats = rig.stats();
    assert_eq!(stats.batches_created, 1, "{stats:#?}");
    let report = assert_verifies(&rig.db());
    assert_report_counts(&report, CORPUS.len(), &[&format!("submitted: {}", CORPUS.len())]);
}

/// After [`kill_after_the_create`]: the restart finds the job by the dialect's lookup and
/// commits every member once from it, creating nothing. Returns the simulator's counters
/// for the dialect's own checks (how far the lookup paged).
pub async fn the_job_is_found_again(rig: &SimRig) -> Stats {
    let stats = assert_recovered_once(rig.serve(ONE_BATCH, None), || rig.stats()).await;
    assert!(stats.batches_listed >= 1, "the restart looked the job up: {stats:#?}");
    assert_eq!(stats.lines_completed, CORPUS.len() as u64, "each member answered once: {stats:#?}");
    stats
}

/// Both halves: a kill after the create, then a restart that finds the job.
pub async fn killed_after_the_create_the_job_is_found_again(rig: &SimRig) -> Stats {
    kill_after_the_create(rig).await;
    the_job_is_found_again(rig).await
}

/// A create answered by a dropped connection (the job exists, its answer is lost; the rig's
/// faults drop one): the job is looked up, not created again, and each member is sent and
/// committed once. Returns the simulator's counters for the dialect's own checks.
pub async fn a_dropped_create_is_looked_up_not_repeated(rig: &SimRig) -> Stats {
    let server = rig.serve(ONE_BATCH, None);
    let api = server.api();
    let ids = intake_corpus(&api).await;
    assert_all_committed_with_model_findings(&api).await;
    settle(&api, &ids).await;
    let stats = rig.stats();
    assert_eq!(stats.dropped_connections, 1, "{stats:#?}");
    assert_eq!(stats.batches_created, 1, "the unanswered create was looked up, not repeated: {stats:#?}");
    assert_submitted(&stats, &ids, 1);
    let health = health(&api).await;
    assert_eq!(counter(&health, "batches_recovered"), 1, "{health:#}");
    let report = finish(server);
    assert_report_counts(&report, CORPUS.len(), &[&format!("committed: {}", CORPUS.len())]);
    stats
}

/// A request over the model's input limit (the rig's faults set `max_input_tokens`) is
/// refused on its own line of a job that succeeds: it fails `invalid_request` after one
/// job, sent once, and the rest of the corpus commits. Returns its failure reason, in the
/// provider's words.
pub async fn a_request_over_the_input_limit_fails_alone(rig: &SimRig) -> String {
    let server = rig.serve(&[], None);
    let api = server.api();
    let mut ids = intake_corpus(&api).await;
    let big = format!("// a long file\n{}", "fn filler() { let x = 1; }\n".repeat(1_000));
    let over = api.create(crate::provider::TENANT, "huge.rs", &big).await;
    ids.insert(over.clone());
    let records = settle(&api, &ids).await;
    let failed = &records[&over];
    assert_eq!(failed["state"], "failed", "{failed:#}");
    assert_eq!(failed["failure_class"], "invalid_request", "{failed:#}");
    let stats = rig.stats();
    assert_eq!(stats.submissions_per_custom_id.get(&over), Some(&1), "sent once: {stats:#?}");
    for (id, record) in &records {
        if *id != over {
            assert_eq!(record["state"], "committed", "{record:#}");
        }
    }
    finish(server);
    let reason = failed["failure_reason"].as_str();
    reason.unwrap_or_else(|| panic!("a failure reason: {failed:#}")).to_string()
}

/// How much of its first job the rig's simulator answers before cutting it short.
#[derive(Clone, Copy)]
pub enum Answered {
    /// It expired before it ran (Bedrock, Gemini and Vertex `Expired`).
    Nothing,
    /// Its first half, in input order (OpenAI-shaped and Anthropic `expired`, Bedrock
    /// `PartiallyCompleted`).
    FirstHalf,
}

/// The rig's first job is cut short (its faults say how: `expire_batches`,
/// `partial_batches`) having answered what `answered` says; `then` are the simulator's
/// faults from that job on. What it answered commits from it; the rest never ran, goes back
/// to the queue, and commits once from one new job, its attempt counted. Every attempt is
/// billed by `provider`. Returns the simulator's counters and the provider's health for the
/// dialect's own checks.
pub async fn a_job_cut_short_requeues_what_it_did_not_answer(
    rig: &SimRig,
    provider: &str,
    then: Faults,
    answered: Answered,
) -> (Stats, Value) {
    let server = rig.serve(ONE_BATCH, None);
    let api = server.api();
    let ids = intake_corpus(&api).await;
    rig.wait_stats("the first job", |s| s.batches_created >= 1).await;
    rig.sim.set_faults(then);

    let records = settle(&api, &ids).await;
    assert_all_committed_with_model_findings(&api).await;
    let stats = rig.stats();
    assert_eq!(stats.batches_created, 2, "the unanswered went into one new job: {stats:#?}");
    let first = match answered {
        Answered::Nothing => 0,
        Answered::FirstHalf => CORPUS.len() / 2,
    };
    let sent = |times: u64| -> BTreeSet<String> {
        stats.submissions_per_custom_id.iter().filter(|(_, n)| **n == times).map(|(id, _)| id.clone()).collect()
    };
    let (once, twice) = (sent(1), sent(2));
    assert_eq!((once.len(), twice.len()), (first, CORPUS.len() - first), "{stats:#?}");
    assert_eq!(once.union(&twice).cloned().collect::<BTreeSet<_>>(), ids);
    assert_eq!(stats.max_live_batches_per_custom_id, 1, "never in two live jobs: {stats:#?}");
    assert_eq!(stats.lines_completed, CORPUS.len() as u64, "nothing answered twice: {stats:#?}");
    for (id, record) in &records {
        let attempts = if twice.contains(id) { 2 } else { 1 };
        assert_eq!(record["attempts"], attempts, "the sent-again ones are on their second attempt: {record:#}");
    }
    assert_billed_by(&api, &ids, provider).await;
    let health = health(&api).await;
    assert_eq!(counter(&health, "members_requeued"), (CORPUS.len() - first) as u64, "{health:#}");
    let report = finish(server);
    assert_report_counts(&report, CORPUS.len(), &[&format!("committed: {}", CORPUS.len())]);
    (stats, health)
}
