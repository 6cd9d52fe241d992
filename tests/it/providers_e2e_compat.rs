//! `kind = "openai"` with another `base_url`, against the simulator speaking a Groq-like
//! platform: the Files and Batches API under `/openai/v1`, batch metadata dropped (or
//! refused), one-page lists, and Groq's 429 headers. The real binary, over real HTTP;
//! SIGKILL where a crash point is named. The shared rig for OpenAI-shaped platforms (Azure
//! too) is here.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use commitpoint::simulator::{Faults, MetadataMode, RateLimitHeaders, Simulator, SimulatorConfig, Variant};
use serde_json::json;

use crate::provider::assert_corpus_committed_once;
use crate::provider::{
    CORPUS, assert_all_committed_with_model_findings, assert_report_counts, counter, finish, health, intake_corpus,
    settle,
};
use crate::providers_e2e::{
    Answered, KEY, KEY_ENV, ONE_BATCH, Pricing, SimRig, a_dropped_create_is_looked_up_not_repeated,
    a_job_cut_short_requeues_what_it_did_not_answer, assert_charged, killed_after_the_create_the_job_is_found_again,
};
use crate::util::{Api, run_to_end, stderr, stdout};

/// Sampling the simulator's counters every 5 ms leaves this much error in a measured gap.
const SAMPLING_SLACK: Duration = Duration::from_millis(100);
/// $/Mtok list prices for the ledger check; the batch discount is the default 0.5.
pub const INPUT_PER_MTOK: u64 = 2;
pub const OUTPUT_PER_MTOK: u64 = 8;

/// A simulator speaking an OpenAI-shaped platform, and a data directory whose config routes
/// everything to the provider `name` pointed at it. `section` writes the
/// `[providers.<name>]` table for the started simulator; `model` is what the answers'
/// `usage` names, which the price table is keyed by.
pub async fn shaped_rig(
    config: SimulatorConfig,
    name: &'static str,
    model: &str,
    section: impl FnOnce(&Simulator) -> String,
) -> SimRig {
    let config = SimulatorConfig { api_key: Some(KEY.into()), ..config };
    let prices = format!(
        "[[prices]]\nprovider = \"{name}\"\nmodel = \"{model}\"\ninput_per_mtok = {INPUT_PER_MTOK}\noutput_per_mtok = {OUTPUT_PER_MTOK}\n"
    );
    SimRig::start(config, name, |sim, _| format!("{}\n{prices}", section(sim))).await
}

/// Every ledger entry of every extraction: billed by `provider` for `model`, priced by the
/// table at half the list price (the batch discount), never at list price.
pub async fn assert_discounted(api: &Api, ids: &BTreeSet<String>, provider: &str, model: &str) {
    // $/Mtok is micro-dollars a token.
    assert_charged(api, ids, provider, (INPUT_PER_MTOK, OUTPUT_PER_MTOK), Pricing::Batch).await;
    for id in ids {
        let reply = api.get(&format!("/v1/extractions/{id}/costs")).await;
        for entry in reply.body["attempts"].as_array().expect("attempts") {
            assert_eq!((&entry["model"], &entry["cost_source"]), (&json!(model), &json!("price_table")), "{entry:#}");
        }
    }
}

/// The waits measured around one 429: from the 429 to the create it delayed.
pub async fn assert_waited_for_the_429(rig: &SimRig, retry_after: Duration) {
    let limited = rig.wait_stats("the 429", |s| s.rate_limited >= 1).await;
    let limited_at = Instant::now();
    assert_eq!(limited.batches_created, 0, "the 429 answered the upload or create: {limited:#?}");
    rig.wait_stats("the batch to be created", |s| s.batches_created >= 1).await;
    let waited = limited_at.elapsed();
    assert!(waited + SAMPLING_SLACK >= retry_after, "the 429's {retry_after:?} not honoured: {waited:?}");
    assert!(waited <= retry_after + Duration::from_millis(1500), "waited far longer than asked: {waited:?}");
}

const MODEL: &str = "llama-3.1-8b-instant";

