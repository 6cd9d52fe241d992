//! The happy path and the lifecycle faults: full cycle, dropped create, expiry, cancel.

use std::time::Duration;

use reqwest::StatusCode;
use serde_json::{Value, json};

use super::{create, download, get_json, input_file, poll_until_terminal, start, upload};
use crate::simulator::{Faults, SimulatorConfig, Stats};

#[tokio::test]
async fn full_cycle_upload_create_poll_download_parse() {
    let (sim, client, base) = start(SimulatorConfig { seed: 42, ..SimulatorConfig::default() }).await;
    assert!(base.starts_with("http://127.0.0.1:") && base.ends_with("/v1"));
    let file = upload(&client, &base, input_file(5)).await;
    assert_eq!(file["object"], "file");
    assert_eq!(file["purpose"], "batch");
    assert_eq!(file["status"], "processed");
    assert!(file["id"].as_str().unwrap().starts_with("file-"));
    assert!(file["expires_at"].as_i64().unwrap() > file["created_at"].as_i64().unwrap());

    let response = create(&client, &base, file["id"].as_str().unwrap()).await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    assert!(response.headers().get("x-request-id").unwrap().to_str().unwrap().starts_with("req_"));
    let batch: Value = response.json().await.unwrap();
    assert_eq!(batch["status"], "validating");
    assert_eq!(batch["request_counts"], json!({"total": 0, "completed": 0, "failed": 0}));
    assert!(batch["output_file_id"].is_null());

    let done = poll_until_terminal(&client, &base, batch["id"].as_str().unwrap()).await;
    assert_eq!(done["status"], "completed");
    assert_eq!(done["request_counts"], json!({"total": 5, "completed": 5, "failed": 0}));
    assert_eq!(done["metadata"]["commitpoint_key"], format!("key-{}", file["id"].as_str().unwrap()));
    assert_eq!(done["model"], "sim-reviewer");
    for stamp in ["in_progress_at", "finalizing_at", "completed_at", "expires_at"] {
        assert!(done[stamp].as_i64().is_some(), "{stamp} unset");
    }
    assert!(done["usage"]["total_tokens"].as_u64().unwrap() > 0);

    let output = download(&client, &base, &done["output_file_id"]).await;
    assert_eq!(output.keys().cloned().collect::<Vec<_>>(), ["c0", "c1", "c2", "c3", "c4"]);
    for (i, (custom_id, line)) in output.iter().enumerate() {
        assert_eq!(line["custom_id"], *custom_id);
        assert!(line["error"].is_null());
        let response = &line["response"];
        assert_eq!(response["status_code"], 200);
        assert_eq!(response["body"]["object"], "chat.completion");
        let usage = &response["body"]["usage"];
        assert_eq!(
            usage["total_tokens"].as_u64().unwrap(),
            usage["prompt_tokens"].as_u64().unwrap() + usage["completion_tokens"].as_u64().unwrap()
        );
        let content = response["body"]["choices"][0]["message"]["content"].as_str().unwrap();
        let review: Value = serde_json::from_str(content).unwrap();
        assert_eq!(
            review,
            json!({"findings": [{"rule": "no-unwrap", "severity": "medium", "file": format!("src/f{i}.rs"),
                "line": 2, "summary": "unwrap() panics on bad input; return the error instead"}]})
        );
    }
    assert!(download(&client, &base, &done["error_file_id"]).await.is_empty());

    let stats = sim.stats();
    assert_eq!((stats.files_uploaded, stats.batches_created, stats.content_downloads), (1, 1, 2));
    assert_eq!((stats.lines_completed, stats.lines_failed), (5, 0));
    assert!(stats.polls >= 1);
    assert_eq!(stats.submissions_per_custom_id.values().copied().collect::<Vec<_>>(), [1; 5]);
    assert_eq!(stats.max_live_batches_per_custom_id, 1);
    let over_http: Stats = serde_json::from_value(get_json(&client, base.replace("/v1", "/_sim/stats")).await).unwrap();
    assert_eq!(over_http, sim.stats());
    sim.stop().await;
}

