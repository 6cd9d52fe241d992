//! `[providers.generic]` through the server against a fake of the generic REST batch
//! contract (PROVIDERS.md §4) over real HTTP: `POST /v1/ai/batch/submit` deduplicated by
//! `Idempotency-Key`, `GET /v1/ai/batch/status/{id}`, every answer in an `{ok, data,
//! error, metadata}` envelope. The fake answers with the simulator's rule-based reviewer,
//! so the corpus's findings are known.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde_json::{Value, json};

use crate::provider::{
    CORPUS, assert_all_committed_with_model_findings, assert_report_counts, corpus_ids, counter, expected_id, finish,
    health, intake_corpus, settle, settle_failed,
};
use crate::providers_e2e::{KEY, KEY_ENV, ONE_BATCH, assert_billed_by, expect_crash, serve, write_config};
use crate::util::{Server, id_of, temp_dir};

/// What the fake charges per answered item, in USD (as `metadata.cost_usd`).
const ITEM_COST_USD: f64 = 0.000_25;
const ITEM_COST_MICROS: u64 = 250;

#[derive(Debug, Clone)]
struct Submit {
    idempotency_key: Option<String>,
    body: Bytes,
}

#[derive(Debug)]
struct Batch {
    id: String,
    items: Vec<Value>,
    polls: usize,
}

