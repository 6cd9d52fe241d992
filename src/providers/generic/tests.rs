//! The adapter against a fake of the generic REST batch contract (PROVIDERS.md §4) over
//! real HTTP: envelopes, canonical JSON, `Idempotency-Key` dedup by key, error envelopes,
//! and both ways results can come back (inline in the status, or a JSONL URL).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::body::Bytes;
use axum::extract::{Path, State};
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
use crate::providers::lines::MAX_LINE_BYTES;

/// How the fake names the contract's unconfirmed fields.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Dialect {
    /// The adapter's defaults; results inline in the status.
    Defaults,
    /// Other names everywhere; results as JSONL behind a relative URL.
    Renamed,
}

#[derive(Debug)]
struct Fake {
    dialect: Dialect,
    submits: Mutex<Vec<(HeaderMap, Bytes)>>,
    result_downloads: Mutex<Vec<HeaderMap>>,
    /// Submits still to be answered 503 before the fake accepts one.
    failing_submits: AtomicUsize,
    /// A canned answer for every submit, instead of accepting it.
    submit_answer: Mutex<Option<Response>>,
    /// Idempotency key → the batch it created.
    batches: Mutex<HashMap<String, FakeBatch>>,
    /// Result files open with a line longer than the adapter reads.
    huge_first_line: AtomicBool,
}

/// (batch id, the accepted request items, polls so far).
type FakeBatch = (String, Vec<Value>, usize);

fn metadata(cost_usd: f64, request_id: &str) -> Value {
    json!({"cost_usd": cost_usd, "latency_ms": 4, "vendor": "fake", "cache_hit": false, "request_id": request_id})
}

fn envelope_error(status: StatusCode, code: &str, retryable: Option<bool>) -> Response {
    let mut error = json!({"code": code, "message": format!("{code} from the fake"), "hint": "see docs"});
    if let Some(flag) = retryable {
        error["retryable"] = flag.into();
    }
    let body = json!({"ok": false, "data": null, "error": error, "metadata": metadata(0.0, "0190-err")});
    (status, axum::Json(body)).into_response()
}

async fn submit(State(fake): State<Arc<Fake>>, headers: HeaderMap, body: Bytes) -> Response {
    fake.submits.lock().unwrap().push((headers, body.clone()));
    if fake.failing_submits.load(Ordering::SeqCst) > 0 {
        fake.failing_submits.fetch_sub(1, Ordering::SeqCst);
        return envelope_error(StatusCode::SERVICE_UNAVAILABLE, "SERVICE_UNAVAILABLE", Some(true));
    }
    if let Some(answer) = fake.submit_answer.lock().unwrap().take() {
        return answer;
    }
    let request: Value = serde_json::from_slice(&body).unwrap();
    let key = request["idempotency_key"].as_str().unwrap().to_string();
    let mut batches = fake.batches.lock().unwrap();
    let next = format!("bat_{}", batches.len() + 1);
    let items = request["requests"].as_array().unwrap().clone();
    let count = items.len();
    let (batch_id, _, _) = batches.entry(key).or_insert((next, items, 0));
    let data = json!({"batch_id": batch_id, "state": "queued", "total_count": count, "estimated_cost_usd": 0.01});
    axum::Json(json!({"ok": true, "data": data, "error": null, "metadata": metadata(0.0, "0190-sub")})).into_response()
}

/// The result item for one request item, shaped by the dialect.
fn result_item(dialect: Dialect, index: usize, item: &Value) -> Value {
    let (id_key, id) = match dialect {
        Dialect::Defaults => ("custom_id", item["custom_id"].clone()),
        Dialect::Renamed => ("key", item["key"].clone()),
    };
    let user = item["body"]["messages"][1]["content"].as_str().unwrap_or_default();
    let mut result = if user.contains("BAD") {
        json!({"ok": false, "data": null, "error": {"code": "INVALID_PARAMS", "message": "schema rejected", "retryable": false}})
    } else if user.contains("LATE") {
        json!({"ok": false, "data": null, "error": {"code": "EXPIRED", "message": "batch_timeout reached"}})
    } else {
        let completion = json!({"id": format!("chatcmpl-{index}"), "object": "chat.completion", "created": 1,
            "model": item["body"]["model"], "choices": [{"index": 0, "finish_reason": "stop", "logprobs": null,
            "message": {"role": "assistant", "content": "{\"findings\":[]}"}}],
            "usage": {"prompt_tokens": 20, "completion_tokens": 5, "total_tokens": 25}});
        match dialect {
            Dialect::Defaults => json!({"ok": true, "data": completion, "error": null,
                "metadata": metadata(0.0021, &format!("req-{index}"))}),
            Dialect::Renamed => json!({"response": {"body": completion}, "cost_usd": 0.0021}),
        }
    };
    result[id_key] = id;
    result
}

