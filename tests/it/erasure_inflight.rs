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

/// A worker's result for one of `ids` (leased under `tokens`), with a paid usage report.
async fn post_paid(api: &crate::util::Api, id: &str, token: &str) -> u16 {
    let body = json!({"lease_token": token,
        "output": crate::util::output(&[crate::util::finding("R1", "a.rs", 1, "late")]),
        "usage": {"model": "m", "input_tokens": 10, "output_tokens": 5, "cost_micros": 1000}});
    api.post(&format!("/v1/extractions/{id}/result"), &body).await.status
}

/// Workers hold leases on the tenant's work when it is erased; their results come in
/// before, during and after the erasure. Each result either committed before the
/// erasure (and went with it: its charge is in the erased total) or finds nothing (404):
/// nothing is recreated, nothing is charged to a live entry, and the other tenant's
/// leased work commits as usual.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn results_under_leases_racing_an_erasure_commit_before_it_or_find_nothing() {
    const N: usize = 24;
    let dir = crate::util::temp_dir();
    let server = crate::util::Server::start(dir.path());
    let api = server.api();
    let mut ids = Vec::new();
    for i in 0..N {
        // One file, `a.rs`, in 24 versions (and the bystander's): the answers' findings name it.
        ids.push(api.create("leased", "a.rs", &format!("fn l{i}() {{}}")).await);
    }
    let kept = api.create("bystander", "a.rs", "fn b() {}").await;
    let grants = api.claim("w1", N as u32 + 1, 600).await;
    assert_eq!(grants.len(), N + 1);
    let token = |id: &str| {
        let grant = grants.iter().find(|g| g["extraction_id"] == json!(id)).expect("granted");
        grant["lease_token"].as_str().expect("token").to_string()
    };
    // The first third commits before the erasure starts.
    for id in &ids[..N / 3] {
        assert_eq!(post_paid(&api, id, &token(id)).await, 200);
    }
    // The rest race it.
    let racing: Vec<_> = ids[N / 3..]
        .iter()
        .map(|id| {
            let (api, id, token) = (server.api(), id.clone(), token(id));
            tokio::spawn(async move { post_paid(&api, &id, &token).await })
        })
        .collect();
    let erased = api.send(Method::DELETE, "/v1/tenants/leased", None).await;
    assert_eq!(erased.status, 200, "{:#}", erased.body);
    let mut committed = N / 3;
    for task in racing {
        match task.await.expect("post task") {
            200 => committed += 1,
            404 => {}
            other => panic!("a racing result got {other}"),
        }
    }
    // Every late result (its extraction erased) now finds nothing.
    for id in &ids {
        assert_eq!(post_paid(&api, id, &token(id)).await, 404, "a late result recreates nothing");
        api.get(&format!("/v1/extractions/{id}")).await.assert_error(404, "not_found");
    }
    assert!(api.list_all("tenant=leased&").await.is_empty());
    assert_eq!(erased.body["extractions"], json!(N), "{:#}", erased.body);
    let costs = api.get("/v1/tenants/leased/costs").await;
    assert_eq!(costs.status, 200, "{:#}", costs.body);
    assert_eq!(costs.body["charged_micros"], json!(0), "no live entry: {:#}", costs.body);
    assert_eq!(costs.body["erased_micros"], json!(1000 * committed), "{committed} committed first: {:#}", costs.body);
    assert_eq!(post_paid(&api, &kept, &token(&kept)).await, 200, "the other tenant's lease is untouched");
    assert_eq!(api.record(&kept).await["state"], json!("committed"));
    stop_and_verify(server);
}

/// A submit intent (members taken, nothing sent yet: the process died before the job id)
/// whose every member's tenant is erased is closed, so their content is never sent; the
/// closed batch names the erasure, and `verify` passes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_intent_whose_members_are_all_erased_is_closed_unsent() {
    use std::os::unix::process::ExitStatusExt;

    let rig = Rig::start(Duration::from_millis(200), Faults::default()).await;
    let mut server = rig.serve(crate::provider::ONE_BATCH, Some("after-submit-before-job-id"));
    intake_corpus(&server.api()).await;
    let (status, _) = server.wait_exit(SETTLE).expect("the server reached its crash point");
    assert_eq!(status.signal(), Some(9), "{status:?}");
    // Without [providers] nothing resumes the intent: it is still an intent when erased.
    let server = crate::util::Server::start(rig.dir.path());
    let api = server.api();
    assert!(api.list_all("").await.iter().all(|r| r["state"] == json!("submitted")));
    let reply = api.send(Method::DELETE, &format!("/v1/tenants/{TENANT}"), None).await;
    assert_eq!(reply.status, 200, "{:#}", reply.body);
    assert_eq!(reply.body["extractions"], json!(CORPUS.len()), "{:#}", reply.body);
    assert_eq!(reply.body["intents_closed"], json!(1), "{:#}", reply.body);
    stop_and_verify(server);
    let rows = if crate::support::postgres::enabled() {
        crate::support::postgres::dump(rig.dir.path())
    } else {
        let mut cmd = std::process::Command::new(crate::util::BIN);
        cmd.arg("debug-dump").arg(rig.db());
        crate::util::stdout(&crate::util::run_to_end(cmd))
    };
    let batches: Vec<&str> = rows.lines().filter(|r| r.starts_with("batches\t")).collect();
    assert_eq!(batches.len(), 1, "{rows}");
    assert!(batches[0].contains("Closed { job_id: None, outcome: \"erased: "), "{}", batches[0]);
    assert!(batches[0].contains("members: []"), "the erased members left the intent: {}", batches[0]);
}
