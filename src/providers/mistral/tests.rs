//! The adapter against the simulator's Mistral dialect over real HTTP: upload, create,
//! poll, both result files, the metadata lookup through paged lists, cancel, deletes,
//! Mistral's error bodies, and the probe.

use std::time::{Duration, Instant};

use serde_json::{Value, json};
use tokio::sync::mpsc;

use super::*;
use crate::domain::batch::{BatchMember, LineResult};
use crate::domain::identity::{ExtractionId, SourceHash};
use crate::domain::lifecycle::FailureClass;
use crate::domain::schema::{BUILTIN_CODE_REVIEW, Registry};
use crate::simulator::{Dialect as SimDialect, Faults, Simulator, SimulatorConfig};

const KEY: &str = "mistral-test-key";
const MODEL: &str = "mistral-small-latest";

fn member(source: &str, content: &str) -> BatchMember {
    let hash = SourceHash::compute(content.as_bytes(), BUILTIN_CODE_REVIEW);
    BatchMember {
        id: ExtractionId::compute("t", source, &hash, BUILTIN_CODE_REVIEW),
        source_id: source.into(),
        content: content.into(),
        output_budget: None,
        previous_attempt: None,
    }
}

fn members(n: usize) -> Vec<BatchMember> {
    (0..n).map(|i| member(&format!("src-{i}.rs"), &format!("fn f{i}() {{ x.unwrap() }}"))).collect()
}

async fn simulator(faults: Faults) -> Simulator {
    let config = SimulatorConfig {
        dialect: SimDialect::Mistral,
        api_key: Some(KEY.into()),
        complete_after: Duration::from_millis(100),
        faults,
        ..SimulatorConfig::default()
    };
    Simulator::start(([127, 0, 0, 1], 0).into(), config).await.unwrap()
}

fn adapter(base_url: String, key: &str) -> MistralBatches {
    let mut config = MistralConfig::new(ApiKey::new(key.into()), MODEL);
    config.base_url = base_url;
    config.max_tokens = Some(4000);
    MistralBatches::new(config).unwrap()
}

async fn submit(provider: &MistralBatches, key: &str, members: &[BatchMember]) -> Result<String, ProviderError> {
    let schema = Registry::builtin().get(BUILTIN_CODE_REVIEW).unwrap();
    provider.submit(&BatchSpec { batch_key: key, schema: &schema, members }).await
}