/// How the fake answers.
#[derive(Debug, Default, Clone, Copy)]
struct Script {
    /// Submits answered `503 SERVICE_UNAVAILABLE` (retryable) before one is accepted.
    unavailable_first: usize,
    /// Every submit refused with this status and a non-retryable code.
    refuse: Option<(StatusCode, &'static str)>,
    /// Results as JSONL behind `data.results_url` instead of inline in the status.
    results_by_url: bool,
}

#[derive(Debug, Default)]
struct Fake {
    script: Script,
    submits: Mutex<Vec<Submit>>,
    unavailable_served: AtomicUsize,
    /// Idempotency key → the one batch it created.
    batches: Mutex<BTreeMap<String, Batch>>,
}

fn envelope(data: Value) -> Response {
    let metadata = json!({"cost_usd": 0.0, "latency_ms": 3, "vendor": "fake", "cache_hit": false,
        "request_id": "0190a000-0000-7000-8000-000000000001"});
    axum::Json(json!({"ok": true, "data": data, "error": null, "metadata": metadata})).into_response()
}

fn error_envelope(status: StatusCode, code: &str, retryable: bool) -> Response {
    let error = json!({"code": code, "message": format!("{code} (fake)"), "retryable": retryable});
    (status, axum::Json(json!({"ok": false, "data": null, "error": error, "metadata": null}))).into_response()
}

fn authorized(headers: &HeaderMap) -> bool {
    headers.get("authorization").and_then(|v| v.to_str().ok()) == Some(&format!("Bearer {KEY}"))
}

async fn submit(State(fake): State<Arc<Fake>>, headers: HeaderMap, body: Bytes) -> Response {
    if !authorized(&headers) {
        return error_envelope(StatusCode::UNAUTHORIZED, "UNAUTHORIZED", false);
    }
    let idempotency_key = headers.get("idempotency-key").and_then(|v| v.to_str().ok()).map(str::to_string);
    fake.submits.lock().expect("submits").push(Submit { idempotency_key: idempotency_key.clone(), body: body.clone() });
    if fake.unavailable_served.load(Ordering::SeqCst) < fake.script.unavailable_first {
        fake.unavailable_served.fetch_add(1, Ordering::SeqCst);
        return error_envelope(StatusCode::SERVICE_UNAVAILABLE, "SERVICE_UNAVAILABLE", true);
    }
    if let Some((status, code)) = fake.script.refuse {
        return error_envelope(status, code, false);
    }
    let Ok(request) = serde_json::from_slice::<Value>(&body) else {
        return error_envelope(StatusCode::BAD_REQUEST, "INVALID_PARAMS", false);
    };
    // Creating a resource needs an explicit key; header and body must agree.
    let Some(key) = idempotency_key.filter(|k| request["idempotency_key"] == json!(k)) else {
        return error_envelope(StatusCode::BAD_REQUEST, "INVALID_PARAMS", false);
    };
    let Some(items) = request["requests"].as_array().filter(|items| !items.is_empty()).cloned() else {
        return error_envelope(StatusCode::BAD_REQUEST, "INVALID_PARAMS", false);
    };
    let mut batches = fake.batches.lock().expect("batches");
    let next_id = format!("bat_{}", batches.len() + 1);
    let count = items.len();
    let batch = batches.entry(key).or_insert(Batch { id: next_id, items, polls: 0 });
    envelope(json!({"batch_id": batch.id, "state": "queued", "total_count": count, "estimated_cost_usd": 0.01}))
}

/// The completion the reviewer gives one request item, as a result item.
fn result_item(index: usize, item: &Value) -> Value {
    let review = commitpoint::simulator::answer_chat_body(&item["body"]);
    let completion = json!({"id": format!("chatcmpl-{index}"), "object": "chat.completion", "created": 1,
        "model": item["body"]["model"], "choices": [{"index": 0, "finish_reason": "stop",
        "message": {"role": "assistant", "content": review.to_string()}}],
        "usage": {"prompt_tokens": 40, "completion_tokens": 12, "total_tokens": 52}});
    json!({"custom_id": item["custom_id"], "ok": true, "data": completion, "error": null,
        "metadata": {"cost_usd": ITEM_COST_USD, "request_id": format!("req-{index}")}})
}

async fn status(State(fake): State<Arc<Fake>>, headers: HeaderMap, Path(id): Path<String>) -> Response {
    if !authorized(&headers) {
        return error_envelope(StatusCode::UNAUTHORIZED, "UNAUTHORIZED", false);
    }
    let mut batches = fake.batches.lock().expect("batches");
    let Some(batch) = batches.values_mut().find(|b| b.id == id) else {
        return error_envelope(StatusCode::NOT_FOUND, "BATCH_NOT_FOUND", false);
    };
    batch.polls += 1;
    if batch.polls < 2 {
        return envelope(json!({"batch_id": id, "state": "running", "completed_count": 0}));
    }
    let mut data = json!({"batch_id": id, "state": "completed", "completed_count": batch.items.len()});
    if fake.script.results_by_url {
        data["results_url"] = json!(format!("/v1/ai/batch/results/{id}"));
    } else {
        data["results"] = batch.items.iter().enumerate().map(|(i, item)| result_item(i, item)).collect();
    }
    envelope(data)
}

async fn results(State(fake): State<Arc<Fake>>, headers: HeaderMap, Path(id): Path<String>) -> Response {
    if !authorized(&headers) {
        return error_envelope(StatusCode::UNAUTHORIZED, "UNAUTHORIZED", false);
    }
    let batches = fake.batches.lock().expect("batches");
    let Some(batch) = batches.values().find(|b| b.id == id) else {
        return error_envelope(StatusCode::NOT_FOUND, "BATCH_NOT_FOUND", false);
    };
    batch
        .items
        .iter()
        .enumerate()
        .map(|(i, item)| format!("{}\n", result_item(i, item)))
        .collect::<String>()
        .into_response()
}

async fn start_fake(script: Script) -> (String, Arc<Fake>) {
    let fake = Arc::new(Fake { script, ..Fake::default() });
    let app = Router::new()
        .route("/v1/ai/batch/submit", post(submit))
        .route("/v1/ai/batch/status/{id}", get(status))
        .route("/v1/ai/batch/results/{id}", get(results))
        .with_state(Arc::clone(&fake));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind the fake");
    let addr = listener.local_addr().expect("fake address");
    tokio::spawn(async move { axum::serve(listener, app).await.expect("fake server") });
    (format!("http://{addr}"), fake)
}

/// The fake, and a data directory whose config routes everything to `[providers.generic]` at it.
struct Rig {
    fake: Arc<Fake>,
    dir: tempfile::TempDir,
    config: String,
}

impl Rig {
    async fn start(script: Script) -> Rig {
        let (base, fake) = start_fake(script).await;
        let dir = temp_dir();
        let sections =
            format!("[providers.generic]\nbase_url = \"{base}\"\nmodel = \"gpt-e2e\"\napi_key_env = \"{KEY_ENV}\"\n");
        let config = write_config(dir.path(), &sections, "generic");
        Rig { fake, dir, config }
    }

