//! `[providers.chat]` through the server against a fake OpenAI-compatible
//! `POST /v1/chat/completions` (as vLLM, llama.cpp or Ollama serve it) that answers with
//! the simulator's rule-based reviewer and counts its calls per source. The answers live
//! only in the server's memory until committed, so a kill costs a repeated call, never a
//! second commit.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use axum::Router;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use serde_json::{Value, json};

use crate::provider::{
    CORPUS, assert_all_committed_with_model_findings, assert_report_counts, corpus_ids, counter, finish, health,
    intake_corpus, settle,
};
use crate::providers_e2e::{KEY, KEY_ENV, ONE_BATCH, assert_billed_by, expect_crash, serve, write_config};
use crate::util::{Server, assert_verifies, temp_dir};

const MODEL: &str = "qwen-e2e";

#[derive(Debug, Default)]
struct Fake {
    /// source id → completion calls answered for it.
    calls: Mutex<BTreeMap<String, u64>>,
    /// Every request body, in arrival order.
    bodies: Mutex<Vec<Value>>,
}

impl Fake {
    fn calls(&self) -> BTreeMap<String, u64> {
        self.calls.lock().expect("calls").clone()
    }
}

async fn completions(State(fake): State<Arc<Fake>>, headers: HeaderMap, body: axum::body::Bytes) -> Response {
    if headers.get("authorization").and_then(|v| v.to_str().ok()) != Some(&format!("Bearer {KEY}")) {
        let error = json!({"error": {"message": "Incorrect API key", "type": "invalid_request_error",
            "param": null, "code": "invalid_api_key"}});
        return (StatusCode::UNAUTHORIZED, axum::Json(error)).into_response();
    }
    let Ok(body) = serde_json::from_slice::<Value>(&body) else {
        let error = json!({"error": {"message": "not JSON", "type": "invalid_request_error", "code": null}});
        return (StatusCode::BAD_REQUEST, axum::Json(error)).into_response();
    };
    let prompt = body["messages"].as_array().and_then(|m| m.last()).and_then(|m| m["content"].as_str());
    let prompt = prompt.unwrap_or_default().to_string();
    let (header, content) = prompt.split_once("\n\n").unwrap_or(("", &prompt));
    let source_id = header.strip_prefix("source_id: ").unwrap_or("unknown").to_string();
    let review = commitpoint::simulator::review(&source_id, content);
    let n = {
        let mut calls = fake.calls.lock().expect("calls");
        let n = calls.entry(source_id).or_default();
        *n += 1;
        *n
    };
    fake.bodies.lock().expect("bodies").push(body.clone());
    axum::Json(json!({
        "id": format!("chatcmpl-{n}-{}", prompt.len()),
        "object": "chat.completion",
        "created": 1_700_000_000,
        "model": body["model"],
        "choices": [{"index": 0, "finish_reason": "stop", "logprobs": null,
            "message": {"role": "assistant", "content": review.to_string()}}],
        "usage": {"prompt_tokens": 64, "completion_tokens": 16, "total_tokens": 80},
    }))
    .into_response()
}

/// The fake, and a data directory whose config routes everything to `[providers.chat]` at it.
struct Rig {
    fake: Arc<Fake>,
    dir: tempfile::TempDir,
    config: String,
}

impl Rig {
    async fn start() -> Rig {
        let fake = Arc::new(Fake::default());
        let app = Router::new().route("/v1/chat/completions", post(completions)).with_state(Arc::clone(&fake));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind the fake");
        let addr = listener.local_addr().expect("fake address");
        tokio::spawn(async move { axum::serve(listener, app).await.expect("fake server") });
        let dir = temp_dir();
        let sections = format!(
            "[providers.chat]\nbase_url = \"http://{addr}/v1\"\nmodel = \"{MODEL}\"\nconcurrency = 2\napi_key_env = \"{KEY_ENV}\"\n"
        );
        let config = write_config(dir.path(), &sections, "chat");
        Rig { fake, dir, config }
    }

    fn serve(&self, failpoint: Option<&str>) -> Server {
        serve(self.dir.path(), &self.config, ONE_BATCH, failpoint)
    }

    fn db(&self) -> std::path::PathBuf {
        self.dir.path().join("commitpoint.redb")
    }

