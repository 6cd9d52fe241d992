//! Intake identity: one extraction per (tenant, source_id, source_hash, schema), however
//! many times and however concurrently it is submitted.

use std::collections::BTreeSet;

use commitpoint::domain::identity::{ExtractionId, SourceHash};
use serde_json::json;

use crate::util::{SCHEMA, Server, id_of, stop_and_verify, temp_dir};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_identical_submits_create_exactly_one_extraction() {
    let dir = temp_dir();
    let server = Server::start(dir.path());
    let api = server.api();

    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..64 {
        let api = api.clone();
        tasks.spawn(async move { api.intake("acme", "PR-17", "diff --git a/x b/x\n+1").await });
    }
    let mut created = 0;
    let mut ids = BTreeSet::new();
    while let Some(reply) = tasks.join_next().await {
        let reply = reply.expect("intake task");
        match reply.status {
            201 => {
                assert_eq!(reply.body["created"], json!(true));
                created += 1;
            }
            200 => assert_eq!(reply.body["created"], json!(false)),
            other => panic!("unexpected {other}: {:#}", reply.body),
        }
        assert_eq!(reply.body["state"], json!("pending"));
        ids.insert(id_of(&reply.body));
    }
    assert_eq!(created, 1, "exactly one of 64 identical submits creates");
    assert_eq!(ids.len(), 1, "all 64 answers name the same extraction");

    let listed = api.list_all("").await;
    assert_eq!(listed.len(), 1, "{listed:#?}");
    assert_eq!(listed[0]["extraction_id"].as_str(), ids.first().map(String::as_str));
    stop_and_verify(server);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn extraction_id_is_the_documented_identity_hash() {
    let dir = temp_dir();
    let server = Server::start(dir.path());
    let api = server.api();
    let content = "fn main() {}\n";
    let id = api.create("acme", "repo#1", content).await;

    let hash = SourceHash::compute(content.as_bytes(), SCHEMA);
    let expected = ExtractionId::compute("acme", "repo#1", &hash, SCHEMA);
    assert_eq!(id, expected.to_hex());

    let record = api.record(&id).await;
    assert_eq!(record["extraction_id"], json!(id));
    assert_eq!(record["tenant"], json!("acme"));
    assert_eq!(record["source_id"], json!("repo#1"));
    assert_eq!(record["source_hash"], json!(hash.to_hex()));
    assert_eq!(record["schema"], json!(SCHEMA));
    assert_eq!(record["state"], json!("pending"));
    assert_eq!(record["attempts"], json!(1));
    assert_eq!(record["claims"], json!(0));
    assert_eq!(record["content_bytes"], json!(content.len()));
    assert!(record["committed_at"].is_null());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn changed_content_under_the_same_source_id_is_a_new_extraction() {
    let dir = temp_dir();
    let server = Server::start(dir.path());
    let api = server.api();
    let first = api.create("acme", "PR-9", "revision one").await;
    let second = api.create("acme", "PR-9", "revision two").await;
    assert_ne!(first, second);

    let listed = api.list_all("tenant=acme&").await;
    assert_eq!(listed.len(), 2);
    assert!(listed.iter().all(|r| r["source_id"] == json!("PR-9")));
    assert_ne!(listed[0]["source_hash"], listed[1]["source_hash"]);

    // Resubmitting the first revision finds it again rather than creating a third.
    let again = api.intake("acme", "PR-9", "revision one").await;
    assert_eq!(again.status, 200);
    assert_eq!(again.body["created"], json!(false));
    assert_eq!(id_of(&again.body), first);
    assert_eq!(api.list_all("").await.len(), 2);
    stop_and_verify(server);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn same_content_under_two_tenants_is_two_extractions() {
    let dir = temp_dir();
    let server = Server::start(dir.path());
    let api = server.api();
    let a = api.create("tenant-a", "doc-1", "identical text").await;
    let b = api.create("tenant-b", "doc-1", "identical text").await;
    assert_ne!(a, b);

    let in_a = api.list_all("tenant=tenant-a&").await;
    let in_b = api.list_all("tenant=tenant-b&").await;
    assert_eq!(in_a.len(), 1);
    assert_eq!(in_b.len(), 1);
    assert_eq!(in_a[0]["extraction_id"], json!(a));
    assert_eq!(in_b[0]["extraction_id"], json!(b));
    // Same material, same source hash; the tenant alone separates them.
    assert_eq!(in_a[0]["source_hash"], in_b[0]["source_hash"]);
    assert_eq!(api.list_all("").await.len(), 2);
    stop_and_verify(server);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resubmitting_reports_the_current_state_and_keeps_metadata() {
    let dir = temp_dir();
    let server = Server::start(dir.path());
    let api = server.api();
    let body = json!({
        "tenant": "acme", "source_id": "T-1", "schema": SCHEMA,
        "content": "ticket body", "metadata": {"pr": 42, "labels": ["x"]}
    });
    let first = api.post("/v1/extractions", &body).await;
    assert_eq!(first.status, 201, "{:#}", first.body);
    let id = id_of(&first.body);
    assert_eq!(api.record(&id).await["metadata"], body["metadata"]);

    let grants = api.claim("w1", 10, 60).await;
    assert_eq!(grants.len(), 1);
    assert_eq!(grants[0]["metadata"], body["metadata"]);
    assert_eq!(grants[0]["content"], json!("ticket body"));

    // Different metadata does not change the identity; the answer shows the live state.
    let mut again = body.clone();
    again["metadata"] = json!({"pr": 43});
    let second = api.post("/v1/extractions", &again).await;
    assert_eq!(second.status, 200, "{:#}", second.body);
    assert_eq!(second.body["created"], json!(false));
    assert_eq!(second.body["state"], json!("claimed"));
    assert_eq!(id_of(&second.body), id);
    assert_eq!(api.record(&id).await["metadata"], body["metadata"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn listing_pages_through_every_extraction_once() {
    let dir = temp_dir();
    let server = Server::start(dir.path());
    let api = server.api();
    let mut ids = Vec::new();
    for i in 0..5 {
        ids.push(api.create("acme", &format!("s{i}"), &format!("content {i}")).await);
    }
    api.create("other", "s0", "content 0").await;

    let mut seen = Vec::new();
    let mut after = String::new();
    let mut pages = 0;
    loop {
        let reply = api.get(&format!("/v1/extractions?tenant=acme&limit=2&after={after}")).await;
        assert_eq!(reply.status, 200, "{:#}", reply.body);
        let page = reply.body["extractions"].as_array().expect("array").clone();
        assert!(page.len() <= 2);
        seen.extend(page.iter().map(id_of));
        pages += 1;
        match reply.body["next"].as_str() {
            Some(next) => after = next.to_string(),
            None => break,
        }
        assert!(pages < 10, "paging does not terminate");
    }
    assert_eq!(seen, ids, "every extraction once, in intake order");
    assert_eq!(pages, 3);

    let pending = api.list_all("state=pending&").await;
    assert_eq!(pending.len(), 6);
    assert!(api.list_all("state=committed&").await.is_empty());

    // Filters combine: one claimed extraction of tenant acme.
    let (claimed, _) = api.claim_one("w", 60).await;
    assert_eq!(claimed, ids[0]);
    let acme_claimed = api.list_all("tenant=acme&state=claimed&").await;
    assert_eq!(acme_claimed.iter().map(id_of).collect::<Vec<_>>(), [claimed]);
    assert!(api.list_all("tenant=other&state=claimed&").await.is_empty());
    assert_eq!(api.list_all("tenant=acme&state=pending&").await.len(), 4);
}