    fn serve(&self, failpoint: Option<&str>) -> Server {
        serve(self.dir.path(), &self.config, ONE_BATCH, failpoint)
    }

    fn submits(&self) -> Vec<Submit> {
        self.fake.submits.lock().expect("submits").clone()
    }

    fn batches(&self) -> usize {
        self.fake.batches.lock().expect("batches").len()
    }
}

/// The custom ids of every request item of every batch the fake holds, with their counts.
fn submitted_items(rig: &Rig) -> BTreeMap<String, usize> {
    let mut seen = BTreeMap::new();
    for batch in rig.fake.batches.lock().expect("batches").values() {
        for item in &batch.items {
            *seen.entry(item["custom_id"].as_str().expect("custom_id").to_string()).or_default() += 1;
        }
    }
    seen
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn generic_rest_commits_the_corpus_once_with_the_providers_cost() {
    let rig = Rig::start(Script::default()).await;
    let server = rig.serve(None);
    let api = server.api();
    let ids = intake_corpus(&api).await;

    assert_all_committed_with_model_findings(&api).await;
    let records = settle(&api, &ids).await;
    assert!(records.values().all(|r| r["attempts"] == json!(1)), "{records:#?}");
    assert_eq!((rig.submits().len(), rig.batches()), (1, 1), "one submit, no retry, one job");
    let items = submitted_items(&rig);
    assert_eq!(items.keys().cloned().collect::<BTreeSet<_>>(), corpus_ids());
    assert!(items.values().all(|n| *n == 1), "{items:?}");
    // Canonical JSON: one line, keys sorted, a trailing newline.
    let body = String::from_utf8(rig.submits()[0].body.to_vec()).expect("UTF-8 body");
    let parsed: Value = serde_json::from_str(&body).expect("JSON body");
    assert_eq!(format!("{}\n", serde_json::to_string(&parsed).expect("json")), body);

    // Each item's own `metadata.cost_usd` is what the ledger charges.
    assert_billed_by(&api, &ids, "generic").await;
    for source in CORPUS {
        let reply = api.get(&format!("/v1/extractions/{}/costs", expected_id(source))).await;
        let attempts = reply.body["attempts"].as_array().expect("attempts");
        assert_eq!(attempts.len(), 1, "{:#}", reply.body);
        assert_eq!(attempts[0]["cost_source"], json!("provider"), "{:#}", reply.body);
        assert_eq!(attempts[0]["cost_micros"], json!(ITEM_COST_MICROS), "{:#}", reply.body);
        assert!(attempts[0]["request_id"].as_str().is_some_and(|r| r.starts_with("req-")), "{:#}", reply.body);
    }
    let health = health(&api).await;
    assert_eq!(health["name"], json!("generic"), "{health:#}");
    assert_eq!(counter(&health, "batches_submitted"), 1, "{health:#}");
    assert_eq!(counter(&health, "lines_ingested"), CORPUS.len() as u64, "{health:#}");
    assert_eq!(counter(&health, "batches_closed"), 1, "{health:#}");

    let report = finish(server);
    assert_report_counts(&report, CORPUS.len(), &[&format!("committed: {}", CORPUS.len())]);
}

/// Asserts every submit carried one key, as header and body field, and one body.
fn assert_one_key_one_body(submits: &[Submit]) {
    let key = submits[0].idempotency_key.clone().expect("an Idempotency-Key header");
    assert!(!key.is_empty());
    for (n, submit) in submits.iter().enumerate() {
        assert_eq!(submit.idempotency_key.as_deref(), Some(key.as_str()), "submit {n}: the same key");
        assert_eq!(submit.body, submits[0].body, "submit {n}: a byte-identical body");
        let body: Value = serde_json::from_slice(&submit.body).expect("a JSON body");
        assert_eq!(body["idempotency_key"], json!(key), "submit {n}: the body names the same key");
    }
}

/// The fake answers the first two submits 503: the third is the same request, byte for
/// byte, under the same `Idempotency-Key`, so the provider could deduplicate it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn generic_rest_retries_one_submit_under_one_idempotency_key() {
    let rig = Rig::start(Script { unavailable_first: 2, results_by_url: true, ..Script::default() }).await;
    let server = rig.serve(None);
    let api = server.api();
    let ids = intake_corpus(&api).await;

    assert_all_committed_with_model_findings(&api).await;
    let submits = rig.submits();
    assert_eq!(submits.len(), 3, "two 503s, then the accepted submit");
    assert_one_key_one_body(&submits);
    assert_eq!(rig.batches(), 1, "one job at the provider");
    assert_eq!(submitted_items(&rig).keys().cloned().collect::<BTreeSet<_>>(), ids);
    let records = settle(&api, &ids).await;
    assert!(records.values().all(|r| r["attempts"] == json!(1)), "a failed submit is no new attempt: {records:#?}");
    let health = health(&api).await;
    assert_eq!(counter(&health, "batches_submitted"), 1, "{health:#}");
    assert!(health["last_error"].as_str().is_some_and(|e| e.contains("SERVICE_UNAVAILABLE")), "{health:#}");

    let report = finish(server);
    assert_report_counts(&report, CORPUS.len(), &[&format!("committed: {}", CORPUS.len())]);
}

/// The contract has no lookup by key: after a kill between the accepted submit and
/// storing the batch id, the restart submits again under the same key, and the
/// provider's deduplication hands back the job it already has.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn generic_rest_kill_before_the_batch_id_is_stored_resubmits_under_the_same_key() {
    let rig = Rig::start(Script::default()).await;
    let mut server = rig.serve(Some("after-submit-before-job-id"));
    intake_corpus(&server.api()).await;
    expect_crash(&mut server, "after-submit-before-job-id");
    assert_eq!((rig.submits().len(), rig.batches()), (1, 1));

