//! Cancel and bulk retry (issue 15, item 5) on the real binary: cancelling is terminal,
//! fences late answers (charged, never committed, in a worker's lease or a live provider
//! batch) and emits `extraction.cancelled`; a bulk retry moves exactly the matching
//! failures back, across more than one bounded transaction, from the API and the CLI.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::routing::post;
use commitpoint::simulator::Faults;
use serde_json::{Value, json};

use crate::provider::{CORPUS, Rig, SETTLE, TENANT, settle};
use crate::util::{Api, Server, cli, finding, output, stderr, stdout, stop_and_verify, temp_dir};

const SINK_SECRET: &str = "whsec_Y2FuY2VsLXRlc3Qtc2luay1zZWNyZXQ=";

/// A sink that takes every event and keeps its JSON body.
async fn receiver() -> (String, Arc<Mutex<Vec<Value>>>) {
    let seen: Arc<Mutex<Vec<Value>>> = Arc::default();
    let log = Arc::clone(&seen);
    let app = axum::Router::new().route(
        "/hook",
        post(move |body: axum::body::Bytes| {
            let log = Arc::clone(&log);
            async move {
                log.lock().expect("log").push(serde_json::from_slice(&body).unwrap_or(Value::Null));
                axum::http::StatusCode::NO_CONTENT
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind receiver");
    let url = format!("http://{}/hook", listener.local_addr().expect("addr"));
    tokio::spawn(async move { axum::serve(listener, app).await });
    (url, seen)
}

async fn cancel(api: &Api, id: &str) -> crate::util::Reply {
    api.post(&format!("/v1/extractions/{id}/cancel"), &json!({})).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelling_is_terminal_fences_a_late_worker_and_emits_an_event() {
    let (url, seen) = receiver().await;
    let dir = temp_dir();
    let config = dir.path().join("config.toml");
    let sink = format!("[[outbox.sinks]]\nname = \"down\"\nurl = \"{url}\"\nsecret_env = \"SINK_SECRET\"\n");
    std::fs::write(&config, sink).expect("config");
    let server = Server::start_with_env(
        &dir.path().join("data"),
        &["--config", config.to_str().expect("utf-8")],
        &[("SINK_SECRET", SINK_SECRET)],
    );
    let api = server.api();

    // Pending → cancelled, twice the same answer, and never handed to a worker.
    let pending = api.create("acme", "a.rs", "fn a() {}").await;
    for _ in 0..2 {
        let reply = cancel(&api, &pending).await;
        assert_eq!((reply.status, &reply.body["state"]), (200, &json!("cancelled")), "{:#}", reply.body);
    }
    // Claimed → cancelled: the worker's later answer is refused and charged, not committed.
    let claimed = api.create("acme", "b.rs", "fn b() {}").await;
    let grants = api.claim("w", 10, 60).await;
    assert_eq!(grants.len(), 1, "the cancelled extraction is not claimable: {grants:#?}");
    let token = grants[0]["lease_token"].as_str().expect("token").to_string();
    assert_eq!(cancel(&api, &claimed).await.status, 200);
    let usage = json!({"model": "m", "input_tokens": 10, "output_tokens": 2, "cost_micros": 7});
    let late = json!({"lease_token": token, "output": output(&[finding("R1", "b.rs", 1, "x")]), "usage": usage});
    api.post(&format!("/v1/extractions/{claimed}/result"), &late).await.assert_error(409, "illegal_transition");
    assert_eq!(api.record(&claimed).await["state"], json!("cancelled"));
    assert_eq!(api.findings(&claimed).await["findings"], json!([]));
    let costs = api.get(&format!("/v1/extractions/{claimed}/costs")).await;
    assert_eq!(costs.body["charged_micros"], json!(7), "the late answer was paid for: {:#}", costs.body);
    // Failed → cancelled; retry of a cancelled one and cancel of a committed one are refused.
    let failed = api.create("acme", "c.rs", "fn c() {}").await;
    let (_, token) = api.claim_one("w", 60).await;
    assert_eq!(api.post_result(&failed, &token, &json!({"findings": 3})).await.status, 422);
    assert_eq!(cancel(&api, &failed).await.status, 200);
    api.retry(&failed).await.assert_error(409, "illegal_transition");
    let committed = api.create("acme", "d.rs", "fn d() {}").await;
    let (_, token) = api.claim_one("w", 60).await;
    assert_eq!(api.post_result(&committed, &token, &output(&[])).await.status, 200);
    cancel(&api, &committed).await.assert_error(409, "illegal_transition");
    cancel(&api, &"0".repeat(64)).await.assert_error(404, "not_found");
    cancel(&api, "xyz").await.assert_error(400, "invalid_id");

    let listed: BTreeSet<String> = api
        .list_all("state=cancelled&")
        .await
        .iter()
        .map(|r| r["extraction_id"].as_str().expect("id").to_string())
        .collect();
    assert_eq!(listed, BTreeSet::from([pending.clone(), claimed.clone(), failed.clone()]));
    assert_eq!(api.get("/v1/stats").await.body["extractions"]["cancelled"], json!(3));

    // One `extraction.cancelled` per cancelled extraction reaches the sink.
    let deadline = Instant::now() + SETTLE;
    let cancelled_events = || -> BTreeSet<String> {
        let log = seen.lock().expect("log");
        log.iter()
            .filter(|e| e["type"] == "extraction.cancelled")
            .map(|e| e["data"]["id"].as_str().unwrap_or_default().to_string())
            .collect()
    };
    while cancelled_events().len() < 3 {
        assert!(Instant::now() < deadline, "cancel events not delivered: {:#?}", seen.lock().expect("log"));
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(cancelled_events(), listed);
    stop_and_verify(server);
}

/// Intakes `n` sources of `tenant` and fails each through a worker (class validation).
async fn fail_many(api: &Api, tenant: &str, n: usize) -> Vec<String> {
    let mut ids = Vec::with_capacity(n);
    for chunk in (0..n).collect::<Vec<_>>().chunks(50) {
        let created = futures_util::future::join_all(
            chunk
                .iter()
                .map(|i| async move { api.create(tenant, &format!("src/{i}.rs"), &format!("fn f{i}() {{}}")).await }),
        )
        .await;
        ids.extend(created);
    }
    let mut grants = Vec::new();
    while grants.len() < n {
        let got = api.claim("w", 1000, 600).await;
        assert!(!got.is_empty(), "ran out of work to claim");
        grants.extend(got);
    }
    for chunk in grants.chunks(50) {
        let posts = chunk.iter().map(|g| {
            let id = g["extraction_id"].as_str().expect("id").to_string();
            let token = g["lease_token"].as_str().expect("token").to_string();
            async move { api.post_result(&id, &token, &json!({"findings": "none"})).await.status }
        });
        assert!(futures_util::future::join_all(posts).await.iter().all(|s| *s == 422));
    }
    ids
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bulk_retry_moves_exactly_the_matching_failures_back() {
    let dir = temp_dir();
    let server = Server::start(dir.path());
    let api = server.api();
    let acme = fail_many(&api, "acme", 1100).await;
    fail_many(&api, "globex", 20).await;

    let retry = |body: Value| {
        let api = api.clone();
        async move { api.post("/v1/admin/retry", &body).await }
    };
    let none = retry(json!({"tenant": "acme", "failure_class": "truncated"})).await;
    assert_eq!((none.status, &none.body["retried"]), (200, &json!(0)), "{:#}", none.body);
    // More than one bounded transaction (500 each).
    let first = retry(json!({"tenant": "acme", "failure_class": "validation", "limit": 600})).await;
    assert_eq!((first.status, &first.body["retried"]), (200, &json!(600)), "{:#}", first.body);
    retry(json!({"schema": "nope@1"})).await.assert_error(422, "unknown_schema");
    retry(json!({"limit": 0})).await.assert_error(422, "invalid_input");
    retry(json!({"failure_class": "bogus"})).await.assert_error(422, "invalid_input");
    retry(json!({"tenant": "no spaces"})).await.assert_error(422, "invalid_input");

    // The CLI takes the rest of acme's, and leaves globex's alone.
    let run = cli(&["ctl", "retry", "--failure-class", "validation", "--tenant", "acme", "--admin", &server.url]);
    assert_eq!(run.status.code(), Some(0), "{}", stderr(&run));
    assert_eq!(stdout(&run).trim(), "retried 500");
    let bad = cli(&["ctl", "retry", "--failure-class", "nonsense", "--admin", &server.url]);
    assert_eq!(bad.status.code(), Some(64), "a usage error: {}", stderr(&bad));

    let stats = api.get("/v1/stats").await.body;
    assert_eq!(stats["extractions"]["pending"], json!(1100), "{stats:#}");
    assert_eq!(stats["extractions"]["failed"], json!(20), "{stats:#}");
    let record = api.record(&acme[0]).await;
    assert_eq!((record["state"].clone(), record["attempts"].clone()), (json!("pending"), json!(2)));
    let rest = retry(json!({})).await;
    assert_eq!(rest.body["retried"], json!(20));
    stop_and_verify(server);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_cancelled_in_a_live_batch_is_charged_but_never_committed() {
    // A slow provider: the batch stays live while one of its members is cancelled.
    let rig = Rig::start(Duration::from_millis(1500), Faults::default()).await;
    let server = rig.serve(&["--batch-max-size", "2"], None);
    let api = server.api();
    let (gone, kept) = (&CORPUS[0], &CORPUS[4]);
    let cancelled = api.create(TENANT, gone.id, gone.content).await;
    let committed = api.create(TENANT, kept.id, kept.content).await;
    rig.wait_stats("the batch to be created", |s| s.batches_created == 1).await;
    let deadline = Instant::now() + SETTLE;
    while api.record(&cancelled).await["state"] != json!("submitted") {
        assert!(Instant::now() < deadline, "the member never reached its batch");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let reply = cancel(&api, &cancelled).await;
    assert_eq!((reply.status, &reply.body["state"]), (200, &json!("cancelled")), "{:#}", reply.body);
    assert_eq!(rig.stats().lines_completed, 0, "the batch finished too early for this test");

    let records = settle(&api, &BTreeSet::from([committed.clone()])).await;
    assert_eq!(records[&committed]["state"], json!("committed"));
    let record = api.record(&cancelled).await;
    assert_eq!(record["state"], json!("cancelled"), "{record:#}");
    assert_eq!(api.findings(&cancelled).await["findings"], json!([]));
    let costs = api.get(&format!("/v1/extractions/{cancelled}/costs")).await.body;
    let attempts = costs["attempts"].as_array().expect("attempts");
    assert_eq!(attempts.len(), 1, "the answer was paid for: {costs:#}");
    assert_eq!(attempts[0]["kind"], json!("fresh"), "{costs:#}");
    stop_and_verify(server);
}
