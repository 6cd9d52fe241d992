//! The Gemini dialect's wire details a plain HTTP client sees: Google's error body, the
//! key checks, request validation, operations, paging, uploads and downloads.

use std::time::{Duration, Instant};

use reqwest::{Client, StatusCode};
use serde_json::{Value, json};

use crate::simulator::{Dialect, Faults, Simulator, SimulatorConfig};

const KEY: &str = "AIza-wire";

async fn start(faults: Faults) -> (Simulator, Client, String) {
    let config = SimulatorConfig {
        dialect: Dialect::Gemini,
        api_key: Some(KEY.into()),
        complete_after: Duration::from_millis(100),
        faults,
        ..Default::default()
    };
    let sim = Simulator::start(([127, 0, 0, 1], 0).into(), config).await.unwrap();
    let base = sim.base_url();
    (sim, Client::new(), base)
}

fn request(text: &str) -> Value {
    json!({"contents": [{"role": "user", "parts": [{"text": text}]}],
        "generationConfig": {"responseMimeType": "application/json", "responseJsonSchema": {"type": "object"}}})
}

fn batch(display_name: &str, keys: &[&str]) -> Value {
    let requests: Vec<Value> =
        keys.iter().map(|k| json!({"request": request("source_id: a.rs\n\nTODO"), "metadata": {"key": k}})).collect();
    json!({"batch": {"displayName": display_name, "inputConfig": {"requests": {"requests": requests}}}})
}

async fn send(request: reqwest::RequestBuilder) -> (StatusCode, Value) {
    let response = request.header("x-goog-api-key", KEY).send().await.unwrap();
    let status = response.status();
    (status, response.json().await.unwrap_or(Value::Null))
}

fn assert_google_error(body: &Value, code: u16, status: &str, words: &str) {
    let error = &body["error"];
    assert_eq!((error["code"].as_u64(), error["status"].as_str()), (Some(u64::from(code)), Some(status)), "{body:#}");
    assert!(error["message"].as_str().unwrap().contains(words), "{body:#}");
}

#[tokio::test]
async fn keys_are_checked_in_googles_words() {
    let (_sim, client, base) = start(Faults::default()).await;
    let url = format!("{base}/v1beta/batches");
    let response = client.get(&url).send().await.unwrap();
    assert_eq!(response.status(), StatusCode::FORBIDDEN);
    assert_google_error(&response.json().await.unwrap(), 403, "PERMISSION_DENIED", "unregistered callers");
    let response = client.get(&url).header("x-goog-api-key", "AIza-other").send().await.unwrap();
    let body: Value = response.json().await.unwrap();
    assert_google_error(&body, 400, "INVALID_ARGUMENT", "API key not valid");
    assert_eq!(body["error"]["details"][0]["reason"], "API_KEY_INVALID");
    let by_query = client.get(format!("{url}?key={KEY}")).send().await.unwrap();
    assert_eq!(by_query.status(), StatusCode::OK, "the key may travel as ?key=");
}

