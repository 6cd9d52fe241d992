//! The real Anthropic adapter (`providers::anthropic`) against the simulator's Anthropic
//! dialect over real HTTP: lifecycle, request faults and their classes, a dropped create
//! found again by listing, expiry, cancel and a damaged results file.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use serde_json::Value;
use tokio::sync::mpsc;

use crate::domain::batch::{BatchMember, LineResult};
use crate::domain::identity::{ExtractionId, SourceHash};
use crate::domain::schema::{BUILTIN_CODE_REVIEW, Registry};
use crate::providers::anthropic::{AnthropicBatches, AnthropicConfig, ApiKey};
use crate::providers::{BatchProvider, BatchSpec, ErrorClass, IntentRef, JobPhase, JobStatus, Lookup, StreamCounts};
use crate::simulator::{Dialect, Faults, Simulator, SimulatorConfig, review};

const KEY: &str = "sk-ant-sim-key";

async fn start(complete_after: Duration, faults: Faults) -> (Simulator, AnthropicBatches) {
    let config = SimulatorConfig {
        dialect: Dialect::Anthropic,
        api_key: Some(KEY.to_string()),
        complete_after,
        faults,
        seed: 9,
        ..SimulatorConfig::default()
    };
    let sim = Simulator::start(([127, 0, 0, 1], 0).into(), config).await.unwrap();
    let adapter = AnthropicBatches::new(AnthropicConfig {
        base_url: sim.base_url(),
        request_timeout: Duration::from_secs(5),
        ..AnthropicConfig::new(ApiKey::new(KEY.to_string()), "sim-reviewer")
    })
    .unwrap();
    (sim, adapter)
}

fn members(tag: &str, n: usize) -> Vec<BatchMember> {
    (0..n)
        .map(|i| {
            let source = format!("src/{tag}{i}.rs");
            let content = format!("fn f{i}() {{\n    let password = x.unwrap();\n}}\n");
            let hash = SourceHash::compute(content.as_bytes(), BUILTIN_CODE_REVIEW);
            BatchMember {
                id: ExtractionId::compute("t", &source, &hash, BUILTIN_CODE_REVIEW),
                source_id: source,
                content,
                output_budget: None,
                previous_attempt: None,
            }
        })
        .collect()
}

async fn submit(
    adapter: &AnthropicBatches,
    members: &[BatchMember],
) -> Result<String, crate::providers::ProviderError> {
    let schema = Registry::builtin().get(BUILTIN_CODE_REVIEW).unwrap();
    adapter.submit(&BatchSpec { batch_key: "cpb-sim", schema: &schema, members }).await
}

