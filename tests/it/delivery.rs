//! Outbox delivery to a real receiver (signed, retried with the same webhook-id, across a
//! SIGKILL, disabled by 410) and signed webhook intake (redeliveries, forgeries).

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::http::{HeaderMap, StatusCode};
use commitpoint::engine::webhook::{StandardHeaders, WebhookSecret, sign_github, sign_standard, verify_standard};
use reqwest::Method;
use serde_json::{Value, json};
use tokio::sync::Notify;

use crate::util::{Api, Server, finding, output, temp_dir};

const SINK_SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";

#[derive(Clone, Debug)]
struct Received {
    id: String,
    timestamp: String,
    signature: String,
    body: Vec<u8>,
}

/// What the receiver answers to its n-th request; `None` hangs until the test lets go.
type Script = Arc<dyn Fn(usize) -> Option<(StatusCode, Option<&'static str>)> + Send + Sync>;

struct Receiver {
    url: String,
    seen: Arc<Mutex<Vec<Received>>>,
    first_arrived: Arc<Notify>,
}

async fn receiver(script: Script) -> Receiver {
    let seen: Arc<Mutex<Vec<Received>>> = Arc::default();
    let first_arrived = Arc::new(Notify::new());
    let (log, notify) = (Arc::clone(&seen), Arc::clone(&first_arrived));
    let app = axum::Router::new().route(
        "/hook",
        axum::routing::post(move |headers: HeaderMap, body: axum::body::Bytes| {
            let (log, notify, script) = (Arc::clone(&log), Arc::clone(&notify), Arc::clone(&script));
            async move {
                let header = |n: &str| headers.get(n).and_then(|v| v.to_str().ok()).unwrap_or_default().to_string();
                let n = {
                    let mut log = log.lock().expect("log");
                    log.push(Received {
                        id: header("webhook-id"),
                        timestamp: header("webhook-timestamp"),
                        signature: header("webhook-signature"),
                        body: body.to_vec(),
                    });
                    log.len()
                };
                notify.notify_one();
                match script(n) {
                    Some((status, retry_after)) => {
                        let mut response = axum::response::Response::new(axum::body::Body::empty());
                        *response.status_mut() = status;
                        if let Some(secs) = retry_after {
                            response.headers_mut().insert("retry-after", secs.parse().expect("header"));
                        }
                        response
                    }
                    None => std::future::pending().await,
                }
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind receiver");
    let url = format!("http://{}/hook", listener.local_addr().expect("addr"));
    tokio::spawn(async move { axum::serve(listener, app).await });
    Receiver { url, seen, first_arrived }
}

fn config_with_sink(dir: &std::path::Path, url: &str) -> String {
    let path = dir.join("config.toml");
    let text = format!("[[outbox.sinks]]\nname = \"downstream\"\nurl = \"{url}\"\nsecret_env = \"SINK_SECRET\"\n");
    std::fs::write(&path, text).expect("config");
    path.display().to_string()
}

fn serve(dir: &std::path::Path, config: &str) -> Server {
    Server::start_with_env(dir, &["--config", config], &[("SINK_SECRET", SINK_SECRET), ("HOOK_SECRET", HOOK_SECRET)])
}

/// Commits one extraction through the worker API; returns its id.
async fn commit_one(api: &Api, source: &str) -> String {
    let id = api.create("acme", source, "fn main() {}").await;
    let (claimed, token) = api.claim_one("w1", 60).await;
    assert_eq!(claimed, id);
    let reply = api.post_result(&id, &token, &output(&[finding("R1", source, 1, "unused")])).await;
    assert_eq!(reply.status, 200, "{:#}", reply.body);
    id
}

async fn wait_for(what: &str, limit: Duration, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + limit;
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn assert_signed(r: &Received) {
    let secret = WebhookSecret::standard(SINK_SECRET).expect("secret");
    let headers = StandardHeaders { id: Some(&r.id), timestamp: Some(&r.timestamp), signature: Some(&r.signature) };
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).expect("clock").as_secs();
    verify_standard(&[secret], headers, &r.body, now, Duration::from_secs(300)).expect("the signature verifies");
}

#[tokio::test]
async fn events_are_retried_with_one_webhook_id_until_taken() {
    let script: Script = Arc::new(|n| {
        Some(match n {
            1 => (StatusCode::INTERNAL_SERVER_ERROR, None),
            2 => (StatusCode::TOO_MANY_REQUESTS, Some("1")),
            _ => (StatusCode::NO_CONTENT, None),
        })
    });
    let hook = receiver(script).await;
    let dir = temp_dir();
    let server = serve(dir.path(), &config_with_sink(dir.path(), &hook.url));
    let api = server.api();
    let id = commit_one(&api, "a.rs").await;
    wait_for("three deliveries", Duration::from_secs(30), || hook.seen.lock().expect("log").len() >= 3).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let seen = hook.seen.lock().expect("log").clone();
    assert_eq!(seen.len(), 3, "delivered once it was taken, never again");
    assert!(seen.iter().all(|r| r.id == seen[0].id), "one webhook-id for every attempt");
    seen.iter().for_each(assert_signed);
    let body: Value = serde_json::from_slice(&seen[2].body).expect("json body");
    assert_eq!(body["type"], json!("extraction.committed"));
    assert_eq!(body["data"]["id"], json!(id));
    assert_eq!(body["data"]["findings"].as_array().map(Vec::len), Some(1), "{body:#}");
    // One finding shape everywhere: the API's, with the old `key`/`finding` kept a release.
    let listed = api.findings(&id).await["findings"][0].clone();
    let sent = &body["data"]["findings"][0];
    for (field, value) in listed.as_object().expect("a finding") {
        assert_eq!(&sent[field], value, "event field {field} differs from the API's: {sent:#}");
    }
    assert_eq!((&sent["key"], &sent["finding"]["rule"]), (&listed["finding_key"], &listed["rule"]), "{sent:#}");
    let pending = api.get("/v1/outbox?state=pending").await;
    assert_eq!(pending.body["events"], json!([]), "{:#}", pending.body);
    crate::util::stop_and_verify(server);
}

#[tokio::test]
async fn a_kill_during_delivery_redelivers_the_same_event() {
    let hang_first: Script = Arc::new(|n| if n == 1 { None } else { Some((StatusCode::OK, None)) });
    let hook = receiver(hang_first).await;
    let dir = temp_dir();
    let config = config_with_sink(dir.path(), &hook.url);
    let mut server = serve(dir.path(), &config);
    let api = server.api();
    commit_one(&api, "b.rs").await;
    tokio::time::timeout(Duration::from_secs(20), hook.first_arrived.notified()).await.expect("first delivery");
    server.kill9();
    drop(server);
    let server = serve(dir.path(), &config);
    wait_for("the redelivery", Duration::from_secs(20), || hook.seen.lock().expect("log").len() >= 2).await;
    let seen = hook.seen.lock().expect("log").clone();
    assert_eq!(seen[0].id, seen[1].id, "the same event, with the same webhook-id");
    assert_eq!(seen[0].body, seen[1].body);
    assert_signed(&seen[1]);
    crate::util::stop_and_verify(server);
}

#[tokio::test]
async fn a_410_disables_the_sink_and_dead_events_can_be_redelivered() {
    let gone: Script = Arc::new(|_| Some((StatusCode::GONE, None)));
    let hook = receiver(gone).await;
    let dir = temp_dir();
    let server = serve(dir.path(), &config_with_sink(dir.path(), &hook.url));
    let api = server.api();
    commit_one(&api, "c.rs").await;
    wait_for("the first delivery", Duration::from_secs(20), || !hook.seen.lock().expect("log").is_empty()).await;
    // Let the 410 be recorded before the second event exists.
    let deadline = Instant::now() + Duration::from_secs(20);
    while api.get("/v1/outbox?state=dead").await.body["events"].as_array().map(Vec::len) != Some(1) {
        assert!(Instant::now() < deadline, "the first event did not go dead");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    commit_one(&api, "d.rs").await;
    let deadline = Instant::now() + Duration::from_secs(20);
    let dead = loop {
        let reply = api.get("/v1/outbox?state=dead").await;
        if reply.body["events"].as_array().map(Vec::len) == Some(2) {
            break reply.body;
        }
        assert!(Instant::now() < deadline, "events did not go dead: {:#}", reply.body);
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(hook.seen.lock().expect("log").len(), 1, "nothing is sent to a disabled sink");
    assert!(dead.to_string().contains("410"), "{dead:#}");
    let event = dead["events"][0]["id"].as_u64().expect("event id");
    let enabled = api.send(Method::POST, "/v1/admin/sinks/downstream/enable", None).await;
    assert_eq!(enabled.status, 200, "{:#}", enabled.body);
    let again = api.send(Method::POST, &format!("/v1/outbox/{event}/redeliver"), None).await;
    assert_eq!(again.status, 200, "{:#}", again.body);
    assert_eq!(again.body["state"], json!("pending"));
    wait_for("the redelivery", Duration::from_secs(20), || hook.seen.lock().expect("log").len() >= 2).await;
    let missing = api.send(Method::POST, "/v1/outbox/999999/redeliver", None).await;
    missing.assert_error(404, "unknown_event");
    crate::util::stop_and_verify(server);
}

const HOOK_SECRET: &str = "gh-hook-secret";

fn config_with_webhooks(dir: &std::path::Path) -> String {
    let path = dir.join("config.toml");
    let text = "[[webhooks]]\nname = \"github\"\nscheme = \"github\"\nsecret_env = \"HOOK_SECRET\"\n\
         tenant_pointer = \"/repository/owner/login\"\nsource_id_pointer = \"/pull_request/html_url\"\n\
         content_pointer = \"/pull_request/body\"\nschema = \"code-review@1\"\n\n\
         [[webhooks]]\nname = \"std\"\nscheme = \"standard\"\nsecret_env = \"SINK_SECRET\"\ntenant = \"acme\"\n\
         source_id_pointer = \"/id\"\ncontent_pointer = \"/text\"\nschema = \"code-review@1\"\n";
    std::fs::write(&path, text).expect("config");
    path.display().to_string()
}

async fn post_raw(base: &str, path: &str, headers: &[(&str, String)], body: &[u8]) -> (u16, Value) {
    let mut request = reqwest::Client::new().post(format!("{base}{path}")).body(body.to_vec());
    for (name, value) in headers {
        request = request.header(*name, value);
    }
    let response = request.send().await.expect("send");
    let status = response.status().as_u16();
    (status, response.json().await.unwrap_or(Value::Null))
}

#[tokio::test]
async fn signed_webhooks_are_taken_once_per_delivery_and_forgeries_store_nothing() {
    let dir = temp_dir();
    let server = serve(dir.path(), &config_with_webhooks(dir.path()));
    let api = server.api();
    let body =
        br#"{"repository":{"owner":{"login":"acme"}},"pull_request":{"html_url":"https://x/pr/1","body":"fn a() {}"}}"#;
    let signature = sign_github(&WebhookSecret::github(HOOK_SECRET).expect("secret"), body);
    let headers = [("x-hub-signature-256", signature.clone()), ("x-github-delivery", "d-1".to_string())];
    let (status, first) = post_raw(&server.url, "/v1/webhooks/github", &headers, body).await;
    assert_eq!(status, 201, "{first:#}");
    assert_eq!(first["redelivery"], json!(false));
    for _ in 0..2 {
        let (status, again) = post_raw(&server.url, "/v1/webhooks/github", &headers, body).await;
        assert_eq!(status, 200, "{again:#}");
        assert_eq!(again["redelivery"], json!(true));
        assert_eq!(again["extraction_id"], first["extraction_id"]);
    }

    // A forged signature, a tampered body, a missing delivery id: 401, nothing stored.
    let forged = [("x-hub-signature-256", format!("sha256={}", "0".repeat(64))), ("x-github-delivery", "d-2".into())];
    let (status, err) = post_raw(&server.url, "/v1/webhooks/github", &forged, body).await;
    assert_eq!((status, err["error"]["code"].clone()), (401, json!("bad_signature")), "{err:#}");
    let tampered =
        br#"{"repository":{"owner":{"login":"evil"}},"pull_request":{"html_url":"https://x/pr/1","body":"x"}}"#;
    let (status, _) = post_raw(&server.url, "/v1/webhooks/github", &headers, tampered).await;
    assert_eq!(status, 401);
    let (status, _) = post_raw(&server.url, "/v1/webhooks/github", &headers[..1], body).await;
    assert_eq!(status, 401);

    // Standard Webhooks: a stale timestamp is refused even with a valid signature.
    let secret = WebhookSecret::standard(SINK_SECRET).expect("secret");
    let std_body = br#"{"id":"doc-7","text":"fn b() {}"}"#;
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).expect("clock").as_secs();
    let signed = |ts: u64| {
        vec![
            ("webhook-id", "msg_1".to_string()),
            ("webhook-timestamp", ts.to_string()),
            ("webhook-signature", sign_standard(&secret, "msg_1", ts, std_body)),
        ]
    };
    let (status, err) = post_raw(&server.url, "/v1/webhooks/std", &signed(now - 600), std_body).await;
    assert_eq!(status, 401, "{err:#}");
    let (status, ok) = post_raw(&server.url, "/v1/webhooks/std", &signed(now), std_body).await;
    assert_eq!(status, 201, "{ok:#}");
    let (status, _) = post_raw(&server.url, "/v1/webhooks/nope", &signed(now), std_body).await;
    assert_eq!(status, 404);

    assert_eq!(api.list_all("").await.len(), 2, "one extraction per genuine delivery");
    crate::util::stop_and_verify(server);
}

/// A schema that requires fields beside its findings (`language`, `summary`): the committed
/// output's other fields are shown on the extraction and sent in `extraction.committed`,
/// not dropped once validated.
#[tokio::test]
async fn the_outputs_fields_beside_its_findings_reach_the_api_and_the_event() {
    let hook = receiver(Arc::new(|_| Some((StatusCode::NO_CONTENT, None)))).await;
    let dir = temp_dir();
    let schemas = dir.path().join("schemas");
    std::fs::create_dir_all(&schemas).expect("schema dir");
    let schema = json!({
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "type": "object",
        "required": ["language", "summary", "findings"],
        "properties": {
            "language": {"type": "string"},
            "summary": {"type": "string"},
            "findings": {"type": "array", "items": {"type": "object", "required": ["rule"],
                         "properties": {"rule": {"type": "string"}}}}
        },
        "x-commitpoint-identity": ["/rule"]
    });
    std::fs::write(schemas.join("triage@1.json"), schema.to_string()).expect("write schema");
    let config = config_with_sink(dir.path(), &hook.url);
    let env = [("SINK_SECRET", SINK_SECRET), ("HOOK_SECRET", HOOK_SECRET)];
    let server = Server::start_with_env(
        dir.path(),
        &["--config", &config, "--schema-dir", schemas.to_str().expect("utf-8")],
        &env,
    );
    let api = server.api();
    let intake = json!({"tenant": "acme", "source_id": "T-1", "schema": "triage@1", "content": "the app crashes"});
    let reply = api.post("/v1/extractions", &intake).await;
    assert_eq!(reply.status, 201, "{:#}", reply.body);
    let id = crate::util::id_of(&reply.body);
    assert!(api.record(&id).await["output_fields"].is_null(), "nothing before the commit");
    let (claimed, token) = api.claim_one("w1", 60).await;
    assert_eq!(claimed, id);
    let output = json!({"language": "en", "summary": "a crash at start", "findings": [{"rule": "crash"}]});
    let reply = api.post_result(&id, &token, &output).await;
    assert_eq!(reply.status, 200, "{:#}", reply.body);
    let expected = json!({"language": "en", "summary": "a crash at start"});
    assert_eq!(api.record(&id).await["output_fields"], expected);

    wait_for("the committed event", Duration::from_secs(20), || !hook.seen.lock().expect("log").is_empty()).await;
    let sent = hook.seen.lock().expect("log")[0].clone();
    let body: Value = serde_json::from_slice(&sent.body).expect("json body");
    assert_eq!(body["type"], json!("extraction.committed"), "{body:#}");
    assert_eq!(body["data"]["output_fields"], expected, "{body:#}");
    assert_eq!(body["data"]["findings"][0]["rule"], json!("crash"), "{body:#}");

    // The export line carries them too.
    let export = reqwest::get(format!("{}/v1/export?tenant=acme", server.url)).await.expect("export");
    assert_eq!(export.status(), 200);
    let text = export.text().await.expect("the whole body");
    let line: Value = serde_json::from_str(text.lines().next().expect("one line")).expect("a JSON line");
    assert_eq!(line["output_fields"], expected, "{line:#}");
    crate::util::stop_and_verify(server);
}
