//! The adapter against a fake Message Batches server speaking PROVIDERS.md §2 over real
//! HTTP: it demands the auth and version headers, validates custom ids the way the API
//! does, paginates newest first, serves results only once a batch has ended (in small
//! chunks, so lines cross chunk boundaries), and injects failures on request.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde_json::{Value, json};
use tokio::sync::mpsc;

use super::*;
use crate::domain::batch::{BatchMember, LineResult};
use crate::domain::identity::{ExtractionId, SourceHash};
use crate::domain::lifecycle::FailureClass;
use crate::domain::schema::{BUILTIN_CODE_REVIEW, Registry};

const KEY: &str = "sk-ant-test-123";
/// The intent time of the find_job tests; fake batches are placed around it.
const INTENT_AT: &str = "2026-01-01T00:10:00Z";

#[derive(Debug, Clone)]
struct FakeBatch {
    id: String,
    created_at: String,
    status: &'static str,
    total: u64,
    cancel_initiated: bool,
    lines: Vec<String>,
    results_gone: bool,
}

/// An answer the server gives instead of handling the next request.
type Injected = (u16, Vec<(&'static str, &'static str)>, Value);

#[derive(Debug, Default)]
struct Fake {
    base: String,
    /// Oldest first; listed newest first.
    batches: Vec<FakeBatch>,
    creates: Vec<(HashMap<String, String>, Value)>,
    inject: Vec<Injected>,
    page_cap: Option<usize>,
    list_calls: usize,
    result_fetches: Vec<String>,
}

type Shared = Arc<Mutex<Fake>>;

fn api_error(status: u16, kind: &str, message: &str) -> Response {
    let body = json!({"type": "error", "error": {"type": kind, "message": message}, "request_id": "req_fake"});
    (StatusCode::from_u16(status).unwrap(), axum::Json(body)).into_response()
}

/// Header checks and injected failures, ahead of every route.
fn guard(fake: &Shared, headers: &HeaderMap) -> Option<Response> {
    let mut fake = fake.lock().unwrap();
    if !fake.inject.is_empty() {
        let (status, extra, body) = fake.inject.remove(0);
        let mut response = (StatusCode::from_u16(status).unwrap(), axum::Json(body)).into_response();
        for (name, value) in extra {
            response.headers_mut().insert(name, value.parse().unwrap());
        }
        return Some(response);
    }
    let header = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
    if header("x-api-key") != Some(KEY) {
        return Some(api_error(401, "authentication_error", "invalid x-api-key"));
    }
    if header("anthropic-version") != Some("2023-06-01") {
        return Some(api_error(400, "invalid_request_error", "anthropic-version header is required"));
    }
    None
}

fn batch_json(batch: &FakeBatch, base: &str) -> Value {
    let ended = batch.status == "ended";
    let mut counts = json!({"processing": 0, "succeeded": 0, "errored": 0, "canceled": 0, "expired": 0});
    if ended {
        let kinds: Vec<String> = batch
            .lines
            .iter()
            .filter_map(|l| serde_json::from_str::<Value>(l).ok())
            .filter_map(|v| v["result"]["type"].as_str().filter(|k| counts.get(k).is_some()).map(str::to_string))
            .collect();
        let mut tallied = 0;
        for kind in kinds {
            counts[&kind] = json!(counts[&kind].as_u64().unwrap() + 1);
            tallied += 1;
        }
        counts["errored"] = json!(counts["errored"].as_u64().unwrap() + batch.total.saturating_sub(tallied));
    } else {
        counts["processing"] = json!(batch.total);
    }
    json!({
        "id": batch.id, "type": "message_batch", "processing_status": batch.status, "request_counts": counts,
        "created_at": batch.created_at, "expires_at": batch.created_at,
        "ended_at": if ended { json!(batch.created_at) } else { Value::Null },
        "cancel_initiated_at": if batch.cancel_initiated { json!(batch.created_at) } else { Value::Null },
        "archived_at": Value::Null,
        "results_url": if ended { json!(format!("{base}/v1/messages/batches/{}/results", batch.id)) } else { Value::Null },
    })
}

