//! The adapter against a fake OpenAI-compatible server over real HTTP: request shapes
//! field by field (OpenAI `CreateChatCompletionRequest` with a strict `json_schema`
//! response format), the submit → poll → stream lifecycle, per-member failures, and the
//! concurrency bound as the server sees it.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use serde_json::{Value, json};
use tokio::sync::mpsc;

use super::*;
use crate::domain::identity::{ExtractionId, SourceHash};
use crate::domain::lifecycle::FailureClass;
use crate::domain::schema::{BUILTIN_CODE_REVIEW, Registry};

/// One request as it arrived: path, headers, raw body.
type Arrival = (String, HeaderMap, Bytes);

#[derive(Debug, Default)]
struct Fake {
    arrivals: Mutex<Vec<Arrival>>,
    in_flight: AtomicUsize,
    max_in_flight: AtomicUsize,
    served: AtomicUsize,
}

fn completion(n: usize, model: &str) -> Value {
    json!({"id": format!("chatcmpl-{n}"), "object": "chat.completion", "created": 1_700_000_000, "model": model,
           "choices": [{"index": 0, "message": {"role": "assistant", "content": "{\"findings\":[]}", "refusal": null},
                        "finish_reason": "stop", "logprobs": null}],
           "usage": {"prompt_tokens": 30, "completion_tokens": 7, "total_tokens": 37,
                     "prompt_tokens_details": {"cached_tokens": 16}, "completion_tokens_details": {"reasoning_tokens": 2}}})
}

fn openai_error(status: StatusCode, message: &str, kind: &str, code: Option<&str>) -> Response {
    (status, axum::Json(json!({"error": {"message": message, "type": kind, "param": null, "code": code}})))
        .into_response()
}

/// Answers by what the user message asks for, after a pause long enough for the
/// concurrency bound to show.
async fn completions(State(fake): State<Arc<Fake>>, uri: Uri, headers: HeaderMap, body: Bytes) -> Response {
    fake.arrivals.lock().unwrap().push((uri.path().to_string(), headers, body.clone()));
    let now = fake.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
    fake.max_in_flight.fetch_max(now, Ordering::SeqCst);
    let request: Value = serde_json::from_slice(&body).unwrap();
    let user = request["messages"][1]["content"].as_str().unwrap_or_default().to_string();
    let pause = if user.contains("SLOW") { 2_000 } else { 40 };
    tokio::time::sleep(Duration::from_millis(pause)).await;
    fake.in_flight.fetch_sub(1, Ordering::SeqCst);
    let n = fake.served.fetch_add(1, Ordering::SeqCst);
    if user.contains("BAD") {
        openai_error(StatusCode::BAD_REQUEST, "schema rejected", "invalid_request_error", None)
    } else if user.contains("AUTH") {
        openai_error(
            StatusCode::UNAUTHORIZED,
            "Incorrect API key provided",
            "invalid_request_error",
            Some("invalid_api_key"),
        )
    } else if user.contains("LIMIT") {
        let mut response =
            openai_error(StatusCode::TOO_MANY_REQUESTS, "slow down", "requests", Some("rate_limit_exceeded"));
        response.headers_mut().insert("retry-after", "2".parse().unwrap());
        response
    } else if user.contains("BUSY") {
        (StatusCode::SERVICE_UNAVAILABLE, "model is loading").into_response()
    } else if user.contains("GARBAGE") {
        axum::Json(json!({"object": "list", "data": []})).into_response()
    } else {
        axum::Json(completion(n, request["model"].as_str().unwrap_or_default())).into_response()
    }
}

async fn start_fake() -> (String, Arc<Fake>) {
    let fake = Arc::new(Fake::default());
    let app = Router::new().route("/v1/chat/completions", post(completions)).with_state(fake.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (format!("http://{addr}/v1"), fake)
}

fn adapter(base_url: String, configure: impl FnOnce(&mut ChatConfig)) -> ChatCompletions {
    let mut config = ChatConfig::new(base_url, "qwen2.5-7b-instruct");
    configure(&mut config);
    ChatCompletions::new(config).unwrap()
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

async fn submit(provider: &ChatCompletions, members: &[BatchMember]) -> Result<String, ProviderError> {
    let schema = Registry::builtin().get(BUILTIN_CODE_REVIEW).unwrap();
    provider.submit(&BatchSpec { batch_key: "cpb-7", schema: &schema, members }).await
}

async fn drain(provider: &ChatCompletions, job_id: &str) -> (StreamCounts, Vec<ResultLine>) {
    let status = provider.poll(job_id).await.unwrap();
    assert_eq!(status.phase, JobPhase::Completed);
    let (tx, mut rx) = mpsc::channel(4);
    let collect = tokio::spawn(async move {
        let mut lines = Vec::new();
        while let Some(line) = rx.recv().await {
            lines.push(line);
        }
        lines
    });
    let counts = provider.stream_results(&status, &tx).await.unwrap();
    drop(tx);
    (counts, collect.await.unwrap())
}

fn line_for<'a>(lines: &'a [ResultLine], member: &BatchMember) -> &'a LineResult {
    &lines.iter().find(|(id, _)| *id == member.id.to_hex()).unwrap().1
}

