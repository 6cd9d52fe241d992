//! `kind = "azure"` through the server against the simulator's Azure dialect: the resource
//! key in `api-key`, the v1 API under `/openai/v1` (or a dated `api-version` under
//! `/openai`), the Global-Batch deployment as every line's model. The corpus, a kill between
//! create and persisting the batch id, a 429, an expiry with partial results, and
//! `provider check`. Counters of the simulator span restarts.

use std::time::{Duration, Instant};

use commitpoint::simulator::{Dialect, Faults, SimulatorConfig};
use serde_json::json;

use crate::provider::{
    CORPUS, SETTLE, assert_all_committed_with_model_findings, assert_report_counts, assert_submitted, counter, finish,
    health, intake_corpus, settle, settle_failed,
};
use crate::providers_e2e::{
    Answered, KEY, KEY_ENV, ONE_BATCH, SimRig, a_job_cut_short_requeues_what_it_did_not_answer,
    killed_after_the_create_the_job_is_found_again,
};
use crate::providers_e2e_compat::{assert_discounted, assert_waited_for_the_429, provider_check, shaped_rig};
use crate::util::{stderr, stdout};

const DEPLOYMENT: &str = "gpt-4o-batch";

async fn azure_rig(faults: Faults, complete_after: Duration, extra: &str) -> SimRig {
    let config = SimulatorConfig { dialect: Dialect::Azure, faults, complete_after, ..SimulatorConfig::default() };
    let extra = extra.to_string();
    shaped_rig(config, "azure", DEPLOYMENT, move |sim| {
        format!(
            "[providers.azure]\nkind = \"azure\"\nendpoint = \"{}\"\ndeployment = \"{DEPLOYMENT}\"\napi_key_env = \"{KEY_ENV}\"\n{extra}\n",
            sim.origin()
        )
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn azure_commits_the_corpus_once_billed_at_the_batch_discount() {
    for extra in ["", "api_version = \"2024-10-21\""] {
        let rig = azure_rig(Faults::default(), Duration::from_millis(200), extra).await;
        let server = rig.serve(ONE_BATCH, None);
        let api = server.api();
        let ids = intake_corpus(&api).await;

        assert_all_committed_with_model_findings(&api).await;
        let records = settle(&api, &ids).await;
        assert!(records.values().all(|r| r["attempts"] == json!(1)), "{extra}: {records:#?}");
        let stats = rig.stats();
        assert_submitted(&stats, &ids, 1);
        assert_eq!(stats.lines_completed, CORPUS.len() as u64, "{extra}: each extraction billed once: {stats:#?}");
        assert_eq!(stats.batches_created, 1, "{extra}: {stats:#?}");
        let health = health(&api).await;
        assert_eq!(health["name"], json!("azure"), "{health:#}");
        assert_eq!(counter(&health, "lines_ingested"), CORPUS.len() as u64, "{health:#}");
        assert_discounted(&api, &ids, "azure", DEPLOYMENT).await;
        // Input, output and error files are deleted once the batch is closed.
        rig.wait_stats("the files to be deleted", |s| s.files_deleted >= 2).await;

        let report = finish(server);
        assert_report_counts(&report, CORPUS.len(), &[&format!("committed: {}", CORPUS.len())]);
    }
}

/// Azure keeps batch metadata (v1 reference): the batch created before the kill is found
/// by its batch key and never created a second time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn azure_kill_after_create_before_the_batch_id_is_stored_finds_the_batch() {
    let rig = azure_rig(Faults::default(), Duration::from_millis(200), "").await;
    killed_after_the_create_the_job_is_found_again(&rig).await;
}

/// Azure lists `expired` among its statuses although it says it does not expire jobs:
/// an expired batch's answered half commits, the rest goes into one new batch.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn azure_expiry_keeps_the_partial_results_and_requeues_the_rest_once() {
    let rig = azure_rig(Faults { expire_batches: true, ..Faults::default() }, Duration::from_millis(300), "").await;
    a_job_cut_short_requeues_what_it_did_not_answer(&rig, "azure", Faults::default(), Answered::FirstHalf).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn azure_429_and_a_dropped_create_are_survived_with_one_batch() {
    const RETRY_AFTER_SECS: u32 = 2;
    let faults = Faults { rate_limit_next: 1, retry_after_secs: RETRY_AFTER_SECS, ..Faults::default() };
    let rig = azure_rig(faults, Duration::from_millis(200), "").await;
    let server = rig.serve(ONE_BATCH, None);
    let api = server.api();
    let ids = intake_corpus(&api).await;
    assert_waited_for_the_429(&rig, Duration::from_secs(RETRY_AFTER_SECS.into())).await;
    settle(&api, &ids).await;
    assert_eq!(counter(&health(&api).await, "rate_limited"), 1);

    // The next batch's create happens, but its answer is lost with the connection.
    rig.sim.set_faults(Faults { drop_after_create_next: 1, ..Faults::default() });
    let more = api.create(crate::provider::TENANT, "src/extra.rs", "fn f() { x.unwrap(); }").await;
    let records = settle(&api, &[more.clone()].into_iter().collect()).await;
    assert_eq!(records[&more]["state"], json!("committed"), "{records:#?}");
    let stats = rig.stats();
    assert_eq!((stats.batches_created, stats.dropped_connections), (2, 1), "{stats:#?}");
    assert_eq!(counter(&health(&api).await, "batches_recovered"), 1);
    finish(server);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn provider_check_reads_with_the_key_and_sends_the_schema_to_a_check_deployment() {
    let rig = azure_rig(Faults::default(), Duration::from_millis(200), "").await;
    let out = provider_check(rig.config_path(), KEY);
    let text = stdout(&out);
    assert_eq!(out.status.code(), Some(0), "{text}\n{}", stderr(&out));
    assert!(
        text.contains(
            "azure / code-review@1: accepted (key); model and schema not checked: a batch deployment takes no \
             synchronous call"
        ),
        "{text}"
    );
    let refused = provider_check(rig.config_path(), "wrong-key");
    assert_eq!(refused.status.code(), Some(1), "{}", stdout(&refused));
    assert!(stdout(&refused).contains("azure / code-review@1: REFUSED"), "{}", stdout(&refused));

    for extra in
        ["check_deployment = \"gpt-4o-std\"", "check_deployment = \"gpt-4o-std\"\napi_version = \"2024-10-21\""]
    {
        let rig = azure_rig(Faults::default(), Duration::from_millis(200), extra).await;
        let out = provider_check(rig.config_path(), KEY);
        assert_eq!(out.status.code(), Some(0), "{extra}: {}\n{}", stdout(&out), stderr(&out));
        assert!(stdout(&out).contains("azure / code-review@1: accepted"), "{extra}: {}", stdout(&out));
        assert_eq!(rig.stats().chat_completions, 1, "{extra}: one synchronous call to the check deployment");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn azure_torn_and_duplicated_lines_commit_once() {
    let faults = Faults { malformed_line_every: 2, duplicate_line_every: 3, ..Faults::default() };
    let rig = azure_rig(faults, Duration::from_millis(200), "").await;
    crate::providers_e2e_compat::assert_bad_lines_commit_once(&rig).await;
}

/// A dated api-version before 2025-03-01 sends no expiry, so Azure's cap on batch files
/// without one applies: past it an upload is 400 `quotaExceeded` ("The quota for files
/// without expiry is reached. The maximum is 500.", Azure/azure-sdk-for-java#47401). That
/// is a spent quota, not a file too large: submissions pause (`budget`) instead of the
/// intent being halved down to members failed as invalid requests.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn azure_a_full_quota_of_files_without_expiry_pauses_instead_of_splitting() {
    let faults = Faults { azure_unexpiring_file_quota: 1, ..Faults::default() };
    let rig = azure_rig(faults, Duration::from_secs(3), "api_version = \"2024-10-21\"").await;
    let server = rig.serve(&["--batch-max-size", "3", "--batch-max-wait", "200ms"], None);
    let api = server.api();
    let ids = intake_corpus(&api).await;
    let deadline = Instant::now() + SETTLE;
    let health = loop {
        let health = health(&api).await;
        if health["last_error"].as_str().is_some_and(|e| e.contains("quotaExceeded")) {
            break health;
        }
        assert!(Instant::now() < deadline, "never refused: {health:#}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    // Long enough for a split (immediate) to have failed members.
    tokio::time::sleep(Duration::from_millis(500)).await;
    for id in &ids {
        let record = api.record(id).await;
        assert_ne!(record["state"], json!("failed"), "{record:#}\n{health:#}");
    }
    let stats = rig.stats();
    assert_eq!(stats.uploads_refused, 1, "no split retried the upload: {stats:#?}");
    finish(server);
}

/// An upload Azure refuses as an invalid payload (400 `invalidPayload`, its words quoted in
/// Azure/azure-sdk-for-net#44710) says nothing about size: the members fail
/// `invalid_request` after that one upload, quoting Azure, instead of the batch being halved
/// down to single members (each refused the same way) as a file too large would be.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn azure_an_upload_refused_as_an_invalid_payload_fails_its_members_without_splitting() {
    let faults = Faults { refuse_upload_next: 1, ..Faults::default() };
    let rig = azure_rig(faults, Duration::from_millis(200), "").await;
    let server = rig.serve(ONE_BATCH, None);
    let api = server.api();
    let ids = intake_corpus(&api).await;
    // Azure's own words are quoted.
    settle_failed(&api, &ids, "invalid_request", &["invalidPayload", "content type"]).await;
    let stats = rig.stats();
    assert_eq!(stats.uploads_refused, 1, "no split sent the file again: {stats:#?}");
    assert_eq!((stats.files_uploaded, stats.batches_created), (0, 0), "{stats:#?}");
    finish(server);
}
