//! The adapter against the simulator's Gemini dialect over real HTTP (inline and File API
//! batches, the display-name lookup through paged lists, expiry, Google's errors), and
//! against a recorder that checks the documented request shapes field by field.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::IntoResponse;
use serde_json::{Value, json};
use tokio::sync::mpsc;

use super::*;
use crate::domain::batch::{BatchMember, LineResult};
use crate::domain::identity::{ExtractionId, SourceHash};
use crate::domain::schema::{BUILTIN_CODE_REVIEW, Registry};
use crate::simulator::{Dialect as SimDialect, Faults, Simulator, SimulatorConfig};

const KEY: &str = "AIza-gemini-test-key";
const MODEL: &str = "gemini-test";

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
        dialect: SimDialect::Gemini,
        api_key: Some(KEY.into()),
        complete_after: Duration::from_millis(100),
        faults,
        ..SimulatorConfig::default()
    };
    Simulator::start(([127, 0, 0, 1], 0).into(), config).await.unwrap()
}

fn adapter(base_url: String, inline_max_bytes: u64) -> GeminiBatches {
    let mut config = GeminiConfig::new(ApiKey::new(KEY.into()), MODEL);
    config.base_url = base_url;
    config.inline_max_bytes = inline_max_bytes;
    GeminiBatches::new(config).unwrap()
}

async fn submit(provider: &GeminiBatches, key: &str, members: &[BatchMember]) -> Result<String, ProviderError> {
    let schema = Registry::builtin().get(BUILTIN_CODE_REVIEW).unwrap();
    provider.submit(&BatchSpec { batch_key: key, schema: &schema, members }).await
}

