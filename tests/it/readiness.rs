//! Issue 30, item 10: `/healthz` answers 503 with a reason while the store does not answer
//! reads (it once said ok with every database connection or blocking thread taken), and no
//! answer of the API or the console may be kept by a cache.

use std::time::{Duration, Instant};

use serde_json::Value;

use crate::util::{Server, temp_dir};

async fn health(base: &str) -> (u16, Value) {
    let response = reqwest::get(format!("{base}/healthz")).await.expect("healthz");
    let status = response.status().as_u16();
    (status, response.json().await.expect("a JSON answer"))
}

async fn health_until(base: &str, want: u16, within: Duration) -> Value {
    let start = Instant::now();
    loop {
        let (status, body) = health(base).await;
        if status == want {
            return body;
        }
        assert!(start.elapsed() < within, "/healthz did not answer {want} within {within:?}: {status} {body}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// On PostgreSQL, a session holding the extractions table stands for a database whose
/// connections are all taken: nothing the server asks is answered. (The blocking pool on
/// redb is covered in-process, `service::readiness`, where its size can be set.)
#[ignore = "PostgreSQL only: COMMITPOINT_TEST_STORE=postgres, --include-ignored (.ci/run does both)"]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn healthz_says_unavailable_while_the_store_does_not_answer() {
    crate::support::postgres::require();
    let dir = temp_dir();
    let data = dir.path().join("data");
    let server = Server::start(&data);
    let (status, body) = health(&server.url).await;
    assert_eq!((status, &body["status"]), (200, &Value::from("ok")), "{body}");

    let database = crate::support::postgres::database_for(&data);
    let mut holder = crate::support::postgres::cluster()
        .spawn_psql(&database, "BEGIN; LOCK TABLE extractions IN ACCESS EXCLUSIVE MODE; SELECT pg_sleep(5); COMMIT;");
    let body = health_until(&server.url, 503, Duration::from_secs(5)).await;
    assert_eq!(body["status"], "unavailable", "{body}");
    assert!(body["reason"].as_str().is_some_and(|r| r.contains("did not answer")), "{body}");

    holder.wait().expect("the lock holder ends");
    let body = health_until(&server.url, 200, Duration::from_secs(15)).await;
    assert_eq!(body["status"], "ok");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_answer_of_the_api_or_the_console_is_stored() {
    let dir = temp_dir();
    let server = Server::start(&dir.path().join("data"));
    let client = reqwest::Client::builder().redirect(reqwest::redirect::Policy::none()).build().expect("client");
    for path in ["/v1/extractions", "/v1/stats", "/healthz", "/openapi.json", "/metrics", "/nope", "/ui/login"] {
        let response = client.get(format!("{}{path}", server.url)).send().await.expect("get");
        let cache = response.headers().get("cache-control").and_then(|v| v.to_str().ok()).unwrap_or("");
        assert_eq!(cache, "no-store", "{path}");
    }
}