#[tokio::test]
async fn dropped_create_still_creates_a_listed_batch() {
    let config = SimulatorConfig { complete_after: Duration::from_secs(5), ..SimulatorConfig::default() };
    let (sim, client, base) = start(config).await;
    let file = upload(&client, &base, input_file(2)).await;
    let file_id = file["id"].as_str().unwrap();
    let faults = Faults { drop_after_create_next: 1, ..Faults::default() };
    let set = client.post(base.replace("/v1", "/_sim/faults")).json(&faults).send().await.unwrap();
    assert_eq!(set.status(), StatusCode::OK);

    let lost = create(&client, &base, file_id).await.expect_err("the client must get no answer");
    assert!(!lost.is_timeout() && !lost.is_status(), "{lost:?}");
    let list = get_json(&client, format!("{base}/batches")).await;
    assert_eq!(list["object"], "list");
    let data = list["data"].as_array().unwrap();
    assert_eq!(data.len(), 1);
    assert_eq!(data[0]["metadata"]["commitpoint_key"], format!("key-{file_id}"));
    assert_eq!(data[0]["input_file_id"], file_id);
    assert_eq!(sim.stats().dropped_connections, 1);
    assert_eq!(sim.stats().max_live_batches_per_custom_id, 1);

    // A client that blindly retries the create submits live work twice; the stats show it.
    let retried = create(&client, &base, file_id).await.unwrap();
    assert_eq!(retried.status(), StatusCode::OK);
    let stats = sim.stats();
    assert_eq!(stats.batches_created, 2);
    assert_eq!(stats.max_live_batches_per_custom_id, 2);
    assert_eq!(stats.submissions_per_custom_id["c0"], 2);
    sim.stop().await;
}

#[tokio::test]
async fn expired_batch_returns_partial_output() {
    let config =
        SimulatorConfig { faults: Faults { expire_batches: true, ..Faults::default() }, ..SimulatorConfig::default() };
    let (sim, client, base) = start(config).await;
    let file = upload(&client, &base, input_file(4)).await;
    let batch: Value = create(&client, &base, file["id"].as_str().unwrap()).await.unwrap().json().await.unwrap();
    let done = poll_until_terminal(&client, &base, batch["id"].as_str().unwrap()).await;
    assert_eq!(done["status"], "expired");
    assert!(done["expired_at"].as_i64().is_some());
    assert_eq!(done["request_counts"], json!({"total": 4, "completed": 2, "failed": 2}));
    let output = download(&client, &base, &done["output_file_id"]).await;
    let errors = download(&client, &base, &done["error_file_id"]).await;
    assert_eq!(output.len(), 2);
    assert_eq!(errors.len(), 2);
    assert!(errors.values().all(|e| e["response"].is_null() && e["error"]["code"] == "batch_expired"));
    let all: Vec<&String> = output.keys().chain(errors.keys()).collect();
    assert_eq!(all.len(), 4);
    assert_eq!((sim.stats().lines_completed, sim.stats().lines_failed), (2, 2));
    sim.stop().await;
}

#[tokio::test]
async fn cancel_goes_through_cancelling_and_keeps_the_done_part() {
    let config = SimulatorConfig { complete_after: Duration::from_secs(4), ..SimulatorConfig::default() };
    let (sim, client, base) = start(config).await;
    let file = upload(&client, &base, input_file(10)).await;
    let batch: Value = create(&client, &base, file["id"].as_str().unwrap()).await.unwrap().json().await.unwrap();
    let id = batch["id"].as_str().unwrap();
    // Early in in_progress (0.4 s → 3.2 s): some lines are done, and a slow machine has
    // two seconds of slack before all of them are.
    tokio::time::sleep(Duration::from_millis(1200)).await;
    let response = client.post(format!("{base}/batches/{id}/cancel")).send().await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    let cancelling: Value = response.json().await.unwrap();
    assert_eq!(cancelling["status"], "cancelling");
    assert!(cancelling["cancelling_at"].as_i64().is_some());

    let done = poll_until_terminal(&client, &base, id).await;
    assert_eq!(done["status"], "cancelled");
    assert!(done["cancelled_at"].as_i64().is_some());
    let counts = &done["request_counts"];
    let completed = counts["completed"].as_u64().unwrap();
    assert!(completed > 0 && completed < 10, "{counts}");
    assert_eq!(counts["total"], 10);
    assert_eq!(counts["failed"].as_u64().unwrap(), 10 - completed);
    let output = download(&client, &base, &done["output_file_id"]).await;
    let errors = download(&client, &base, &done["error_file_id"]).await;
    assert_eq!(output.len() as u64, completed);
    assert!(errors.values().all(|e| e["error"]["code"] == "batch_cancelled"));
    assert_eq!(output.len() + errors.len(), 10);

    let again = client.post(format!("{base}/batches/{id}/cancel")).send().await.unwrap();
    let error = super::expect_error(again, StatusCode::BAD_REQUEST).await;
    assert_eq!(error["type"], "invalid_request_error");
    assert_eq!(sim.stats().max_live_batches_per_custom_id, 1);
    sim.stop().await;
}