async fn wait_terminal(provider: &GeminiBatches, job: &str) -> JobStatus {
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

async fn collect(provider: &GeminiBatches, status: &JobStatus) -> (Vec<ResultLine>, StreamCounts) {
    let (tx, mut rx) = mpsc::channel(64);
    let counts = provider.stream_results(status, &tx).await.unwrap();
    drop(tx);
    let mut lines = Vec::new();
    while let Some(line) = rx.recv().await {
        lines.push(line);
    }
    (lines, counts)
}

fn assert_answers(lines: &[ResultLine], members: &[BatchMember]) {
    let mut keys: Vec<&str> = lines.iter().map(|(k, _)| k.as_str()).collect();
    keys.sort_unstable();
    let mut wanted: Vec<String> = members.iter().map(|m| m.id.to_hex()).collect();
    wanted.sort_unstable();
    assert_eq!(keys, wanted.iter().map(String::as_str).collect::<Vec<_>>());
    for (key, result) in lines {
        let LineResult::Answer { output, usage } = result else { panic!("{key}: {result:?}") };
        let member = members.iter().find(|m| m.id.to_hex() == *key).unwrap();
        let output: Value = serde_json::from_str(output).unwrap();
        assert_eq!(output["findings"][0]["file"], json!(member.source_id), "joined on the key");
        let usage = usage.as_ref().unwrap();
        assert_eq!(usage.model, MODEL);
        assert!(usage.input_tokens > 0 && usage.output_tokens > 0, "{usage:?}");
    }
}

#[tokio::test]
async fn a_small_batch_goes_inline_and_its_answers_join_on_the_key() {
    let sim = simulator(Faults::default()).await;
    let provider = adapter(sim.base_url(), INLINE_MAX_BYTES);
    let members = members(3);
    let job = submit(&provider, "cpb-inline", &members).await.unwrap();
    assert!(job.starts_with("batches/"), "{job}");
    let status = wait_terminal(&provider, &job).await;
    assert_eq!(status.phase, JobPhase::Completed);
    assert_eq!(status.result_files, [format!("inline:{job}")]);
    let (lines, counts) = collect(&provider, &status).await;
    assert_eq!((counts.lines, counts.malformed), (3, 0));
    assert_answers(&lines, &members);
    assert_eq!((sim.stats().files_uploaded, sim.stats().batches_created), (0, 1));
}

#[tokio::test]
async fn a_large_batch_is_uploaded_and_a_torn_line_is_counted_not_fatal() {
    let sim = simulator(Faults { malformed_line_every: 2, ..Faults::default() }).await;
    let provider = adapter(sim.base_url(), 100);
    let members = members(4);
    let job = submit(&provider, "cpb-file", &members).await.unwrap();
    let stats = sim.stats();
    assert_eq!(stats.files_uploaded, 1, "{stats:#?}");
    assert!(stats.last_upload_bytes > 100, "{stats:#?}");
    let status = wait_terminal(&provider, &job).await;
    assert_eq!(status.result_files.len(), 1);
    assert!(status.result_files[0].starts_with("file:files/"), "{:?}", status.result_files);
    let (lines, counts) = collect(&provider, &status).await;
    assert_eq!((counts.lines, counts.malformed), (4, 2), "lines 2 and 4 are torn");
    assert_answers(&lines, &[members[0].clone(), members[2].clone()]);
    assert_eq!(sim.stats().content_downloads, 1);
    assert_eq!(provider.delete_files(&status).await.unwrap(), 2, "the input and the responses file");
    assert_eq!(sim.stats().files_deleted, 2);
    assert_eq!(provider.delete_files(&status).await.unwrap(), 0, "already gone is done");
}

#[tokio::test]
async fn find_job_pages_through_other_clients_batches_to_the_display_name() {
    let sim = simulator(Faults { foreign_batches: 150, ..Faults::default() }).await;
    let provider = adapter(sim.base_url(), INLINE_MAX_BYTES);
    let members = members(2);
    let job = submit(&provider, "cpb-lost", &members).await.unwrap();
    let ids: Vec<ExtractionId> = members.iter().map(|m| m.id).collect();
    let intent = |key| IntentRef { batch_key: key, created_at_ms: 0, members: &ids, known_jobs: &[] };
    assert_eq!(provider.find_job(&intent("cpb-lost")).await.unwrap(), Lookup::Found(job.clone()));
    assert!(sim.stats().batches_listed >= 2, "the batch is on the second page");
    assert_eq!(provider.find_job(&intent("cpb-never-created")).await.unwrap(), Lookup::Absent);
    let known = [job.clone()];
    let excluded = IntentRef { batch_key: "cpb-lost", created_at_ms: 0, members: &ids, known_jobs: &known };
    assert_eq!(provider.find_job(&excluded).await.unwrap(), Lookup::Absent);
}

/// A list longer than the adapter reads cannot rule a batch out: undecided, never absent.
#[tokio::test]
async fn a_list_past_the_page_limit_is_undecided_not_absent() {
    let foreign = u32::try_from(MAX_LIST_PAGES * 100 + 1).unwrap();
    let sim = simulator(Faults { foreign_batches: foreign, ..Faults::default() }).await;
    let provider = adapter(sim.base_url(), INLINE_MAX_BYTES);
    let intent = IntentRef { batch_key: "cpb-buried", created_at_ms: 0, members: &[], known_jobs: &[] };
    let Lookup::Undecided { recheck_after, reason } = provider.find_job(&intent).await.unwrap() else { panic!() };
    assert_eq!(recheck_after, RECHECK_AFTER);
    assert!(reason.contains("commitpoint-cpb-buried"), "{reason}");
    assert_eq!(sim.stats().batches_listed, MAX_LIST_PAGES as u64);
}

#[tokio::test]
async fn expiry_leaves_no_results_and_a_failed_batch_says_why() {
    let sim = simulator(Faults { expire_batches: true, ..Faults::default() }).await;
    let provider = adapter(sim.base_url(), INLINE_MAX_BYTES);
    let job = submit(&provider, "cpb-exp", &members(2)).await.unwrap();
    let status = wait_terminal(&provider, &job).await;
    assert_eq!(status.phase, JobPhase::Expired);
    assert!(status.result_files.is_empty(), "an expired batch has no results: {status:?}");
    sim.set_faults(Faults { fail_batch_validation: true, ..Faults::default() });
    let job = submit(&provider, "cpb-fail", &members(2)).await.unwrap();
    let JobPhase::Failed { reason, cause } = wait_terminal(&provider, &job).await.phase else { panic!() };
    assert!(reason.contains("validation"), "{reason}");
    assert_eq!(cause, FailureCause::Unattributed);
}

#[tokio::test]
async fn googles_errors_sort_into_classes_with_their_retry_delay() {
    let sim = simulator(Faults { rate_limit_next: 1, retry_after_secs: 7, ..Faults::default() }).await;
    let provider = adapter(sim.base_url(), INLINE_MAX_BYTES);
    let limited = submit(&provider, "cpb-e", &members(1)).await.unwrap_err();
    assert_eq!((limited.class, limited.status), (ErrorClass::RateLimited, Some(429)));
    assert_eq!(limited.retry_after, Some(Duration::from_secs(7)), "read from RetryInfo in the body");
    assert!(limited.message().contains("RESOURCE_EXHAUSTED"), "{}", limited.message());
    for (faults, class) in [
        (Faults { insufficient_quota_next: 1, retry_after_secs: 0, ..Faults::default() }, ErrorClass::Budget),
        (Faults { unauthorized_next: 1, ..Faults::default() }, ErrorClass::Auth),
        (Faults { overloaded_next: 1, ..Faults::default() }, ErrorClass::Transient),
        (Faults { server_error_next: 1, ..Faults::default() }, ErrorClass::Transient),
    ] {
        sim.set_faults(faults);
        assert_eq!(submit(&provider, "cpb-e", &members(1)).await.unwrap_err().class, class);
    }
    // A per-day quota whose RetryInfo says seconds: the service says when to come back, so
    // that wait is honoured instead of a 15-minute budget pause.
    sim.set_faults(Faults { insufficient_quota_next: 1, retry_after_secs: 3, ..Faults::default() });
    let daily = submit(&provider, "cpb-e", &members(1)).await.unwrap_err();
    assert_eq!((daily.class, daily.retry_after), (ErrorClass::RateLimited, Some(Duration::from_secs(3))));
    assert_eq!(provider.poll("batches/nosuch").await.unwrap_err().class, ErrorClass::Gone);
    assert_eq!(sim.stats().batches_created, 0, "no error created a batch");
    let mut config = GeminiConfig::new(ApiKey::new("AIza-wrong".into()), MODEL);
    config.base_url = sim.base_url();
    let wrong = GeminiBatches::new(config).unwrap();
    let refused = submit(&wrong, "cpb-e", &members(1)).await.unwrap_err();
    assert_eq!((refused.class, refused.status), (ErrorClass::Auth, Some(400)), "API_KEY_INVALID is a 400");
}

#[tokio::test]
async fn probe_asks_generate_content_and_quotes_a_refusal() {
    let sim = simulator(Faults { missing_models: vec!["gemini-gone".into()], ..Faults::default() }).await;
    let schema = Registry::builtin().get(BUILTIN_CODE_REVIEW).unwrap();
    assert!(
        matches!(adapter(sim.base_url(), INLINE_MAX_BYTES).probe(&schema).await, Probe::Passed(c) if c == Checked::everything())
    );
    let mut config = GeminiConfig::new(ApiKey::new(KEY.into()), "gemini-gone");
    config.base_url = sim.base_url();
    let Probe::Refused(error) = GeminiBatches::new(config).unwrap().probe(&schema).await else { panic!() };
    assert_eq!((error.class, error.status), (ErrorClass::InvalidRequest, Some(404)));
    assert!(error.message().contains("models/gemini-gone is not found"), "{}", error.message());
    assert!(error.message().contains("unknown model gemini-gone"), "{}", error.message());
}

/// A create naming a model the project cannot use is 404 `NOT_FOUND` at Gemini: nothing a
/// retry fixes, so it is an invalid request, and the input file uploaded for it (which no
/// batch refers to) is deleted rather than left for the Files API's 48 hours.
#[tokio::test]
async fn an_unknown_model_on_create_is_invalid_and_its_upload_is_deleted() {
    let sim = simulator(Faults { missing_models: vec!["gemini-gone".into()], ..Faults::default() }).await;
    let mut config = GeminiConfig::new(ApiKey::new(KEY.into()), "gemini-gone");
    config.base_url = sim.base_url();
    config.inline_max_bytes = 100;
    let provider = GeminiBatches::new(config).unwrap();
    let refused = submit(&provider, "cpb-gone", &members(2)).await.unwrap_err();
    assert_eq!((refused.class, refused.status), (ErrorClass::InvalidRequest, Some(404)), "{refused}");
    assert!(refused.message().contains("unknown model gemini-gone"), "{}", refused.message());
    let stats = sim.stats();
    assert_eq!((stats.files_uploaded, stats.files_deleted, stats.batches_created), (1, 1, 0), "{stats:#?}");
    // A file that went away before the create is no fault of the request: retried.
    let provider = adapter(sim.base_url(), 100);
    sim.set_faults(Faults::default());
    let body = wire::create_body("commitpoint-x", json!({"fileName": "files/nosuch"}));
    let url = provider.model_url("batchGenerateContent").unwrap();
    let missing = provider.create(url, &body).await.unwrap_err();
    assert_eq!((missing.class, missing.status), (ErrorClass::Transient, Some(404)), "{missing}");
    // Naming neither (a wrong base URL, say): left as it came.
    let elsewhere = provider.create(provider.api_url(&["nosuch"]).unwrap(), &body).await.unwrap_err();
    assert_eq!((elsewhere.class, elsewhere.status), (ErrorClass::Gone, Some(404)), "{elsewhere}");
}

/// What a recorder saw: (path with query, headers, body).
type Seen = Arc<Mutex<Vec<(String, HeaderMap, Bytes)>>>;

async fn record(
    State(seen): State<Seen>,
    uri: axum::http::Uri,
    headers: HeaderMap,
    body: Bytes,
) -> axum::response::Response {
    let path = uri.path_and_query().map(ToString::to_string).unwrap_or_default();
    seen.lock().unwrap().push((path.clone(), headers, body));
    if path.starts_with("/upload/") && !path.contains("upload_id") {
        return ([("x-goog-upload-url", "/upload/v1beta/files?upload_id=u1"), ("x-goog-upload-status", "active")], "")
            .into_response();
    }
    if path.starts_with("/upload/") {
        return ([("x-goog-upload-status", "final")], axum::Json(json!({"file": {"name": "files/in1"}})))
            .into_response();
    }
    axum::Json(json!({"name": "batches/rec1", "metadata": {"state": "BATCH_STATE_PENDING"}})).into_response()
}

async fn recorder() -> (String, Seen) {
    let seen: Seen = Arc::default();
    let app = Router::new().fallback(record).with_state(Arc::clone(&seen));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await });
    (base, seen)
}

