//! End-to-end tests over real HTTP on loopback with a plain reqwest client, the way a
//! provider adapter would talk to the real API. Helpers here; cases in the submodules.

mod answers;
mod anthropic;
mod anthropic_wire;
mod errors;
mod gemini_wire;
mod lifecycle;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use reqwest::multipart::{Form, Part};
use reqwest::{Client, StatusCode};
use serde_json::{Value, json};

use super::{Simulator, SimulatorConfig};
use crate::domain::schema::{BUILTIN_CODE_REVIEW, Dialect, Registry};

/// The built-in `code-review@1` as the adapters send it to `dialect`.
fn code_review_view(dialect: Dialect) -> Value {
    Registry::builtin().get(BUILTIN_CODE_REVIEW).unwrap().provider_schema(dialect).clone()
}

fn request_line(custom_id: &str, source_id: &str, content: &str) -> String {
    json!({
        "custom_id": custom_id,
        "method": "POST",
        "url": "/v1/chat/completions",
        "body": {
            "model": "sim-reviewer",
            "messages": [
                {"role": "system", "content": "Review the code."},
                {"role": "user", "content": format!("source_id: {source_id}\n\n{content}")}
            ],
            "response_format": {"type": "json_schema", "json_schema": {"name": "code-review_1", "strict": true,
                "schema": code_review_view(Dialect::OpenAiStrict)}}
        }
    })
    .to_string()
}

fn input_file(n: usize) -> String {
    (0..n)
        .map(|i| request_line(&format!("c{i}"), &format!("src/f{i}.rs"), "fn f() {\n    x.unwrap();\n}\n"))
        .collect::<Vec<_>>()
        .join("\n")
}

async fn start(config: SimulatorConfig) -> (Simulator, Client, String) {
    let sim = Simulator::start(([127, 0, 0, 1], 0).into(), config).await.unwrap();
    let base = sim.base_url();
    (sim, Client::new(), base)
}

async fn upload(client: &Client, base: &str, text: String) -> Value {
    let form =
        Form::new().text("purpose", "batch").part("file", Part::bytes(text.into_bytes()).file_name("input.jsonl"));
    let response = client.post(format!("{base}/files")).multipart(form).send().await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    response.json().await.unwrap()
}

async fn create(client: &Client, base: &str, file_id: &str) -> reqwest::Result<reqwest::Response> {
    let body = json!({
        "input_file_id": file_id,
        "endpoint": "/v1/chat/completions",
        "completion_window": "24h",
        "metadata": {"commitpoint_key": format!("key-{file_id}")},
    });
    client.post(format!("{base}/batches")).json(&body).send().await
}

async fn get_json(client: &Client, url: String) -> Value {
    let response = client.get(url).send().await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    response.json().await.unwrap()
}

async fn poll_until_terminal(client: &Client, base: &str, id: &str) -> Value {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let batch = get_json(client, format!("{base}/batches/{id}")).await;
        let status = batch["status"].as_str().unwrap().to_string();
        if ["completed", "failed", "expired", "cancelled"].contains(&status.as_str()) {
            return batch;
        }
        assert!(Instant::now() < deadline, "batch stuck in {status}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Downloads a result file and joins its lines on custom_id.
async fn download(client: &Client, base: &str, file_id: &Value) -> BTreeMap<String, Value> {
    let response = client.get(format!("{base}/files/{}/content", file_id.as_str().unwrap())).send().await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    let text = response.text().await.unwrap();
    text.lines()
        .map(|l| {
            let line: Value = serde_json::from_str(l).unwrap();
            (line["custom_id"].as_str().unwrap().to_string(), line)
        })
        .collect()
}

async fn upload_form(client: &Client, base: &str, purpose: &str, filename: &str, text: String) -> reqwest::Response {
    let form = Form::new()
        .text("purpose", purpose.to_string())
        .part("file", Part::bytes(text.into_bytes()).file_name(filename.to_string()));
    client.post(format!("{base}/files")).multipart(form).send().await.unwrap()
}

/// Asserts an OpenAI-shaped error and returns its `error` object.
async fn expect_error(response: reqwest::Response, status: StatusCode) -> Value {
    assert_eq!(response.status(), status);
    assert!(response.headers().contains_key("x-request-id"));
    let body: Value = response.json().await.unwrap();
    let error = body["error"].clone();
    let keys: Vec<&String> = error.as_object().unwrap().keys().collect();
    assert_eq!(keys, ["code", "message", "param", "type"], "{body}");
    assert!(error["message"].as_str().is_some_and(|m| !m.is_empty()));
    assert!(error["type"].as_str().is_some());
    error
}
