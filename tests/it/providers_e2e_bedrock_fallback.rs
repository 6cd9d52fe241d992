//! `[providers.bedrock] min_batch_fallback`: work that stays under Bedrock's minimum job
//! size past `min_batch_wait` is handed to another provider (the same Claude model through
//! the simulator's Anthropic Message Batches, or its synchronous chat completions) instead
//! of failing. Through the real
//! binary, with Bedrock's simulator over moto's S3 beside it: the work commits once through
//! the fallback, charged to it at its prices, nothing reaches Bedrock; a SIGKILL after the
//! hand-over still submits once; a fallback that cannot take the work is refused at start.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use commitpoint::simulator::{Dialect, Faults, Simulator, SimulatorConfig};
use serde_json::{Value, json};

use crate::provider::{CORPUS, SETTLE, assert_report_counts, counter, finish, intake_corpus, settle};
use crate::providers_e2e::{KEY, KEY_ENV, ONE_BATCH, Pricing, assert_billed_by, assert_charged, expect_crash};
use crate::providers_e2e_bedrock::{BedrockRig, IN_BUCKET, MODEL, aws_env};
use crate::util::{Api, Server, cli_with_env, run_to_end, serve_command, stderr, stdout};

const FALLBACK_MODEL: &str = "claude-e2e";
/// Micro-dollars a token at each provider (`[[prices]]` per million tokens): different, so
/// a charge shows which provider it was priced as.
const FALLBACK_PRICES: (u64, u64) = (1_000, 5_000);
const BEDROCK_PRICES: (u64, u64) = (800, 4_000);

struct FallbackRig {
    bedrock: BedrockRig,
    claude: Simulator,
}

/// How the fallback `claude` reaches the model: Anthropic's Message Batches, or an
/// OpenAI-compatible chat server called synchronously (`kind = "chat"`).
#[derive(Clone, Copy, PartialEq)]
enum Path {
    Batches,
    Chat,
}

impl FallbackRig {
    async fn start(path: Path) -> FallbackRig {
        let (dialect, kind) = match path {
            Path::Batches => (Dialect::Anthropic, "anthropic"),
            Path::Chat => (SimulatorConfig::default().dialect, "chat"),
        };
        let config = SimulatorConfig {
            dialect,
            api_key: Some(KEY.into()),
            complete_after: Duration::from_millis(300),
            ..SimulatorConfig::default()
        };
        let claude = Simulator::start("127.0.0.1:0".parse().expect("loopback address"), config)
            .await
            .expect("start the Anthropic simulator");
        // The bedrock section's tail, then the fallback's table and both providers' prices.
        let extra = format!(
            "min_records = 100\nmin_batch_wait = \"5s\"\nmin_batch_fallback = \"claude\"\n\n\
             [providers.claude]\nkind = \"{kind}\"\nbase_url = \"{}\"\nmodel = \"{FALLBACK_MODEL}\"\n\
             max_tokens = 1024\napi_key_env = \"{KEY_ENV}\"\n\n\
             [[prices]]\nprovider = \"claude\"\nmodel = \"{FALLBACK_MODEL}\"\ninput_per_mtok = {}\noutput_per_mtok = {}\n\
             [[prices]]\nprovider = \"bedrock\"\nmodel = \"{MODEL}\"\ninput_per_mtok = {}\noutput_per_mtok = {}\n",
            claude.base_url(),
            FALLBACK_PRICES.0,
            FALLBACK_PRICES.1,
            BEDROCK_PRICES.0,
            BEDROCK_PRICES.1,
        );
        let bedrock = BedrockRig::start(Duration::from_millis(300), Faults::default(), &extra).await;
        FallbackRig { bedrock, claude }
    }

    fn serve(&self, failpoint: Option<&str>) -> Server {
        self.bedrock.serve(ONE_BATCH, failpoint)
    }