#[tokio::test]
async fn creates_are_validated_and_answered_with_a_pending_operation() {
    let (sim, client, base) = start(Faults::default()).await;
    let url = format!("{base}/v1beta/models/gemini-wire:batchGenerateContent");
    let mut nameless = batch("x", &["a"]);
    nameless["batch"].as_object_mut().unwrap().remove("displayName");
    let (status, body) = send(client.post(&url).json(&nameless)).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_google_error(&body, 400, "INVALID_ARGUMENT", "display_name");
    let mut no_mime = batch("x", &["a"]);
    no_mime["batch"]["inputConfig"]["requests"]["requests"][0]["request"]["generationConfig"]
        .as_object_mut()
        .unwrap()
        .remove("responseMimeType");
    let (_, body) = send(client.post(&url).json(&no_mime)).await;
    assert_google_error(&body, 400, "INVALID_ARGUMENT", "requests[0].request: GenerationConfig.response_mime_type");
    let huge = "x".repeat(21 * 1024 * 1024);
    let (status, body) = send(client.post(&url).json(&batch("x", &[&huge]))).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_google_error(&body, 400, "INVALID_ARGUMENT", "Request payload size exceeds the limit: 20971520 bytes.");
    assert_eq!(sim.stats().batches_created, 0);

    let (status, op) = send(client.post(&url).json(&batch("mine", &["a", "b"]))).await;
    assert_eq!(status, StatusCode::OK, "{op:#}");
    let name = op["name"].as_str().unwrap();
    assert!(name.starts_with("batches/"));
    assert_eq!(op["metadata"]["state"], "BATCH_STATE_PENDING");
    assert_eq!(op["metadata"]["displayName"], "mine");
    assert_eq!(op["metadata"]["model"], "models/gemini-wire");
    assert_eq!(op["metadata"]["batchStats"]["requestCount"], "2", "int64 as a string");
    assert!(op.get("done").is_none(), "{op:#}");

    let deadline = Instant::now() + Duration::from_secs(10);
    let done = loop {
        let (_, op) = send(client.get(format!("{base}/v1beta/{name}"))).await;
        if op["done"] == true {
            break op;
        }
        assert!(Instant::now() < deadline, "{op:#}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(done["metadata"]["state"], "BATCH_STATE_SUCCEEDED");
    let entries = done["metadata"]["output"]["inlinedResponses"]["inlinedResponses"].as_array().unwrap();
    assert_eq!(entries.iter().map(|e| &e["metadata"]["key"]).collect::<Vec<_>>(), [&json!("a"), &json!("b")]);
    assert_eq!(done["response"]["inlinedResponses"], done["metadata"]["output"]["inlinedResponses"]);
    let (status, body) = send(client.post(format!("{base}/v1beta/{name}:cancel"))).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_google_error(&body, 400, "FAILED_PRECONDITION", "terminal state");
}

#[tokio::test]
async fn lists_page_with_tokens_newest_first() {
    let (_sim, client, base) = start(Faults { foreign_batches: 3, ..Faults::default() }).await;
    let create = format!("{base}/v1beta/models/m:batchGenerateContent");
    for name in ["first", "second"] {
        assert_eq!(send(client.post(&create).json(&batch(name, &["k"]))).await.0, StatusCode::OK);
    }
    let (_, page) = send(client.get(format!("{base}/v1beta/batches?pageSize=4"))).await;
    let names: Vec<&str> =
        page["operations"].as_array().unwrap().iter().map(|o| o["metadata"]["displayName"].as_str().unwrap()).collect();
    assert_eq!(names, ["someone-else-0", "someone-else-1", "someone-else-2", "second"]);
    let token = page["nextPageToken"].as_str().unwrap();
    let (_, last) = send(client.get(format!("{base}/v1beta/batches?pageSize=4&pageToken={token}"))).await;
    assert_eq!(last["operations"][0]["metadata"]["displayName"], "first");
    assert!(last.get("nextPageToken").is_none(), "{last:#}");
    let (status, body) = send(client.get(format!("{base}/v1beta/batches?pageToken=forged"))).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_google_error(&body, 400, "INVALID_ARGUMENT", "page token");
}

#[tokio::test]
async fn resumable_uploads_check_offsets_and_sizes_and_downloads_need_alt_media() {
    let (_sim, client, base) = start(Faults::default()).await;
    let line = json!({"key": "k1", "request": request("source_id: a.rs\n\nTODO")}).to_string() + "\n";
    let start = |length: usize| {
        client
            .post(format!("{base}/upload/v1beta/files"))
            .header("x-goog-api-key", KEY)
            .header("X-Goog-Upload-Protocol", "resumable")
            .header("X-Goog-Upload-Command", "start")
            .header("X-Goog-Upload-Header-Content-Length", length.to_string())
            .json(&json!({"file": {"displayName": "in"}}))
    };
    let started = start(line.len()).send().await.unwrap();
    assert_eq!(started.headers()["x-goog-upload-status"], "active");
    let url = started.headers()["x-goog-upload-url"].to_str().unwrap().to_string();
    let chunk = |offset: usize, command: &str, bytes: String| {
        client
            .post(&url)
            .header("x-goog-api-key", KEY)
            .header("X-Goog-Upload-Command", command.to_string())
            .header("X-Goog-Upload-Offset", offset.to_string())
            .body(bytes)
    };
    let (status, body) = send(chunk(5, "upload, finalize", line.clone())).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_google_error(&body, 400, "INVALID_ARGUMENT", "X-Goog-Upload-Offset must be 0");
    let (head, tail) = line.split_at(10);
    assert_eq!(send(chunk(0, "upload", head.to_string())).await.0, StatusCode::OK);
    let finished = chunk(10, "upload, finalize", tail.to_string()).send().await.unwrap();
    assert_eq!(finished.headers()["x-goog-upload-status"], "final");
    let file: Value = finished.json().await.unwrap();
    let name = file["file"]["name"].as_str().unwrap();
    assert_eq!(file["file"]["sizeBytes"], line.len().to_string());

    let short = start(1000).send().await.unwrap();
    let short_url = short.headers()["x-goog-upload-url"].to_str().unwrap().to_string();
    let request = client
        .post(&short_url)
        .header("X-Goog-Upload-Command", "upload, finalize")
        .header("X-Goog-Upload-Offset", "0")
        .body(line.clone());
    let (_, body) = send(request).await;
    assert_google_error(&body, 400, "INVALID_ARGUMENT", "declared 1000");

    let download = format!("{base}/download/v1beta/{name}:download");
    let (status, body) = send(client.get(&download)).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_google_error(&body, 400, "INVALID_ARGUMENT", "alt=media");
    let (status, body) = send(client.get(format!("{base}/download/v1beta/files/nosuch:download?alt=media"))).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert_google_error(&body, 404, "NOT_FOUND", "files/nosuch");
}