#[tokio::test]
async fn request_shapes_follow_the_documented_contract_field_by_field() {
    let (base, seen) = recorder().await;
    let mut budgeted = members(2);
    budgeted[1].output_budget = Some(2048);
    assert_eq!(submit(&adapter(base.clone(), INLINE_MAX_BYTES), "cpb-shape", &budgeted).await.unwrap(), "batches/rec1");
    let (path, headers, body) = seen.lock().unwrap().remove(0);
    assert_eq!(path, format!("/v1beta/models/{MODEL}:batchGenerateContent"));
    assert_eq!(headers["x-goog-api-key"], KEY);
    assert!(headers.get("authorization").is_none(), "the key travels in x-goog-api-key only");
    let body: Value = serde_json::from_slice(&body).unwrap();
    let batch = &body["batch"];
    assert_eq!(batch.as_object().unwrap().len(), 2, "{batch:#}");
    assert_eq!(batch["displayName"], "commitpoint-cpb-shape");
    let entries = batch["inputConfig"]["requests"]["requests"].as_array().unwrap();
    assert_eq!(entries.len(), 2);
    let schema = Registry::builtin().get(BUILTIN_CODE_REVIEW).unwrap();
    for (entry, member) in entries.iter().zip(&budgeted) {
        assert_eq!(entry["metadata"], json!({"key": member.id.to_hex()}));
        let request = &entry["request"];
        let keys: Vec<&String> = request.as_object().unwrap().keys().collect();
        assert_eq!(keys, ["contents", "generationConfig", "systemInstruction"]);
        assert_eq!(request["systemInstruction"]["parts"][0]["text"], schema.instructions());
        assert_eq!(request["contents"][0]["role"], "user");
        let text = format!("source_id: {}\n\n{}", member.source_id, member.content);
        assert_eq!(request["contents"][0]["parts"], json!([{"text": text}]));
        let config = &request["generationConfig"];
        assert_eq!(config["responseMimeType"], "application/json");
        assert_eq!(config["responseJsonSchema"], *schema.provider_schema(Dialect::GeminiJson));
        assert_eq!(config.get("maxOutputTokens").and_then(Value::as_u64), member.output_budget.map(u64::from));
        assert!(config.get("responseSchema").is_none(), "one schema field only");
    }

    assert_eq!(submit(&adapter(base, 10), "cpb-shape", &budgeted).await.unwrap(), "batches/rec1");
    let seen = std::mem::take(&mut *seen.lock().unwrap());
    let [(start, start_headers, start_body), (upload, upload_headers, bytes), (create, _, create_body)] = &seen[..]
    else {
        panic!("{:?}", seen.iter().map(|s| &s.0).collect::<Vec<_>>())
    };
    assert_eq!(start, "/upload/v1beta/files");
    for (name, value) in [
        ("x-goog-upload-protocol", "resumable"),
        ("x-goog-upload-command", "start"),
        ("x-goog-upload-header-content-type", "application/jsonl"),
        ("x-goog-api-key", KEY),
    ] {
        assert_eq!(start_headers[name], value, "{name}");
    }
    assert_eq!(start_headers["x-goog-upload-header-content-length"], bytes.len().to_string());
    let start_body: Value = serde_json::from_slice(start_body).unwrap();
    assert_eq!(start_body, json!({"file": {"displayName": "commitpoint-cpb-shape"}}));
    assert_eq!(upload, "/upload/v1beta/files?upload_id=u1");
    assert_eq!(
        (&upload_headers["x-goog-upload-command"], &upload_headers["x-goog-upload-offset"]),
        (&"upload, finalize".parse().unwrap(), &"0".parse().unwrap())
    );
    let lines: Vec<Value> =
        bytes.split(|b| *b == b'\n').filter(|l| !l.is_empty()).map(|l| serde_json::from_slice(l).unwrap()).collect();
    assert_eq!(lines.len(), 2);
    assert_eq!(lines[0]["key"], json!(budgeted[0].id.to_hex()));
    assert_eq!(lines[0]["request"], entries[0]["request"], "the same request as inline");
    assert_eq!(create, &format!("/v1beta/models/{MODEL}:batchGenerateContent"));
    let create_body: Value = serde_json::from_slice(create_body).unwrap();
    assert_eq!(create_body["batch"]["inputConfig"], json!({"fileName": "files/in1"}));
}