#[tokio::test]
async fn each_member_is_one_documented_chat_completion_request() {
    let (base, fake) = start_fake().await;
    let provider = adapter(base, |c| {
        c.api_key = Some(ApiKey::new("sk-local-1".into()));
        c.max_tokens = Some(2048);
    });
    let members = [member("a.rs", "x.unwrap()"), member("b.rs", "// TODO")];
    submit(&provider, &members).await.unwrap();

    let schema = Registry::builtin().get(BUILTIN_CODE_REVIEW).unwrap();
    let arrivals = fake.arrivals.lock().unwrap();
    assert_eq!(arrivals.len(), 2);
    let mut sources = Vec::new();
    for (path, headers, raw) in arrivals.iter() {
        assert_eq!(path, "/v1/chat/completions");
        assert_eq!(headers["authorization"], "Bearer sk-local-1");
        assert_eq!(headers["content-type"], "application/json");
        let body: Value = serde_json::from_slice(raw).unwrap();
        let keys: Vec<&str> = body.as_object().unwrap().keys().map(String::as_str).collect();
        assert_eq!(keys, ["max_tokens", "messages", "model", "response_format"], "no stream, no n, nothing else");
        assert_eq!(body["model"], "qwen2.5-7b-instruct");
        assert_eq!(body["max_tokens"], 2048);
        let messages = body["messages"].as_array().unwrap();
        assert_eq!(messages.len(), 2);
        assert_eq!(messages[0]["role"], "system");
        assert_eq!(messages[0]["content"], schema.instructions());
        assert_eq!(messages[1]["role"], "user");
        let user = messages[1]["content"].as_str().unwrap();
        let member = members.iter().find(|m| user == format!("source_id: {}\n\n{}", m.source_id, m.content)).unwrap();
        sources.push(member.source_id.clone());
        let format = &body["response_format"];
        assert_eq!(format["type"], "json_schema");
        let json_schema = &format["json_schema"];
        assert_eq!(json_schema["strict"], true);
        assert_eq!(json_schema["schema"], *schema.provider_schema(crate::domain::schema::Dialect::OpenAiStrict));
        let name = json_schema["name"].as_str().unwrap();
        assert!(!name.is_empty() && name.len() <= 64);
        assert!(name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-'), "{name}");
    }
    sources.sort();
    assert_eq!(sources, ["a.rs", "b.rs"]);
}

#[tokio::test]
async fn without_a_key_no_authorization_is_sent_and_the_key_never_shows() {
    let (base, fake) = start_fake().await;
    submit(&adapter(base.clone(), |_| {}), &[member("a.rs", "x")]).await.unwrap();
    let (_, headers, raw) = fake.arrivals.lock().unwrap()[0].clone();
    assert!(headers.get("authorization").is_none());
    assert!(serde_json::from_slice::<Value>(&raw).unwrap().get("max_tokens").is_none());
    let keyed = adapter(base, |c| c.api_key = Some(ApiKey::new("sk-secret-9".into())));
    assert!(!format!("{keyed:?}").contains("sk-secret-9"));
}

#[tokio::test]
async fn submit_poll_stream_then_the_job_is_forgotten() {
    let (base, _fake) = start_fake().await;
    let provider = adapter(base, |_| {});
    let members = [member("a.rs", "one"), member("b.rs", "two"), member("c.rs", "GARBAGE")];
    let job_id = submit(&provider, &members).await.unwrap();
    assert!(job_id.starts_with("sync-cpb-7-"), "{job_id}");
    assert_ne!(submit(&provider, &members[..1]).await.unwrap(), job_id, "every submit is a fresh job");

    let (counts, lines) = drain(&provider, &job_id).await;
    assert_eq!(counts, StreamCounts { lines: 3, malformed: 1 });
    assert_eq!(lines.len(), 2, "the member without a completion is left to be requeued");
    for member in &members[..2] {
        let LineResult::Answer { output, usage } = line_for(&lines, member) else { panic!("{lines:?}") };
        assert_eq!(output, r#"{"findings":[]}"#);
        let usage = usage.as_ref().unwrap();
        assert_eq!(usage.model, "qwen2.5-7b-instruct");
        assert_eq!((usage.input_tokens, usage.output_tokens), (30, 7));
        assert_eq!((usage.cached_input_tokens, usage.reasoning_tokens), (16, 2));
        assert!(usage.request_id.as_deref().unwrap().starts_with("chatcmpl-"));
    }
    assert_eq!(provider.poll(&job_id).await.unwrap_err().class, ErrorClass::Gone);
    let status = JobStatus { job_id: job_id.clone(), phase: JobPhase::Completed, result_files: Vec::new() };
    let (tx, _rx) = mpsc::channel(4);
    assert_eq!(provider.stream_results(&status, &tx).await.unwrap_err().class, ErrorClass::Gone);
}

#[tokio::test]
async fn an_interrupted_stream_keeps_the_answers() {
    let (base, _fake) = start_fake().await;
    let provider = adapter(base, |_| {});
    let job_id = submit(&provider, &[member("a.rs", "one"), member("b.rs", "two")]).await.unwrap();
    let status = provider.poll(&job_id).await.unwrap();
    let (tx, rx) = mpsc::channel(1);
    drop(rx);
    assert_eq!(provider.stream_results(&status, &tx).await.unwrap_err().class, ErrorClass::Transient);
    let (counts, lines) = drain(&provider, &job_id).await;
    assert_eq!((counts.lines, lines.len()), (2, 2));
}

#[tokio::test]
async fn concurrency_bound_is_respected_and_used() {
    let (base, fake) = start_fake().await;
    let provider = adapter(base, |c| c.concurrency = 3);
    let members: Vec<BatchMember> = (0..12).map(|i| member(&format!("f{i}.rs"), &format!("body {i}"))).collect();
    let job_id = submit(&provider, &members).await.unwrap();
    assert_eq!(fake.served.load(Ordering::SeqCst), 12);
    assert_eq!(fake.max_in_flight.load(Ordering::SeqCst), 3, "never more than the bound, and the bound is reached");
    assert_eq!(drain(&provider, &job_id).await.1.len(), 12);
    assert_eq!(ChatConfig::new("http://x/v1", "m").concurrency, 4);
}

#[tokio::test]
async fn one_members_failure_does_not_sink_the_others() {
    let (base, _fake) = start_fake().await;
    let provider = adapter(base, |c| c.request_timeout = Duration::from_millis(500));
    let members = [
        member("ok.rs", "fine"),
        member("bad.rs", "BAD"),
        member("busy.rs", "BUSY"),
        member("limit.rs", "LIMIT"),
        member("slow.rs", "SLOW"),
    ];
    let job_id = submit(&provider, &members).await.unwrap();
    let (counts, lines) = drain(&provider, &job_id).await;
    assert_eq!(counts, StreamCounts { lines: 5, malformed: 0 });
    assert!(matches!(line_for(&lines, &members[0]), LineResult::Answer { .. }));
    let LineResult::Refused { class, reason } = line_for(&lines, &members[1]) else { panic!("{lines:?}") };
    assert_eq!(*class, FailureClass::InvalidRequest);
    assert!(reason.contains("400") && reason.contains("schema rejected"), "{reason}");
    for retried in &members[2..] {
        assert!(matches!(line_for(&lines, retried), LineResult::Retry { .. }), "{}: {lines:?}", retried.source_id);
    }
    let LineResult::Retry { reason } = line_for(&lines, &members[4]) else { unreachable!() };
    assert!(reason.contains("timed out"), "{reason}");
}

#[tokio::test]
async fn unauthorized_stops_the_submit_as_auth() {
    let (base, _fake) = start_fake().await;
    let provider = adapter(base, |c| c.concurrency = 1);
    let members = [member("a.rs", "fine"), member("b.rs", "AUTH"), member("c.rs", "fine too")];
    let err = submit(&provider, &members).await.unwrap_err();
    assert_eq!(err.class, ErrorClass::Auth);
    assert_eq!(err.status, Some(401));
    assert!(provider.jobs().is_empty(), "no job is kept for a stopped submit");
}

#[tokio::test]
async fn a_batch_without_any_answer_backs_off_as_told() {
    let (base, _fake) = start_fake().await;
    let provider = adapter(base, |_| {});
    let err = submit(&provider, &[member("a.rs", "LIMIT"), member("b.rs", "BUSY")]).await.unwrap_err();
    assert_eq!(err.class, ErrorClass::RateLimited);
    assert_eq!(err.retry_after, Some(Duration::from_secs(2)));
    let err = submit(&provider, &[member("c.rs", "BUSY")]).await.unwrap_err();
    assert_eq!(err.class, ErrorClass::Transient);
}

#[tokio::test]
async fn unknown_and_cancelled_jobs_are_gone() {
    let (base, _fake) = start_fake().await;
    let provider = adapter(base, |_| {});
    let err = provider.poll("sync-cpb-1-00000000000000aa").await.unwrap_err();
    assert_eq!(err.class, ErrorClass::Gone);
    let job_id = submit(&provider, &[member("a.rs", "one")]).await.unwrap();
    provider.cancel(&job_id).await.unwrap();
    assert_eq!(provider.poll(&job_id).await.unwrap_err().class, ErrorClass::Gone);
    let intent = IntentRef { batch_key: "cpb-7", created_at_ms: 0, members: &[], known_jobs: &[] };
    assert_eq!(provider.find_job(&intent).await.unwrap(), Lookup::Absent);
}
