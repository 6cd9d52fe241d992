//! A provider (or a gateway in front of it) that repeats the request's credentials in its
//! error bodies must not publish the key: not in `/healthz`, `/v1/stats`, the records,
//! the log, nor the database file (and so its backups).

use std::time::{Duration, Instant};

use axum::Router;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use reqwest::Method;
use serde_json::{Value, json};

use crate::util::{Server, call_as, temp_dir, write_secret};

/// Not shaped like any key (no prefix, no digits, no capitals): only the configured-key
/// rule can catch it.
const KEY: &str = "correct-horse-battery-staple-key";
const KEY_ENV: &str = "REDACTION_PROVIDER_KEY";
const ADMIN: &str = "admin-token-redaction-0001";
const SETTLE: Duration = Duration::from_secs(30);

/// Every call fails, echoing the Authorization header back: sources named `refuse-*`
/// with a 400 (the member is refused, and the reason is stored with the record), the
/// others with a 401 (the provider pauses, and the reason is its health).
async fn completions(headers: HeaderMap, body: axum::body::Bytes) -> Response {
    let auth = headers.get("authorization").and_then(|v| v.to_str().ok()).unwrap_or_default().to_string();
    let text = String::from_utf8_lossy(&body);
    let (status, code) = if text.contains("source_id: refuse") {
        (StatusCode::BAD_REQUEST, "invalid_request")
    } else {
        (StatusCode::UNAUTHORIZED, "invalid_api_key")
    };
    let message = format!("request rejected; you sent Authorization: {auth} (x-api-key: {KEY})");
    (status, axum::Json(json!({"error": {"message": message, "type": "invalid_request_error", "code": code}})))
        .into_response()
}

async fn wait_until(what: &str, mut done: impl AsyncFnMut() -> Option<Value>) -> Value {
    let deadline = Instant::now() + SETTLE;
    loop {
        if let Some(v) = done().await {
            return v;
        }
        assert!(Instant::now() < deadline, "{what} did not happen within {SETTLE:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_provider_echoing_the_key_never_publishes_it() {
    let app = Router::new().route("/v1/chat/completions", post(completions));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind the fake");
    let addr = listener.local_addr().expect("fake address");
    tokio::spawn(async move { axum::serve(listener, app).await.expect("fake server") });

    let dir = temp_dir();
    let admin = dir.path().join("admin");
    write_secret(&admin, &format!("{ADMIN}\n"));
    let config = dir.path().join("config.toml");
    std::fs::write(
        &config,
        format!(
            "[access]\nadmin_token_file = \"{}\"\n\n[providers.chat]\nbase_url = \"http://{addr}/v1\"\n\
             model = \"m\"\napi_key_env = \"{KEY_ENV}\"\n\n[routing]\ndefault = \"chat\"\n",
            admin.display()
        ),
    )
    .expect("write config");
    let data = dir.path().join("data");
    let args = ["--config", config.to_str().unwrap(), "--batch-max-wait", "100ms", "--poll-interval", "100ms"];
    let server = Server::start_with_env(&data, &args, &[(KEY_ENV, KEY), ("COMMITPOINT_LOG", "debug")]);
    let base = server.url.clone();
    let admin = Some(ADMIN);

    // A refused member: the provider's reason is stored with the extraction.
    let intake =
        |source: &str| json!({"tenant": "acme", "source_id": source, "schema": "code-review@1", "content": "x"});
    let (status, body) =
        call_as(&format!("{base}/v1/extractions"), admin, Method::POST, Some(intake("refuse-1"))).await;
    assert_eq!(status, 201, "{body}");
    let id = body["extraction_id"].as_str().expect("id").to_string();
    let record = wait_until("the refusal", async || {
        let (_, record) = call_as(&format!("{base}/v1/extractions/{id}"), admin, Method::GET, None).await;
        (record["state"] == json!("failed")).then_some(record)
    })
    .await;
    let shown = record.to_string();
    assert!(shown.contains("request rejected") && shown.contains("[redacted]"), "the reason is kept: {shown}");

    // An auth failure: the provider pauses and reports why.
    let (status, body) = call_as(&format!("{base}/v1/extractions"), admin, Method::POST, Some(intake("auth-1"))).await;
    assert_eq!(status, 201, "{body}");
    let health = wait_until("the auth pause", async || {
        let (_, health) = call_as(&format!("{base}/healthz"), admin, Method::GET, None).await;
        health["providers"][0]["last_error"].is_string().then_some(health)
    })
    .await;
    let shown = health.to_string();
    assert!(shown.contains("request rejected"), "the provider's error is shown: {shown}");

    let (status, anonymous) = call_as(&format!("{base}/healthz"), None, Method::GET, None).await;
    assert_eq!((status, &anonymous), (200, &json!({"status": "ok"})), "without a token, only liveness");
    let (status, wrong) = call_as(&format!("{base}/healthz"), Some("not-the-admin-token"), Method::GET, None).await;
    assert_eq!((status, &wrong), (200, &json!({"status": "ok"})));

    let (status, stats) = call_as(&format!("{base}/v1/stats"), admin, Method::GET, None).await;
    assert_eq!(status, 200, "{stats}");
    assert!(stats.to_string().contains("request rejected"), "{stats}");
    for (what, text) in [("/healthz", &health), ("/v1/stats", &stats), ("the record", &record)] {
        assert!(!text.to_string().contains(KEY), "the key reached {what}: {text}");
    }

    let db = server.db_path();
    let (exit, log) = server.terminate();
    assert_eq!(exit.code(), Some(0), "{log}");
    assert!(log.contains("request rejected"), "the provider's errors are logged: {log}");
    assert!(!log.contains(KEY), "the key reached the log");
    let bytes = std::fs::read(&db).expect("read the database file");
    assert!(!bytes.windows(KEY.len()).any(|w| w == KEY.as_bytes()), "the key reached the database file");
}
