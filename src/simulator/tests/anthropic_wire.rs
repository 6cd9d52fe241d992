//! The Anthropic dialect's wire details a plain HTTP client sees: headers, error bodies,
//! validation, pagination, timestamps and when results may be read.

use std::time::{Duration, Instant};

use reqwest::{Client, StatusCode};
use serde_json::{Value, json};

use crate::simulator::{Dialect, Simulator, SimulatorConfig};

const KEY: &str = "sk-ant-wire";

async fn start(complete_after: Duration) -> (Simulator, Client, String) {
    let config = SimulatorConfig {
        dialect: Dialect::Anthropic,
        api_key: Some(KEY.into()),
        complete_after,
        ..Default::default()
    };
    let sim = Simulator::start(([127, 0, 0, 1], 0).into(), config).await.unwrap();
    let base = format!("{}/v1/messages/batches", sim.base_url());
    (sim, Client::new(), base)
}

fn authed(request: reqwest::RequestBuilder) -> reqwest::RequestBuilder {
    request.header("x-api-key", KEY).header("anthropic-version", "2023-06-01")
}

fn create_body(ids: &[&str]) -> Value {
    let requests: Vec<Value> = ids
        .iter()
        .map(|id| {
            json!({"custom_id": id, "params": {"model": "sim", "max_tokens": 64,
                "messages": [{"role": "user", "content": "source_id: s\n\nTODO"}],
                "tools": [{"name": "t", "input_schema": {"type": "object"}}],
                "tool_choice": {"type": "tool", "name": "t"}}})
        })
        .collect();
    json!({ "requests": requests })
}

async fn create(client: &Client, base: &str, ids: &[&str]) -> Value {
    let response = authed(client.post(base)).json(&create_body(ids)).send().await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    response.json().await.unwrap()
}

/// Asserts an Anthropic-shaped error whose body repeats the `request-id` header.
async fn expect_error(response: reqwest::Response, status: StatusCode, kind: &str) -> String {
    assert_eq!(response.status(), status);
    let request_id = response.headers()["request-id"].to_str().unwrap().to_string();
    let body: Value = response.json().await.unwrap();
    assert_eq!(body["type"], "error", "{body}");
    assert_eq!(body["error"]["type"], kind, "{body}");
    assert_eq!(body["request_id"], request_id.as_str());
    body["error"]["message"].as_str().unwrap().to_string()
}

fn stamp(value: &Value) -> std::time::SystemTime {
    humantime::parse_rfc3339(value.as_str().unwrap()).unwrap()
}

#[tokio::test]
async fn headers_are_required_and_errors_have_the_anthropic_shape() {
    let (sim, client, base) = start(Duration::from_millis(100)).await;
    let no_key = client.get(&base).header("anthropic-version", "2023-06-01").send().await.unwrap();
    expect_error(no_key, StatusCode::UNAUTHORIZED, "authentication_error").await;
    let bearer = client.get(&base).bearer_auth(KEY).header("anthropic-version", "2023-06-01").send().await.unwrap();
    expect_error(bearer, StatusCode::UNAUTHORIZED, "authentication_error").await;
    let no_version = client.get(&base).header("x-api-key", KEY).send().await.unwrap();
    let message = expect_error(no_version, StatusCode::BAD_REQUEST, "invalid_request_error").await;
    assert!(message.contains("anthropic-version"), "{message}");
    let missing = authed(client.get(format!("{base}/msgbatch_nope"))).send().await.unwrap();
    expect_error(missing, StatusCode::NOT_FOUND, "not_found_error").await;
    let openai_path = authed(client.get(format!("{}/v1/batches", sim.base_url()))).send().await.unwrap();
    expect_error(openai_path, StatusCode::NOT_FOUND, "not_found_error").await;

    let long = "x".repeat(65);
    for (body, want) in [
        (create_body(&["a", "a"]), "requests.1.custom_id"),
        (create_body(&[long.as_str()]), "at most 64 characters"),
        (json!({"requests": []}), "requests"),
    ] {
        let response = authed(client.post(&base)).json(&body).send().await.unwrap();
        let message = expect_error(response, StatusCode::BAD_REQUEST, "invalid_request_error").await;
        assert!(message.contains(want), "{message}");
    }
    assert_eq!(sim.stats().batches_created, 0);
    sim.stop().await;
}