async fn status(State(fake): State<Arc<Fake>>, Path(id): Path<String>) -> Response {
    let mut batches = fake.batches.lock().unwrap();
    let Some((_, items, polls)) = batches.values_mut().find(|(batch_id, _, _)| *batch_id == id) else {
        return envelope_error(StatusCode::NOT_FOUND, "BATCH_NOT_FOUND", Some(false));
    };
    *polls += 1;
    let done = *polls > 1;
    let data = match (fake.dialect, done) {
        (Dialect::Defaults, false) => json!({"batch_id": id, "state": "running", "completed_count": 0}),
        (Dialect::Renamed, false) => json!({"id": id, "status": "in_progress"}),
        (Dialect::Defaults, true) => {
            let mut results: Vec<Value> =
                items.iter().enumerate().map(|(i, item)| result_item(Dialect::Defaults, i, item)).collect();
            results.push(json!({"ok": true, "data": {}}));
            json!({"batch_id": id, "state": "completed", "completed_count": items.len(), "results": results})
        }
        (Dialect::Renamed, true) => {
            json!({"id": id, "status": "complete", "output": {"url": format!("/v1/ai/batch/results/{id}")}})
        }
    };
    axum::Json(json!({"ok": true, "data": data, "error": null, "metadata": metadata(0.0063, "0190-st")}))
        .into_response()
}

async fn results(State(fake): State<Arc<Fake>>, Path(id): Path<String>, headers: HeaderMap) -> String {
    fake.result_downloads.lock().unwrap().push(headers);
    let batches = fake.batches.lock().unwrap();
    let (_, items, _) = batches.values().find(|(batch_id, _, _)| *batch_id == id).unwrap();
    let mut jsonl = String::new();
    if fake.huge_first_line.load(Ordering::Relaxed) {
        jsonl = format!("{{\"key\": \"{}\"}}\n", "x".repeat(MAX_LINE_BYTES));
    }
    jsonl.extend(items.iter().enumerate().map(|(i, item)| format!("{}\n", result_item(Dialect::Renamed, i, item))));
    jsonl.push_str("{\"key\": \"truncat");
    jsonl
}

async fn start_fake(dialect: Dialect) -> (String, Arc<Fake>) {
    let fake = Arc::new(Fake {
        dialect,
        submits: Mutex::default(),
        result_downloads: Mutex::default(),
        failing_submits: AtomicUsize::new(0),
        submit_answer: Mutex::default(),
        batches: Mutex::default(),
        huge_first_line: AtomicBool::new(false),
    });
    let app = Router::new()
        .route("/v1/ai/batch/submit", post(submit))
        .route("/v1/ai/batch/status/{id}", get(status))
        .route("/v1/ai/batch/results/{id}", get(results))
        .with_state(fake.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (format!("http://{addr}"), fake)
}

fn adapter(base_url: String, dialect: Dialect) -> GenericBatches {
    let mut config = GenericConfig::new(base_url, ApiKey::new("ifr_pk_proj_test".into()), "gpt-4o-mini");
    if dialect == Dialect::Renamed {
        config.fields = GenericFields {
            item_id: "key".into(),
            state: "/status".into(),
            results: "/items".into(),
            results_url: "/output/url".into(),
            item_response: "/response/body".into(),
            item_cost_usd: "/cost_usd".into(),
            ..GenericFields::default()
        };
    }
    GenericBatches::new(config).unwrap()
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

async fn submit_members(provider: &GenericBatches, members: &[BatchMember]) -> Result<String, ProviderError> {
    let schema = Registry::builtin().get(BUILTIN_CODE_REVIEW).unwrap();
    provider.submit(&BatchSpec { batch_key: "cpb-42", schema: &schema, members }).await
}

async fn drain(provider: &GenericBatches, status: &JobStatus) -> (StreamCounts, Vec<ResultLine>) {
    let (tx, mut rx) = mpsc::channel(2);
    let collect = tokio::spawn(async move {
        let mut lines = Vec::new();
        while let Some(line) = rx.recv().await {
            lines.push(line);
        }
        lines
    });
    let counts = provider.stream_results(status, &tx).await.unwrap();
    drop(tx);
    (counts, collect.await.unwrap())
}

fn line_for<'a>(lines: &'a [ResultLine], member: &BatchMember) -> &'a LineResult {
    &lines.iter().find(|(id, _)| *id == member.id.to_hex()).unwrap().1
}

