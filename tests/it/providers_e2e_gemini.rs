//! `[providers.gemini] kind = "gemini"` through the real binary against the simulator's
//! Gemini dialect: the corpus inline and through the File API, a SIGKILL between create
//! and persisting the batch name, a create answered by a dropped connection, a 429
//! `RESOURCE_EXHAUSTED` whose `retryDelay` is honoured, an expired batch (which, at
//! Gemini, has no results at all), torn result lines, `provider check` and `config check`.
//! Counters of the simulator span restarts, so `batches_created` proves no second job.

use std::path::Path;
use std::process::Output;
use std::time::{Duration, Instant};

use commitpoint::simulator::{Dialect, Faults, Simulator, SimulatorConfig};
use serde_json::json;

use crate::provider::assert_corpus_committed_once;
use crate::provider::{
    CORPUS, assert_all_committed_with_model_findings, assert_report_counts, assert_submitted, counter, finish, health,
    intake_corpus, settle, settle_failed,
};
use crate::providers_e2e::{
    Answered, KEY, KEY_ENV, ONE_BATCH, SimRig, a_dropped_create_is_looked_up_not_repeated,
    a_job_cut_short_requeues_what_it_did_not_answer, a_request_over_the_input_limit_fails_alone, assert_billed_by,
    killed_after_the_create_the_job_is_found_again,
};
use crate::util::{cli_with_env, run_to_end, stderr, stdout, temp_dir};

/// Sampling the simulator's counters every 5 ms leaves this much error in a measured gap.
const SAMPLING_SLACK: Duration = Duration::from_millis(100);

/// The simulator's Gemini dialect; `extra` is added to the `[providers.gemini]` table
/// (e.g. `inline_max_bytes`).
async fn gemini_rig(complete_after: Duration, faults: Faults, extra: &str) -> SimRig {
    let config = SimulatorConfig {
        dialect: Dialect::Gemini,
        api_key: Some(KEY.into()),
        complete_after,
        faults,
        ..SimulatorConfig::default()
    };
    SimRig::start(config, "gemini", |sim, _| section(sim, "gemini-e2e", extra)).await
}

