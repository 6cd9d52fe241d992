//! `[providers.anthropic]` through the server against the simulator's Anthropic dialect:
//! the corpus, a 529 overload, a kill between create and persisting the batch id, and a
//! batch that ends with `expired` lines. Counters of the simulator span restarts.

use std::time::{Duration, Instant};

use commitpoint::simulator::Faults;
use serde_json::json;

use crate::provider::assert_corpus_committed_once;
use crate::provider::{
    CORPUS, assert_all_committed_with_model_findings, assert_report_counts, assert_submitted, counter, finish, health,
    intake_corpus,
};
use crate::providers_e2e::{
    Answered, ONE_BATCH, a_job_cut_short_requeues_what_it_did_not_answer, anthropic_rig, assert_billed_by,
    kill_after_the_create, the_job_is_found_again,
};

/// Sampling the simulator's counters every 5 ms leaves this much error in a measured gap.
const SAMPLING_SLACK: Duration = Duration::from_millis(100);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn anthropic_commits_the_corpus_once_with_the_reviewers_findings() {
    let rig = anthropic_rig(Duration::from_millis(200), Faults::default()).await;
    let server = rig.serve(&[], None);
    let api = server.api();
    let ids = intake_corpus(&api).await;

    let stats = assert_corpus_committed_once(&api, &ids, || rig.stats()).await;
    let health = health(&api).await;
    assert_eq!(health["name"], json!("anthropic"), "{health:#}");
    assert_eq!(counter(&health, "batches_submitted"), stats.batches_created, "{health:#}");
    assert_eq!(counter(&health, "lines_ingested"), CORPUS.len() as u64, "{health:#}");
    assert_eq!(counter(&health, "members_requeued"), 0, "{health:#}");
    assert_billed_by(&api, &ids, "anthropic").await;

    let report = finish(server);
    assert_report_counts(&report, CORPUS.len(), &[&format!("committed: {}", CORPUS.len())]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn anthropic_overloaded_529_waits_for_retry_after_then_succeeds() {
    const RETRY_AFTER_SECS: u32 = 2;
    let faults = Faults { overloaded_next: 1, retry_after_secs: RETRY_AFTER_SECS, ..Faults::default() };
    let rig = anthropic_rig(Duration::from_millis(200), faults).await;
    let server = rig.serve(ONE_BATCH, None);
    let api = server.api();
    let ids = intake_corpus(&api).await;

    let overloaded = rig.wait_stats("the 529", |s| s.overloaded >= 1).await;
    let overloaded_at = Instant::now();
    assert_eq!(overloaded.batches_created, 0, "the 529 answered the create: {overloaded:#?}");
    rig.wait_stats("the batch to be created", |s| s.batches_created >= 1).await;
    let waited = overloaded_at.elapsed();
    let retry_after = Duration::from_secs(RETRY_AFTER_SECS.into());
    assert!(waited + SAMPLING_SLACK >= retry_after, "retry-after {retry_after:?} not honoured: {waited:?}");
    assert!(waited <= retry_after + Duration::from_millis(1500), "waited far longer than asked: {waited:?}");

    assert_all_committed_with_model_findings(&api).await;
    let stats = rig.stats();
    assert_eq!(stats.overloaded, 1, "{stats:#?}");
    assert_eq!(stats.batches_created, 1, "an overload is no reason to submit twice: {stats:#?}");
    assert_submitted(&stats, &ids, 1);
    let health = health(&api).await;
    assert_eq!(counter(&health, "rate_limited"), 1, "a 529 is handled as a rate limit: {health:#}");
    assert!(health["last_error"].as_str().is_some_and(|e| e.contains("overloaded")), "{health:#}");
    assert!(health["paused_until_ms"].is_null(), "an overload is no pause: {health:#}");

    let report = finish(server);
    assert_report_counts(&report, CORPUS.len(), &[&format!("committed: {}", CORPUS.len())]);
}

/// Anthropic has no idempotency key: the batch created before the crash is found again by
/// listing batches and reading the ended one's results, never created a second time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn anthropic_kill_after_create_before_the_batch_id_is_stored_finds_the_batch() {
    const COMPLETE_AFTER: Duration = Duration::from_millis(200);
    assert_eq!(CORPUS.len(), 6, "ONE_BATCH sizes the batch to the corpus");
    let rig = anthropic_rig(COMPLETE_AFTER, Faults::default()).await;
    kill_after_the_create(&rig).await;
    // A batch still in progress cannot be told apart from another intent's until it ends
    // (the adapter then asks again after a minute): restart once it has ended.
    tokio::time::sleep(COMPLETE_AFTER + Duration::from_millis(100)).await;
    the_job_is_found_again(&rig).await;
}

/// The simulator ends an expiring batch with the first half of its requests (input order)
/// answered and the rest `expired`. Expired members never ran: they go back to the queue
/// and commit in the next batch, each exactly once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn anthropic_expired_lines_are_requeued_and_commit_once_in_a_later_batch() {
    let rig = anthropic_rig(Duration::from_millis(300), Faults { expire_batches: true, ..Faults::default() }).await;
    let (stats, health) =
        a_job_cut_short_requeues_what_it_did_not_answer(&rig, "anthropic", Faults::default(), Answered::FirstHalf)
            .await;
    assert_eq!(stats.lines_failed, (CORPUS.len() - CORPUS.len() / 2) as u64, "the expired lines: {stats:#?}");
    assert_eq!(counter(&health, "batches_closed"), 2, "{health:#}");
}
