//! The adapter's requests, checked field by field against the Batch API contract
//! (PROVIDERS.md §1, OpenAI's `CreateFileRequest` / `CreateBatchRequest`), by a server
//! that records exactly what arrived over HTTP.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::extract::{Multipart, Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::IntoResponse;
use axum::routing::{get, post};
use serde_json::{Value, json};
use tokio::sync::mpsc;

use super::*;
use crate::domain::batch::{BatchMember, LineResult};
use crate::domain::identity::{ExtractionId, SourceHash};
use crate::domain::schema::{BUILTIN_CODE_REVIEW, Registry};

#[derive(Debug, Default)]
struct Seen {
    auth: Vec<String>,
    upload_fields: Vec<UploadField>,
    create_body: Option<Value>,
    list_queries: usize,
}

/// One multipart field as received: (name, file name, content type, bytes).
type UploadField = (String, Option<String>, Option<String>, Vec<u8>);

type Shared = Arc<Mutex<Seen>>;

fn record_auth(seen: &Shared, headers: &HeaderMap) {
    let auth = headers.get("authorization").and_then(|v| v.to_str().ok()).unwrap_or("").to_string();
    seen.lock().unwrap().auth.push(auth);
}

async fn upload(State(seen): State<Shared>, headers: HeaderMap, mut form: Multipart) -> impl IntoResponse {
    record_auth(&seen, &headers);
    while let Some(field) = form.next_field().await.unwrap() {
        let name = field.name().unwrap_or_default().to_string();
        let file_name = field.file_name().map(str::to_string);
        let content_type = field.content_type().map(str::to_string);
        let bytes = field.bytes().await.unwrap().to_vec();
        seen.lock().unwrap().upload_fields.push((name, file_name, content_type, bytes));
    }
    axum::Json(
        json!({"id": "file-in1", "object": "file", "bytes": 10, "created_at": 1, "filename": "x.jsonl", "purpose": "batch", "status": "processed"}),
    )
}

fn batch(status: &str) -> Value {
    json!({"id": "batch_1", "object": "batch", "endpoint": "/v1/chat/completions", "input_file_id": "file-in1",
           "completion_window": "24h", "status": status, "created_at": 4_000_000_000u64,
           "output_file_id": "file-out", "error_file_id": "file-err",
           "metadata": {"commitpoint_batch_key": "cpb-found"}})
}

async fn create(State(seen): State<Shared>, headers: HeaderMap, body: axum::Json<Value>) -> impl IntoResponse {
    record_auth(&seen, &headers);
    seen.lock().unwrap().create_body = Some(body.0);
    axum::Json(batch("validating"))
}

async fn list(State(seen): State<Shared>) -> impl IntoResponse {
    seen.lock().unwrap().list_queries += 1;
    axum::Json(
        json!({"object": "list", "data": [batch("in_progress")], "first_id": "batch_1", "last_id": "batch_1", "has_more": false}),
    )
}

async fn content(Path(id): Path<String>) -> impl IntoResponse {
    let ok = json!({"id": "r1", "custom_id": "a".repeat(64), "response": {"status_code": 200, "request_id": "req_1",
        "body": {"model": "m", "choices": [{"index": 0, "message": {"role": "assistant", "content": "{\"findings\":[]}"}}],
                 "usage": {"prompt_tokens": 5, "completion_tokens": 3, "total_tokens": 8}}}, "error": null});
    match id.as_str() {
        "file-out" => format!("{ok}\n{{\"custom_id\": truncated\n"),
        // A line past the limit, then a good one: the first is skipped, memory stays flat.
        "file-huge" => format!("{{\"custom_id\": \"{}\"}}\n{ok}\n", "x".repeat(17 * 1024 * 1024)),
        _ => format!(
            "{}\n",
            json!({"id": "r2", "custom_id": "b".repeat(64), "response": null, "error": {"code": "batch_expired", "message": "x"}})
        ),
    }
}