#[tokio::test]
async fn submit_request_matches_the_contract_field_by_field() {
    let (base, fake) = start_fake(Dialect::Defaults).await;
    let provider = adapter(base, Dialect::Defaults);
    let members = [member("a.rs", "x.unwrap()"), member("b.rs", "// TODO")];
    assert_eq!(submit_members(&provider, &members).await.unwrap(), "bat_1");

    let submits = fake.submits.lock().unwrap();
    let (headers, raw) = &submits[0];
    assert_eq!(headers["authorization"], "Bearer ifr_pk_proj_test");
    assert_eq!(headers["idempotency-key"], "cpb-42");
    assert_eq!(headers["content-type"], "application/json");
    let text = std::str::from_utf8(raw).unwrap();
    assert!(text.ends_with("}\n") && !text[..text.len() - 1].contains('\n'), "one line, trailing newline");
    let body: Value = serde_json::from_str(text).unwrap();
    assert_eq!(format!("{}\n", serde_json::to_string(&body).unwrap()), text, "canonical: compact, keys sorted");
    let at = |key: &str| text.find(&format!("\"{key}\":")).unwrap();
    assert!(at("batch_timeout") < at("idempotency_key") && at("idempotency_key") < at("metadata"));
    assert!(at("metadata") < at("requests"));

    assert_eq!(body.as_object().unwrap().len(), 4);
    assert_eq!(body["idempotency_key"], "cpb-42");
    assert_eq!(body["batch_timeout"], "24h");
    assert_eq!(body["metadata"], json!({"commitpoint_batch_key": "cpb-42"}));
    let schema = Registry::builtin().get(BUILTIN_CODE_REVIEW).unwrap();
    let items = body["requests"].as_array().unwrap();
    assert_eq!(items.len(), 2);
    for (item, member) in items.iter().zip(&members) {
        assert_eq!(item["capability"], "ai.chat");
        assert_eq!(item["custom_id"], member.id.to_hex());
        let chat = &item["body"];
        assert_eq!(chat["model"], "gpt-4o-mini");
        assert_eq!(chat["messages"][0], json!({"role": "system", "content": schema.instructions()}));
        assert_eq!(chat["messages"][1]["content"], format!("source_id: {}\n\n{}", member.source_id, member.content));
        assert_eq!(chat["response_format"]["type"], "json_schema");
        assert_eq!(chat["response_format"]["json_schema"]["strict"], true);
        assert_eq!(
            chat["response_format"]["json_schema"]["schema"],
            *schema.provider_schema(crate::domain::schema::Dialect::OpenAiStrict)
        );
    }
}

