//! Request-level faults, authentication, validation failures and error shapes.

use std::time::{Duration, Instant};

use reqwest::StatusCode;
use serde_json::{Value, json};

use super::{
    create, download, expect_error, get_json, input_file, poll_until_terminal, request_line, start, upload, upload_form,
};
use crate::simulator::{Faults, SimulatorConfig};

#[tokio::test]
async fn auth_and_request_faults_are_served_exactly_in_order() {
    let config = SimulatorConfig { api_key: Some("sk-sim".to_string()), ..SimulatorConfig::default() };
    let (sim, client, base) = start(config).await;
    let list = format!("{base}/batches");
    let missing = expect_error(client.get(&list).send().await.unwrap(), StatusCode::UNAUTHORIZED).await;
    assert_eq!(missing["type"], "invalid_request_error");
    let wrong = client.get(&list).bearer_auth("sk-other").send().await.unwrap();
    assert_eq!(expect_error(wrong, StatusCode::UNAUTHORIZED).await["code"], "invalid_api_key");

    let faults = Faults {
        unauthorized_next: 1,
        insufficient_quota_next: 1,
        rate_limit_next: 2,
        retry_after_secs: 2,
        server_error_next: 2,
        ..Faults::default()
    };
    sim.set_faults(faults.clone());
    // The /_sim endpoints neither need the key nor consume faults.
    for _ in 0..2 {
        assert_eq!(get_json(&client, base.replace("/v1", "/_sim/faults")).await, json!(faults));
    }
    let mut seen = Vec::new();
    let mut request_ids = std::collections::BTreeSet::new();
    for _ in 0..7 {
        let response = client.get(&list).bearer_auth("sk-sim").send().await.unwrap();
        let status = response.status().as_u16();
        let headers = response.headers().clone();
        request_ids.insert(headers["x-request-id"].to_str().unwrap().to_string());
        let retry_after = headers.get("retry-after").map(|v| v.to_str().unwrap().to_string());
        if status == 429 && retry_after.is_some() {
            assert_eq!(headers["retry-after-ms"], "2000");
            assert_eq!(headers["x-ratelimit-remaining-requests"], "0");
            assert!(headers.contains_key("x-ratelimit-reset-requests"));
        }
        let body: Value = response.json().await.unwrap();
        let code = body["error"]["code"].as_str().or(body["error"]["type"].as_str()).unwrap_or("ok").to_string();
        seen.push((status, code, retry_after));
    }
    let s = |c: &str| c.to_string();
    assert_eq!(
        seen,
        [
            (401, s("invalid_api_key"), None),
            (429, s("insufficient_quota"), None),
            (429, s("rate_limit_exceeded"), Some(s("2"))),
            (429, s("rate_limit_exceeded"), Some(s("2"))),
            (503, s("server_error"), None),
            (500, s("server_error"), None),
            (200, s("ok"), None),
        ]
    );
    assert_eq!(request_ids.len(), 7, "x-request-id is unique per response");
    let stats = sim.stats();
    assert_eq!((stats.rate_limited, stats.server_errors, stats.batches_listed), (3, 2, 1));
    assert_eq!(get_json(&client, base.replace("/v1", "/_sim/faults")).await["rate_limit_next"], 0);
    sim.stop().await;
}

#[tokio::test]
async fn slow_ms_delays_api_responses() {
    let config = SimulatorConfig { faults: Faults { slow_ms: 150, ..Faults::default() }, ..SimulatorConfig::default() };
    let (sim, client, base) = start(config).await;
    let started = Instant::now();
    get_json(&client, format!("{base}/batches")).await;
    assert!(started.elapsed() >= Duration::from_millis(150));
    sim.stop().await;
}

#[tokio::test]
async fn invalid_lines_and_the_validation_fault_fail_the_batch_with_errors() {
    let (sim, client, base) = start(SimulatorConfig::default()).await;
    let text = [request_line("a", "s", "x"), request_line("a", "s", "y")].join("\n");
    let file = upload(&client, &base, text).await;
    let batch: Value = create(&client, &base, file["id"].as_str().unwrap()).await.unwrap().json().await.unwrap();
    let failed = poll_until_terminal(&client, &base, batch["id"].as_str().unwrap()).await;
    assert_eq!(failed["status"], "failed");
    assert!(failed["failed_at"].as_i64().is_some());
    assert!(failed["output_file_id"].is_null());
    assert_eq!(failed["errors"]["object"], "list");
    let error = &failed["errors"]["data"][0];
    assert_eq!((error["code"].as_str(), error["line"].as_u64()), (Some("duplicate_custom_id"), Some(2)));
    assert_eq!(error["param"], "custom_id");

    sim.set_faults(Faults { fail_batch_validation: true, ..Faults::default() });
    let file = upload(&client, &base, input_file(2)).await;
    let batch: Value = create(&client, &base, file["id"].as_str().unwrap()).await.unwrap().json().await.unwrap();
    let failed = poll_until_terminal(&client, &base, batch["id"].as_str().unwrap()).await;
    assert_eq!(failed["status"], "failed");
    assert!(!failed["errors"]["data"].as_array().unwrap().is_empty());
    assert_eq!(sim.stats().lines_completed, 0);
    sim.stop().await;
}