    /// Nothing of this work reached Bedrock: no job, no record file in S3.
    async fn assert_nothing_at_bedrock(&self) {
        let stats = self.bedrock.sim.stats();
        assert_eq!(stats.batches_created, 0, "no Bedrock job: {stats:#?}");
        assert!(stats.submissions_per_custom_id.is_empty(), "{stats:#?}");
        assert!(self.bedrock.moto.keys(IN_BUCKET, "commitpoint/").await.is_empty(), "nothing uploaded to S3");
    }

    /// One Message Batch at the fallback holding each extraction once.
    fn assert_one_fallback_job(&self, ids: &BTreeSet<String>) {
        let stats = self.claude.stats();
        assert_eq!(stats.batches_created, 1, "{stats:#?}");
        let sent: BTreeSet<String> = stats.submissions_per_custom_id.keys().cloned().collect();
        assert_eq!(&sent, ids, "{stats:#?}");
        assert!(stats.submissions_per_custom_id.values().all(|n| *n == 1), "each sent once: {stats:#?}");
    }
}

/// A provider's row of `/healthz`, by name.
async fn health_of(api: &Api, name: &str) -> Value {
    let reply = api.get("/healthz").await;
    assert_eq!(reply.status, 200, "{:#}", reply.body);
    let providers = reply.body["providers"].as_array().cloned().unwrap_or_default();
    providers.into_iter().find(|p| p["name"] == json!(name)).unwrap_or_else(|| panic!("no {name}: {:#}", reply.body))
}

/// Six extractions against Bedrock's minimum of 100: the health says where they will go
/// and when; after `min_batch_wait` they are sent as one Message Batch to the fallback,
/// committed once, charged to it at its own (batch) prices, and Bedrock never sees them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bedrock_work_under_the_minimum_commits_once_through_the_fallback() {
    let rig = FallbackRig::start(Path::Batches).await;
    let server = rig.serve(None);
    let api = server.api();
    let ids = intake_corpus(&api).await;
    let deadline = Instant::now() + SETTLE;
    loop {
        let bedrock = health_of(&api, "bedrock").await;
        let note = bedrock["waiting_for_minimum"].as_str().unwrap_or_default();
        if note.contains("6 extractions") {
            assert!(note.contains("sent to claude at") && !note.contains("failed at"), "{bedrock:#}");
            break;
        }
        assert!(Instant::now() < deadline, "never said where the work goes: {bedrock:#}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // The admin API and `ctl status` say the same while the work waits.
    let listed = api.get("/v1/admin/providers").await;
    assert!(listed.body.to_string().contains("sent to claude at"), "{:#}", listed.body);
    let data_dir = rig.bedrock.dir.path().to_str().expect("utf-8");
    let status = cli_with_env(&["ctl", "status"], &[("COMMITPOINT_DATA_DIR", data_dir)]);
    let text = stdout(&status);
    assert!(
        text.lines().any(|l| l.starts_with("provider bedrock: waiting:") && l.contains("sent to claude at")),
        "{text}\n{}",
        stderr(&status)
    );
    assert_eq!(rig.claude.stats().batches_created, 0, "nothing handed over before min_batch_wait");

    let records = settle(&api, &ids).await;
    for record in records.values() {
        assert_eq!(record["state"], json!("committed"), "{record:#}");
        assert_eq!(record["attempts"], json!(1), "{record:#}");
    }
    rig.assert_one_fallback_job(&ids);
    rig.assert_nothing_at_bedrock().await;
    assert_charged(&api, &ids, "claude", FALLBACK_PRICES, Pricing::Batch).await;
    let bedrock = health_of(&api, "bedrock").await;
    assert_eq!(counter(&bedrock, "batches_handed_over"), 1, "{bedrock:#}");
    assert_eq!(counter(&bedrock, "batches_submitted"), 0, "{bedrock:#}");
    assert!(bedrock["waiting_for_minimum"].is_null(), "the note goes with the work: {bedrock:#}");
    let claude = health_of(&api, "claude").await;
    assert_eq!(counter(&claude, "batches_submitted"), 1, "{claude:#}");

    let report = finish(server);
    assert_report_counts(&report, CORPUS.len(), &[&format!("committed: {}", CORPUS.len())]);
}

/// Killed once the hand-over is committed, before the fallback sent anything: the restart
/// finds the intent bound to the fallback, looks for its job (none), and submits it once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_after_the_hand_over_still_submits_to_the_fallback_once() {
    let rig = FallbackRig::start(Path::Batches).await;
    let point = "after-hand-over-before-fallback-submit";
    let mut server = rig.serve(Some(point));
    let ids = intake_corpus(&server.api()).await;
    expect_crash(&mut server, point);
    assert_eq!(rig.claude.stats().batches_created, 0, "{:#?}", rig.claude.stats());

    let server = rig.serve(None);
    let api = server.api();
    let records = settle(&api, &ids).await;
    assert!(records.values().all(|r| r["state"] == json!("committed")), "{records:#?}");
    rig.assert_one_fallback_job(&ids);
    assert!(rig.claude.stats().batches_listed >= 1, "looked up before submitting: {:#?}", rig.claude.stats());
    rig.assert_nothing_at_bedrock().await;
    assert_billed_by(&api, &ids, "claude").await;
    let report = finish(server);
    assert_report_counts(&report, CORPUS.len(), &[&format!("committed: {}", CORPUS.len())]);
}

