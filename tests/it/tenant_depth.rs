//! Each tenant's queue depth (issue 27, item 1) on the real binary: `/v1/stats`, the
//! Prometheus series under their cap and `ctl status` agree with what was taken in and
//! claimed, on either store backend (the console's table: `console.rs`).

use std::time::Duration;

use serde_json::{Value, json};

use crate::util::{Server, cli, stdout, stop_and_verify, temp_dir};

fn metric(text: &str, series: &str) -> Option<f64> {
    text.lines().find_map(|l| l.strip_prefix(series)?.trim().parse().ok())
}

#[tokio::test]
async fn each_tenants_depth_is_counted_by_state_and_shown_everywhere() {
    let dir = temp_dir();
    let config = dir.path().join("config.toml");
    // One tenant by name on /metrics; the others are summed.
    std::fs::write(&config, "[metrics]\ntenant_series = 1\n").expect("write config");
    let server = Server::start_with(&dir.path().join("data"), &["--config", config.to_str().expect("utf-8 path")]);
    let api = server.api();
    for i in 0..30 {
        api.create("big", &format!("big/{i}"), &format!("fn big_{i}() {{}}\n")).await;
    }
    for i in 0..3 {
        api.create("small", &format!("small/{i}"), &format!("fn small_{i}() {{}}\n")).await;
    }
    api.create("tiny", "tiny/0", "fn tiny() {}\n").await;
    // Claims take the oldest first: five of big's.
    assert_eq!(api.claim("w", 5, 60).await.len(), 5);
    tokio::time::sleep(Duration::from_millis(1100)).await;

    let stats = api.get("/v1/stats").await;
    assert_eq!(stats.status, 200, "{:#}", stats.body);
    let tenants = stats.body["tenants"].as_array().expect("tenants").clone();
    let row = |tenant: &str| -> Value {
        tenants
            .iter()
            .find(|t| t["tenant"] == json!(tenant))
            .cloned()
            .unwrap_or_else(|| panic!("{tenant}: {tenants:#?}"))
    };
    assert_eq!(tenants.len(), 3, "{tenants:#?}");
    assert_eq!(row("big")["schema"], json!("code-review@1"));
    assert_eq!(row("big")["extractions"], json!({"pending": 25, "claimed": 5}));
    assert_eq!((row("big")["total"].as_u64(), row("small")["total"].as_u64()), (Some(30), Some(3)));
    assert_eq!(row("small")["extractions"], json!({"pending": 3}));
    for tenant in ["big", "small", "tiny"] {
        assert!(row(tenant)["oldest_pending_age_seconds"].as_u64() >= Some(1), "{tenants:#?}");
    }
    let sum: u64 = tenants.iter().map(|t| t["total"].as_u64().unwrap_or(0)).sum();
    assert_eq!(Some(sum), stats.body["total"].as_u64(), "the tenants add up to the store");

    let text = reqwest::get(format!("{}/metrics", server.url)).await.expect("metrics").text().await.expect("text");
    let series = |tenant: &str, state: &str| {
        metric(&text, &format!("commitpoint_tenant_extractions{{tenant=\"{tenant}\",state=\"{state}\"}}"))
    };
    assert_eq!(series("big", "pending"), Some(25.0), "{text}");
    assert_eq!(series("big", "claimed"), Some(5.0), "{text}");
    assert_eq!(series("(other)", "pending"), Some(4.0), "small and tiny, summed under the cap: {text}");
    assert_eq!(series("small", "pending"), None, "past the cap, no series of its own: {text}");
    let age = metric(&text, "commitpoint_tenant_oldest_pending_age_seconds{tenant=\"big\"}");
    assert!(age.is_some_and(|a| a >= 1.0), "{text}");

    let status = stdout(&cli(&["ctl", "status", "--server", &server.url]));
    let big = status.lines().find(|l| l.starts_with("big ")).unwrap_or_else(|| panic!("{status}"));
    let columns: Vec<&str> = big.split_whitespace().collect();
    assert_eq!(&columns[..4], ["big", "code-review@1", "25", "5"], "{status}");
    let small = status.lines().position(|l| l.starts_with("small ")).expect("small's row");
    let big_at = status.lines().position(|l| l.starts_with("big ")).expect("big's row");
    assert!(big_at < small, "the busiest first:\n{status}");
    stop_and_verify(server);
}