/// A server that answers every request with `answer`.
async fn fixed(answer: Value) -> String {
    let app = Router::new().fallback(move || {
        let answer = answer.clone();
        async move { axum::Json(answer) }
    });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await });
    base
}

/// The guide says an expired batch has no results; should one carry some (here in the
/// REST guide's `response` field, with the SDK's state spelling), they are still read.
#[tokio::test]
async fn partial_results_of_an_expired_batch_are_read_wherever_they_sit() {
    let answer = json!({"candidates": [{"content": {"parts": [{"text": "{\"findings\":[]}"}]}, "finishReason": "STOP"}],
        "usageMetadata": {"promptTokenCount": 5, "candidatesTokenCount": 3}, "modelVersion": MODEL});
    let base = fixed(json!({"name": "batches/old", "done": true,
    "metadata": {"state": "JOB_STATE_EXPIRED", "displayName": "commitpoint-x"},
    "response": {"inlinedResponses": {"inlinedResponses": [
        {"response": answer, "metadata": {"key": "k-ran"}},
        {"error": {"code": 500, "message": "x", "status": "INTERNAL"}, "metadata": {"key": "k-failed"}},
        {"response": {}},
    ]}}}))
    .await;
    let provider = adapter(base, INLINE_MAX_BYTES);
    let status = provider.poll("batches/old").await.unwrap();
    assert_eq!(status.phase, JobPhase::Expired);
    assert_eq!(status.result_files, ["inline:batches/old"]);
    let (lines, counts) = collect(&provider, &status).await;
    assert_eq!((counts.lines, counts.malformed), (3, 1), "an entry without a key cannot be joined");
    assert!(matches!(&lines[0], (key, LineResult::Answer { .. }) if key == "k-ran"), "{lines:?}");
    assert!(matches!(&lines[1], (key, LineResult::Retry { .. }) if key == "k-failed"), "{lines:?}");
}

