//! Batch-level provider behaviour against the SIMULATED OpenAI Batch API: a batch failed
//! for want of room (the enqueued-token limit), 404s on a live job, `x-should-retry:
//! false` on a server error, and a lookup that runs out of pages. Each test fails without
//! the behaviour it names.

use std::collections::BTreeSet;
use std::time::Duration;

use commitpoint::simulator::Faults;
use serde_json::json;

use crate::provider::{
    CORPUS, ONE_BATCH, Rig, TENANT, assert_all_committed_with_model_findings, assert_submitted, corpus_ids, counter,
    finish, health, settle,
};
use crate::util::Api;

/// Writes a config file with these `[scheduler]` lines into the rig's directory.
fn scheduler_config(rig: &Rig, lines: &str) -> String {
    let path = rig.dir.path().join("batchlevel.toml");
    std::fs::write(&path, format!("[scheduler]\n{lines}\n")).expect("write the config file");
    path.display().to_string()
}

async fn intake(api: &Api, sources: &[crate::provider::Source]) -> BTreeSet<String> {
    let mut ids = BTreeSet::new();
    for source in sources {
        ids.insert(api.create(TENANT, source.id, source.content).await);
    }
    ids
}

async fn assert_attempts(api: &Api, ids: &BTreeSet<String>, attempts: u64) {
    for (id, record) in settle(api, ids).await {
        assert_eq!(record["state"], json!("committed"), "{record:#}");
        assert_eq!(record["attempts"], json!(attempts), "{id}: {record:#}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_enqueued_token_limit_returns_the_members_and_holds_submissions_until_a_job_ends() {
    let rig = Rig::start(Duration::from_secs(2), Faults::default()).await;
    let server = rig.serve(&["--batch-max-size", "3"], None);
    let api = server.api();
    let (first, second) = CORPUS.split_at(3);
    intake(&api, first).await;
    let stats = rig.wait_stats("the first batch", |s| s.batches_created >= 1).await;
    // Room for one batch like the first, not for two at once.
    let limit = stats.last_batch_tokens * 3 / 2;
    rig.sim.set_faults(Faults { enqueued_token_limit: limit, ..Faults::default() });
    intake(&api, second).await;
    rig.wait_stats("the second batch to fail on the limit", |s| s.token_limit_failures >= 1).await;

    // The returned members wait for the first job to end, then go as the same attempt.
    assert_attempts(&api, &corpus_ids(), 1).await;
    assert_all_committed_with_model_findings(&api).await;
    let stats = rig.stats();
    assert_eq!(stats.token_limit_failures, 1, "the hold kept the members from failing again at once: {stats:#?}");
    assert_eq!(stats.batches_created, 3, "{stats:#?}");
    assert_eq!(stats.max_live_batches_per_custom_id, 1, "{stats:#?}");
    let health = health(&api).await;
    assert_eq!(counter(&health, "batches_returned"), 1, "{health:#}");
    assert!(health["held_until_ms"].is_null(), "the hold ended with the first job: {health:#}");
    let report = finish(server);
    assert!(report.contains(&format!("committed: {}", CORPUS.len())), "{report}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_validation_naming_a_line_refuses_that_member_alone() {
    let rig = Rig::start(Duration::from_millis(300), Faults { fail_batch_validation: true, ..Faults::default() }).await;
    // One source per batch would blame every member; three share the failed batch.
    let server = rig.serve(&["--batch-max-size", "3"], None);
    let api = server.api();
    let ids = intake(&api, &CORPUS[..3]).await;
    rig.wait_stats("the batch", |s| s.batches_created >= 1).await;
    rig.sim.set_faults(Faults::default());

    let records = settle(&api, &ids).await;
    // The simulator's validation failure names line 1: the first member in submit order.
    let failed: Vec<_> = records.values().filter(|r| r["state"] == json!("failed")).collect();
    assert_eq!(failed.len(), 1, "only the named line's member fails: {records:#?}");
    assert_eq!(failed[0]["failure_class"], json!("invalid_request"), "{:#}", failed[0]);
    for record in records.values().filter(|r| r["state"] == json!("committed")) {
        assert_eq!(record["attempts"], json!(1), "the others went back as the same attempt: {record:#}");
    }
    let stats = rig.stats();
    assert_eq!(stats.batches_created, 2, "{stats:#?}");
    finish(server);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_few_404s_on_a_live_job_do_not_resubmit_it() {
    let rig = Rig::start(Duration::from_secs(1), Faults { poll_not_found_next: 4, ..Faults::default() }).await;
    let server = rig.serve(ONE_BATCH, None);
    let api = server.api();
    let ids = intake(&api, CORPUS).await;

    assert_attempts(&api, &ids, 1).await;
    assert_all_committed_with_model_findings(&api).await;
    let stats = rig.stats();
    assert_eq!(stats.polls_not_found, 4, "{stats:#?}");
    assert_eq!(stats.batches_created, 1, "a 404 on a live job is no reason to pay for it twice: {stats:#?}");
    assert_submitted(&stats, &ids, 1);
    assert_eq!(counter(&health(&api).await, "polls_not_found"), 4);
    finish(server);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn not_found_answers_that_outlast_the_window_declare_the_job_gone_once() {
    // Every poll of the first job answers 404 for well over the 1 s window.
    let rig = Rig::start(Duration::from_secs(1), Faults { poll_not_found_next: 30, ..Faults::default() }).await;
    let config = scheduler_config(&rig, "job_gone_after = \"1s\"");
    let server = rig.serve(&["--config", &config], None);
    let api = server.api();
    let ids = intake(&api, CORPUS).await;
    rig.wait_stats("the job to be declared gone", |s| s.batches_created >= 2).await;
    rig.sim.set_faults(Faults::default());

    assert_attempts(&api, &ids, 2).await;
    let stats = rig.stats();
    assert_eq!(stats.batches_created, 2, "{stats:#?}");
    assert!(stats.polls_not_found >= 5, "the window is not one poll: {stats:#?}");
    finish(server);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_404_window_survives_a_restart() {
    let rig = Rig::start(Duration::from_secs(1), Faults { poll_not_found_next: 1000, ..Faults::default() }).await;
    let config = scheduler_config(&rig, "job_gone_after = \"3s\"");
    let server = rig.serve(&["--config", &config], None);
    let api = server.api();
    let ids = intake(&api, CORPUS).await;
    rig.wait_stats("404s", |s| s.polls_not_found >= 3).await;
    let (status, _) = server.terminate();
    assert!(status.success(), "{status:?}");
    // Down for longer than the window: a restart that reset it would wait 3 s more. Two
    // more 404s are all the old job gets (the new job's polls must not draw on the same
    // fault under a slow host): a window that restarted would see the job again on the
    // third poll and never declare it gone.
    tokio::time::sleep(Duration::from_millis(3200)).await;
    rig.sim.set_faults(Faults { poll_not_found_next: 2, ..Faults::default() });
    let polls_before = rig.stats().polls_not_found;
    let server = rig.serve(&["--config", &config], None);
    let api2 = server.api();
    rig.wait_stats("the job to be declared gone", |s| s.batches_created >= 2).await;
    let after = rig.stats().polls_not_found - polls_before;
    assert!(after <= 2, "the window opened before the restart still counts: {after} more 404s");
    rig.sim.set_faults(Faults::default());
    assert_attempts(&api2, &ids, 2).await;
    drop(api);
    finish(server);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_error_marked_should_retry_false_is_retried_not_failed() {
    let faults = Faults { server_error_next: 2, should_retry_false: true, ..Faults::default() };
    let rig = Rig::start(Duration::from_millis(300), faults).await;
    let server = rig.serve(ONE_BATCH, None);
    let api = server.api();
    let ids = intake(&api, CORPUS).await;

    assert_attempts(&api, &ids, 1).await;
    let stats = rig.stats();
    assert_eq!(stats.server_errors, 2, "{stats:#?}");
    assert_eq!(stats.batches_created, 1, "{stats:#?}");
    finish(server);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lookup_that_runs_out_of_pages_never_resubmits() {
    // The create happens but its answer is lost; the batch list then shows more batches
    // of another client than the lookup may page through.
    let faults = Faults { drop_after_create_next: 1, foreign_batches: 2_500, ..Faults::default() };
    let rig = Rig::start(Duration::from_millis(300), faults).await;
    let server = rig.serve(ONE_BATCH, None);
    let api = server.api();
    let ids = intake(&api, CORPUS).await;
    rig.wait_stats("the lost create", |s| s.dropped_connections >= 1).await;
    rig.wait_stats("two lookups", |s| s.batches_listed >= 40).await;
    let stats = rig.stats();
    assert_eq!(stats.batches_created, 1, "an undecided lookup resubmitted: {stats:#?}");
    for id in &ids {
        assert_eq!(api.record(id).await["state"], json!("submitted"), "{id}");
    }

    // Once the list is short enough to rule on, the lost job is found, not recreated.
    rig.sim.set_faults(Faults::default());
    assert_attempts(&api, &ids, 1).await;
    let stats = rig.stats();
    assert_eq!(stats.batches_created, 1, "{stats:#?}");
    assert_eq!(counter(&health(&api).await, "batches_recovered"), 1);
    finish(server);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_over_the_input_file_limit_is_split_not_failed() {
    let rig = Rig::start(Duration::from_millis(300), Faults::default()).await;
    let server = rig.serve(&["--batch-max-size", "6"], None);
    let api = server.api();
    let (first, rest) = CORPUS.split_at(1);
    let mut ids = intake(&api, first).await;
    let stats = rig.wait_stats("a one-request batch", |s| s.batches_created >= 1).await;
    // Room for about two requests per input file; the other five come as one batch.
    let limit = stats.last_upload_bytes * 5 / 2;
    rig.sim.set_faults(Faults { max_input_file_bytes: limit, ..Faults::default() });
    ids.extend(intake(&api, rest).await);

    assert_attempts(&api, &ids, 1).await;
    assert_all_committed_with_model_findings(&api).await;
    let stats = rig.stats();
    assert!(stats.uploads_refused >= 2, "the five-request file and a three-request half: {stats:#?}");
    assert!(stats.batches_created >= 4, "{stats:#?}");
    assert_eq!(stats.max_live_batches_per_custom_id, 1, "{stats:#?}");
    finish(server);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn provider_files_are_deleted_after_ingestion_unless_configured_off() {
    let rig = Rig::start(Duration::from_millis(300), Faults::default()).await;
    let server = rig.serve(ONE_BATCH, None);
    let api = server.api();
    let ids = intake(&api, CORPUS).await;
    assert_attempts(&api, &ids, 1).await;
    // Input, output and error file of the one batch.
    let stats = rig.wait_stats("the files to be deleted", |s| s.files_deleted >= 3).await;
    assert_eq!((stats.files_uploaded, stats.files_deleted), (1, 3), "{stats:#?}");
    let deleted = async {
        loop {
            if counter(&health(&api).await, "files_deleted") == 3 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    };
    tokio::time::timeout(Duration::from_secs(10), deleted).await.expect("health counts the deletions");
    finish(server);

    let rig = Rig::start(Duration::from_millis(300), Faults::default()).await;
    let config = scheduler_config(&rig, "delete_provider_files = false");
    let server = rig.serve(&["--config", &config], None);
    let api = server.api();
    let ids = intake(&api, CORPUS).await;
    assert_attempts(&api, &ids, 1).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(rig.stats().files_deleted, 0, "deletion is configurable");
    finish(server);
}
