//! An operator pauses a provider while its batch is live (the simulator's Anthropic
//! dialect, completing slowly): no new batch is created while paused, across a restart
//! too, the live job still completes and commits, and resuming submits the held work.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use commitpoint::simulator::Faults;
use reqwest::Method;
use serde_json::{Value, json};

use crate::provider::{
    CORPUS, TENANT, assert_all_committed_with_model_findings, assert_report_counts, assert_submitted, corpus_ids,
    expected_id, finish, settle,
};
use crate::providers_e2e::{SimRig, anthropic_rig};
use crate::util::Api;

/// Three sources make a batch the moment the third arrives.
const BATCHES_OF_THREE: &[&str] = &["--batch-max-size", "3", "--batch-max-wait", "2s"];
const PROVIDER: &str = "anthropic";

async fn set_paused(api: &Api, paused: bool) -> Value {
    let verb = if paused { "pause" } else { "resume" };
    let reply = api.send(Method::POST, &format!("/v1/admin/providers/{PROVIDER}/{verb}"), None).await;
    assert_eq!(reply.status, 200, "{verb}: {:#}", reply.body);
    assert_eq!(reply.body["name"], json!(PROVIDER), "{:#}", reply.body);
    assert_eq!(reply.body["operator_paused"], json!(paused), "{:#}", reply.body);
    reply.body
}

/// The provider's entry in `GET /v1/admin/providers`.
async fn admin_view(api: &Api) -> Value {
    let reply = api.get("/v1/admin/providers").await;
    assert_eq!(reply.status, 200, "{:#}", reply.body);
    let providers = reply.body["providers"].as_array().expect("providers array");
    assert_eq!(providers.len(), 1, "only the configured provider: {:#}", reply.body);
    assert_eq!(providers[0]["name"], json!(PROVIDER), "{:#}", reply.body);
    providers[0].clone()
}

async fn create_all(api: &Api, sources: &[crate::provider::Source]) -> BTreeSet<String> {
    let mut ids = BTreeSet::new();
    for source in sources {
        ids.insert(api.create(TENANT, source.id, source.content).await);
    }
    ids
}

/// Asserts, for a while, that every `ids` record stays pending and the provider sees no new batch.
async fn assert_held(rig: &SimRig, api: &Api, ids: &BTreeSet<String>, batches: u64, how_long: Duration) {
    let deadline = Instant::now() + how_long;
    while Instant::now() < deadline {
        for id in ids {
            let record = api.record(id).await;
            assert_eq!(record["state"], json!("pending"), "held while paused: {record:#}");
        }
        let stats = rig.stats();
        assert_eq!(stats.batches_created, batches, "a batch was created while paused: {stats:#?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_provider_finishes_its_live_batch_and_submits_nothing_new_until_resumed() {
    let (first, second) = CORPUS.split_at(3);
    let rig = anthropic_rig(Duration::from_millis(1500), Faults::default()).await;
    let mut server = rig.serve(BATCHES_OF_THREE, None);
    let api = server.api();
    let live = create_all(&api, first).await;
    rig.wait_stats("the first batch", |s| s.batches_created == 1).await;

    let paused = set_paused(&api, true).await;
    assert_eq!(paused["open_batches"], json!(1), "the live batch: {paused:#}");
    let held = create_all(&api, second).await;
    assert_eq!(rig.stats().lines_completed, 0, "the live batch ended before the pause took effect");

    // The live job is still polled to the end and its members commit.
    let records = settle(&api, &live).await;
    assert!(records.values().all(|r| r["state"] == json!("committed")), "{records:#?}");
    for source in first {
        crate::provider::assert_findings(&api, source, &expected_id(source)).await;
    }
    // Three pending sources would form a batch at once; none does while paused.
    assert_held(&rig, &api, &held, 1, Duration::from_millis(800)).await;
    let view = admin_view(&api).await;
    assert_eq!((view["operator_paused"].clone(), view["open_batches"].clone()), (json!(true), json!(0)), "{view:#}");
    assert_eq!(view["batches_submitted"], json!(1), "{view:#}");

    // The pause is persisted: a SIGKILL and a restart keep it.
    server.kill9();
    drop(server);
    let server = rig.serve(BATCHES_OF_THREE, None);
    let api = server.api();
    assert_eq!(admin_view(&api).await["operator_paused"], json!(true));
    assert_held(&rig, &api, &held, 1, Duration::from_millis(800)).await;

    let resumed = set_paused(&api, false).await;
    assert_eq!(resumed["operator_paused"], json!(false), "{resumed:#}");
    assert_all_committed_with_model_findings(&api).await;
    let stats = rig.stats();
    assert_eq!(stats.batches_created, 2, "{stats:#?}");
    assert_submitted(&stats, &corpus_ids(), 1);
    assert_eq!(stats.lines_completed, CORPUS.len() as u64, "{stats:#?}");

    let report = finish(server);
    assert_report_counts(&report, CORPUS.len(), &[&format!("committed: {}", CORPUS.len())]);
}