#[tokio::test]
async fn bad_requests_get_openai_shaped_errors() {
    let (sim, client, base) = start(SimulatorConfig::default()).await;
    let error =
        expect_error(upload_form(&client, &base, "nonsense", "a.jsonl", input_file(1)).await, StatusCode::BAD_REQUEST)
            .await;
    assert_eq!(error["param"], "purpose");
    expect_error(upload_form(&client, &base, "batch", "a.csv", input_file(1)).await, StatusCode::BAD_REQUEST).await;
    let too_many = "{}\n".repeat(50_001);
    let error =
        expect_error(upload_form(&client, &base, "batch", "a.jsonl", too_many).await, StatusCode::BAD_REQUEST).await;
    assert_eq!(error["param"], "file");

    let other: Value = upload_form(&client, &base, "user_data", "a.jsonl", input_file(1)).await.json().await.unwrap();
    assert_eq!(other["purpose"], "user_data");
    let wrong_purpose = create(&client, &base, other["id"].as_str().unwrap()).await.unwrap();
    assert_eq!(expect_error(wrong_purpose, StatusCode::BAD_REQUEST).await["param"], "input_file_id");
    let unknown = create(&client, &base, "file-nope").await.unwrap();
    assert_eq!(expect_error(unknown, StatusCode::NOT_FOUND).await["param"], "input_file_id");

    let file = upload(&client, &base, input_file(1)).await;
    let valid = json!({"input_file_id": file["id"], "endpoint": "/v1/chat/completions", "completion_window": "24h"});
    let metadata: serde_json::Map<String, Value> = (0..17).map(|i| (format!("k{i}"), json!("v"))).collect();
    for (field, value) in [
        ("endpoint", json!("/v1/embeddings")),
        ("endpoint", json!("/v1/nope")),
        ("completion_window", json!("1h")),
        ("metadata", Value::Object(metadata)),
        ("metadata", json!({"k": "v".repeat(513)})),
        ("surprise", json!(1)),
    ] {
        let mut body = valid.clone();
        body[field] = value;
        let response = client.post(format!("{base}/batches")).json(&body).send().await.unwrap();
        let error = expect_error(response, StatusCode::BAD_REQUEST).await;
        assert_eq!(error["type"], "invalid_request_error", "{field}");
    }
    expect_error(client.get(format!("{base}/batches/batch_nope")).send().await.unwrap(), StatusCode::NOT_FOUND).await;
    expect_error(client.get(format!("{base}/files/file-nope/content")).send().await.unwrap(), StatusCode::NOT_FOUND)
        .await;
    expect_error(client.get(format!("{base}/nowhere")).send().await.unwrap(), StatusCode::NOT_FOUND).await;
    expect_error(client.get(format!("{base}/batches?limit=0")).send().await.unwrap(), StatusCode::BAD_REQUEST).await;
    expect_error(client.delete(format!("{base}/batches")).send().await.unwrap(), StatusCode::METHOD_NOT_ALLOWED).await;
    assert_eq!(sim.stats().batches_created, 0);
    sim.stop().await;
}

#[tokio::test]
async fn list_pages_newest_first() {
    let (sim, client, base) = start(SimulatorConfig::default()).await;
    let file = upload(&client, &base, input_file(1)).await;
    let mut ids = Vec::new();
    for _ in 0..3 {
        let batch: Value = create(&client, &base, file["id"].as_str().unwrap()).await.unwrap().json().await.unwrap();
        ids.push(batch["id"].as_str().unwrap().to_string());
    }
    let page = get_json(&client, format!("{base}/batches?limit=2")).await;
    let got: Vec<&str> = page["data"].as_array().unwrap().iter().map(|b| b["id"].as_str().unwrap()).collect();
    assert_eq!(got, [ids[2].as_str(), ids[1].as_str()]);
    assert_eq!((page["first_id"].as_str(), page["last_id"].as_str()), (Some(ids[2].as_str()), Some(ids[1].as_str())));
    assert_eq!(page["has_more"], true);
    let rest = get_json(&client, format!("{base}/batches?limit=2&after={}", ids[1])).await;
    assert_eq!(rest["data"][0]["id"], ids[0]);
    assert_eq!(rest["has_more"], false);
    sim.stop().await;
}

#[tokio::test]
async fn line_faults_reach_the_downloaded_files() {
    let faults = Faults {
        failed_line_every: 3,
        malformed_line_every: 4,
        duplicate_line_every: 2,
        invalid_output_every: 5,
        ..Faults::default()
    };
    let (sim, client, base) = start(SimulatorConfig { faults, ..SimulatorConfig::default() }).await;
    let file = upload(&client, &base, input_file(9)).await;
    let batch: Value = create(&client, &base, file["id"].as_str().unwrap()).await.unwrap().json().await.unwrap();
    let done = poll_until_terminal(&client, &base, batch["id"].as_str().unwrap()).await;
    assert_eq!(done["request_counts"], json!({"total": 9, "completed": 6, "failed": 3}));

    let errors = download(&client, &base, &done["error_file_id"]).await;
    assert_eq!(errors.keys().collect::<Vec<_>>(), ["c2", "c5", "c8"]);
    let http_shaped = errors.values().filter(|e| e["response"]["status_code"] == 500).count();
    let bare = errors.values().filter(|e| e["response"].is_null() && e["error"]["code"] == "request_timeout").count();
    assert_eq!((http_shaped, bare), (2, 1));

    let url = format!("{base}/files/{}/content", done["output_file_id"].as_str().unwrap());
    let text = client.get(url).send().await.unwrap().text().await.unwrap();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 9, "6 answers, 3 of them written twice");
    let parsed: Vec<Value> = lines.iter().filter_map(|l| serde_json::from_str(l).ok()).collect();
    assert_eq!(parsed.len(), 7, "the 4th line is torn, and so is its duplicate");
    for line in &parsed {
        let content = line["response"]["body"]["choices"][0]["message"]["content"].as_str().unwrap();
        assert_eq!(content.contains("urgent"), line["custom_id"] == "c4", "{content}");
    }
    sim.stop().await;
}
