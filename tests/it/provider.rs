//! The built-in provider lifecycle against the SIMULATED OpenAI Batch API, run inside the
//! test process so its counters outlive every `commitpoint serve` the test kills and
//! restarts. Shared rig and checks here, plus the duplicate-intake cases; crash points in
//! `provider_crash.rs`, provider faults in `provider_faults.rs`.
//!
//! Every scenario ends with `commitpoint verify` passing on the data directory.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use commitpoint::domain::identity::{ExtractionId, SourceHash};
use commitpoint::simulator::{Faults, Simulator, SimulatorConfig, Stats};
use serde_json::{Value, json};

use crate::util::{Api, SCHEMA, Server, id_of, stop_and_verify, temp_dir};

pub const TENANT: &str = "acme";
pub const SIM_KEY: &str = "sk-test";
/// The whole corpus in one batch: formed the moment the last source arrives, however slowly
/// a loaded machine delivers the six intakes. Tests that count batches need it; the 200 ms
/// default splits the corpus when intake is slower than that.
pub const ONE_BATCH: &[&str] = &["--batch-max-size", "6", "--batch-max-wait", "2s"];

/// Every wait for the system to settle is bounded by this.
pub const SETTLE: Duration = Duration::from_secs(20);

/// A source and what the simulator's rule-based reviewer must find in it:
/// (rule, severity, 1-based line); the finding's `file` is the source id.
pub struct Source {
    pub id: &'static str,
    pub content: &'static str,
    pub findings: &'static [(&'static str, &'static str, u64)],
}

/// One source per rule of the simulated reviewer, one with several, one clean.
pub const CORPUS: &[Source] = &[
    Source {
        id: "src/parse.rs",
        content: "fn parse(s: &str) -> u32 {\n    s.parse().unwrap()\n}\n",
        findings: &[("no-unwrap", "medium", 2)],
    },
    Source {
        id: "src/cache.rs",
        content: "// TODO: evict old entries\nstruct Cache;\n",
        findings: &[("todo-left", "low", 1)],
    },
    Source {
        id: "src/ffi.rs",
        content: "pub fn peek(p: *const u8) -> u8 {\n    unsafe { *p }\n}\n",
        findings: &[("unsafe-code", "high", 2)],
    },
    Source {
        id: "src/config.rs",
        content: "let user = \"admin\";\nlet password = \"hunter2\";\nlet secret = load();\n",
        findings: &[("hardcoded-secret", "critical", 2), ("hardcoded-secret", "critical", 3)],
    },
    Source {
        id: "src/main.rs",
        content: "fn main() {\n    // TODO: flags\n    let n = run().unwrap();\n    if n == 0 { panic!(\"nothing ran\"); }\n}\n",
        findings: &[("todo-left", "low", 2), ("no-unwrap", "medium", 3), ("explicit-panic", "medium", 4)],
    },
    Source { id: "src/lib.rs", content: "pub fn add(a: u32, b: u32) -> u32 {\n    a + b\n}\n", findings: &[] },
];

/// The extraction id commitpoint must give a corpus source (the documented identity).
pub fn expected_id(source: &Source) -> String {
    let hash = SourceHash::compute(source.content.as_bytes(), SCHEMA);
    ExtractionId::compute(TENANT, source.id, &hash, SCHEMA).to_hex()
}

pub fn corpus_ids() -> BTreeSet<String> {
    CORPUS.iter().map(expected_id).collect()
}

/// A simulator in this process and a data directory that outlive server restarts.
pub struct Rig {
    pub sim: Simulator,
    pub dir: tempfile::TempDir,
}

impl Rig {
    pub async fn start(complete_after: Duration, faults: Faults) -> Rig {
        let config =
            SimulatorConfig { api_key: Some(SIM_KEY.into()), complete_after, faults, ..SimulatorConfig::default() };
        let sim = Simulator::start("127.0.0.1:0".parse().expect("loopback address"), config)
            .await
            .expect("start the simulator");
        Rig { sim, dir: temp_dir() }
    }

