//! Erasure while the tenant's work is at a provider (issue 15, item 3): the batch is at the
//! SIMULATED OpenAI Batch API when the tenant is erased. Its answers arrive later, are
//! fetched and dropped: nothing is recreated, nothing is charged, `verify` passes, and
//! the same source submitted again is new work that commits normally.

use std::time::{Duration, Instant};

use commitpoint::simulator::Faults;
use reqwest::Method;
use serde_json::json;

use crate::provider::{CORPUS, Rig, SETTLE, TENANT, counter, health, intake_corpus, settle};
use crate::util::stop_and_verify;

#[tokio::test]
async fn a_late_answer_for_an_erased_tenant_is_dropped_and_charged_nowhere() {
    let rig = Rig::start(Duration::from_millis(1500), Faults::default()).await;
    let server = rig.serve(&["--batch-max-size", "6", "--batch-max-wait", "100ms"], None);
    let api = server.api();
    let ids = intake_corpus(&api).await;
    rig.wait_stats("the batch at the provider", |s| s.batches_created >= 1).await;
    // Wait for the job id to be durable: every member is submitted with it.
    let deadline = Instant::now() + SETTLE;
    while !api.list_all("").await.iter().all(|r| r["state"] == json!("submitted")) {
        assert!(Instant::now() < deadline, "members never reached submitted");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(rig.stats().content_downloads, 0, "erased before the provider answered");

    let reply = api.send(Method::DELETE, &format!("/v1/tenants/{TENANT}"), None).await;
    assert_eq!(reply.status, 200, "{:#}", reply.body);
    assert_eq!(reply.body["extractions"], json!(CORPUS.len()), "{:#}", reply.body);
    assert_eq!(reply.body["ledger_entries"], json!(0), "nothing was paid yet");

    // The answers arrive and are read: the batch closes with every line a stranger.
    rig.wait_stats("the results fetched", |s| s.content_downloads >= 1 && s.lines_completed >= 6).await;
    let deadline = Instant::now() + SETTLE;
    while counter(&health(&api).await, "batches_closed") < 1 {
        assert!(Instant::now() < deadline, "the batch never closed: {:#}", health(&api).await);
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(api.list_all("").await.is_empty(), "a late answer recreates nothing");
    for id in &ids {
        api.get(&format!("/v1/extractions/{id}")).await.assert_error(404, "not_found");
    }
    let costs = api.get(&format!("/v1/tenants/{TENANT}/costs")).await;
    assert_eq!(costs.status, 200, "{:#}", costs.body);
    assert_eq!(costs.body["charged_micros"], json!(0), "charged nowhere: {:#}", costs.body);

    // The same source is new work, and its own answer is charged to it alone.
    let source = &CORPUS[0];
    let again = api.intake(TENANT, source.id, source.content).await;
    assert_eq!(again.status, 201, "{:#}", again.body);
    let id = crate::util::id_of(&again.body);
    let one = std::iter::once(id.clone()).collect();
    let records = settle(&api, &one).await;
    assert_eq!(records[&id]["state"], json!("committed"), "{:#}", records[&id]);
    let costs = api.get(&format!("/v1/extractions/{id}/costs")).await;
    assert_eq!(costs.body["attempts"].as_array().map(Vec::len), Some(1), "{:#}", costs.body);
    stop_and_verify(server);
}
