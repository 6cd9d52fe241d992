//! Wrong tokens and failed console logins (issue 30, item 7): after ten mistakes an address
//! is shut out with a doubling backoff (429 with `Retry-After`, the credential unchecked),
//! the refusals are logged at most once per interval, and counted in
//! `commitpoint_auth_refusals_total`.

use std::time::Duration;

use reqwest::Method;

use crate::util::{Server, call_as, temp_dir, write_secret};

const ADMIN: &str = "admin-token-guessing-000001";

fn start() -> (tempfile::TempDir, Server) {
    let dir = temp_dir();
    let admin = dir.path().join("admin");
    write_secret(&admin, &format!("{ADMIN}\n"));
    let config = dir.path().join("config.toml");
    std::fs::write(&config, format!("[access]\nadmin_token_file = \"{}\"\n", admin.display())).expect("config");
    let server = Server::start_with(&dir.path().join("data"), &["--config", config.to_str().expect("utf-8")]);
    (dir, server)
}

async fn stats_as(base: &str, token: &str) -> reqwest::Response {
    let client = reqwest::Client::builder().no_proxy().build().expect("client");
    client.get(format!("{base}/v1/stats")).bearer_auth(token).send().await.expect("send")
}

/// A console login post with `token`, carrying a fresh form's nonce and CSRF token.
async fn console_login(base: &str, token: &str) -> u16 {
    let client = reqwest::Client::builder().no_proxy().redirect(reqwest::redirect::Policy::none()).build().expect("c");
    let form = client.get(format!("{base}/ui/login")).send().await.expect("login form");
    let nonce = form.headers()["set-cookie"].to_str().expect("ascii").split(';').next().expect("pair").to_string();
    let html = form.text().await.expect("page");
    let marker = "name=\"csrf\" value=\"";
    let start = html.find(marker).expect("csrf field") + marker.len();
    let body = format!("token={token}&csrf={}", &html[start..start + 64]);
    let posted = client
        .post(format!("{base}/ui/login"))
        .header("cookie", nonce)
        .header("content-type", "application/x-www-form-urlencoded")
        .body(body)
        .send()
        .await
        .expect("post login");
    posted.status().as_u16()
}

fn counted(metrics: &str, reason: &str) -> u64 {
    let series = format!("commitpoint_auth_refusals_total{{reason=\"{reason}\"}} ");
    metrics.lines().find_map(|l| l.strip_prefix(&series)).and_then(|v| v.trim().parse().ok()).unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn guessing_tokens_is_slowed_logged_and_counted() {
    let (_dir, server) = start();
    let base = server.url.clone();
    for i in 0..10 {
        let response = stats_as(&base, &format!("guess-{i:020}")).await;
        assert_eq!(response.status().as_u16(), 401, "mistake {i} is free");
    }
    assert_eq!(console_login(&base, "a-wrong-console-login").await, 401, "the eleventh, at the console");

    // Shut out: neither a guess nor the right token is checked from this address.
    for token in ["guess-after-the-eleventh", ADMIN] {
        let response = stats_as(&base, token).await;
        assert_eq!(response.status().as_u16(), 429, "{token}");
        let wait: u64 = response.headers()["retry-after"].to_str().expect("ascii").parse().expect("seconds");
        assert!((1..=60).contains(&wait), "{wait}");
        let body: serde_json::Value = response.json().await.expect("a JSON error");
        assert_eq!(body["error"]["code"], "rate_limited", "{body}");
    }
    assert_eq!(console_login(&base, ADMIN).await, 429, "the console's login form is shut out as well");
    // A request without any credential guesses nothing and is answered as before.
    let (status, _) = call_as(&format!("{base}/v1/stats"), None, Method::GET, None).await;
    assert_eq!(status, 401);

    tokio::time::sleep(Duration::from_millis(1100)).await;
    assert_eq!(stats_as(&base, ADMIN).await.status().as_u16(), 200, "the backoff is over");
    // The next mistake doubles it.
    assert_eq!(stats_as(&base, "guess-after-the-wait").await.status().as_u16(), 401);
    let response = stats_as(&base, ADMIN).await;
    assert_eq!(response.headers()["retry-after"], "2");

    let metrics = reqwest::get(format!("{base}/metrics")).await.expect("metrics").text().await.expect("text");
    assert_eq!(counted(&metrics, "bad_token"), 11, "{metrics}");
    assert_eq!(counted(&metrics, "bad_login"), 1);
    assert!(counted(&metrics, "rate_limited") >= 4);
    let (_, log) = server.terminate();
    let lines = log.lines().filter(|l| l.contains("authentication refused")).count();
    assert!((1..=4).contains(&lines), "refusals are logged, at most once per interval: {lines}\n{log}");
    assert!(
        log.lines().any(|l| l.contains("authentication refused") && l.contains("client=127.0.0.1")),
        "the log names the address: {log}"
    );
}