fn section(sim: &Simulator, model: &str, extra: &str) -> String {
    format!(
        "[providers.gemini]\nkind = \"gemini\"\nbase_url = \"{}\"\nmodel = \"{model}\"\napi_key_env = \"{KEY_ENV}\"\n{extra}\n",
        sim.base_url()
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gemini_commits_the_corpus_once_inline_with_the_reviewers_findings() {
    let rig = gemini_rig(Duration::from_millis(200), Faults::default(), "").await;
    let server = rig.serve(&[], None);
    let api = server.api();
    let ids = intake_corpus(&api).await;

    let stats = assert_corpus_committed_once(&api, &ids, || rig.stats()).await;
    assert_eq!(stats.files_uploaded, 0, "a small batch goes inline: {stats:#?}");
    let health = health(&api).await;
    assert_eq!(health["name"], json!("gemini"), "{health:#}");
    assert_eq!(counter(&health, "batches_submitted"), stats.batches_created, "{health:#}");
    assert_eq!(counter(&health, "lines_ingested"), CORPUS.len() as u64, "{health:#}");
    assert_billed_by(&api, &ids, "gemini").await;

    let report = finish(server);
    assert_report_counts(&report, CORPUS.len(), &[&format!("committed: {}", CORPUS.len())]);
}

/// Over `inline_max_bytes` the batch is uploaded as JSONL and its results downloaded from
/// the responses file; torn lines there send their members round again, each committed once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gemini_large_batches_go_through_the_file_api_and_torn_lines_are_retried() {
    let faults = Faults { malformed_line_every: 4, ..Faults::default() };
    let rig = gemini_rig(Duration::from_millis(200), faults, "inline_max_bytes = 1000").await;
    let server = rig.serve(ONE_BATCH, None);
    let api = server.api();
    let ids = intake_corpus(&api).await;
    rig.wait_stats("the first batch", |s| s.batches_created >= 1).await;
    rig.sim.set_faults(Faults::default());

    assert_all_committed_with_model_findings(&api).await;
    let records = settle(&api, &ids).await;
    let stats = rig.stats();
    assert!(stats.files_uploaded >= 2 && stats.content_downloads >= 2, "every batch went by file: {stats:#?}");
    assert_eq!(stats.files_uploaded, stats.batches_created, "{stats:#?}");
    assert_eq!(stats.batches_created, 2, "the torn line's member went into one new batch: {stats:#?}");
    let retried: Vec<_> = records.values().filter(|r| r["attempts"] == json!(2)).collect();
    assert_eq!(retried.len(), 1, "line 4 of 6 was torn: {records:#?}");
    assert_eq!(stats.max_live_batches_per_custom_id, 1, "{stats:#?}");
    let health = health(&api).await;
    assert_eq!(counter(&health, "members_requeued"), 1, "{health:#}");
    // The Files API keeps 20 GB per project: each closed batch's input and responses go.
    rig.wait_stats("the files to be deleted", |s| s.files_deleted == 2 * s.batches_created).await;

    let report = finish(server);
    assert_report_counts(&report, CORPUS.len(), &[&format!("committed: {}", CORPUS.len())]);
}

/// Creation is not idempotent: the batch created before the kill is found again by its
/// display name in the batch list, never created a second time. Unlike Anthropic, no wait
/// for it to end is needed: the name alone identifies it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gemini_kill_after_create_before_the_batch_name_is_stored_finds_the_batch() {
    let faults = Faults { foreign_batches: 120, ..Faults::default() };
    let rig = gemini_rig(Duration::from_millis(500), faults, "").await;
    let stats = killed_after_the_create_the_job_is_found_again(&rig).await;
    assert!(stats.batches_listed >= 2, "the lookup paged past 120 foreign batches: {stats:#?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gemini_create_answered_by_a_dropped_connection_is_found_not_resubmitted() {
    let faults = Faults { drop_after_create_next: 1, ..Faults::default() };
    let rig = gemini_rig(Duration::from_millis(200), faults, "").await;
    let stats = a_dropped_create_is_looked_up_not_repeated(&rig).await;
    assert!(stats.batches_listed >= 1, "{stats:#?}");
}

/// Google sends no `Retry-After` header: the delay is `RetryInfo.retryDelay` in the body.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gemini_resource_exhausted_waits_for_the_retry_delay_then_succeeds() {
    const RETRY_SECS: u32 = 2;
    let faults = Faults { rate_limit_next: 1, retry_after_secs: RETRY_SECS, ..Faults::default() };
    let rig = gemini_rig(Duration::from_millis(200), faults, "").await;
    let server = rig.serve(&[], None);
    let api = server.api();
    let ids = intake_corpus(&api).await;

    let limited = rig.wait_stats("the 429", |s| s.rate_limited >= 1).await;
    let limited_at = Instant::now();
    assert_eq!(limited.batches_created, 0, "the 429 answered the create: {limited:#?}");
    rig.wait_stats("the batch to be created", |s| s.batches_created >= 1).await;
    let waited = limited_at.elapsed();
    let delay = Duration::from_secs(RETRY_SECS.into());
    assert!(waited + SAMPLING_SLACK >= delay, "retryDelay {delay:?} not honoured: {waited:?}");
    assert!(waited <= delay + Duration::from_millis(1500), "waited far longer than asked: {waited:?}");

    assert_all_committed_with_model_findings(&api).await;
    let stats = rig.stats();
    assert_eq!((stats.rate_limited, stats.batches_created), (1, 1), "{stats:#?}");
    assert_submitted(&stats, &ids, 1);
    let health = health(&api).await;
    assert_eq!(counter(&health, "rate_limited"), 1, "{health:#}");
    assert!(health["last_error"].as_str().is_some_and(|e| e.contains("RESOURCE_EXHAUSTED")), "{health:#}");

    let report = finish(server);
    assert_report_counts(&report, CORPUS.len(), &[&format!("committed: {}", CORPUS.len())]);
}