    let server = rig.serve(None);
    let api = server.api();
    assert_all_committed_with_model_findings(&api).await;
    let submits = rig.submits();
    assert_eq!(submits.len(), 2, "one more submit after the restart");
    assert_one_key_one_body(&submits);
    assert_eq!(rig.batches(), 1, "the provider deduplicated the second submit");
    let items = submitted_items(&rig);
    assert_eq!(items.keys().cloned().collect::<BTreeSet<_>>(), corpus_ids());
    assert!(items.values().all(|n| *n == 1), "{items:?}");
    let records = settle(&api, &corpus_ids()).await;
    assert!(records.values().all(|r| r["attempts"] == json!(1)), "{records:#?}");

    let report = finish(server);
    assert_report_counts(&report, CORPUS.len(), &[&format!("committed: {}", CORPUS.len())]);
}

/// `INVALID_PARAMS` with `retryable: false` is the provider refusing the request itself:
/// retrying cannot help, so the members fail at once, as `invalid_request`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn generic_rest_non_retryable_error_envelope_fails_the_members() {
    let rig =
        Rig::start(Script { refuse: Some((StatusCode::BAD_REQUEST, "INVALID_PARAMS")), ..Script::default() }).await;
    let server = rig.serve(None);
    let api = server.api();
    let ids = intake_corpus(&api).await;

    // The provider's code is kept in the reason.
    let records = settle_failed(&api, &ids, "invalid_request", &["INVALID_PARAMS"]).await;
    for record in records.values() {
        let findings = api.findings(&id_of(record)).await;
        assert_eq!(findings["findings"], json!([]), "{findings:#}");
    }
    // Not retried, now or later.
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert_eq!(rig.submits().len(), 1, "a non-retryable refusal was retried");
    assert_eq!(rig.batches(), 0);
    let health = health(&api).await;
    assert_eq!(counter(&health, "batches_submitted"), 0, "{health:#}");
    assert!(health["last_error"].as_str().is_some_and(|e| e.contains("INVALID_PARAMS")), "{health:#}");
    assert!(health["paused_until_ms"].is_null(), "a refused request is no reason to pause: {health:#}");

    let report = finish(server);
    assert_report_counts(&report, CORPUS.len(), &[&format!("failed: {}", CORPUS.len())]);
}