/// `config check` shows the fallback; one that is not a configured provider is refused at
/// start, naming the rule.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fallback_that_is_not_configured_is_refused_at_start() {
    let rig = FallbackRig::start(Path::Batches).await;
    let mut env = aws_env().to_vec();
    env.push((KEY_ENV, KEY));
    let out = cli_with_env(&["config", "check", "--config", rig.bedrock.config_path()], &env);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(stdout(&out).contains("min_batch_fallback = \"claude\""), "{}", stdout(&out));
    let text = std::fs::read_to_string(rig.bedrock.config_path()).expect("read config");
    std::fs::write(
        rig.bedrock.config_path(),
        text.replace("min_batch_fallback = \"claude\"", "min_batch_fallback = \"claud\""),
    )
    .expect("write config");
    let out = cli_with_env(&["config", "check", "--config", rig.bedrock.config_path()], &env);
    assert_eq!(out.status.code(), Some(78), "{}\n{}", stdout(&out), stderr(&out));
    let said = stderr(&out);
    assert!(
        said.contains("providers.bedrock")
            && said.contains("min_batch_fallback \"claud\" is not a configured provider"),
        "{said}"
    );
    let mut serve = serve_command(rig.bedrock.dir.path(), &["--config", rig.bedrock.config_path()]);
    serve.envs(env.iter().copied());
    let out = run_to_end(serve);
    assert_eq!(out.status.code(), Some(78), "serve refuses to start: {}", stderr(&out));
    assert!(stderr(&out).contains("min_batch_fallback \"claud\""), "{}", stderr(&out));
}

/// The same through a synchronous chat fallback: one completion per extraction, charged to
/// the fallback at its list price (no batch discount), nothing at Bedrock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bedrock_work_under_the_minimum_commits_once_through_a_chat_fallback() {
    let rig = FallbackRig::start(Path::Chat).await;
    let server = rig.serve(None);
    let api = server.api();
    let ids = intake_corpus(&api).await;
    let records = settle(&api, &ids).await;
    for record in records.values() {
        assert_eq!((record["state"].clone(), record["attempts"].clone()), (json!("committed"), json!(1)), "{record:#}");
    }
    let stats = rig.claude.stats();
    assert_eq!((stats.chat_completions, stats.batches_created), (CORPUS.len() as u64, 0), "{stats:#?}");
    rig.assert_nothing_at_bedrock().await;
    assert_charged(&api, &ids, "claude", FALLBACK_PRICES, Pricing::Synchronous).await;
    assert_eq!(counter(&health_of(&api, "bedrock").await, "batches_handed_over"), 1);
    let report = finish(server);
    assert_report_counts(&report, CORPUS.len(), &[&format!("committed: {}", CORPUS.len())]);
}