    /// `serve --provider openai` against the simulator: batches wait at most 200 ms and
    /// jobs are polled every 100 ms unless `extra` sets those flags itself; the crash point
    /// is armed if one is given.
    pub fn serve(&self, extra: &[&str], failpoint: Option<&str>) -> Server {
        let base = self.sim.base_url();
        let mut args = vec!["--provider", "openai", "--provider-base-url", &base, "--provider-key-env", "SIM_KEY"];
        for (flag, value) in [("--batch-max-wait", "200ms"), ("--poll-interval", "100ms")] {
            if !extra.contains(&flag) {
                args.extend([flag, value]);
            }
        }
        args.extend_from_slice(extra);
        let mut env = vec![("SIM_KEY", SIM_KEY)];
        if let Some(name) = failpoint {
            env.push(("COMMITPOINT_FAILPOINTS", name));
        }
        Server::start_with_env(self.dir.path(), &args, &env)
    }

    pub fn stats(&self) -> Stats {
        self.sim.stats()
    }

    pub fn db(&self) -> std::path::PathBuf {
        self.dir.path().join("commitpoint.redb")
    }

    /// Waits (bounded) until the simulator's counters satisfy `done`.
    pub async fn wait_stats(&self, what: &str, done: impl Fn(&Stats) -> bool) -> Stats {
        wait_stats(&self.sim, what, done).await
    }
}

