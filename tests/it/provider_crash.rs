//! DESIGN §7 crash points with the built-in provider: the process SIGKILLs itself at a
//! named point (`COMMITPOINT_FAILPOINTS`), is restarted on the same data directory without
//! it, and every extraction still ends committed exactly once, against a simulator whose
//! counters span both processes.

use std::collections::BTreeSet;
use std::os::unix::process::ExitStatusExt;
use std::time::{Duration, Instant};

use commitpoint::simulator::{Faults, Stats};
use serde_json::json;

use crate::provider::{
    CORPUS, ONE_BATCH, Rig, SETTLE, TENANT, assert_all_committed_with_model_findings, assert_report_counts,
    assert_submitted, corpus_ids, counter, expected_id, finish, health, intake_corpus, settle,
};
use crate::util::{Api, Server, assert_verifies, id_of};

/// Waits for the server to kill itself at `point`; asserts it died of SIGKILL there.
fn expect_crash(server: &mut Server, point: &str) {
    let (status, stderr) = server.wait_exit(SETTLE).unwrap_or_else(|| panic!("the server never reached {point}"));
    assert_eq!(status.signal(), Some(9), "killed by SIGKILL at {point}: {status:?}\n{stderr}");
    assert!(stderr.contains(&format!("failpoint {point} reached")), "{stderr}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_after_submit_before_job_id_recovers_the_batch_by_its_key() {
    assert_eq!(CORPUS.len(), 6, "ONE_BATCH sizes the batch to the corpus");
    let rig = Rig::start(Duration::from_millis(200), Faults::default()).await;
    let mut server = rig.serve(ONE_BATCH, Some("after-submit-before-job-id"));
    intake_corpus(&server.api()).await;
    expect_crash(&mut server, "after-submit-before-job-id");

    // The provider has the batch; the store has only the intent (no job id).
    let stats = rig.stats();
    assert_eq!(stats.batches_created, 1, "{stats:#?}");
    let report = assert_verifies(&rig.db());
    assert_report_counts(&report, CORPUS.len(), &[&format!("submitted: {}", CORPUS.len())]);

    let server = rig.serve(ONE_BATCH, None);
    let api = server.api();
    assert_all_committed_with_model_findings(&api).await;
    let stats = rig.stats();
    assert_eq!(stats.batches_created, 1, "the batch was resubmitted instead of found: {stats:#?}");
    assert!(stats.batches_listed >= 1, "the restart looked the batch key up: {stats:#?}");
    assert_submitted(&stats, &corpus_ids(), 1);
    assert_eq!(stats.lines_completed, CORPUS.len() as u64, "{stats:#?}");
    // Answers commit as they are ingested, before the batch is closed.
    let health = health_once_closed(&api).await;
    assert!(counter(&health, "batches_recovered") >= 1, "{health:#}");
    assert_eq!(counter(&health, "batches_submitted"), 0, "the restarted process submitted nothing: {health:#}");
    assert_eq!(counter(&health, "batches_closed"), 1, "{health:#}");

    let report = finish(server);
    assert_report_counts(&report, CORPUS.len(), &[&format!("committed: {}", CORPUS.len())]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_after_staging_before_commit_commits_each_result_once_after_restart() {
    let rig = Rig::start(Duration::from_millis(200), Faults::default()).await;
    let mut server = rig.serve(ONE_BATCH, Some("after-stage-before-commit"));
    intake_corpus(&server.api()).await;
    expect_crash(&mut server, "after-stage-before-commit");

    // Ingestion judged each answer and committed it in the transaction that took it; the
    // kill came before the batch was closed. The store is consistent.
    let findings: usize = CORPUS.iter().map(|s| s.findings.len()).sum();
    let report = assert_verifies(&rig.db());
    assert_report_counts(&report, CORPUS.len(), &[&format!("committed: {}", CORPUS.len())]);
    assert!(report.contains(&format!("findings: {findings}\n")), "{report}");
    let before = rig.stats();
    assert_eq!((before.batches_created, before.lines_completed), (1, CORPUS.len() as u64), "{before:#?}");

    let server = rig.serve(ONE_BATCH, None);
    let api = server.api();
    assert_all_committed_with_model_findings(&api).await;
    let records = settle(&api, &corpus_ids()).await;
    assert!(records.values().all(|r| r["attempts"] == json!(1)), "nothing was requeued: {records:#?}");

    // The restarted process reads the result files again (to close the batch); the
    // replayed lines change nothing and nothing more is bought from the provider. The
    // commits may land before the batch is closed, so wait for the close.
    let health = health_once_closed(&api).await;
    assert_eq!(counter(&health, "batches_closed"), 1, "{health:#}");
    assert_eq!(counter(&health, "members_requeued"), 0, "{health:#}");
    let stats = rig.stats();
    assert_eq!(stats.batches_created, 1, "{stats:#?}");
    assert_eq!(stats.lines_completed, CORPUS.len() as u64, "{stats:#?}");
    assert!(stats.content_downloads > before.content_downloads, "the files were read again: {stats:#?}");
    assert_submitted(&stats, &corpus_ids(), 1);

    let report = finish(server);
    assert_report_counts(&report, CORPUS.len(), &[&format!("committed: {}", CORPUS.len())]);
    assert!(report.contains(&format!("findings: {findings}\n")), "the replayed lines stored nothing twice: {report}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_after_intake_commit_before_ack_then_redelivery_finds_the_extraction() {
    let rig = Rig::start(Duration::from_millis(200), Faults::default()).await;
    let mut server = rig.serve(&[], Some("after-commit-before-ack"));
    let source = &CORPUS[3];
    let sent = server.api().try_intake(TENANT, source.id, source.content).await;
    assert!(sent.is_err(), "the client must see a broken connection, got {sent:?}");
    expect_crash(&mut server, "after-commit-before-ack");
    let report = assert_verifies(&rig.db());
    assert_report_counts(&report, 1, &["pending: 1"]);

    let server = rig.serve(&[], None);
    let api = server.api();
    let again = api.intake(TENANT, source.id, source.content).await;
    assert_eq!(again.status, 200, "the committed intake is found, not created again: {:#}", again.body);
    assert_eq!(again.body["created"], json!(false));
    let id = id_of(&again.body);
    assert_eq!(id, expected_id(source));
    assert_eq!(api.list_all("").await.len(), 1);

    let ids = BTreeSet::from([id.clone()]);
    let records = settle(&api, &ids).await;
    assert_eq!(records[&id]["state"], json!("committed"), "{:#}", records[&id]);
    crate::provider::assert_findings(&api, source, &id).await;
    assert_submitted(&rig.stats(), &ids, 1);

    let report = finish(server);
    assert_report_counts(&report, 1, &["committed: 1"]);
}

/// The provider created the batch but the connection died before its answer: the submit
/// failed as far as commitpoint knows. The job is found by its batch key, not created again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_create_whose_answer_was_lost_is_found_by_its_batch_key() {
    let rig = Rig::start(Duration::from_millis(200), Faults { drop_after_create_next: 1, ..Faults::default() }).await;
    let server = rig.serve(ONE_BATCH, None);
    let api = server.api();
    intake_corpus(&api).await;

    assert_all_committed_with_model_findings(&api).await;
    let stats = rig.stats();
    assert_eq!(stats.dropped_connections, 1, "{stats:#?}");
    assert_eq!(stats.batches_created, 1, "the lost create was repeated: {stats:#?}");
    assert_submitted(&stats, &corpus_ids(), 1);
    let health = health(&api).await;
    assert_eq!(counter(&health, "batches_recovered"), 1, "{health:#}");

    let report = finish(server);
    assert_report_counts(&report, CORPUS.len(), &[&format!("committed: {}", CORPUS.len())]);
}

/// A Retry-After wait is persisted with the batch: a process killed during the wait and
/// restarted at once still leaves the provider alone until the wait is over.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_after_wait_survives_kill_and_restart() {
    const RETRY_AFTER_SECS: u32 = 3;
    let faults = Faults { rate_limit_next: 1, retry_after_secs: RETRY_AFTER_SECS, ..Faults::default() };
    let rig = Rig::start(Duration::from_millis(200), faults).await;
    let mut server = rig.serve(&[], None);
    intake_corpus(&server.api()).await;
    let limited = rig.wait_stats("the 429", |s| s.rate_limited >= 1).await;
    let limited_at = Instant::now();
    // Time to persist the wait (one write), well inside the wait itself.
    tokio::time::sleep(Duration::from_millis(300)).await;
    server.kill9();
    let calls = |s: &Stats| s.files_uploaded + s.batches_listed + s.batches_created + s.polls + s.rate_limited;
    let before = calls(&limited);
    assert_eq!(calls(&rig.stats()), before, "no call after the 429 before the kill");

    let server = rig.serve(&[], None);
    rig.wait_stats("a provider call after the restart", |s| calls(s) > before).await;
    let waited = limited_at.elapsed();
    let retry_after = Duration::from_secs(RETRY_AFTER_SECS.into());
    assert!(waited + Duration::from_millis(100) >= retry_after, "called again after {waited:?} < {retry_after:?}");

    let api = server.api();
    assert_all_committed_with_model_findings(&api).await;
    let stats = rig.stats();
    assert_eq!(stats.batches_created, 1, "{stats:#?}");
    assert_submitted(&stats, &corpus_ids(), 1);

    let report = finish(server);
    assert_report_counts(&report, CORPUS.len(), &[&format!("committed: {}", CORPUS.len())]);
}

/// Torture finding 1: members a finished batch asked to retry are requeued while the batch
/// is still open; a crash before the close, and a restart that re-forms them into a new
/// batch before the old one is closed, must leave a file that verifies (the old batch only
/// lists members it released) and end with every source committed once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retried_members_reformed_before_their_old_batch_closes_still_verify() {
    let rig = Rig::start(Duration::from_millis(300), Faults { expire_batches: true, ..Faults::default() }).await;
    let mut server = rig.serve(ONE_BATCH, Some("after-stage-before-commit"));
    intake_corpus(&server.api()).await;
    expect_crash(&mut server, "after-stage-before-commit");
    assert_verifies(&rig.db());

    // The restart's first poll of the old batch fails, so the requeued members form a new
    // batch while the old one is still open.
    rig.sim.set_faults(Faults { server_error_next: 1, ..Faults::default() });
    let server = rig.serve(&["--batch-max-size", "6", "--batch-max-wait", "100ms"], None);
    tokio::time::sleep(Duration::from_millis(250)).await;
    finish(server);

    let server = rig.serve(&[], None);
    assert_all_committed_with_model_findings(&server.api()).await;
    let stats = rig.stats();
    assert_eq!(stats.max_live_batches_per_custom_id, 1, "{stats:#?}");
    finish(server);
}

/// `/healthz` once the provider reports a closed batch (or after 20 s, for the assertion
/// to show): ingestion commits answers before the batch closes.
async fn health_once_closed(api: &Api) -> serde_json::Value {
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        let health = health(api).await;
        if counter(&health, "batches_closed") >= 1 || std::time::Instant::now() > deadline {
            return health;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