#[tokio::test]
async fn a_batch_ends_with_counts_timestamps_and_readable_results() {
    let (sim, client, base) = start(Duration::from_millis(300)).await;
    let batch = create(&client, &base, &["one", "two", "three"]).await;
    assert_eq!(batch["type"], "message_batch");
    assert_eq!(batch["processing_status"], "in_progress");
    assert_eq!(
        batch["request_counts"],
        json!({"processing": 3, "succeeded": 0, "errored": 0, "canceled": 0, "expired": 0})
    );
    assert!(batch["results_url"].is_null() && batch["ended_at"].is_null() && batch["archived_at"].is_null());
    assert_eq!(stamp(&batch["expires_at"]).duration_since(stamp(&batch["created_at"])).unwrap().as_secs(), 24 * 3600);
    let id = batch["id"].as_str().unwrap();
    let early = authed(client.get(format!("{base}/{id}/results"))).send().await.unwrap();
    expect_error(early, StatusCode::BAD_REQUEST, "invalid_request_error").await;

    let deadline = Instant::now() + Duration::from_secs(10);
    let ended = loop {
        let batch: Value = authed(client.get(format!("{base}/{id}"))).send().await.unwrap().json().await.unwrap();
        if batch["processing_status"] == "ended" {
            break batch;
        }
        assert!(Instant::now() < deadline);
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(
        ended["request_counts"],
        json!({"processing": 0, "succeeded": 3, "errored": 0, "canceled": 0, "expired": 0})
    );
    let took = stamp(&ended["ended_at"]).duration_since(stamp(&ended["created_at"])).unwrap();
    assert_eq!(took.as_millis(), 300, "ended_at derives from created_at, not from the poll");
    let url = ended["results_url"].as_str().unwrap();
    assert_eq!(url, format!("{base}/{id}/results"));
    let text = authed(client.get(url)).send().await.unwrap().text().await.unwrap();
    let lines: Vec<Value> = text.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(lines.len(), 3);
    for line in &lines {
        let message = &line["result"]["message"];
        assert_eq!(line["result"]["type"], "succeeded");
        assert_eq!((message["type"].as_str(), message["role"].as_str()), (Some("message"), Some("assistant")));
        assert_eq!(message["stop_reason"], "tool_use");
        assert_eq!(message["content"][0]["type"], "tool_use");
        assert_eq!(message["content"][0]["name"], "t");
        assert_eq!(message["content"][0]["input"]["findings"][0]["rule"], "todo-left");
        assert!(message["usage"]["input_tokens"].as_u64().unwrap() > 0);
        assert!(message["usage"]["output_tokens"].as_u64().unwrap() > 0);
    }
    let deleted: Value = authed(client.delete(format!("{base}/{id}"))).send().await.unwrap().json().await.unwrap();
    assert_eq!(deleted, json!({"id": id, "type": "message_batch_deleted"}));
    sim.stop().await;
}

#[tokio::test]
async fn listing_is_newest_first_with_cursors_both_ways() {
    let (sim, client, base) = start(Duration::from_secs(60)).await;
    let mut ids = Vec::new();
    for i in 0..5 {
        let custom_id = format!("c{i}");
        ids.push(create(&client, &base, &[custom_id.as_str()]).await["id"].as_str().unwrap().to_string());
    }
    let newest_first: Vec<String> = ids.iter().rev().cloned().collect();
    let page = |query: String| {
        let client = client.clone();
        let url = format!("{base}?{query}");
        async move {
            let page: Value = authed(client.get(url)).send().await.unwrap().json().await.unwrap();
            let data: Vec<String> =
                page["data"].as_array().unwrap().iter().map(|b| b["id"].as_str().unwrap().to_string()).collect();
            (data, page["has_more"].as_bool().unwrap(), page["first_id"].clone(), page["last_id"].clone())
        }
    };
    let (first, more, first_id, last_id) = page("limit=2".into()).await;
    assert_eq!((first.as_slice(), more), (&newest_first[..2], true));
    assert_eq!((first_id, last_id), (json!(newest_first[0]), json!(newest_first[1])));
    let (second, more, ..) = page(format!("limit=2&after_id={}", newest_first[1])).await;
    assert_eq!((second.as_slice(), more), (&newest_first[2..4], true));
    let (last, more, ..) = page(format!("limit=2&after_id={}", newest_first[3])).await;
    assert_eq!((last.as_slice(), more), (&newest_first[4..], false));
    let (before, more, ..) = page(format!("limit=2&before_id={}", newest_first[3])).await;
    assert_eq!((before.as_slice(), more), (&newest_first[1..3], true));
    let (unknown, more, first_id, _) = page("after_id=msgbatch_unknown".into()).await;
    assert!(unknown.is_empty() && !more && first_id.is_null());
    let bad = authed(client.get(format!("{base}?limit=1001"))).send().await.unwrap();
    expect_error(bad, StatusCode::BAD_REQUEST, "invalid_request_error").await;
    sim.stop().await;
}