async fn wait_terminal(provider: &MistralBatches, job: &str) -> JobStatus {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let status = provider.poll(job).await.unwrap();
        if status.phase.is_terminal() {
            return status;
        }
        assert!(Instant::now() < deadline, "{status:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn collect(provider: &MistralBatches, status: &JobStatus) -> (Vec<ResultLine>, StreamCounts) {
    let (tx, mut rx) = mpsc::channel(64);
    let counts = provider.stream_results(status, &tx).await.unwrap();
    drop(tx);
    let mut lines = Vec::new();
    while let Some(line) = rx.recv().await {
        lines.push(line);
    }
    (lines, counts)
}

fn intent<'a>(batch_key: &'a str, known: &'a [String]) -> IntentRef<'a> {
    IntentRef { batch_key, created_at_ms: 0, members: &[], known_jobs: known }
}

#[tokio::test]
async fn a_batch_runs_once_and_its_answers_join_on_the_custom_id() {
    let sim = simulator(Faults::default()).await;
    let provider = adapter(sim.base_url(), KEY);
    let members = members(3);
    let job = submit(&provider, "cpb-happy", &members).await.unwrap();
    let status = wait_terminal(&provider, &job).await;
    assert_eq!(status.phase, JobPhase::Completed);
    assert_eq!(status.result_files.len(), 1, "only an output file: {status:?}");
    let (lines, counts) = collect(&provider, &status).await;
    assert_eq!((counts.lines, counts.malformed), (3, 0));
    for member in &members {
        let (_, result) = lines.iter().find(|(k, _)| *k == member.id.to_hex()).expect("every member answered");
        let LineResult::Answer { output, usage } = result else { panic!("{result:?}") };
        let output: Value = serde_json::from_str(output).unwrap();
        assert_eq!(output["findings"][0]["file"], json!(member.source_id), "joined on custom_id");
        let usage = usage.as_ref().unwrap();
        assert_eq!(usage.model, MODEL);
        assert!(usage.input_tokens > 0 && usage.output_tokens > 0, "{usage:?}");
    }
    let stats = sim.stats();
    assert_eq!((stats.files_uploaded, stats.batches_created, stats.lines_completed), (1, 1, 3), "{stats:#?}");
    assert_eq!(provider.delete_files(&status).await.unwrap(), 2, "the input and the output file");
    assert_eq!(provider.delete_files(&status).await.unwrap(), 0, "already gone is done");
}

#[tokio::test]
async fn the_job_is_found_by_its_metadata_past_pages_of_other_jobs() {
    let sim = simulator(Faults { foreign_batches: 230, ..Faults::default() }).await;
    let provider = adapter(sim.base_url(), KEY);
    let job = submit(&provider, "cpb-lost", &members(2)).await.unwrap();
    let found = provider.find_job(&intent("cpb-lost", &[])).await.unwrap();
    assert_eq!(found, Lookup::Found(job.clone()));
    assert_eq!(sim.stats().batches_listed, 3, "230 foreign jobs fill two pages of 100");
    assert_eq!(provider.find_job(&intent("cpb-other", &[])).await.unwrap(), Lookup::Absent);
    let known = [job];
    assert_eq!(
        provider.find_job(&intent("cpb-lost", &known)).await.unwrap(),
        Lookup::Absent,
        "a known job is not ours"
    );
}

#[tokio::test]
async fn per_line_failures_are_refused_or_retried_and_the_rest_commit() {
    // Line 2 of 4 is rate limited; an over-long prompt is refused on its own line.
    let sim = simulator(Faults { failed_line_every: 2, max_input_tokens: 5000, ..Faults::default() }).await;
    let provider = adapter(sim.base_url(), KEY);
    let mut members = members(3);
    members.push(member("big.rs", &"let x = y.unwrap();\n".repeat(2000)));
    let job = submit(&provider, "cpb-lines", &members).await.unwrap();
    let status = wait_terminal(&provider, &job).await;
    assert_eq!(status.result_files.len(), 2, "output and error file: {status:?}");
    let (lines, _) = collect(&provider, &status).await;
    let result = |m: &BatchMember| &lines.iter().find(|(k, _)| *k == m.id.to_hex()).unwrap().1;
    let LineResult::Refused { class, reason } = result(&members[3]) else { panic!("{:?}", result(&members[3])) };
    assert_eq!(*class, FailureClass::InvalidRequest);
    assert!(reason.contains("400") && reason.contains("too large for model"), "{reason}");
    let LineResult::Retry { reason } = result(&members[1]) else { panic!("{:?}", result(&members[1])) };
    assert!(reason.contains("429") && reason.contains("rate_limited"), "{reason}");
    assert!(matches!(result(&members[0]), LineResult::Answer { .. }));
}

#[tokio::test]
async fn failed_and_timed_out_jobs_map_to_their_phases() {
    let sim = simulator(Faults { fail_batch_validation: true, ..Faults::default() }).await;
    let provider = adapter(sim.base_url(), KEY);
    let job = submit(&provider, "cpb-failed", &members(2)).await.unwrap();
    let status = wait_terminal(&provider, &job).await;
    let JobPhase::Failed { reason, cause } = &status.phase else { panic!("{status:?}") };
    assert_eq!(*cause, FailureCause::Unattributed);
    assert!(reason.contains("fail_batch_validation") && reason.contains("(x2)"), "{reason}");
    assert!(status.result_files.is_empty());

    sim.set_faults(Faults { expire_batches: true, ..Faults::default() });
    let members = members(4);
    let job = submit(&provider, "cpb-timeout", &members).await.unwrap();
    let status = wait_terminal(&provider, &job).await;
    assert_eq!(status.phase, JobPhase::Expired, "TIMEOUT_EXCEEDED");
    let (lines, _) = collect(&provider, &status).await;
    assert_eq!(lines.len(), 2, "what ran before the timeout is read");
}

#[tokio::test]
async fn a_cancel_is_requested_then_the_job_is_cancelled() {
    let config = SimulatorConfig {
        dialect: SimDialect::Mistral,
        api_key: Some(KEY.into()),
        complete_after: Duration::from_secs(30),
        ..SimulatorConfig::default()
    };
    let sim = Simulator::start(([127, 0, 0, 1], 0).into(), config).await.unwrap();
    let provider = adapter(sim.base_url(), KEY);
    let job = submit(&provider, "cpb-cancel", &members(1)).await.unwrap();
    provider.cancel(&job).await.unwrap();
    assert_eq!(wait_terminal(&provider, &job).await.phase, JobPhase::Cancelled);
    let again = provider.cancel(&job).await.unwrap_err();
    assert_eq!(again.class, ErrorClass::InvalidRequest, "{again}");
}

#[tokio::test]
async fn mistral_errors_are_classified_by_status_whatever_their_type() {
    let sim = simulator(Faults::default()).await;
    let wrong = adapter(sim.base_url(), "not-the-key");
    let e = wrong.poll("00000000-0000-4000-a000-000000000001").await.unwrap_err();
    assert_eq!((e.class, e.status), (ErrorClass::Auth, Some(401)), "{e}");
    assert!(e.message().contains("Unauthorized"), "{e}");

    let provider = adapter(sim.base_url(), KEY);
    sim.set_faults(Faults { rate_limit_next: 1, retry_after_secs: 3, ..Faults::default() });
    let e = provider.poll("x").await.unwrap_err();
    assert_eq!(e.class, ErrorClass::RateLimited, "{e}");
    assert!(e.message().contains("rate_limited"), "{e}");
    // Capacity comes typed `invalid_request_error`: only its 429 says to wait.
    sim.set_faults(Faults { overloaded_next: 1, ..Faults::default() });
    let e = provider.poll("x").await.unwrap_err();
    assert_eq!(e.class, ErrorClass::RateLimited, "{e}");
    assert!(e.message().contains("capacity"), "{e}");
    sim.set_faults(Faults::default());
    let e = provider.poll("no-such-job").await.unwrap_err();
    assert_eq!(e.class, ErrorClass::Gone, "{e}");
}

#[tokio::test]
async fn an_unknown_model_is_refused_and_its_upload_deleted() {
    let sim = simulator(Faults { missing_models: vec![MODEL.into()], ..Faults::default() }).await;
    let provider = adapter(sim.base_url(), KEY);
    let e = submit(&provider, "cpb-model", &members(1)).await.unwrap_err();
    assert_eq!((e.class, e.status), (ErrorClass::InvalidRequest, Some(400)), "{e}");
    assert!(e.message().contains("invalid_model") && e.message().contains("Invalid model"), "{e}");
    let stats = sim.stats();
    assert_eq!((stats.files_uploaded, stats.files_deleted, stats.batches_created), (1, 1, 0), "{stats:#?}");
    let schema = Registry::builtin().get(BUILTIN_CODE_REVIEW).unwrap();
    let Probe::Refused(e) = provider.probe(&schema).await else { panic!("the probe passed an unknown model") };
    assert_eq!(e.class, ErrorClass::InvalidRequest, "{e}");
    sim.set_faults(Faults::default());
    assert!(matches!(provider.probe(&schema).await, Probe::Passed(c) if c == Checked::everything()));
}

#[test]
fn a_line_sends_max_tokens_and_leaves_the_model_to_the_job() {
    let schema = Registry::builtin().get(BUILTIN_CODE_REVIEW).unwrap();
    let line = wire::input_line(&members(1)[0], &schema, Some(700));
    let body = &line["body"];
    assert_eq!(body["max_tokens"], 700);
    assert!(body.get("max_completion_tokens").is_none() && body.get("model").is_none(), "{body}");
    assert_eq!(body["response_format"]["type"], "json_schema");
    assert_eq!(body["response_format"]["json_schema"]["strict"], true);
    assert_eq!(line["custom_id"], json!(members(1)[0].id.to_hex()));
}

#[test]
fn bad_settings_are_refused_at_construction() {
    let build = |base: &str, key: &str, model: &str| {
        let mut config = MistralConfig::new(ApiKey::new(key.into()), model);
        config.base_url = base.into();
        MistralBatches::new(config)
    };
    assert!(matches!(build("https://api.mistral.ai/v1", KEY, MODEL), Err(ConfigError::BaseUrlWithVersion(_))));
    assert!(matches!(build("api.mistral.ai", KEY, MODEL), Err(ConfigError::BaseUrl(_))));
    assert!(matches!(build(DEFAULT_BASE_URL, " ", MODEL), Err(ConfigError::EmptyKey)));
    assert!(matches!(build(DEFAULT_BASE_URL, "a\nb", MODEL), Err(ConfigError::KeyNotHeaderSafe)));
    assert!(matches!(build(DEFAULT_BASE_URL, KEY, ""), Err(ConfigError::NoModel)));
    assert!(build(DEFAULT_BASE_URL, KEY, MODEL).is_ok());
}