async fn poll_until_ended(adapter: &AnthropicBatches, job: &str) -> JobStatus {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let status = adapter.poll(job).await.unwrap();
        if status.phase.is_terminal() {
            return status;
        }
        assert!(Instant::now() < deadline, "batch {job} never ended");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn results(adapter: &AnthropicBatches, job: &JobStatus) -> (BTreeMap<String, Vec<LineResult>>, StreamCounts) {
    let (tx, mut rx) = mpsc::channel(4);
    let collect = async {
        let mut lines: BTreeMap<String, Vec<LineResult>> = BTreeMap::new();
        while let Some((id, result)) = rx.recv().await {
            lines.entry(id).or_default().push(result);
        }
        lines
    };
    let stream = async {
        let counts = adapter.stream_results(job, &tx).await.unwrap();
        drop(tx);
        counts
    };
    let (lines, counts) = tokio::join!(collect, stream);
    (lines, counts)
}

fn now_ms() -> u64 {
    crate::domain::clock::now_ms()
}

#[tokio::test]
async fn the_adapter_runs_a_batch_from_submit_to_tool_use_answers() {
    let (sim, adapter) = start(Duration::from_millis(300), Faults::default()).await;
    assert!(!sim.base_url().ends_with("/v1"), "the Anthropic adapter wants the bare origin");
    let members = members("a", 5);
    let job = submit(&adapter, &members).await.unwrap();
    assert!(job.starts_with("msgbatch_"), "{job}");
    let running = adapter.poll(&job).await.unwrap();
    assert_eq!(running.phase, JobPhase::Running);
    assert!(running.result_files.is_empty());

    let done = poll_until_ended(&adapter, &job).await;
    assert_eq!(done.phase, JobPhase::Completed);
    assert_eq!(done.result_files, [format!("{}/v1/messages/batches/{job}/results", sim.base_url())]);
    let (lines, counts) = results(&adapter, &done).await;
    assert_eq!(counts, StreamCounts { lines: 5, malformed: 0 });
    assert_eq!(lines.len(), 5);
    for member in &members {
        let [LineResult::Answer { output, usage }] = lines[&member.id.to_hex()].as_slice() else {
            panic!("{:?}", lines[&member.id.to_hex()]);
        };
        let output: Value = serde_json::from_str(output).unwrap();
        assert_eq!(output, review(&member.source_id, &member.content), "the tool input is the review");
        assert_eq!(output["findings"].as_array().unwrap().len(), 2, "unwrap and password on line 2");
        let usage = usage.as_ref().unwrap();
        assert_eq!(usage.model, "sim-reviewer");
        assert!(usage.input_tokens > 1 && usage.output_tokens > 1, "{usage:?}");
        assert!(usage.request_id.as_deref().is_some_and(|id| id.starts_with("msg_")));
    }
    let stats = sim.stats();
    assert_eq!((stats.batches_created, stats.lines_completed, stats.content_downloads), (1, 5, 1));
    assert_eq!(stats.max_live_batches_per_custom_id, 1);
    sim.stop().await;
}

#[tokio::test]
async fn request_faults_arrive_in_anthropic_shapes_and_classes() {
    let faults = Faults {
        unauthorized_next: 1,
        insufficient_quota_next: 1,
        rate_limit_next: 1,
        overloaded_next: 1,
        server_error_next: 1,
        retry_after_secs: 2,
        ..Faults::default()
    };
    let (sim, adapter) = start(Duration::from_millis(100), faults).await;
    let mut seen = Vec::new();
    for _ in 0..6 {
        let error = adapter.poll("msgbatch_missing").await.unwrap_err();
        seen.push((error.status, error.class, error.retry_after));
    }
    let two = Some(Duration::from_secs(2));
    assert_eq!(
        seen,
        [
            (Some(401), ErrorClass::Auth, None),
            (Some(400), ErrorClass::Budget, None),
            (Some(429), ErrorClass::RateLimited, two),
            (Some(529), ErrorClass::RateLimited, two),
            (Some(500), ErrorClass::Transient, None),
            (Some(404), ErrorClass::Gone, None),
        ]
    );
    let stats = sim.stats();
    assert_eq!((stats.rate_limited, stats.overloaded, stats.server_errors), (2, 1, 1));
    sim.stop().await;
}

#[tokio::test]
async fn an_overloaded_create_is_retried_after_the_delay_it_asked_for() {
    let faults = Faults { overloaded_next: 1, retry_after_secs: 3, ..Faults::default() };
    let (sim, adapter) = start(Duration::from_millis(100), faults).await;
    let members = members("o", 2);
    let error = submit(&adapter, &members).await.unwrap_err();
    assert_eq!((error.status, error.class), (Some(529), ErrorClass::RateLimited));
    assert_eq!(error.retry_after, Some(Duration::from_secs(3)));
    assert!(error.message().contains("overloaded_error"), "{}", error.message());
    assert_eq!(sim.stats().batches_created, 0, "an overloaded create creates nothing");
    let job = submit(&adapter, &members).await.unwrap();
    assert_eq!(poll_until_ended(&adapter, &job).await.phase, JobPhase::Completed);
    assert_eq!(sim.stats().batches_created, 1);
    sim.stop().await;
}

#[tokio::test]
async fn a_dropped_create_is_found_by_listing_once_it_ends_and_never_resubmitted() {
    let faults = Faults { drop_after_create_next: 1, ..Faults::default() };
    let (sim, adapter) = start(Duration::from_millis(1500), faults).await;
    let members = members("d", 3);
    let ids: Vec<ExtractionId> = members.iter().map(|m| m.id).collect();
    let intent = IntentRef { batch_key: "cpb-sim", created_at_ms: now_ms(), members: &ids, known_jobs: &[] };
    let error = submit(&adapter, &members).await.unwrap_err();
    assert_eq!(error.class, ErrorClass::Transient, "{error}");
    assert_eq!(sim.stats().dropped_connections, 1);

    let lookup = adapter.find_job(&intent).await.unwrap();
    assert!(matches!(lookup, Lookup::Undecided { .. }), "still in progress: {lookup:?}");
    let others = members_ids(&self::members("x", 3));
    let stranger = IntentRef { batch_key: "other", created_at_ms: now_ms(), members: &others, known_jobs: &[] };

    let deadline = Instant::now() + Duration::from_secs(10);
    let job = loop {
        match adapter.find_job(&intent).await.unwrap() {
            Lookup::Found(job) => break job,
            Lookup::Undecided { .. } => {}
            Lookup::Absent => panic!("the created batch was missed"),
        }
        assert!(Instant::now() < deadline, "never found");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(adapter.find_job(&stranger).await.unwrap(), Lookup::Absent, "same size, other members");
    let done = adapter.poll(&job).await.unwrap();
    assert_eq!(done.phase, JobPhase::Completed);
    let (lines, _) = results(&adapter, &done).await;
    assert_eq!(lines.len(), 3);
    let stats = sim.stats();
    assert_eq!(stats.batches_created, 1, "no second batch");
    assert!(stats.submissions_per_custom_id.values().all(|n| *n == 1), "{stats:?}");
    assert_eq!(stats.max_live_batches_per_custom_id, 1);
    sim.stop().await;
}

fn members_ids(members: &[BatchMember]) -> Vec<ExtractionId> {
    members.iter().map(|m| m.id).collect()
}

#[tokio::test]
async fn expired_and_canceled_requests_come_back_as_retries() {
    let (sim, adapter) = start(Duration::from_millis(200), Faults { expire_batches: true, ..Faults::default() }).await;
    let job = submit(&adapter, &members("e", 4)).await.unwrap();
    let done = poll_until_ended(&adapter, &job).await;
    assert_eq!(done.phase, JobPhase::Completed, "Anthropic ends a batch; expiry is per request");
    let (lines, _) = results(&adapter, &done).await;
    let expired = lines
        .values()
        .flatten()
        .filter(|l| matches!(l, LineResult::Retry { reason } if reason.contains("expired")))
        .count();
    let answered = lines.values().flatten().filter(|l| matches!(l, LineResult::Answer { .. })).count();
    assert_eq!((expired, answered), (2, 2));

    sim.stop().await;
    let (sim, adapter) = start(Duration::from_secs(2), Faults::default()).await;
    let job = submit(&adapter, &members("c", 4)).await.unwrap();
    adapter.cancel(&job).await.unwrap();
    assert_eq!(adapter.poll(&job).await.unwrap().phase, JobPhase::Running, "canceling");
    let done = poll_until_ended(&adapter, &job).await;
    assert_eq!(done.phase, JobPhase::Cancelled);
    let (lines, _) = results(&adapter, &done).await;
    assert_eq!(lines.len(), 4);
    assert!(lines.values().flatten().all(|l| matches!(l, LineResult::Retry { reason } if reason.contains("canceled"))));
    assert_eq!(sim.stats().lines_failed, 4);
    sim.stop().await;
}

#[tokio::test]
async fn a_damaged_results_file_is_survivable() {
    let faults = Faults { failed_line_every: 3, malformed_line_every: 4, duplicate_line_every: 2, ..Faults::default() };
    let (sim, adapter) = start(Duration::from_millis(150), faults).await;
    let members = members("f", 6);
    let job = submit(&adapter, &members).await.unwrap();
    let done = poll_until_ended(&adapter, &job).await;
    let (lines, counts) = results(&adapter, &done).await;
    assert_eq!(counts.lines, 9, "6 lines + 3 duplicates");
    assert_eq!(counts.malformed, 2, "position 4 is torn and, being even, written twice");
    let retries = lines.values().flatten().filter(|l| matches!(l, LineResult::Retry { .. })).count();
    let answers = lines.values().flatten().filter(|l| matches!(l, LineResult::Answer { .. })).count();
    // 2 errored + 4 answered, minus the torn line, plus 2 readable duplicates.
    assert_eq!(retries + answers, 7);
    sim.stop().await;
}
