//! Provider faults from the simulator's knobs: 429 with Retry-After, an expired batch with
//! partial output, malformed result lines, exhausted quota and schema-violating answers.
//! Batch-level knobs are read when a batch is created, so switching a fault off right
//! after the first batch exists confines it to that batch.

use std::collections::BTreeSet;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use commitpoint::simulator::Faults;
use serde_json::{Value, json};

use crate::provider::SIM_KEY;
use crate::provider::{
    CORPUS, ONE_BATCH, Rig, SETTLE, TENANT, assert_all_committed_with_model_findings, assert_findings,
    assert_report_counts, assert_submitted, corpus_ids, counter, expected_id, finish, health, intake_corpus, settle,
    settle_within,
};
use crate::util::id_of;

const RETRY_AFTER_SECS: u32 = 2;
/// Sampling the simulator's counters every 5 ms leaves this much error in a measured gap.
const SAMPLING_SLACK: Duration = Duration::from_millis(100);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rate_limited_submits_wait_for_retry_after_then_succeed() {
    let faults = Faults { rate_limit_next: 2, retry_after_secs: RETRY_AFTER_SECS, ..Faults::default() };
    let rig = Rig::start(Duration::from_millis(200), faults).await;
    let server = rig.serve(ONE_BATCH, None);
    let api = server.api();
    let started = Instant::now();
    intake_corpus(&api).await;

    // When each 429 was served and when the batch was finally created.
    let first = rig.wait_stats("the first 429", |s| s.rate_limited >= 1).await;
    let first_at = Instant::now();
    assert_eq!(first.batches_created, 0, "{first:#?}");
    let second = rig.wait_stats("the second 429", |s| s.rate_limited >= 2).await;
    let second_at = Instant::now();
    assert_eq!(second.batches_created, 0, "{second:#?}");
    rig.wait_stats("the batch to be created", |s| s.batches_created >= 1).await;
    let created_at = Instant::now();

    let retry_after = Duration::from_secs(RETRY_AFTER_SECS.into());
    let waits = [second_at - first_at, created_at - second_at];
    for wait in waits {
        assert!(wait + SAMPLING_SLACK >= retry_after, "Retry-After {retry_after:?} not honoured: waits {waits:?}");
        assert!(wait <= retry_after + Duration::from_millis(1500), "waited far longer than asked: {waits:?}");
    }
    assert!(created_at - started >= 2 * retry_after - SAMPLING_SLACK, "{:?}", created_at - started);

    assert_all_committed_with_model_findings(&api).await;
    let stats = rig.stats();
    assert_eq!(stats.rate_limited, 2, "{stats:#?}");
    assert_eq!(stats.batches_created, 1, "a rate limit is not a reason to submit twice: {stats:#?}");
    assert_submitted(&stats, &corpus_ids(), 1);
    let health = health(&api).await;
    assert_eq!(counter(&health, "rate_limited"), 2, "{health:#}");
    assert!(health["last_error"].as_str().is_some_and(|e| e.contains("rate_limit_exceeded")), "{health:#}");
    assert!(health["paused_until_ms"].is_null(), "a rate limit is no pause: {health:#}");
    // The class label reads as docs/OPERATIONS.md and PROVIDERS.md spell it.
    let metrics = reqwest::get(format!("{}/metrics", server.url)).await.unwrap().text().await.unwrap();
    let errors: Vec<&str> =
        metrics.lines().filter(|line| line.starts_with("commitpoint_provider_errors_total{")).collect();
    assert!(errors.iter().any(|line| line.contains(r#"class="rate_limited""#) && line.ends_with(" 2")), "{errors:#?}");

    let report = finish(server);
    assert_report_counts(&report, CORPUS.len(), &[&format!("committed: {}", CORPUS.len())]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_expired_batch_commits_its_answers_and_requeues_the_rest_once() {
    let rig = Rig::start(Duration::from_millis(300), Faults { expire_batches: true, ..Faults::default() }).await;
    let server = rig.serve(ONE_BATCH, None);
    let api = server.api();
    let ids = intake_corpus(&api).await;
    rig.wait_stats("the first batch", |s| s.batches_created >= 1).await;
    rig.sim.set_faults(Faults::default());

    let records = settle(&api, &ids).await;
    let stats = rig.stats();
    assert_eq!(stats.batches_created, 2, "the unanswered half went into one new batch: {stats:#?}");
    // The simulator answers the first half of an expiring batch (input order).
    let half = CORPUS.len() / 2;
    let twice: BTreeSet<String> =
        stats.submissions_per_custom_id.iter().filter(|(_, n)| **n == 2).map(|(id, _)| id.clone()).collect();
    let once: BTreeSet<String> =
        stats.submissions_per_custom_id.iter().filter(|(_, n)| **n == 1).map(|(id, _)| id.clone()).collect();
    assert_eq!((once.len(), twice.len()), (half, CORPUS.len() - half), "{stats:#?}");
    assert_eq!(once.union(&twice).cloned().collect::<BTreeSet<_>>(), ids);
    assert_eq!(stats.max_live_batches_per_custom_id, 1, "{stats:#?}");
    assert_eq!(stats.lines_completed, CORPUS.len() as u64, "no member was billed twice: {stats:#?}");
    for (id, record) in &records {
        let attempts = if twice.contains(id) { 2 } else { 1 };
        assert_eq!(record["attempts"], json!(attempts), "{record:#}");
    }
    assert_all_committed_with_model_findings(&api).await;
    let health = health(&api).await;
    assert_eq!(counter(&health, "members_requeued"), (CORPUS.len() - half) as u64, "{health:#}");
    assert_eq!(counter(&health, "batches_closed"), 2, "{health:#}");

    let report = finish(server);
    assert_report_counts(&report, CORPUS.len(), &[&format!("committed: {}", CORPUS.len())]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_result_lines_requeue_their_members_which_commit_later() {
    // Every second output line of the first batch is torn in half.
    let rig = Rig::start(Duration::from_millis(200), Faults { malformed_line_every: 2, ..Faults::default() }).await;
    let server = rig.serve(ONE_BATCH, None);
    let api = server.api();
    let ids = intake_corpus(&api).await;
    rig.wait_stats("the first batch", |s| s.batches_created >= 1).await;
    rig.sim.set_faults(Faults::default());

    let records = settle(&api, &ids).await;
    let torn = (CORPUS.len() / 2) as u64;
    let health = health(&api).await;
    assert_eq!(counter(&health, "malformed_lines"), torn, "{health:#}");
    assert_eq!(counter(&health, "members_requeued"), torn, "{health:#}");
    let stats = rig.stats();
    assert_eq!(stats.batches_created, 2, "{stats:#?}");
    let resubmitted = stats.submissions_per_custom_id.values().filter(|n| **n == 2).count() as u64;
    assert_eq!(resubmitted, torn, "exactly the members of torn lines went again: {stats:#?}");
    assert_eq!(stats.max_live_batches_per_custom_id, 1, "{stats:#?}");
    let requeued = records.values().filter(|r| r["attempts"] == json!(2)).count() as u64;
    assert_eq!(requeued, torn, "{records:#?}");
    // Findings are stored once per extraction, whichever batch answered it.
    assert_all_committed_with_model_findings(&api).await;

    let report = finish(server);
    assert_report_counts(&report, CORPUS.len(), &[&format!("committed: {}", CORPUS.len())]);
    let findings: usize = CORPUS.iter().map(|s| s.findings.len()).sum();
    assert!(report.contains(&format!("findings: {findings}\n")), "{report}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn insufficient_quota_pauses_submissions_and_keeps_the_work_queued() {
    let rig = Rig::start(Duration::from_millis(200), Faults { insufficient_quota_next: 1, ..Faults::default() }).await;
    let server = rig.serve(&[], None);
    let api = server.api();
    let ids = intake_corpus(&api).await;
    rig.wait_stats("the quota error", |s| s.rate_limited >= 1).await;

    let deadline = Instant::now() + SETTLE;
    let health = loop {
        let health = health(&api).await;
        if !health["paused_until_ms"].is_null() {
            break health;
        }
        assert!(Instant::now() < deadline, "no pause after insufficient_quota: {health:#}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let now_ms = SystemTime::now().duration_since(UNIX_EPOCH).expect("clock").as_millis() as u64;
    let until = counter(&health, "paused_until_ms");
    assert!(until >= now_ms + 14 * 60 * 1000, "a budget pause lasts 15 minutes: {until} vs now {now_ms}");
    assert_eq!(health["pause_submissions_only"], json!(true), "{health:#}");
    assert!(health["last_error"].as_str().is_some_and(|e| e.contains("insufficient_quota")), "{health:#}");
    assert_eq!(counter(&health, "rate_limited"), 0, "quota is not a rate limit: {health:#}");

    // New work during the pause is accepted and waits, unsent.
    let late = api.create(TENANT, "src/late.rs", "let x = y.unwrap();\n").await;
    tokio::time::sleep(Duration::from_millis(800)).await;
    for record in api.list_all("").await {
        let state = record["state"].as_str().unwrap_or_default();
        let want = if id_of(&record) == late { "pending" } else { "submitted" };
        assert_eq!(state, want, "queued, not failed, not sent: {record:#}");
        assert!(record["failure_class"].is_null(), "{record:#}");
    }
    let stats = rig.stats();
    assert_eq!((stats.batches_created, stats.files_uploaded), (0, 0), "nothing sent during the pause: {stats:#?}");
    assert_eq!(stats.rate_limited, 1, "the provider was not called again: {stats:#?}");
    assert_eq!(api.list_all("").await.len(), ids.len() + 1);

    let report = finish(server);
    assert_report_counts(&report, CORPUS.len() + 1, &[&format!("submitted: {}", CORPUS.len()), "pending: 1"]);
}

/// `serve` in one batch, keeping the provider's files so a test can read what was sent.
fn serve_keeping_files(rig: &Rig) -> crate::util::Server {
    let config = rig.dir.path().join("keep-files.toml");
    std::fs::write(&config, "[scheduler]\ndelete_provider_files = false\n").expect("write config");
    let config = config.display().to_string();
    let mut args = ONE_BATCH.to_vec();
    args.extend(["--config", config.as_str()]);
    rig.serve(&args, None)
}

/// The requests of the `n`th batch (from 1, in creation order) as the simulator received
/// them: its input file's lines, downloaded through the Files API.
async fn batch_requests(rig: &Rig, n: usize) -> Vec<Value> {
    let http = reqwest::Client::new();
    let base = rig.sim.base_url();
    let get = |url: String| http.get(url).bearer_auth(SIM_KEY).send();
    let list: Value = get(format!("{base}/batches?limit=100")).await.expect("list batches").json().await.expect("json");
    // Listed newest first, as OpenAI lists them; `created_at` is in whole seconds.
    let mut batches = list["data"].as_array().cloned().unwrap_or_default();
    batches.reverse();
    batches.sort_by_key(|b| b["created_at"].as_u64());
    let file = batches[n - 1]["input_file_id"].as_str().expect("input_file_id").to_string();
    let body = get(format!("{base}/files/{file}/content")).await.expect("download").text().await.expect("text");
    body.lines().map(|line| serde_json::from_str(line).expect("a JSON line")).collect()
}

/// An answer that fails the schema is asked again (the default is one re-ask): the second
/// batch carries the refused answer and its issues in each request's conversation, its valid
/// answers commit once, and the ledger keeps both calls.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn schema_violating_answers_are_reasked_with_their_issues_and_commit_once() {
    let rig = Rig::start(Duration::from_millis(200), Faults { invalid_output_every: 1, ..Faults::default() }).await;
    let server = serve_keeping_files(&rig);
    let api = server.api();
    let ids = intake_corpus(&api).await;
    rig.wait_stats("the first batch", |s| s.batches_created >= 1).await;
    rig.sim.set_faults(Faults::default());

    assert_all_committed_with_model_findings(&api).await;
    let stats = rig.stats();
    assert_eq!(stats.batches_created, 2, "one re-ask batch: {stats:#?}");
    assert_submitted(&stats, &corpus_ids(), 2);
    for request in batch_requests(&rig, 1).await {
        let roles: Vec<&str> =
            request["body"]["messages"].as_array().unwrap().iter().filter_map(|m| m["role"].as_str()).collect();
        assert_eq!(roles, ["system", "user"], "a first ask: {request:#}");
    }
    for request in batch_requests(&rig, 2).await {
        let messages = request["body"]["messages"].as_array().expect("messages").clone();
        let roles: Vec<&str> = messages.iter().filter_map(|m| m["role"].as_str()).collect();
        assert_eq!(roles, ["system", "user", "assistant", "user"], "{request:#}");
        let feedback = messages[3]["content"].as_str().unwrap_or_default();
        assert!(feedback.contains("- /") && feedback.contains("Answer again"), "the issues are listed: {feedback}");
    }
    for id in &ids {
        let record = api.get(&format!("/v1/extractions/{id}")).await.body;
        assert_eq!((&record["attempts"], &record["reasks"]), (&json!(2), &json!(1)), "{record:#}");
        let costs = api.get(&format!("/v1/extractions/{id}/costs")).await.body;
        let kinds: Vec<&str> =
            costs["attempts"].as_array().unwrap().iter().filter_map(|a| a["kind"].as_str()).collect();
        assert_eq!(kinds, ["failed_validation", "fresh"], "both calls are in the ledger: {costs:#}");
    }
    for source in CORPUS {
        assert_findings(&api, source, &expected_id(source)).await;
    }
    let report = finish(server);
    assert_report_counts(&report, CORPUS.len(), &[&format!("committed: {}", CORPUS.len())]);
}

/// Once the re-ask is used, the next invalid answer fails the extraction `validation`, and
/// nothing is asked again on its own; an operator's retry is a fresh allowance and commits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_invalid_answer_fails_validation_and_retry_commits_it() {
    let rig = Rig::start(Duration::from_millis(200), Faults { invalid_output_every: 1, ..Faults::default() }).await;
    let server = serve_keeping_files(&rig);
    let api = server.api();
    let ids = intake_corpus(&api).await;

    let records = settle(&api, &ids).await;
    for record in records.values() {
        assert_eq!(record["state"], json!("failed"), "{record:#}");
        assert_eq!(record["failure_class"], json!("validation"), "{record:#}");
        assert!(record["failure_reason"].as_str().is_some_and(|r| !r.is_empty()), "{record:#}");
        assert_eq!(record["reasks"], json!(1), "{record:#}");
    }
    for source in CORPUS {
        let id = expected_id(source);
        let findings = api.findings(&id).await;
        assert_eq!(findings["findings"], json!([]), "a failed answer stores no findings: {findings:#}");
    }
    // The scheduler does not retry a validation failure on its own.
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert_eq!(rig.stats().batches_created, 2);
    rig.sim.set_faults(Faults::default());

    for id in &ids {
        let reply = api.retry(id).await;
        assert_eq!(reply.status, 200, "{:#}", reply.body);
        assert_eq!(reply.body["state"], json!("pending"), "{:#}", reply.body);
        assert_eq!(reply.body["attempts"], json!(3), "{:#}", reply.body);
    }
    assert_all_committed_with_model_findings(&api).await;
    let stats = rig.stats();
    assert_eq!(stats.batches_created, 3, "{stats:#?}");
    assert_submitted(&stats, &corpus_ids(), 3);
    for request in batch_requests(&rig, 3).await {
        let roles = request["body"]["messages"].as_array().map_or(0, Vec::len);
        assert_eq!(roles, 4, "the retry asks again with the last issues: {request:#}");
    }
    for source in CORPUS {
        assert_findings(&api, source, &expected_id(source)).await;
    }

    let report = finish(server);
    assert_report_counts(&report, CORPUS.len(), &[&format!("committed: {}", CORPUS.len())]);
}

/// Rate limits never give up (PROVIDERS.md), and a submit gives up only after 8
/// *transient* failures in a row. Seven 429s followed by one 503 is one transient failure.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rate_limits_do_not_use_up_the_retries_of_transient_errors() {
    let faults = Faults { rate_limit_next: 7, retry_after_secs: 1, server_error_next: 1, ..Faults::default() };
    let rig = Rig::start(Duration::from_millis(200), faults).await;
    let server = rig.serve(ONE_BATCH, None);
    let api = server.api();
    intake_corpus(&api).await;

    assert_all_committed_with_model_findings(&api).await;
    let stats = rig.stats();
    assert_eq!((stats.rate_limited, stats.server_errors), (7, 1), "{stats:#?}");
    assert_eq!(stats.batches_created, 1, "{stats:#?}");
    assert_submitted(&stats, &corpus_ids(), 1);
    let health = health(&api).await;
    assert_eq!(counter(&health, "rate_limited"), 7, "{health:#}");

    let report = finish(server);
    assert_report_counts(&report, CORPUS.len(), &[&format!("committed: {}", CORPUS.len())]);
}

/// Quota exhaustion pauses new submissions only: "polls go on" (PROVIDERS.md). A quota
/// error answering the poll of a live job must not hold that job's results for 15 minutes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_quota_error_on_a_poll_does_not_hold_the_job_for_the_pause() {
    let rig = Rig::start(Duration::from_millis(1000), Faults::default()).await;
    let server = rig.serve(ONE_BATCH, None);
    let api = server.api();
    let ids = intake_corpus(&api).await;
    rig.wait_stats("the batch", |s| s.batches_created >= 1).await;
    // The next API request is a poll of the live job.
    rig.sim.set_faults(Faults { insufficient_quota_next: 1, ..Faults::default() });
    rig.wait_stats("the quota error", |s| s.rate_limited >= 1).await;

    // The simulator counts the 429 when it answers; the scheduler records the pause when it
    // has read the answer, a moment later (under load, after a first look at /healthz).
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let health = health(&api).await;
        if health["pause_submissions_only"] == json!(true) {
            break;
        }
        assert!(Instant::now() < deadline, "the quota error never paused submissions: {health:#}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let records = settle_within(&api, &ids, Duration::from_secs(8)).await;
    assert!(records.values().all(|r| r["state"] == json!("committed")), "{records:#?}");
    assert_all_committed_with_model_findings(&api).await;
    assert_eq!(rig.stats().batches_created, 1);

    let report = finish(server);
    assert_report_counts(&report, CORPUS.len(), &[&format!("committed: {}", CORPUS.len())]);
}

/// A model that cites a file or a line the source does not have is refused as ungrounded
/// and asked again with those issues; its second, grounded answer commits once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ungrounded_answers_are_reasked_and_the_grounded_answer_commits() {
    let rig = Rig::start(Duration::from_millis(200), Faults { ungrounded_first: 1, ..Faults::default() }).await;
    let server = serve_keeping_files(&rig);
    let api = server.api();
    let ids = intake_corpus(&api).await;

    assert_all_committed_with_model_findings(&api).await;
    let stats = rig.stats();
    assert_eq!(stats.batches_created, 2, "one re-ask batch: {stats:#?}");
    for request in batch_requests(&rig, 2).await {
        let messages = request["body"]["messages"].as_array().cloned().unwrap_or_default();
        let feedback = messages.get(3).and_then(|m| m["content"].as_str()).unwrap_or_default();
        assert!(feedback.contains("ungrounded"), "the re-ask names the ungrounded findings: {request:#}");
    }
    for id in &ids {
        let record = api.get(&format!("/v1/extractions/{id}")).await.body;
        assert_eq!((&record["state"], &record["reasks"]), (&json!("committed"), &json!(1)), "{record:#}");
    }
    for source in CORPUS {
        assert_findings(&api, source, &expected_id(source)).await;
    }
    let report = finish(server);
    assert_report_counts(&report, CORPUS.len(), &[&format!("committed: {}", CORPUS.len())]);
}