async fn create(State(fake): State<Shared>, headers: HeaderMap, body: axum::Json<Value>) -> Response {
    if let Some(early) = guard(&fake, &headers) {
        return early;
    }
    let requests = body["requests"].as_array().cloned().unwrap_or_default();
    if requests.is_empty() || requests.len() > 100_000 {
        return api_error(400, "invalid_request_error", "requests: 1 to 100000 items");
    }
    let mut ids = HashSet::new();
    for (i, request) in requests.iter().enumerate() {
        let id = request["custom_id"].as_str().unwrap_or_default();
        let charset = id.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
        if id.is_empty() || id.len() > 64 || !charset || !ids.insert(id.to_string()) {
            return api_error(400, "invalid_request_error", &format!("requests.{i}.custom_id: invalid or duplicate"));
        }
        if request["params"]["max_tokens"].as_u64().unwrap_or(0) < 1 {
            return api_error(400, "invalid_request_error", &format!("requests.{i}.params.max_tokens: at least 1"));
        }
    }
    let seen: HashMap<String, String> =
        headers.iter().map(|(k, v)| (k.as_str().to_string(), v.to_str().unwrap_or("").to_string())).collect();
    let mut fake = fake.lock().unwrap();
    fake.creates.push((seen, body.0));
    let batch = FakeBatch {
        id: format!("msgbatch_{:02}", fake.batches.len() + 1),
        created_at: "2026-01-01T00:10:30Z".into(),
        status: "in_progress",
        total: requests.len() as u64,
        cancel_initiated: false,
        lines: Vec::new(),
        results_gone: false,
    };
    let answer = batch_json(&batch, &fake.base);
    fake.batches.push(batch);
    axum::Json(answer).into_response()
}

async fn list(
    State(fake): State<Shared>,
    headers: HeaderMap,
    Query(query): Query<HashMap<String, String>>,
) -> Response {
    if let Some(early) = guard(&fake, &headers) {
        return early;
    }
    let mut fake = fake.lock().unwrap();
    fake.list_calls += 1;
    let limit: usize = query.get("limit").and_then(|l| l.parse().ok()).unwrap_or(20);
    if !(1..=1000).contains(&limit) {
        return api_error(400, "invalid_request_error", "limit: 1 to 1000");
    }
    let limit = fake.page_cap.map_or(limit, |cap| limit.min(cap));
    let newest_first: Vec<&FakeBatch> = fake.batches.iter().rev().collect();
    let start = match query.get("after_id") {
        Some(after) => newest_first.iter().position(|b| &b.id == after).map_or(newest_first.len(), |i| i + 1),
        None => 0,
    };
    let page: Vec<Value> = newest_first.iter().skip(start).take(limit).map(|b| batch_json(b, &fake.base)).collect();
    let has_more = start + page.len() < newest_first.len();
    axum::Json(json!({
        "data": page, "has_more": has_more,
        "first_id": page.first().map(|b| b["id"].clone()), "last_id": page.last().map(|b| b["id"].clone()),
    }))
    .into_response()
}

async fn retrieve(State(fake): State<Shared>, headers: HeaderMap, Path(id): Path<String>) -> Response {
    if let Some(early) = guard(&fake, &headers) {
        return early;
    }
    let fake = fake.lock().unwrap();
    match fake.batches.iter().find(|b| b.id == id) {
        Some(batch) => axum::Json(batch_json(batch, &fake.base)).into_response(),
        None => api_error(404, "not_found_error", "no such batch"),
    }
}