/// Waits (bounded by [`SETTLE`]) until `sim`'s counters satisfy `done`; returns them.
pub async fn wait_stats(sim: &Simulator, what: &str, done: impl Fn(&Stats) -> bool) -> Stats {
    let deadline = Instant::now() + SETTLE;
    loop {
        let stats = sim.stats();
        if done(&stats) {
            return stats;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}; simulator stats: {stats:#?}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// `providers[0]` of `/healthz`.
pub async fn health(api: &Api) -> Value {
    let reply = api.get("/healthz").await;
    assert_eq!(reply.status, 200, "{:#}", reply.body);
    let provider = reply.body["providers"][0].clone();
    assert!(provider.is_object(), "no provider in /healthz: {:#}", reply.body);
    provider
}

pub fn counter(health: &Value, name: &str) -> u64 {
    health[name].as_u64().unwrap_or_else(|| panic!("no counter {name} in {health:#}"))
}

/// Intakes every corpus source once (concurrently); each must be new. Returns the ids.
pub async fn intake_corpus(api: &Api) -> BTreeSet<String> {
    let mut tasks = tokio::task::JoinSet::new();
    for source in CORPUS {
        let api = api.clone();
        tasks.spawn(async move { (api.create(TENANT, source.id, source.content).await, expected_id(source)) });
    }
    let mut ids = BTreeSet::new();
    while let Some(joined) = tasks.join_next().await {
        let (id, expected) = joined.expect("intake task");
        assert_eq!(id, expected, "the extraction id is the identity hash");
        ids.insert(id);
    }
    ids
}

/// Polls (every 100 ms, bounded) until every extraction in `ids` is committed or failed;
/// returns the records by id.
pub async fn settle(api: &Api, ids: &BTreeSet<String>) -> BTreeMap<String, Value> {
    settle_within(api, ids, SETTLE).await
}

/// Settles `ids` and asserts that each one failed with `class`, its reason saying every
/// one of `says`; returns the records by id.
pub async fn settle_failed(api: &Api, ids: &BTreeSet<String>, class: &str, says: &[&str]) -> BTreeMap<String, Value> {
    let records = settle(api, ids).await;
    for record in records.values() {
        assert_eq!((&record["state"], &record["failure_class"]), (&json!("failed"), &json!(class)), "{record:#}");
        let reason = record["failure_reason"].as_str().unwrap_or_default();
        assert!(says.iter().all(|s| reason.contains(s)), "the reason says {says:?}: {record:#}");
    }
    records
}

pub async fn settle_within(api: &Api, ids: &BTreeSet<String>, limit: Duration) -> BTreeMap<String, Value> {
    let deadline = Instant::now() + limit;
    loop {
        let records: BTreeMap<String, Value> =
            api.list_all("").await.into_iter().map(|r| (id_of(&r), r)).filter(|(id, _)| ids.contains(id)).collect();
        let done = records.len() == ids.len()
            && records.values().all(|r| r["state"] == json!("committed") || r["state"] == json!("failed"));
        if done {
            return records;
        }
        let states: Vec<_> = records.values().map(|r| r["state"].clone()).collect();
        assert!(Instant::now() < deadline, "not settled within {limit:?}: {states:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Every corpus source is one committed extraction whose findings are exactly the
/// simulated reviewer's, and nothing else exists.
pub async fn assert_all_committed_with_model_findings(api: &Api) {
    let records = settle(api, &corpus_ids()).await;
    assert_eq!(api.list_all("").await.len(), CORPUS.len(), "one extraction per source, no more");
    for source in CORPUS {
        let id = expected_id(source);
        let record = &records[&id];
        assert_eq!(record["state"], json!("committed"), "{}: {record:#}", source.id);
        assert!(record["committed_at"].is_string(), "{record:#}");
        assert_findings(api, source, &id).await;
    }
}

pub async fn assert_findings(api: &Api, source: &Source, id: &str) {
    let body = api.findings(id).await;
    let findings = body["findings"].as_array().expect("findings array");
    let got: BTreeSet<(String, String, u64)> = findings
        .iter()
        .map(|f| {
            assert_eq!(f["file"], json!(source.id), "{f:#}");
            let text = |k: &str| f[k].as_str().unwrap_or_default().to_string();
            (text("rule"), text("severity"), f["line"].as_u64().unwrap_or_default())
        })
        .collect();
    let want: BTreeSet<(String, String, u64)> =
        source.findings.iter().map(|(rule, severity, line)| (rule.to_string(), severity.to_string(), *line)).collect();
    assert_eq!(findings.len(), source.findings.len(), "{}: findings stored once each: {body:#}", source.id);
    assert_eq!(got, want, "{}: the simulated reviewer's findings", source.id);
}

/// Every id went to the provider in exactly `times` batches, and never in two live ones.
/// The corpus committed with the model's findings, each extraction on its first attempt,
/// submitted once and billed once; returns the simulator's stats (read once everything
/// settled) for the provider's own checks.
pub async fn assert_corpus_committed_once(api: &Api, ids: &BTreeSet<String>, stats: impl FnOnce() -> Stats) -> Stats {
    assert_all_committed_with_model_findings(api).await;
    let records = settle(api, ids).await;
    assert!(records.values().all(|r| r["attempts"] == json!(1)), "{records:#?}");
    let stats = stats();
    assert_submitted(&stats, ids, 1);
    assert_eq!(stats.lines_completed, CORPUS.len() as u64, "each extraction billed once: {stats:#?}");
    stats
}

pub fn assert_submitted(stats: &Stats, ids: &BTreeSet<String>, times: u64) {
    let submitted: BTreeSet<String> = stats.submissions_per_custom_id.keys().cloned().collect();
    assert_eq!(&submitted, ids, "the provider saw exactly these custom ids");
    for (id, n) in &stats.submissions_per_custom_id {
        assert_eq!(*n, times, "{id} was submitted in {n} batches: {stats:#?}");
    }
    assert_eq!(stats.max_live_batches_per_custom_id, 1, "a member was in two live batches: {stats:#?}");
}

/// After a restart that had to look its batch up: every source committed from the one
/// batch created before the restart, found and never created again, and the file
/// verifies. Returns the simulator's counts for the caller's checks of the lookup itself.
pub async fn assert_recovered_once(server: Server, stats: impl Fn() -> Stats) -> Stats {
    let api = server.api();
    assert_all_committed_with_model_findings(&api).await;
    let stats = stats();
    assert_eq!(stats.batches_created, 1, "the batch was created again instead of found: {stats:#?}");
    assert_submitted(&stats, &corpus_ids(), 1);
    let health = health(&api).await;
    assert_eq!(counter(&health, "batches_recovered"), 1, "{health:#}");
    assert_eq!(counter(&health, "batches_submitted"), 0, "the restarted process submitted nothing: {health:#}");
    let report = finish(server);
    assert_report_counts(&report, CORPUS.len(), &[&format!("committed: {}", CORPUS.len())]);
    stats
}

/// SIGTERM, clean exit, `verify` exit 0; returns the report.
pub fn finish(server: Server) -> String {
    stop_and_verify(server)
}

pub fn assert_report_counts(report: &str, extractions: usize, state_lines: &[&str]) {
    assert!(report.contains(&format!("extractions: {extractions}\n")), "{report}");
    for line in state_lines {
        assert!(report.lines().any(|l| l.trim() == *line), "expected {line:?} in\n{report}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_duplicate_intakes_become_one_batch_member_each() {
    const CLIENTS: usize = 20;
    let rig = Rig::start(Duration::from_millis(200), Faults::default()).await;
    let server = rig.serve(&[], None);
    let api = server.api();

    let mut tasks = tokio::task::JoinSet::new();
    for client in 0..CLIENTS {
        let api = api.clone();
        tasks.spawn(async move {
            let mut replies = Vec::new();
            // Each client walks the corpus from a different start, so identical intakes collide.
            for i in 0..CORPUS.len() {
                let source = &CORPUS[(client + i) % CORPUS.len()];
                let reply = api.intake(TENANT, source.id, source.content).await;
                replies.push((source.id, reply));
            }
            replies
        });
    }
    let mut created: BTreeMap<&str, usize> = BTreeMap::new();
    let mut ids: BTreeMap<&str, BTreeSet<String>> = BTreeMap::new();
    while let Some(joined) = tasks.join_next().await {
        for (source_id, reply) in joined.expect("client task") {
            match reply.status {
                201 => *created.entry(source_id).or_default() += 1,
                200 => assert_eq!(reply.body["created"], json!(false), "{:#}", reply.body),
                other => panic!("intake answered {other}: {:#}", reply.body),
            }
            ids.entry(source_id).or_default().insert(id_of(&reply.body));
        }
    }
    for source in CORPUS {
        assert_eq!(created.get(source.id), Some(&1), "{}: exactly one of {CLIENTS} intakes creates", source.id);
        assert_eq!(ids[source.id], BTreeSet::from([expected_id(source)]), "{}: one id for all answers", source.id);
    }

    assert_all_committed_with_model_findings(&api).await;
    let stats = rig.stats();
    assert_submitted(&stats, &corpus_ids(), 1);
    assert_eq!(stats.lines_completed, CORPUS.len() as u64, "each extraction billed once: {stats:#?}");
    let health = health(&api).await;
    assert_eq!(counter(&health, "batches_submitted"), stats.batches_created, "{health:#}");
    assert_eq!(counter(&health, "members_requeued"), 0, "{health:#}");

    let report = finish(server);
    assert_report_counts(&report, CORPUS.len(), &[&format!("committed: {}", CORPUS.len())]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resubmitting_a_source_while_its_batch_is_live_does_not_resubmit_it() {
    // A slow provider: the batch stays live long enough for three more deliveries.
    let rig = Rig::start(Duration::from_millis(1500), Faults::default()).await;
    let server = rig.serve(&[], None);
    let api = server.api();
    let source = &CORPUS[4];
    let id = api.create(TENANT, source.id, source.content).await;
    rig.wait_stats("the batch to be created", |s| s.batches_created == 1).await;

    for delivery in 0..3 {
        let reply = api.intake(TENANT, source.id, source.content).await;
        assert_eq!(reply.status, 200, "delivery {delivery}: {:#}", reply.body);
        assert_eq!(reply.body["created"], json!(false));
        assert_eq!(id_of(&reply.body), id);
        assert_eq!(reply.body["state"], json!("submitted"), "still in its live batch: {:#}", reply.body);
    }
    // The batch had not finished while the deliveries came in.
    let during = rig.stats();
    assert_eq!(during.lines_completed, 0, "the batch finished too early for this test: {during:#?}");

    let ids = BTreeSet::from([id.clone()]);
    let records = settle(&api, &ids).await;
    assert_eq!(records[&id]["state"], json!("committed"), "{:#}", records[&id]);
    assert_eq!(records[&id]["attempts"], json!(1));
    assert_findings(&api, source, &id).await;

    // Once committed, a fourth delivery finds it committed and sends nothing either.
    let late = api.intake(TENANT, source.id, source.content).await;
    assert_eq!((late.status, late.body["state"].clone()), (200, json!("committed")), "{:#}", late.body);
    tokio::time::sleep(Duration::from_millis(600)).await;
    let stats = rig.stats();
    assert_eq!(stats.batches_created, 1, "{stats:#?}");
    assert_submitted(&stats, &ids, 1);
    assert_eq!(api.list_all("").await.len(), 1);

    let report = finish(server);
    assert_report_counts(&report, 1, &["committed: 1"]);
}

/// Only an intent this process did not just create (found at start-up, or after a failed
/// submit) is looked up by batch key before submitting (PROVIDERS.md, "Reconcile"). A batch
/// formed and submitted in one go costs no `GET /v1/batches` listing: on a busy account a
/// lookup pages through every batch of the last ten minutes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_this_process_just_formed_is_submitted_without_a_lookup() {
    let rig = Rig::start(Duration::from_millis(200), Faults::default()).await;
    let server = rig.serve(&[], None);
    let api = server.api();
    intake_corpus(&api).await;

    assert_all_committed_with_model_findings(&api).await;
    let stats = rig.stats();
    assert_submitted(&stats, &corpus_ids(), 1);
    assert_eq!(stats.batches_listed, 0, "a fresh batch was looked up before its first submit: {stats:#?}");
    assert_eq!(counter(&health(&api).await, "batches_recovered"), 0);

    let report = finish(server);
    assert_report_counts(&report, CORPUS.len(), &[&format!("committed: {}", CORPUS.len())]);
}

/// `ctl status` names the store's backend and who drives each provider's batches: on redb,
/// and on a PostgreSQL store with one instance, this very process (`host:pid`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ctl_status_names_the_backend_and_the_instance_driving_each_provider() {
    let rig = Rig::start(Duration::from_millis(200), Faults::default()).await;
    let server = rig.serve(&[], None);
    let backend = if crate::support::postgres::enabled() { "postgres" } else { "redb" };

    let json = crate::util::cli(&["ctl", "status", "--json", "--admin", &server.url]);
    assert!(json.status.success(), "{}", crate::util::stderr(&json));
    let status: Value = serde_json::from_str(&crate::util::stdout(&json)).expect("status JSON");
    assert_eq!(status["store"]["backend"], json!(backend), "{status:#}");
    let instance = status["store"]["instance"].as_str().expect("the instance's name").to_string();
    assert!(instance.ends_with(&format!(":{}", server.pid())), "host:pid of the server: {status:#}");
    let provider = status["providers"][0]["name"].as_str().expect("the configured provider").to_string();
    assert_eq!(status["store"]["drivers"], json!({ provider.clone(): instance }), "{status:#}");

    let text = crate::util::cli(&["ctl", "status", "--admin", &server.url]);
    let text = crate::util::stdout(&text);
    assert!(text.starts_with(&format!("store: {backend} (this instance: {instance})\n")), "{text}");
    assert!(text.contains(&format!("provider {provider}: active; driven by this instance;")), "{text}");
    finish(server);
}