/// "The job will not have any results to retrieve" (batch guide): every member of an
/// expired batch goes back to the queue and commits once in the next batch.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gemini_expired_batch_is_requeued_whole_and_commits_once() {
    let faults = Faults { expire_batches: true, ..Faults::default() };
    let rig = gemini_rig(Duration::from_millis(300), faults, "").await;
    let (_, health) =
        a_job_cut_short_requeues_what_it_did_not_answer(&rig, "gemini", Faults::default(), Answered::Nothing).await;
    assert_eq!(counter(&health, "batches_closed"), 2, "{health:#}");
}

fn provider_check(dir: &Path, sim: &Simulator, model: &str, key: &str) -> Output {
    let path = dir.join("config.toml");
    let config = format!("[server]\ndata_dir = \"{}\"\n{}", dir.join("data").display(), section(sim, model, ""));
    std::fs::write(&path, config).expect("write config");
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_commitpoint"));
    cmd.args(["provider", "check", "--config", &path.display().to_string()]).env(KEY_ENV, key);
    cmd.env("COMMITPOINT_LOG", "warn");
    run_to_end(cmd)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gemini_provider_check_accepts_the_key_and_model_and_quotes_refusals() {
    let faults = Faults { missing_models: vec!["gemini-gone".to_string()], ..Faults::default() };
    let rig = gemini_rig(Duration::from_millis(200), faults, "").await;
    let dir = temp_dir();
    let out = provider_check(dir.path(), &rig.sim, "gemini-e2e", KEY);
    assert_eq!(out.status.code(), Some(0), "{}\n{}", stdout(&out), stderr(&out));
    assert!(stdout(&out).contains("gemini / code-review@1: accepted"), "{}", stdout(&out));
    let out = provider_check(dir.path(), &rig.sim, "gemini-gone", KEY);
    assert_eq!(out.status.code(), Some(1), "{}", stdout(&out));
    assert!(stdout(&out).contains("models/gemini-gone is not found for API version v1beta"), "{}", stdout(&out));
    let out = provider_check(dir.path(), &rig.sim, "gemini-e2e", "AIza-wrong");
    assert_eq!(out.status.code(), Some(1), "{}", stdout(&out));
    assert!(stdout(&out).contains("API key not valid"), "{}", stdout(&out));
    assert_eq!(rig.stats().batches_created, 0, "a check creates no batch");
}

/// `config check` reports the Gemini view of every schema and refuses one Gemini cannot take.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gemini_config_check_reports_the_view_and_refuses_an_inexpressible_schema() {
    let rig = gemini_rig(Duration::from_millis(200), Faults::default(), "").await;
    let env = [(KEY_ENV, KEY)];
    let out = cli_with_env(&["config", "check", "--config", rig.config_path()], &env);
    let text = stdout(&out);
    assert_eq!(out.status.code(), Some(0), "{text}\n{}", stderr(&out));
    assert!(text.contains("kind = \"gemini\""), "{text}");
    assert!(text.contains("# schema code-review@1 -> gemini (gemini-json-schema): adapted"), "{text}");
    assert!(text.contains("dropped `minLength`"), "{text}");

    let schemas = rig.dir.path().join("schemas");
    std::fs::create_dir_all(&schemas).expect("schema dir");
    let merged = json!({"type": "object", "properties": {"findings": {"type": "array", "items": {
        "allOf": [{"type": "object", "properties": {"code": {"type": "string"}}}]}}},
        "x-commitpoint-identity": ["/code"]});
    std::fs::write(schemas.join("merged@1.json"), merged.to_string()).expect("write schema");
    let schema_dir = schemas.display().to_string();
    let out = cli_with_env(&["config", "check", "--config", rig.config_path(), "--schema-dir", &schema_dir], &env);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(78), "{err}");
    assert!(err.contains("merged@1") && err.contains("gemini") && err.contains("allOf"), "{err}");
}

/// A request over the model's input limit comes back as Gemini's per-request error, a
/// bare `google.rpc.Status` with code 3 (`INVALID_ARGUMENT`) and no status name, in a batch
/// that succeeds (python-genai `JobError`, #2693). It fails `invalid_request` after one
/// batch, not retried until its attempts run out; the rest of the batch commits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gemini_a_request_over_the_input_limit_fails_invalid_request_after_one_batch() {
    let faults = Faults { max_input_tokens: 5_000, ..Faults::default() };
    let rig = gemini_rig(Duration::from_millis(100), faults, "").await;
    let reason = a_request_over_the_input_limit_fails_alone(&rig).await;
    assert!(reason.contains("INVALID_ARGUMENT") && reason.contains("exceeds the maximum"), "{reason}");
}

