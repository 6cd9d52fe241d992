//! The revisions of a source (issue 25, part 3) on the real binary: three revisions of one
//! source submitted in order and committed out of order end with the newest current and
//! the two others `superseded_by` it; a fourth supersedes the third with a findings diff;
//! `GET /v1/sources/...`, `latest=true` listing and export, `GET .../diff`, the outbox
//! events and `verify` agree. With `COMMITPOINT_TEST_STORE=postgres` the same on PostgreSQL.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::util::{Api, Server, finding, output, temp_dir};

/// A webhook receiver that takes every event and keeps the bodies.
async fn receiver() -> (String, Arc<Mutex<Vec<Value>>>) {
    let seen: Arc<Mutex<Vec<Value>>> = Arc::default();
    let log = Arc::clone(&seen);
    let app = axum::Router::new().route(
        "/hook",
        axum::routing::post(move |body: axum::body::Bytes| {
            let log = Arc::clone(&log);
            async move {
                log.lock().expect("log").push(serde_json::from_slice(&body).expect("a JSON event"));
                axum::http::StatusCode::NO_CONTENT
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind receiver");
    let url = format!("http://{}/hook", listener.local_addr().expect("addr"));
    tokio::spawn(async move { axum::serve(listener, app).await });
    (url, seen)
}

fn serve(dir: &std::path::Path, hook: &str) -> Server {
    let config = dir.join("config.toml");
    let text = format!("[[outbox.sinks]]\nname = \"downstream\"\nurl = \"{hook}\"\nsecret_env = \"SINK_SECRET\"\n");
    std::fs::write(&config, text).expect("config");
    let config = config.display().to_string();
    Server::start_with_env(
        &dir.join("data"),
        &["--config", &config],
        &[("SINK_SECRET", "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw")],
    )
}

/// A revision's diff: the files the findings name, grounded, with one more line each time.
fn revision(n: u32) -> String {
    crate::util::diff_adding(&["src/lib.rs", "src/main.rs", "src/io.rs"], 12 + n)
}

fn a() -> Value {
    finding("R1", "src/lib.rs", 3, "unused import")
}
fn b() -> Value {
    finding("R2", "src/lib.rs", 9, "unchecked unwrap")
}
fn c() -> Value {
    finding("R3", "src/main.rs", 1, "shadowed name")
}
fn d() -> Value {
    finding("R4", "src/main.rs", 7, "dead code")
}
fn e() -> Value {
    finding("R5", "src/io.rs", 2, "blocking call")
}

/// Claims everything pending; returns (id → lease token).
async fn claim_all(api: &Api) -> std::collections::HashMap<String, String> {
    api.claim("w1", 10, 60)
        .await
        .iter()
        .map(|g| (crate::util::id_of(g), g["lease_token"].as_str().expect("token").to_string()))
        .collect()
}

async fn commit(api: &Api, tokens: &std::collections::HashMap<String, String>, id: &str, findings: &[Value]) {
    let reply = api.post_result(id, &tokens[id], &output(findings)).await;
    assert_eq!(reply.status, 200, "{:#}", reply.body);
}

/// The identities (rule, file, line) of a diff list, sorted.
fn rules(list: &Value) -> Vec<String> {
    let mut out: Vec<String> =
        list.as_array().expect("a list").iter().map(|i| i["rule"].as_str().unwrap_or("?").to_string()).collect();
    out.sort();
    out
}

async fn export_lines(url: &str, query: &str) -> Vec<Value> {
    let text = reqwest::Client::builder()
        .no_proxy()
        .build()
        .expect("client")
        .get(format!("{url}/v1/export?{query}"))
        .send()
        .await
        .expect("reach the server")
        .text()
        .await
        .expect("body");
    text.lines().map(|l| serde_json::from_str(l).expect("a JSON line")).collect()
}

async fn wait_for_events(seen: &Arc<Mutex<Vec<Value>>>, n: usize) -> Vec<Value> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let events = seen.lock().expect("log").clone();
        if events.len() >= n {
            return events;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {n} events, got {events:#?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn revisions_committed_out_of_order_end_with_the_newest_current() {
    let (hook, seen) = receiver().await;
    let dir = temp_dir();
    let server = serve(dir.path(), &hook);
    let api = server.api();
    let r1 = api.create("acme", "PR-7", &revision(1)).await;
    let r2 = api.create("acme", "PR-7", &revision(2)).await;
    let r3 = api.create("acme", "PR-7", &revision(3)).await;
    let other = api.create("acme", "PR-8", &revision(0)).await;
    let tokens = claim_all(&api).await;
    assert_eq!(tokens.len(), 4);

    // Committed r3, r1, r2: the older two are born superseded by r3.
    commit(&api, &tokens, &r3, &[a(), b()]).await;
    commit(&api, &tokens, &r1, &[a(), c()]).await;
    commit(&api, &tokens, &r2, &[a(), d()]).await;

    let source = api.get("/v1/sources/acme/PR-7?schema=code-review").await;
    assert_eq!(source.status, 200, "{:#}", source.body);
    assert_eq!(source.body["schema"], json!("code-review"));
    assert_eq!(source.body["current"]["extraction_id"], json!(r3));
    assert_eq!(source.body["current"]["state"], json!("committed"));
    assert_eq!(source.body["latest_committed"], json!(r3));
    let revisions: Vec<(Value, Value)> = source.body["revisions"]
        .as_array()
        .expect("revisions")
        .iter()
        .map(|r| (r["extraction_id"].clone(), r["superseded_by"].clone()))
        .collect();
    assert_eq!(
        revisions,
        vec![(json!(r1), json!(r3)), (json!(r2), json!(r3)), (json!(r3), Value::Null)],
        "intake order, the two older ones superseded by the newest"
    );
    assert_eq!(api.record(&r1).await["superseded_by"], json!(r3));
    let versioned = api.get("/v1/sources/acme/PR-7?schema=code-review@1").await;
    assert_eq!(versioned.body["current"]["extraction_id"], json!(r3), "a version in the name is ignored");
    api.get("/v1/sources/acme/PR-9?schema=code-review").await.assert_error(404, "unknown_source");

    let latest: Vec<Value> =
        api.list_all("tenant=acme&latest=true&").await.iter().map(|r| r["extraction_id"].clone()).collect();
    assert_eq!(latest, vec![json!(r3), json!(other)], "one current revision per source");
    assert_eq!(api.list_all("tenant=acme&").await.len(), 4);

    // r3 against the previous committed revision by intake (r2), and against r1.
    let diff = api.get(&format!("/v1/extractions/{r3}/diff?against=previous")).await;
    assert_eq!(diff.status, 200, "{:#}", diff.body);
    assert_eq!(diff.body["against"], json!(r2));
    assert_eq!(diff.body["counts"], json!({"introduced": 1, "resolved": 1, "unchanged": 1}));
    assert_eq!(
        (rules(&diff.body["introduced"]), rules(&diff.body["resolved"])),
        (vec!["R2".into()], vec!["R4".into()])
    );
    assert_eq!(rules(&diff.body["unchanged"]), vec!["R1".to_string()]);
    let diff = api.get(&format!("/v1/extractions/{r3}/diff?against={r1}")).await;
    assert_eq!(
        (rules(&diff.body["introduced"]), rules(&diff.body["resolved"])),
        (vec!["R2".into()], vec!["R3".into()])
    );
    api.get(&format!("/v1/extractions/{r1}/diff")).await.assert_error(409, "not_comparable");
    api.get(&format!("/v1/extractions/{r3}/diff?against={other}")).await.assert_error(409, "not_comparable");

    // A fourth revision supersedes r3 as it commits, with the diff in its event.
    let r4 = api.create("acme", "PR-7", &revision(4)).await;
    let latest: Vec<Value> =
        api.list_all("tenant=acme&latest=true&").await.iter().map(|r| r["extraction_id"].clone()).collect();
    assert_eq!(latest, vec![json!(other), json!(r4)], "the newest intake is current before it commits");
    let tokens = claim_all(&api).await;
    commit(&api, &tokens, &r4, &[b(), e()]).await;
    let source = api.get("/v1/sources/acme/PR-7?schema=code-review").await;
    assert_eq!(source.body["current"]["extraction_id"], json!(r4));
    assert_eq!(source.body["revisions"][2]["superseded_by"], json!(r4));
    assert_eq!(source.body["revisions"][1]["superseded_by"], json!(r3), "links are never rewritten");

    let exported: Vec<Value> =
        export_lines(&server.url, "tenant=acme&latest=true").await.iter().map(|l| l["extraction_id"].clone()).collect();
    assert_eq!(exported, vec![json!(r4)], "the newest committed revision of PR-7 (PR-8 never committed)");
    assert_eq!(export_lines(&server.url, "tenant=acme").await.len(), 4);

    // Events: four commits, three supersessions.
    let events = wait_for_events(&seen, 7).await;
    let of = |kind: &str, id: &str| {
        events
            .iter()
            .find(|e| e["type"] == json!(kind) && e["data"]["id"] == json!(id))
            .unwrap_or_else(|| panic!("no {kind} event for {id}: {events:#?}"))
            .clone()
    };
    let first = of("extraction.committed", &r3);
    assert_eq!((first["data"]["supersedes"].clone(), first["data"]["diff"].clone()), (Value::Null, Value::Null));
    for older in [&r1, &r2] {
        assert_eq!(of("extraction.superseded", older)["data"]["superseded_by"], json!(r3));
        assert_eq!(of("extraction.committed", older)["data"]["supersedes"], Value::Null);
    }
    let fourth = of("extraction.committed", &r4);
    assert_eq!(fourth["data"]["supersedes"], json!(r3));
    assert_eq!(fourth["data"]["diff"], json!({"introduced": 1, "resolved": 1, "unchanged": 1}));
    assert_eq!(of("extraction.superseded", &r3)["data"]["superseded_by"], json!(r4));
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(seen.lock().expect("log").len(), 7, "no other event");

    // The CLI prints the same diff.
    let got = crate::util::cli(&["get", &r4, "--diff", "--server", &server.url]);
    assert!(got.status.success(), "{}", crate::util::stderr(&got));
    let printed: Value = serde_json::from_str(&crate::util::stdout(&got)).expect("JSON");
    assert_eq!((printed["against"].clone(), printed["counts"].clone()), (json!(r3), fourth["data"]["diff"].clone()));
    let got = crate::util::cli(&["get", &r4, "--diff", &r1, "--server", &server.url]);
    let printed: Value = serde_json::from_str(&crate::util::stdout(&got)).expect("JSON");
    assert_eq!(printed["counts"], json!({"introduced": 2, "resolved": 2, "unchanged": 0}));

    // The console's extraction page lists the revisions and the diff against the previous one.
    let browser = reqwest::Client::builder().no_proxy().redirect(reqwest::redirect::Policy::none()).build().expect("c");
    let login = browser.get(format!("{}/ui/login", server.url)).send().await.expect("login");
    let cookie = login.headers()["set-cookie"].to_str().expect("ascii").split(';').next().expect("pair").to_string();
    let page = browser.get(format!("{}/ui/extractions/{r4}", server.url)).header("cookie", cookie).send().await;
    let html = page.expect("page").text().await.expect("html");
    assert!(html.contains("id=\"revisions\"") && html.contains(&r3[..12]), "{html}");
    assert!(html.contains("1 introduced, 1 resolved, 1 unchanged"), "{html}");

    // Erasure takes every revision and every link with it; `verify` then finds the store sound.
    let erased = api.send(reqwest::Method::DELETE, "/v1/tenants/acme", None).await;
    assert_eq!((erased.status, erased.body["extractions"].clone()), (200, json!(5)), "{:#}", erased.body);
    api.get("/v1/sources/acme/PR-7?schema=code-review").await.assert_error(404, "unknown_source");
    crate::util::stop_and_verify(server);
}