async fn cancel(State(fake): State<Shared>, headers: HeaderMap, Path(id): Path<String>) -> Response {
    if let Some(early) = guard(&fake, &headers) {
        return early;
    }
    let mut fake = fake.lock().unwrap();
    let base = fake.base.clone();
    match fake.batches.iter_mut().find(|b| b.id == id) {
        Some(batch) => {
            batch.status = "canceling";
            batch.cancel_initiated = true;
            axum::Json(batch_json(batch, &base)).into_response()
        }
        None => api_error(404, "not_found_error", "no such batch"),
    }
}

async fn results(State(fake): State<Shared>, headers: HeaderMap, Path(id): Path<String>) -> Response {
    if let Some(early) = guard(&fake, &headers) {
        return early;
    }
    let mut fake = fake.lock().unwrap();
    fake.result_fetches.push(id.clone());
    let Some(batch) = fake.batches.iter().find(|b| b.id == id) else {
        return api_error(404, "not_found_error", "no such batch");
    };
    if batch.results_gone {
        return api_error(404, "not_found_error", "results are no longer available");
    }
    if batch.status != "ended" {
        return api_error(400, "invalid_request_error", "results are available once processing has ended");
    }
    let text: String = batch.lines.iter().map(|l| format!("{l}\n")).collect();
    let chunks: Vec<Result<Vec<u8>, std::io::Error>> = text.into_bytes().chunks(7).map(|c| Ok(c.to_vec())).collect();
    ([("content-type", "application/x-jsonl")], Body::from_stream(futures_util::stream::iter(chunks))).into_response()
}