/// An error row without its key (`keyless_error_every`) is matched by elimination when it
/// is the only unkeyed row and exactly one submitted key has no row: each request yields
/// one row, so it can be no one else's. Where that cannot be told (a process that did not
/// submit the batch, two unkeyed rows), it stays unmatched and counted malformed.
#[tokio::test]
async fn an_error_row_without_its_key_is_matched_by_elimination_or_left_unmatched() {
    for inline_max_bytes in [INLINE_MAX_BYTES, 100] {
        let faults = Faults { failed_line_every: 3, keyless_error_every: 1, ..Faults::default() };
        let sim = simulator(faults).await;
        let provider = adapter(sim.base_url(), inline_max_bytes);
        let members = members(3);
        let job = submit(&provider, "cpb-keyless", &members).await.unwrap();
        let status = wait_terminal(&provider, &job).await;
        let (lines, counts) = collect(&provider, &status).await;
        assert_eq!((counts.lines, counts.malformed), (3, 0), "inline_max_bytes {inline_max_bytes}: {lines:?}");
        let third = members[2].id.to_hex();
        let (_, result) = lines.iter().find(|(key, _)| *key == third).expect("the third member's row");
        let LineResult::Retry { reason } = result else { panic!("{result:?}") };
        assert!(reason.contains("RESOURCE_EXHAUSTED"), "{reason}");

        // Another process (after a restart) did not submit it: nothing to eliminate against.
        let restarted = adapter(sim.base_url(), inline_max_bytes);
        let (lines, counts) = collect(&restarted, &status).await;
        assert_eq!((lines.len(), counts.malformed), (2, 1), "{lines:?}");
    }
    let faults = Faults { failed_line_every: 1, keyless_error_every: 2, ..Faults::default() };
    let sim = simulator(faults).await;
    let provider = adapter(sim.base_url(), 100);
    let job = submit(&provider, "cpb-two", &members(4)).await.unwrap();
    let status = wait_terminal(&provider, &job).await;
    let (lines, counts) = collect(&provider, &status).await;
    assert_eq!((lines.len(), counts.malformed), (2, 2), "two unkeyed rows, two keys without one: {lines:?}");
}