    /// Asserts every corpus source was answered `times` times (by the fake's count).
    fn assert_calls(&self, times: impl Fn(u64) -> bool, what: &str) -> BTreeMap<String, u64> {
        let calls = self.fake.calls();
        let sources: Vec<&str> = calls.keys().map(String::as_str).collect();
        let mut want: Vec<&str> = CORPUS.iter().map(|s| s.id).collect();
        want.sort_unstable();
        assert_eq!(sources, want, "calls came for exactly the corpus: {calls:?}");
        assert!(calls.values().all(|n| times(*n)), "{what}: {calls:?}");
        calls
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chat_completions_commit_the_corpus_with_one_call_per_source() {
    let rig = Rig::start().await;
    let server = rig.serve(None);
    let api = server.api();
    let ids = intake_corpus(&api).await;

    assert_all_committed_with_model_findings(&api).await;
    let records = settle(&api, &ids).await;
    assert!(records.values().all(|r| r["attempts"] == json!(1)), "{records:#?}");
    rig.assert_calls(|n| n == 1, "one call per source");
    for body in rig.fake.bodies.lock().expect("bodies").iter() {
        assert_eq!(body["model"], json!(MODEL), "{body:#}");
        assert_eq!(body["response_format"]["type"], json!("json_schema"), "{body:#}");
        assert_eq!(body["response_format"]["json_schema"]["strict"], json!(true), "{body:#}");
    }
    assert_billed_by(&api, &ids, "chat").await;
    let health = health(&api).await;
    assert_eq!(health["name"], json!("chat"), "{health:#}");
    assert_eq!(counter(&health, "lines_ingested"), CORPUS.len() as u64, "{health:#}");
    assert_eq!(counter(&health, "members_requeued"), 0, "{health:#}");

    let report = finish(server);
    assert_report_counts(&report, CORPUS.len(), &[&format!("committed: {}", CORPUS.len())]);
}

/// Every answer was in when the process died at `point`; the restart commits each source
/// exactly once, having asked the model at most once more. Returns the calls per source.
async fn kill_at_and_restart(point: &str, state_at_crash: &str) -> BTreeMap<String, u64> {
    let rig = Rig::start().await;
    let mut server = rig.serve(Some(point));
    intake_corpus(&server.api()).await;
    expect_crash(&mut server, point);
    rig.assert_calls(|n| n == 1, "every source answered once before the kill");
    let report = assert_verifies(&rig.db());
    assert_report_counts(&report, CORPUS.len(), &[&format!("{state_at_crash}: {}", CORPUS.len())]);

    let server = rig.serve(None);
    let api = server.api();
    assert_all_committed_with_model_findings(&api).await;
    let calls = rig.assert_calls(|n| (1..=2).contains(&n), "at most one more call per source after the restart");
    // Each committed extraction is billed for the answer it committed, once.
    for id in corpus_ids() {
        let reply = api.get(&format!("/v1/extractions/{id}/costs")).await;
        let fresh =
            reply.body["attempts"].as_array().expect("attempts").iter().filter(|a| a["kind"] == "fresh").count();
        assert_eq!(fresh, 1, "{:#}", reply.body);
    }

    let report = finish(server);
    assert_report_counts(&report, CORPUS.len(), &[&format!("committed: {}", CORPUS.len())]);
    let findings: usize = CORPUS.iter().map(|s| s.findings.len()).sum();
    assert!(report.contains(&format!("findings: {findings}\n")), "findings stored once each: {report}");
    calls
}

/// The answers died with the process before the job id was stored: the intent is
/// submitted again, which for a synchronous server means asking again, once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chat_kill_after_the_answers_before_the_job_id_asks_once_more_and_commits_once() {
    let calls = kill_at_and_restart("after-submit-before-job-id", "submitted").await;
    assert!(calls.values().all(|n| *n == 2), "the lost answers were asked for again: {calls:?}");
}

/// Ingestion judged and committed the answers as it took them, before the kill: the
/// restart asks for none again and commits none twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chat_kill_after_staging_before_commit_commits_each_answer_once() {
    let calls = kill_at_and_restart("after-stage-before-commit", "committed").await;
    assert!(calls.values().all(|n| *n == 1), "a staged answer is not asked for again: {calls:?}");
}