async fn start() -> (String, Shared) {
    let fake: Shared = Arc::default();
    let app = Router::new()
        .route("/v1/messages/batches", post(create).get(list))
        .route("/v1/messages/batches/{id}", get(retrieve))
        .route("/v1/messages/batches/{id}/cancel", post(cancel))
        .route("/v1/messages/batches/{id}/results", get(results))
        .with_state(fake.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    fake.lock().unwrap().base = base.clone();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (base, fake)
}

fn config(base_url: String) -> AnthropicConfig {
    AnthropicConfig {
        base_url,
        request_timeout: Duration::from_secs(5),
        ..AnthropicConfig::new(ApiKey::new(KEY.into()), "claude-test-model")
    }
}

fn adapter(base_url: String) -> AnthropicBatches {
    AnthropicBatches::new(config(base_url)).unwrap()
}

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

fn succeeded(id: &str, content: Value, usage: Value) -> String {
    json!({"custom_id": id, "result": {"type": "succeeded", "message": {
        "id": "msg_01", "type": "message", "role": "assistant", "model": "claude-test-model", "content": content,
        "stop_reason": "tool_use", "stop_sequence": null, "usage": usage}}})
    .to_string()
}

fn errored(id: &str, kind: &str) -> String {
    json!({"custom_id": id, "result": {"type": "errored",
        "error": {"type": "error", "error": {"type": kind, "message": "from the fake"}, "request_id": "req_1"}}})
    .to_string()
}

fn bare(id: &str, kind: &str) -> String {
    json!({"custom_id": id, "result": {"type": kind}}).to_string()
}

fn place(fake: &Shared, id: &str, created_at: &str, status: &'static str, ids: &[String]) {
    let lines = ids.iter().map(|i| bare(i, "canceled")).collect();
    let total = ids.len() as u64;
    let batch = FakeBatch {
        id: id.into(),
        created_at: created_at.into(),
        status,
        total,
        cancel_initiated: false,
        lines,
        results_gone: false,
    };
    fake.lock().unwrap().batches.push(batch);
}

fn finish(fake: &Shared, id: &str, lines: Vec<String>) {
    let mut fake = fake.lock().unwrap();
    let batch = fake.batches.iter_mut().find(|b| b.id == id).unwrap();
    batch.status = "ended";
    batch.lines = lines;
}

#[tokio::test]
async fn submit_sends_the_documented_create_request() {
    let (base, fake) = start().await;
    let provider = adapter(base);
    let schema = Registry::builtin().get(BUILTIN_CODE_REVIEW).unwrap();
    let members = members(3);
    let spec = BatchSpec { batch_key: "cpb-0011", schema: &schema, members: &members };
    assert_eq!(provider.submit(&spec).await.unwrap(), "msgbatch_01");

    let fake = fake.lock().unwrap();
    assert_eq!(fake.creates.len(), 1, "one POST /v1/messages/batches");
    let (headers, body) = &fake.creates[0];
    assert_eq!(headers["x-api-key"], KEY);
    assert_eq!(headers["anthropic-version"], "2023-06-01");
    assert_eq!(headers["content-type"], "application/json");
    assert!(!headers.contains_key("authorization"), "Anthropic authenticates with x-api-key only");
    assert_eq!(body.as_object().unwrap().keys().collect::<Vec<_>>(), ["requests"]);
    let requests = body["requests"].as_array().unwrap();
    assert_eq!(requests.len(), 3);
    for (request, member) in requests.iter().zip(&members) {
        assert_eq!(request.as_object().unwrap().len(), 2, "only custom_id and params: {request}");
        let custom_id = request["custom_id"].as_str().unwrap();
        assert_eq!(custom_id, member.id.to_hex());
        assert_eq!(custom_id.len(), 64);
        assert!(custom_id.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-'));
        let params = &request["params"];
        assert_eq!(params["model"], "claude-test-model");
        assert_eq!(params["max_tokens"], 4096);
        assert_eq!(params["system"], schema.instructions());
        let messages = params["messages"].as_array().unwrap();
        assert_eq!(messages.len(), 1);
        assert_eq!(messages[0]["role"], "user");
        assert_eq!(messages[0]["content"], format!("source_id: {}\n\n{}", member.source_id, member.content));
        let tools = params["tools"].as_array().unwrap();
        assert_eq!(tools.len(), 1);
        let name = tools[0]["name"].as_str().unwrap();
        assert!(!name.is_empty() && name.len() <= 64);
        assert!(name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-'), "{name}");
        assert!(!tools[0]["description"].as_str().unwrap().is_empty());
        assert_eq!(tools[0]["input_schema"], *schema.provider_schema(crate::domain::schema::Dialect::AnthropicTool));
        assert_eq!(tools[0]["input_schema"]["type"], "object", "tool inputs are objects");
        assert!(tools[0]["input_schema"].as_object().unwrap().keys().all(|k| !k.starts_with("x-commitpoint")));
        assert_eq!(params["tool_choice"]["type"], "tool", "the tool call is forced");
        assert_eq!(params["tool_choice"]["name"], name);
        assert_eq!(params["tool_choice"]["disable_parallel_tool_use"], true);
        assert!(params.get("stream").is_none(), "batches do not stream");
    }
}

#[tokio::test]
async fn submit_rejects_what_the_api_would_before_sending() {
    let (base, fake) = start().await;
    let provider = adapter(base);
    let schema = Registry::builtin().get(BUILTIN_CODE_REVIEW).unwrap();
    let too_many: Vec<BatchMember> = (0..=100_000).map(|i| member(&i.to_string(), "x")).collect();
    let err = provider.submit(&BatchSpec { batch_key: "k", schema: &schema, members: &too_many }).await.unwrap_err();
    assert_eq!(err.class, ErrorClass::TooLarge, "split, not failed");
    assert!(err.message.contains("100000"), "{}", err.message);
    // The byte limit, scaled down so the test does not allocate 256 MB.
    let two = members(2);
    let spec = BatchSpec { batch_key: "k", schema: &schema, members: &two };
    let one_request = provider.create_body(&BatchSpec { members: &two[..1], ..spec }, usize::MAX).unwrap().len();
    let err = provider.create_body(&spec, one_request + 100).unwrap_err();
    assert_eq!(err.class, ErrorClass::TooLarge, "split, not failed");
    assert!(provider.create_body(&spec, 2 * one_request + 100).is_ok());
    let twice = [member("a", "x"), member("a", "x")];
    let err = provider.submit(&BatchSpec { batch_key: "k", schema: &schema, members: &twice }).await.unwrap_err();
    assert_eq!(err.class, ErrorClass::InvalidRequest);
    let err = provider.submit(&BatchSpec { batch_key: "k", schema: &schema, members: &[] }).await.unwrap_err();
    assert_eq!(err.class, ErrorClass::InvalidRequest);
    assert!(fake.lock().unwrap().creates.is_empty(), "nothing reached the server");
}

#[tokio::test]
async fn a_batch_runs_from_submit_to_streamed_results() {
    let (base, fake) = start().await;
    let provider = adapter(base.clone());
    let schema = Registry::builtin().get(BUILTIN_CODE_REVIEW).unwrap();
    let members = members(6);
    let ids: Vec<String> = members.iter().map(|m| m.id.to_hex()).collect();
    let job = provider.submit(&BatchSpec { batch_key: "k", schema: &schema, members: &members }).await.unwrap();

    let running = provider.poll(&job).await.unwrap();
    assert_eq!(running.phase, JobPhase::Running);
    assert!(running.result_files.is_empty(), "no results_url before the batch ends");

    let findings = json!({"findings": [{"rule": "no-unwrap", "file": "src-0.rs", "line": 1}]});
    let usage = json!({"input_tokens": 100, "output_tokens": 20, "cache_creation_input_tokens": 30,
                       "cache_read_input_tokens": 400, "service_tier": "batch"});
    let tool_use = json!([{"type": "tool_use", "id": "toolu_1", "name": "code-review_1", "input": findings}]);
    let refusal = json!([{"type": "text", "text": "I will not do that."}]);
    finish(
        &fake,
        &job,
        vec![
            bare(&ids[4], "expired"),
            succeeded(&ids[0], tool_use, usage),
            errored(&ids[1], "invalid_request_error"),
            "{\"custom_id\": \"truncated".to_string(),
            errored(&ids[2], "overloaded_error"),
            String::new(),
            bare(&ids[3], "canceled"),
            succeeded(&ids[5], refusal, json!({"input_tokens": 9, "output_tokens": 4})),
        ],
    );
    let done = provider.poll(&job).await.unwrap();
    assert_eq!(done.phase, JobPhase::Completed);
    assert_eq!(done.result_files, vec![format!("{base}/v1/messages/batches/{job}/results")]);

    let (tx, mut rx) = mpsc::channel(4);
    let streaming = tokio::spawn(async move {
        let counts = provider.stream_results(&done, &tx).await;
        (provider, counts)
    });
    let mut lines = HashMap::new();
    while let Some((id, result)) = rx.recv().await {
        assert!(lines.insert(id, result).is_none(), "one line per member");
    }
    let (_, counts) = streaming.await.unwrap();
    assert_eq!(counts.unwrap(), StreamCounts { lines: 7, malformed: 1 }, "blank lines are not lines");
    assert_eq!(lines.len(), 6);

    let LineResult::Answer { output, usage: Some(usage) } = &lines[&ids[0]] else { panic!("{:?}", lines[&ids[0]]) };
    assert_eq!(serde_json::from_str::<Value>(output).unwrap(), findings, "the tool input is the output");
    assert_eq!(usage.model, "claude-test-model");
    assert_eq!((usage.input_tokens, usage.output_tokens), (530, 20));
    assert_eq!((usage.cached_input_tokens, usage.cache_write_tokens), (400, 30));
    assert_eq!(usage.request_id.as_deref(), Some("msg_01"));
    assert!(matches!(&lines[&ids[1]], LineResult::Refused { class: FailureClass::InvalidRequest, .. }));
    assert!(matches!(&lines[&ids[2]], LineResult::Retry { .. }), "overload is worth another batch");
    assert!(matches!(&lines[&ids[3]], LineResult::Retry { reason } if reason.contains("canceled")));
    assert!(matches!(&lines[&ids[4]], LineResult::Retry { reason } if reason.contains("expired")));
    // No call of the forced tool: the model declined. Refused, not a validation failure, and charged.
    let LineResult::Unusable { class, reason, usage: Some(usage) } = &lines[&ids[5]] else { panic!() };
    assert_eq!(*class, FailureClass::Refused);
    assert!(reason.contains("I will not do that."), "{reason}");
    assert_eq!(usage.input_tokens, 9);
}

#[tokio::test]
async fn a_cancelled_batch_ends_as_cancelled_with_its_results() {
    let (base, fake) = start().await;
    let provider = adapter(base);
    let schema = Registry::builtin().get(BUILTIN_CODE_REVIEW).unwrap();
    let members = members(1);
    let job = provider.submit(&BatchSpec { batch_key: "k", schema: &schema, members: &members }).await.unwrap();
    provider.cancel(&job).await.unwrap();
    assert_eq!(provider.poll(&job).await.unwrap().phase, JobPhase::Running, "canceling is not an end");
    finish(&fake, &job, vec![bare(&members[0].id.to_hex(), "canceled")]);
    let status = provider.poll(&job).await.unwrap();
    assert_eq!(status.phase, JobPhase::Cancelled);
    assert_eq!(status.result_files.len(), 1);
}

#[tokio::test]
async fn provider_errors_are_classified_from_status_and_error_type() {
    let (base, fake) = start().await;
    let provider = adapter(base.clone());
    let body = |kind: &str, message: &str| json!({"type": "error", "error": {"type": kind, "message": message}});
    let cases: Vec<(Injected, ErrorClass, Option<Duration>)> = vec![
        (
            (529, vec![("retry-after", "7")], body("overloaded_error", "Overloaded")),
            ErrorClass::RateLimited,
            Some(Duration::from_secs(7)),
        ),
        (
            (429, vec![("retry-after", "2")], body("rate_limit_error", "slow down")),
            ErrorClass::RateLimited,
            Some(Duration::from_secs(2)),
        ),
        ((500, vec![], body("api_error", "oops")), ErrorClass::Transient, None),
        ((504, vec![], body("timeout_error", "late")), ErrorClass::Transient, None),
        ((401, vec![], body("authentication_error", "bad key")), ErrorClass::Auth, None),
        ((403, vec![], body("permission_error", "no")), ErrorClass::Auth, None),
        ((402, vec![], body("billing_error", "pay up")), ErrorClass::Budget, None),
        (
            (400, vec![], body("invalid_request_error", "Your credit balance is too low to access the Anthropic API.")),
            ErrorClass::Budget,
            None,
        ),
        ((400, vec![], body("invalid_request_error", "max_tokens: too large")), ErrorClass::InvalidRequest, None),
        ((413, vec![], body("request_too_large", "too big")), ErrorClass::InvalidRequest, None),
    ];
    for (injected, class, delay) in cases {
        let status = injected.0;
        fake.lock().unwrap().inject.push(injected);
        let err = provider.poll("msgbatch_x").await.unwrap_err();
        assert_eq!((err.class, err.status, err.retry_after), (class, Some(status), delay), "{status}: {}", err.message);
        assert!(!err.message.contains(KEY));
    }
    let gone = provider.poll("msgbatch_unknown").await.unwrap_err();
    assert_eq!(gone.class, ErrorClass::Gone);
    assert!(gone.message.contains("req_fake"), "the request id helps support: {}", gone.message);

    let wrong_key =
        AnthropicBatches::new(AnthropicConfig { api_key: ApiKey::new("sk-wrong".into()), ..config(base) }).unwrap();
    assert_eq!(wrong_key.poll("msgbatch_x").await.unwrap_err().class, ErrorClass::Auth);
    assert!(!format!("{provider:?}").contains(KEY), "the key never shows in Debug output");
}

#[tokio::test]
async fn results_are_only_fetched_from_the_configured_origin() {
    let (base, fake) = start().await;
    let provider = adapter(base);
    let job = JobStatus {
        job_id: "msgbatch_01".into(),
        phase: JobPhase::Completed,
        result_files: vec!["https://elsewhere.example/v1/messages/batches/msgbatch_01/results".into()],
    };
    let (tx, _rx) = mpsc::channel(1);
    let err = provider.stream_results(&job, &tx).await.unwrap_err();
    assert_eq!(err.class, ErrorClass::Protocol);
    assert!(fake.lock().unwrap().result_fetches.is_empty());
}

#[test]
fn bad_configuration_is_refused() {
    let good = || config("https://api.anthropic.com".into());
    assert!(AnthropicBatches::new(good()).is_ok());
    let cases = [
        (AnthropicConfig { base_url: "api.anthropic.com".into(), ..good() }, "absolute"),
        (AnthropicConfig { base_url: "ftp://api.anthropic.com".into(), ..good() }, "absolute"),
        (AnthropicConfig { base_url: "https://api.anthropic.com/v1/".into(), ..good() }, "/v1"),
        (AnthropicConfig { api_key: ApiKey::new(" ".into()), ..good() }, "empty"),
        (AnthropicConfig { api_key: ApiKey::new("sk\nx".into()), ..good() }, "header"),
        (AnthropicConfig { model: String::new(), ..good() }, "model"),
        (AnthropicConfig { max_tokens: 0, ..good() }, "max_tokens"),
        (AnthropicConfig { request_timeout: Duration::ZERO, ..good() }, "timeouts"),
    ];
    for (config, expected) in cases {
        let message = AnthropicBatches::new(config).unwrap_err().to_string();
        assert!(message.contains(expected), "{message}");
    }
    assert!(!format!("{:?}", good()).contains(KEY));
}

fn intent_at_ms() -> u64 {
    wire::unix_ms(INTENT_AT).unwrap()
}

async fn find(base: String, ours: &[ExtractionId]) -> Lookup {
    let intent = IntentRef { batch_key: "cpb-lost", created_at_ms: intent_at_ms(), members: ours, known_jobs: &[] };
    adapter(base).find_job(&intent).await.unwrap()
}

fn ids_of(members: &[BatchMember]) -> (Vec<ExtractionId>, Vec<String>) {
    (members.iter().map(|m| m.id).collect(), members.iter().map(|m| m.id.to_hex()).collect())
}

#[tokio::test]
async fn find_job_finds_the_ended_batch_holding_exactly_our_members() {
    let (base, fake) = start().await;
    let (ours, hex) = ids_of(&members(3));
    let (_, strangers) = ids_of(&(10..13).map(|i| member(&format!("other-{i}"), "y")).collect::<Vec<_>>());
    fake.lock().unwrap().page_cap = Some(2);
    // Within the slack before the intent: clock skew can put our own batch there.
    place(&fake, "msgbatch_ours", "2026-01-01T00:09:00Z", "ended", &hex);
    place(&fake, "msgbatch_strangers", "2026-01-01T00:10:05Z", "ended", &strangers);
    place(&fake, "msgbatch_small", "2026-01-01T00:10:06Z", "in_progress", &hex[..2]);
    place(&fake, "msgbatch_newest", "2026-01-01T00:10:07Z", "ended", &strangers[..1]);

    assert_eq!(find(base, &ours).await, Lookup::Found("msgbatch_ours".into()));
    let fake = fake.lock().unwrap();
    assert!(fake.list_calls >= 2, "the listing paginates with after_id");
    assert_eq!(fake.result_fetches, ["msgbatch_strangers", "msgbatch_ours"], "only same-size ended batches are read");
}

#[tokio::test]
async fn find_job_is_undecided_while_a_same_size_batch_runs() {
    let (base, fake) = start().await;
    let (ours, hex) = ids_of(&members(3));
    let (_, strangers) = ids_of(&(10..13).map(|i| member(&format!("other-{i}"), "y")).collect::<Vec<_>>());
    place(&fake, "msgbatch_running", "2026-01-01T00:10:01Z", "in_progress", &hex);
    place(&fake, "msgbatch_strangers", "2026-01-01T00:10:02Z", "ended", &strangers);

    let Lookup::Undecided { recheck_after, reason } = find(base.clone(), &ours).await else { panic!() };
    assert_eq!(recheck_after, RECHECK_AFTER);
    assert!(reason.contains("msgbatch_running"), "{reason}");

    fake.lock().unwrap().batches[0].status = "canceling";
    assert!(matches!(find(base.clone(), &ours).await, Lookup::Undecided { .. }));
    finish(&fake, "msgbatch_running", hex.iter().map(|id| bare(id, "expired")).collect());
    assert_eq!(find(base, &ours).await, Lookup::Found("msgbatch_running".into()));
}

/// A running same-size batch whose id the store already recorded for another batch is
/// not a candidate: the lookup need not wait for it to end.
#[tokio::test]
async fn find_job_skips_running_batches_the_store_knows_are_others() {
    let (base, fake) = start().await;
    let (ours, hex) = ids_of(&members(3));
    place(&fake, "msgbatch_someone_elses", "2026-01-01T00:10:01Z", "in_progress", &hex);
    let known = vec!["msgbatch_someone_elses".to_string()];
    let intent = IntentRef { batch_key: "cpb-lost", created_at_ms: intent_at_ms(), members: &ours, known_jobs: &known };
    assert_eq!(adapter(base.clone()).find_job(&intent).await.unwrap(), Lookup::Absent);
    assert!(matches!(find(base, &ours).await, Lookup::Undecided { .. }), "without the hint it must wait");
}

#[tokio::test]
async fn find_job_is_absent_when_only_other_sizes_older_batches_or_overlaps_exist() {
    let (base, fake) = start().await;
    let (ours, hex) = ids_of(&members(3));
    let (_, strangers) = ids_of(&(10..13).map(|i| member(&format!("other-{i}"), "y")).collect::<Vec<_>>());
    place(&fake, "msgbatch_old_running", "2025-12-31T23:00:00Z", "in_progress", &hex);
    place(&fake, "msgbatch_old_ended", "2026-01-01T00:07:59Z", "ended", &hex);
    place(&fake, "msgbatch_bigger", "2026-01-01T00:10:01Z", "in_progress", &[hex.clone(), strangers.clone()].concat());
    place(&fake, "msgbatch_smaller", "2026-01-01T00:10:02Z", "ended", &hex[..2]);
    // An earlier attempt sharing two members with a stranger is not ours.
    let overlap = vec![hex[0].clone(), hex[1].clone(), strangers[0].clone()];
    place(&fake, "msgbatch_overlap", "2026-01-01T00:10:03Z", "ended", &overlap);
    // A broken line could stand for our third member, but the stranger rules the batch out.
    place(&fake, "msgbatch_faulty", "2026-01-01T00:10:04Z", "ended", &overlap);
    fake.lock().unwrap().batches.last_mut().unwrap().lines.insert(0, "{\"custom_id\": trunc".into());
    place(&fake, "msgbatch_archived", "2026-01-01T00:10:05Z", "ended", &hex);
    fake.lock().unwrap().batches.last_mut().unwrap().results_gone = true;

    assert_eq!(find(base, &ours).await, Lookup::Absent);
    let fake = fake.lock().unwrap();
    assert_eq!(fake.result_fetches, ["msgbatch_archived", "msgbatch_faulty", "msgbatch_overlap"]);
    assert_eq!(fake.list_calls, 1, "one page reaches back past the intent");
}