/// An answer without a `finishReason` comes from a model that has not stopped (the API
/// reference's `FinishReason`; an empty one is never `STOP`): it is billed, never
/// committed, and sent again as a cut-off answer is.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gemini_an_answer_without_a_finish_reason_is_never_committed() {
    let faults = Faults { unfinished_every: 2, ..Faults::default() };
    let rig = gemini_rig(Duration::from_millis(100), faults, "").await;
    let server = rig.serve(&[], None);
    let api = server.api();
    let ids = intake_corpus(&api).await;
    let records = settle(&api, &ids).await;
    // Every second line of each batch (however the corpus was cut into batches) was sent
    // again; before, each was committed from its first, unfinished answer.
    let again = records.values().filter(|r| r["attempts"].as_u64() > Some(1)).count();
    assert!(again > 0, "{records:#?}");
    for record in records.values() {
        let failed_unfinished = record["state"] == json!("failed")
            && record["failure_reason"].as_str().is_some_and(|r| r.contains("no finishReason"));
        assert!(record["state"] == json!("committed") || failed_unfinished, "{record:#}");
    }
    finish(server);
}

/// A model the project cannot use is 404 `NOT_FOUND` on create ("models/<m> is not found
/// for API version v1beta, or is not supported for batchGenerateContent."). No retry
/// fixes that: every member fails `invalid_request` after one create each, instead of eight
/// tries ending `transient`, and each refused create's uploaded input file is deleted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gemini_an_unknown_model_fails_invalid_request_without_retries_or_leftover_files() {
    let faults = Faults { missing_models: vec!["gemini-e2e".to_string()], ..Faults::default() };
    let rig = gemini_rig(Duration::from_millis(100), faults, "inline_max_bytes = 1000").await;
    let server = rig.serve(&[], None);
    let api = server.api();
    let ids = intake_corpus(&api).await;
    settle_failed(&api, &ids, "invalid_request", &["unknown model gemini-e2e"]).await;
    let stats = rig.wait_stats("the uploads to be deleted", |s| s.files_deleted == s.files_uploaded).await;
    assert!(stats.files_uploaded >= 1 && stats.batches_created == 0, "{stats:#?}");
    let health = health(&api).await;
    assert!(health["last_error"].as_str().is_some_and(|e| e.contains("unknown model")), "{health:#}");
    finish(server);
}

/// The over-limit request's error row comes back without its key (`keyless_error_every`,
/// after one third-party measurement): it is the batch's only unkeyed row and its request
/// the only one without a keyed row, so it is matched by elimination and fails
/// `invalid_request` after one batch, instead of going round as unanswered until its
/// attempts run out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gemini_an_error_row_without_its_key_is_matched_by_elimination() {
    let faults = Faults { max_input_tokens: 5_000, keyless_error_every: 1, ..Faults::default() };
    let rig = gemini_rig(Duration::from_millis(100), faults, "").await;
    let server = rig.serve(&[], None);
    let api = server.api();
    let big = format!("// a long file\n{}", "fn filler() { let x = 1; }\n".repeat(1_000));
    let mut ids = intake_corpus(&api).await;
    let over = api.create(crate::provider::TENANT, "huge.rs", &big).await;
    ids.insert(over.clone());
    let records = settle(&api, &ids).await;
    let failed = &records[&over];
    assert_eq!(failed["failure_class"], json!("invalid_request"), "{failed:#}");
    let stats = rig.stats();
    assert_eq!(stats.submissions_per_custom_id.get(&over), Some(&1), "sent once: {stats:#?}");
    assert!(
        records.iter().filter(|(id, _)| **id != over).all(|(_, r)| r["state"] == json!("committed")),
        "{records:#?}"
    );
    let health = health(&api).await;
    assert_eq!(counter(&health, "malformed_lines"), 0, "{health:#}");
    finish(server);
}