async fn start_capture() -> (String, Shared) {
    let seen: Shared = Arc::default();
    let app = Router::new()
        .route("/v1/files", post(upload))
        .route("/v1/batches", post(create).get(list))
        .route("/v1/batches/{id}", get(|| async { axum::Json(batch("completed")) }))
        .route("/v1/files/{id}/content", get(content))
        .route(
            "/v1/limited",
            get(|| async {
                (StatusCode::TOO_MANY_REQUESTS, [("retry-after-ms", "2500")], axum::Json(json!({"error": {"message": "slow down", "type": "requests", "param": null, "code": "rate_limit_exceeded"}})))
            }),
        )
        .with_state(seen.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (format!("http://{addr}/v1"), seen)
}

fn adapter(base_url: String) -> OpenAiBatches {
    OpenAiBatches::new(OpenAiConfig {
        name: "openai".into(),
        base_url,
        api_key: ApiKey::new("sk-test-123".into()),
        model: "gpt-4o-mini".into(),
        request_timeout: Duration::from_secs(5),
        max_completion_tokens: None,
        max_completion_tokens_cap: 16_384,
    })
    .unwrap()
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

#[tokio::test]
async fn submit_sends_the_documented_multipart_upload_and_create_request() {
    let (base, seen) = start_capture().await;
    let provider = adapter(base);
    let schema = Registry::builtin().get(BUILTIN_CODE_REVIEW).unwrap();
    let members = [member("a.rs", "x.unwrap()"), member("b.rs", "// TODO")];
    let spec = BatchSpec { batch_key: "cpb-0011", schema: &schema, members: &members };
    assert_eq!(provider.submit(&spec).await.unwrap(), "batch_1");

    let seen = seen.lock().unwrap();
    assert!(seen.auth.iter().all(|a| a == "Bearer sk-test-123"), "{:?}", seen.auth);
    let fields: Vec<&str> = seen.upload_fields.iter().map(|f| f.0.as_str()).collect();
    assert_eq!(fields.iter().filter(|f| **f == "purpose").count(), 1);
    assert_eq!(fields.iter().filter(|f| **f == "file").count(), 1);
    assert!(
        fields.iter().all(|f| *f == "purpose" || *f == "file"),
        "CreateFileRequest has additionalProperties: false"
    );
    let purpose = seen.upload_fields.iter().find(|f| f.0 == "purpose").unwrap();
    assert_eq!(purpose.3, b"batch");
    let file = seen.upload_fields.iter().find(|f| f.0 == "file").unwrap();
    assert!(file.1.as_deref().unwrap().ends_with(".jsonl"), "the Batch API takes .jsonl files");
    let text = String::from_utf8(file.3.clone()).unwrap();
    let lines: Vec<Value> = text.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(lines.len(), 2);
    for (line, member) in lines.iter().zip(&members) {
        assert_eq!(line["custom_id"], member.id.to_hex());
        assert_eq!(line["method"], "POST");
        assert_eq!(line["url"], "/v1/chat/completions");
        let body = &line["body"];
        assert_eq!(body["model"], "gpt-4o-mini");
        assert_eq!(body["messages"][0]["role"], "system");
        assert_eq!(body["messages"][1]["role"], "user");
        assert!(
            body["messages"][1]["content"]
                .as_str()
                .unwrap()
                .starts_with(&format!("source_id: {}\n\n", member.source_id))
        );
        let format = &body["response_format"];
        assert_eq!(format["type"], "json_schema");
        assert_eq!(format["json_schema"]["strict"], true);
        let name = format["json_schema"]["name"].as_str().unwrap();
        assert!(!name.is_empty() && name.len() <= 64);
        assert!(name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-'), "{name}");
        let schema_sent = &format["json_schema"]["schema"];
        assert_eq!(schema_sent["additionalProperties"], false, "strict mode needs closed objects");
        assert!(schema_sent.as_object().unwrap().keys().all(|k| !k.starts_with("x-commitpoint") && k != "$schema"));
    }
    let create = seen.create_body.as_ref().unwrap();
    assert_eq!(create["input_file_id"], "file-in1");
    assert_eq!(create["endpoint"], "/v1/chat/completions");
    assert_eq!(create["completion_window"], "24h");
    let metadata = create["metadata"].as_object().unwrap();
    assert!(metadata.len() <= 16);
    assert!(metadata.iter().all(|(k, v)| k.len() <= 64 && v.as_str().unwrap().len() <= 512));
    assert_eq!(metadata["commitpoint_batch_key"], "cpb-0011");
}

#[tokio::test]
async fn find_poll_and_stream_join_on_custom_id() {
    let (base, seen) = start_capture().await;
    let provider = adapter(base);
    assert_eq!(provider.find_by_batch_key("cpb-found", 0).await.unwrap(), Lookup::Found("batch_1".to_string()));
    assert_eq!(provider.find_by_batch_key("cpb-other", 0).await.unwrap(), Lookup::Absent);
    assert_eq!(seen.lock().unwrap().list_queries, 2);

    let status = provider.poll("batch_1").await.unwrap();
    assert_eq!(status.phase, JobPhase::Completed);
    assert_eq!(status.result_files, vec!["file-out".to_string(), "file-err".to_string()]);
    let (tx, mut rx) = mpsc::channel(16);
    let counts = provider.stream_results(&status, &tx).await.unwrap();
    drop(tx);
    assert_eq!(counts, StreamCounts { lines: 3, malformed: 1 });
    let mut lines = Vec::new();
    while let Some(line) = rx.recv().await {
        lines.push(line);
    }
    assert_eq!(lines.len(), 2);
    assert!(
        matches!(&lines[0], (id, LineResult::Answer { usage: Some(u), .. }) if *id == "a".repeat(64) && u.input_tokens == 5)
    );
    assert!(matches!(&lines[1], (id, LineResult::Retry { .. }) if *id == "b".repeat(64)));
}

#[tokio::test]
async fn an_oversized_line_is_counted_malformed_and_the_rest_still_read() {
    let (base, _seen) = start_capture().await;
    let provider = adapter(base);
    let job = JobStatus { job_id: "b".into(), phase: JobPhase::Completed, result_files: vec!["file-huge".into()] };
    let (tx, mut rx) = mpsc::channel(16);
    let counts = provider.stream_results(&job, &tx).await.unwrap();
    drop(tx);
    assert_eq!(counts, StreamCounts { lines: 2, malformed: 1 });
    let line = rx.recv().await.unwrap();
    assert_eq!(line.0, "a".repeat(64));
    assert!(rx.recv().await.is_none());
}

#[tokio::test]
async fn rate_limits_are_classified_with_their_delay() {
    let (base, _seen) = start_capture().await;
    let provider = adapter(base);
    let err = provider.json::<Value>(provider.http.get(provider.url("/limited"))).await.unwrap_err();
    assert_eq!(err.class, ErrorClass::RateLimited);
    assert_eq!(err.retry_after, Some(Duration::from_millis(2500)));
    assert!(!format!("{provider:?}").contains("sk-test-123"), "the key never shows in Debug output");
}