async fn groq_rig(variant: Variant, faults: Faults, complete_after: Duration) -> SimRig {
    let config = SimulatorConfig { variant, faults, complete_after, ..SimulatorConfig::default() };
    shaped_rig(config, "groq", MODEL, |sim| {
        format!(
            "[providers.groq]\nkind = \"openai\"\nbase_url = \"{}\"\nmodel = \"{MODEL}\"\napi_key_env = \"{KEY_ENV}\"\n",
            sim.base_url()
        )
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_groq_like_platform_commits_the_corpus_once_billed_at_the_batch_discount() {
    let rig = groq_rig(Variant::groq_like(), Faults::default(), Duration::from_millis(200)).await;
    assert!(rig.sim.base_url().ends_with("/openai/v1"));
    let server = rig.serve(&[], None);
    let api = server.api();
    let ids = intake_corpus(&api).await;

    let stats = assert_corpus_committed_once(&api, &ids, || rig.stats()).await;
    let health = health(&api).await;
    assert_eq!(health["name"], json!("groq"), "{health:#}");
    assert_eq!(counter(&health, "batches_submitted"), stats.batches_created, "{health:#}");
    assert_discounted(&api, &ids, "groq", MODEL).await;

    let report = finish(server);
    assert_report_counts(&report, CORPUS.len(), &[&format!("committed: {}", CORPUS.len())]);
}

/// The platform drops metadata, so the batch key cannot find the batch created before the
/// kill: its input file (named after the key) does, and nothing is created twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kill_after_create_on_a_platform_without_metadata_finds_the_batch_by_its_input_file() {
    let rig = groq_rig(Variant::groq_like(), Faults::default(), Duration::from_millis(200)).await;
    killed_after_the_create_the_job_is_found_again(&rig).await;
}

/// A create answered by a dropped connection, on a platform that refuses metadata: the
/// first create (with metadata) is refused and creates nothing, the second creates the batch
/// and loses its answer, and the lookup finds it by input file.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_metadata_and_a_dropped_create_still_make_one_batch() {
    let variant = Variant { metadata: MetadataMode::Refused, ..Variant::groq_like() };
    let faults = Faults { drop_after_create_next: 1, ..Faults::default() };
    let rig = groq_rig(variant, faults, Duration::from_millis(200)).await;
    a_dropped_create_is_looked_up_not_repeated(&rig).await;
}

/// Half the batch answered, the rest `batch_expired`: the expired members go into one new
/// batch and each commits once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_expired_batch_keeps_its_partial_results_and_requeues_the_rest_once() {
    let faults = Faults { expire_batches: true, ..Faults::default() };
    let rig = groq_rig(Variant::groq_like(), faults, Duration::from_millis(300)).await;
    let (stats, _) =
        a_job_cut_short_requeues_what_it_did_not_answer(&rig, "groq", Faults::default(), Answered::FirstHalf).await;
    assert_eq!(stats.lines_failed, (CORPUS.len() - CORPUS.len() / 2) as u64, "the expired lines: {stats:#?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn groq_retry_after_and_reset_only_429s_are_both_honoured() {
    for headers in [RateLimitHeaders::Groq, RateLimitHeaders::ResetOnly] {
        const RETRY_AFTER_SECS: u32 = 2;
        let variant = Variant { rate_limit_headers: headers, ..Variant::groq_like() };
        let faults = Faults { rate_limit_next: 1, retry_after_secs: RETRY_AFTER_SECS, ..Faults::default() };
        let rig = groq_rig(variant, faults, Duration::from_millis(200)).await;
        let server = rig.serve(&[], None);
        let api = server.api();
        let ids = intake_corpus(&api).await;
        assert_waited_for_the_429(&rig, Duration::from_secs(RETRY_AFTER_SECS.into())).await;
        settle(&api, &ids).await;
        let stats = rig.stats();
        assert_eq!((stats.rate_limited, stats.batches_created), (1, 1), "{headers:?}: {stats:#?}");
        assert_eq!(counter(&health(&api).await, "rate_limited"), 1, "{headers:?}");
        finish(server);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn provider_check_reaches_the_platforms_chat_endpoint() {
    let rig = groq_rig(Variant::groq_like(), Faults::default(), Duration::from_millis(200)).await;
    let out = provider_check(rig.config_path(), KEY);
    assert_eq!(out.status.code(), Some(0), "{}\n{}", stdout(&out), stderr(&out));
    assert!(stdout(&out).contains("groq / code-review@1: accepted"), "{}", stdout(&out));
    let refused = provider_check(rig.config_path(), "gsk-wrong");
    assert_eq!(refused.status.code(), Some(1), "{}", stdout(&refused));
    assert!(stdout(&refused).contains("groq / code-review@1: REFUSED"), "{}", stdout(&refused));
}

/// `commitpoint provider check --config CONFIG` with the key in the environment.
pub fn provider_check(config: &str, key: &str) -> std::process::Output {
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_commitpoint"));
    cmd.args(["provider", "check", "--config", config]).env(KEY_ENV, key).env("COMMITPOINT_LOG", "warn");
    run_to_end(cmd)
}

/// Torn and duplicated result lines: the torn lines' members go again once, duplicates
/// change nothing, every extraction commits once.
pub async fn assert_bad_lines_commit_once(rig: &SimRig) {
    let server = rig.serve(ONE_BATCH, None);
    let api = server.api();
    let ids = intake_corpus(&api).await;
    rig.wait_stats("the first batch", |s| s.batches_created >= 1).await;
    rig.sim.set_faults(Faults::default());

    let records = settle(&api, &ids).await;
    let health = health(&api).await;
    // A member is requeued when none of its lines (original or duplicate) was readable.
    let requeued = counter(&health, "members_requeued");
    assert!(requeued >= 1 && counter(&health, "malformed_lines") >= requeued, "{health:#}");
    let stats = rig.stats();
    assert_eq!(stats.batches_created, 2, "the unreadable members went again in one batch: {stats:#?}");
    assert_eq!(stats.max_live_batches_per_custom_id, 1, "{stats:#?}");
    assert_eq!(stats.lines_completed, CORPUS.len() as u64 + requeued, "billed: the first answers and the retries");
    assert_eq!(records.values().filter(|r| r["attempts"] == json!(2)).count() as u64, requeued, "{records:#?}");
    assert_all_committed_with_model_findings(&api).await;
    let report = finish(server);
    assert_report_counts(&report, CORPUS.len(), &[&format!("committed: {}", CORPUS.len())]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn torn_and_duplicated_lines_on_a_groq_like_platform_commit_once() {
    let faults = Faults { malformed_line_every: 2, duplicate_line_every: 3, ..Faults::default() };
    let rig = groq_rig(Variant::groq_like(), faults, Duration::from_millis(200)).await;
    assert_bad_lines_commit_once(&rig).await;
}