#[tokio::test]
async fn every_retry_of_one_submit_sends_the_same_key_and_body() {
    let (base, fake) = start_fake(Dialect::Defaults).await;
    fake.failing_submits.store(2, Ordering::SeqCst);
    let provider = adapter(base, Dialect::Defaults);
    let members = [member("a.rs", "one"), member("b.rs", "two")];
    for _ in 0..2 {
        let err = submit_members(&provider, &members).await.unwrap_err();
        assert_eq!((err.class, err.status), (ErrorClass::Transient, Some(503)), "{err}");
    }
    assert_eq!(submit_members(&provider, &members).await.unwrap(), "bat_1");
    // A fourth call (a timeout after the server acted, say) gets the same job back.
    assert_eq!(submit_members(&provider, &members).await.unwrap(), "bat_1");
    assert_eq!(fake.batches.lock().unwrap().len(), 1, "the provider created one job");

    let submits = fake.submits.lock().unwrap().clone();
    assert_eq!(submits.len(), 4);
    for (headers, raw) in &submits {
        assert_eq!(headers["idempotency-key"], "cpb-42");
        assert_eq!(serde_json::from_slice::<Value>(raw).unwrap()["idempotency_key"], "cpb-42");
        assert_eq!(raw, &submits[0].1, "byte-identical bodies, as identical retries must be");
    }
    let intent = IntentRef { batch_key: "cpb-42", created_at_ms: 0, members: &[], known_jobs: &[] };
    assert_eq!(provider.find_job(&intent).await.unwrap(), Lookup::Absent);
}

#[tokio::test]
async fn inline_results_flow_from_submit_to_stream_with_cost_and_request_id() {
    let (base, _fake) = start_fake(Dialect::Defaults).await;
    let provider = adapter(base, Dialect::Defaults);
    let members = [member("a.rs", "one"), member("b.rs", "BAD"), member("c.rs", "LATE"), member("d.rs", "two")];
    let job_id = submit_members(&provider, &members).await.unwrap();
    let running = provider.poll(&job_id).await.unwrap();
    assert_eq!((running.phase, running.result_files.len()), (JobPhase::Running, 0));
    let done = provider.poll(&job_id).await.unwrap();
    assert_eq!(done.phase, JobPhase::Completed);
    assert_eq!(done.result_files, vec!["inline".to_string()]);

    let (counts, lines) = drain(&provider, &done).await;
    assert_eq!(counts, StreamCounts { lines: 5, malformed: 1 });
    assert_eq!(lines.len(), 4);
    for (answered, request_id) in [(&members[0], "req-0"), (&members[3], "req-3")] {
        let LineResult::Answer { output, usage: Some(usage) } = line_for(&lines, answered) else { panic!("{lines:?}") };
        assert_eq!(output, r#"{"findings":[]}"#);
        assert_eq!(usage.provider_cost_micros, Some(2100), "the item's metadata.cost_usd");
        assert_eq!(usage.request_id.as_deref(), Some(request_id));
        assert_eq!((usage.model.as_str(), usage.input_tokens, usage.output_tokens), ("gpt-4o-mini", 20, 5));
    }
    let LineResult::Refused { class, reason } = line_for(&lines, &members[1]) else { panic!("{lines:?}") };
    assert_eq!(*class, FailureClass::InvalidRequest);
    assert!(reason.contains("INVALID_PARAMS"), "{reason}");
    assert!(matches!(line_for(&lines, &members[2]), LineResult::Retry { .. }), "expired items are requeued");
}

#[tokio::test]
async fn renamed_fields_and_a_results_url_are_followed() {
    let (base, fake) = start_fake(Dialect::Renamed).await;
    let provider = adapter(base, Dialect::Renamed);
    let members = [member("a.rs", "one"), member("b.rs", "LATE")];
    let job_id = submit_members(&provider, &members).await.unwrap();
    let submitted: Value = serde_json::from_slice(&fake.submits.lock().unwrap()[0].1).unwrap();
    assert_eq!(submitted["requests"][0]["key"], members[0].id.to_hex(), "the configured item id key");
    assert!(submitted["requests"][0].get("custom_id").is_none());

    assert_eq!(provider.poll(&job_id).await.unwrap().phase, JobPhase::Running);
    let done = provider.poll(&job_id).await.unwrap();
    assert_eq!(done.phase, JobPhase::Completed);
    assert_eq!(done.result_files, vec![format!("/v1/ai/batch/results/{job_id}")]);
    let (counts, lines) = drain(&provider, &done).await;
    assert_eq!(counts, StreamCounts { lines: 3, malformed: 1 }, "the truncated last line is malformed");
    let LineResult::Answer { usage: Some(usage), .. } = line_for(&lines, &members[0]) else { panic!("{lines:?}") };
    assert_eq!(usage.provider_cost_micros, Some(2100));
    assert_eq!(usage.request_id.as_deref(), Some("chatcmpl-0"), "no item request id: the completion id");
    assert!(matches!(line_for(&lines, &members[1]), LineResult::Retry { .. }));
    let downloads = fake.result_downloads.lock().unwrap();
    assert_eq!(downloads[0]["authorization"], "Bearer ifr_pk_proj_test", "same origin as the API: authenticated");
}

#[tokio::test]
async fn error_envelopes_are_classified() {
    let (base, fake) = start_fake(Dialect::Defaults).await;
    let provider = adapter(base, Dialect::Defaults);
    let members = [member("a.rs", "one")];
    let outcome = |answer: Response| {
        *fake.submit_answer.lock().unwrap() = Some(answer);
        submit_members(&provider, &members)
    };
    let err = outcome(envelope_error(StatusCode::BAD_REQUEST, "INVALID_PARAMS", Some(false))).await.unwrap_err();
    assert_eq!((err.class, err.status), (ErrorClass::InvalidRequest, Some(400)));
    assert!(err.message.contains("INVALID_PARAMS") && err.message.contains("hint: see docs"), "{}", err.message);
    let err = outcome(envelope_error(StatusCode::PAYMENT_REQUIRED, "INSUFFICIENT_CREDIT", None)).await.unwrap_err();
    assert_eq!(err.class, ErrorClass::Budget);
    let mut limited = envelope_error(StatusCode::TOO_MANY_REQUESTS, "RATE_LIMITED", Some(true));
    limited.headers_mut().insert("retry-after", "3".parse().unwrap());
    let err = outcome(limited).await.unwrap_err();
    assert_eq!((err.class, err.retry_after), (ErrorClass::RateLimited, Some(Duration::from_secs(3))));
    let err = outcome(envelope_error(StatusCode::OK, "INVALID_PARAMS", Some(false))).await.unwrap_err();
    assert_eq!(err.class, ErrorClass::InvalidRequest, "ok:false on a 200 is still an error");
    let err = outcome(envelope_error(StatusCode::OK, "NEVER_SEEN", None)).await.unwrap_err();
    assert_eq!(err.class, ErrorClass::Protocol);
    let err = outcome((StatusCode::BAD_GATEWAY, "<html>bad gateway</html>").into_response()).await.unwrap_err();
    assert_eq!(err.class, ErrorClass::Transient);
    let err = outcome(axum::Json(json!({"ok": true, "data": {}})).into_response()).await.unwrap_err();
    assert_eq!(err.class, ErrorClass::Protocol, "no batch id");

    assert_eq!(provider.poll("bat_404").await.unwrap_err().class, ErrorClass::Gone);
    assert_eq!(provider.cancel("bat_1").await.unwrap_err().class, ErrorClass::InvalidRequest);
    assert!(!format!("{provider:?}").contains("ifr_pk_proj_test"), "the key never shows in Debug output");
}

#[tokio::test]
async fn an_overlong_result_line_is_skipped_as_malformed_and_the_rest_still_read() {
    let (base, fake) = start_fake(Dialect::Renamed).await;
    fake.huge_first_line.store(true, Ordering::Relaxed);
    let provider = adapter(base, Dialect::Renamed);
    let members = [member("a.rs", "one"), member("b.rs", "two")];
    let job_id = submit_members(&provider, &members).await.unwrap();
    provider.poll(&job_id).await.unwrap();
    let done = provider.poll(&job_id).await.unwrap();
    let (counts, lines) = drain(&provider, &done).await;
    // The over-long first line and the truncated last one; both members still arrive.
    assert_eq!(counts, StreamCounts { lines: 4, malformed: 2 });
    for member in &members {
        assert!(matches!(line_for(&lines, member), LineResult::Answer { .. }), "{lines:?}");
    }
}
