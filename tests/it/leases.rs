//! Leases and fencing: an expired lease lets another worker take the work, the lease
//! token decides who may commit, and a late worker can never produce a second commit.

use std::collections::BTreeSet;
use std::time::Duration;

use serde_json::json;

use crate::util::{Server, finding, id_of, output, reviewed, stop_and_verify, temp_dir};

/// Long enough past a one-second lease to be expired on the server's clock.
const PAST_ONE_SECOND_LEASE: Duration = Duration::from_millis(1200);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expired_lease_passes_to_a_second_worker_and_the_late_first_post_is_a_replay() {
    let dir = temp_dir();
    let server = Server::start(dir.path());
    let api = server.api();
    let id = api.create("acme", "PR-1", &reviewed()).await;

    let (claimed, first_token) = api.claim_one("worker-a", 1).await;
    assert_eq!(claimed, id);
    let record = api.record(&id).await;
    assert_eq!(record["state"], json!("claimed"));
    assert_eq!(record["worker"], json!("worker-a"));
    assert!(record["lease_expires_at"].is_string());

    tokio::time::sleep(PAST_ONE_SECOND_LEASE).await;
    let grants = api.claim("worker-b", 10, 60).await;
    assert_eq!(grants.len(), 1, "the expired lease is claimable: {grants:#?}");
    assert_eq!(id_of(&grants[0]), id);
    let second_token = grants[0]["lease_token"].as_str().expect("token").to_string();
    assert_ne!(second_token, first_token, "a new lease gets a new token");
    assert_eq!(api.record(&id).await["worker"], json!("worker-b"));
    assert_eq!(api.record(&id).await["claims"], json!(2));

    // Before the commit, the first worker's token is stale.
    let early = api.post_result(&id, &first_token, &output(&[finding("R9", "a.rs", 9, "from a")])).await;
    early.assert_error(409, "stale_lease");
    assert_eq!(api.record(&id).await["state"], json!("claimed"));

    let committed = api.post_result(&id, &second_token, &output(&[finding("R1", "a.rs", 1, "from b")])).await;
    assert_eq!(committed.status, 200, "{:#}", committed.body);
    assert_eq!(committed.body, json!({"state": "committed", "findings": 1, "replay": false}));
    let record_before = api.record(&id).await;
    let findings_before = api.findings(&id).await;
    assert_eq!(record_before["state"], json!("committed"));
    assert!(record_before["committed_at"].is_string());

    // The first worker finally answers, with different output: a replay, nothing changes.
    let late = api
        .post_result(
            &id,
            &first_token,
            &output(&[finding("R9", "a.rs", 9, "from a"), finding("R8", "b.rs", 2, "also a")]),
        )
        .await;
    assert_eq!(late.status, 200, "{:#}", late.body);
    assert_eq!(late.body, json!({"state": "committed", "findings": 1, "replay": true}));
    assert_eq!(api.record(&id).await, record_before);
    assert_eq!(api.findings(&id).await, findings_before);
    assert_eq!(findings_before["findings"][0]["summary"], json!("from b"));
    stop_and_verify(server);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_live_lease_is_not_handed_out_twice() {
    let dir = temp_dir();
    let server = Server::start(dir.path());
    let api = server.api();
    let id = api.create("acme", "PR-2", &reviewed()).await;
    let (claimed, _) = api.claim_one("worker-a", 60).await;
    assert_eq!(claimed, id);
    assert!(api.claim("worker-b", 10, 60).await.is_empty());
    assert!(api.claim("worker-a", 10, 60).await.is_empty());
    let record = api.record(&id).await;
    assert_eq!(record["worker"], json!("worker-a"));
    assert_eq!(record["claims"], json!(1));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_claimers_split_the_work_without_overlap() {
    let dir = temp_dir();
    let server = Server::start(dir.path());
    let api = server.api();
    let mut created = BTreeSet::new();
    for i in 0..4 {
        created.insert(api.create("acme", &format!("s{i}"), &format!("c{i}")).await);
    }
    let mut tasks = tokio::task::JoinSet::new();
    for w in 0..16 {
        let api = api.clone();
        tasks.spawn(async move { api.claim(&format!("worker-{w}"), 1, 60).await });
    }
    let mut granted = Vec::new();
    while let Some(grants) = tasks.join_next().await {
        granted.extend(grants.expect("claim task").iter().map(id_of));
    }
    granted.sort();
    let distinct: BTreeSet<String> = granted.iter().cloned().collect();
    assert_eq!(granted.len(), 4, "four extractions, four grants: {granted:?}");
    assert_eq!(distinct, created);
    assert!(api.claim("late", 10, 60).await.is_empty());
    stop_and_verify(server);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_expired_lease_nobody_took_over_may_still_commit() {
    let dir = temp_dir();
    let server = Server::start(dir.path());
    let api = server.api();
    let id = api.create("acme", "PR-3", &reviewed()).await;
    let (_, token) = api.claim_one("slow-worker", 1).await;
    tokio::time::sleep(PAST_ONE_SECOND_LEASE).await;
    // The token is still the current one: the fencing token decides, not the clock.
    let reply = api.post_result(&id, &token, &output(&[finding("R1", "x.rs", 3, "s")])).await;
    assert_eq!(reply.status, 200, "{:#}", reply.body);
    assert_eq!(reply.body["replay"], json!(false));
    assert_eq!(api.record(&id).await["state"], json!("committed"));
    assert!(api.claim("other", 10, 60).await.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_result_without_a_current_lease_is_refused() {
    let dir = temp_dir();
    let server = Server::start(dir.path());
    let api = server.api();
    let id = api.create("acme", "PR-4", &reviewed()).await;
    let out = output(&[finding("R1", "x.rs", 3, "s")]);

    // Pending: nobody holds a lease, so no token is current.
    api.post_result(&id, "lt-1-made-up", &out).await.assert_error(409, "stale_lease");
    let (_, token) = api.claim_one("w", 60).await;
    api.post_result(&id, &format!("{token}x"), &out).await.assert_error(409, "stale_lease");
    let record = api.record(&id).await;
    assert_eq!(record["state"], json!("claimed"));
    assert_eq!(api.findings(&id).await["findings"], json!([]));
    stop_and_verify(server);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_worker_cannot_fail_the_current_lease() {
    let dir = temp_dir();
    let server = Server::start(dir.path());
    let api = server.api();
    let id = api.create("acme", "PR-5", &reviewed()).await;
    let invalid = json!({"findings": [{"rule": "R"}]});

    // Pending: an invalid output under no lease changes nothing.
    api.post_result(&id, "lt-1-nobody", &invalid).await.assert_error(409, "stale_lease");
    assert_eq!(api.record(&id).await["state"], json!("pending"));

    let (_, old) = api.claim_one("worker-a", 1).await;
    tokio::time::sleep(PAST_ONE_SECOND_LEASE).await;
    let (_, current) = api.claim_one("worker-b", 60).await;
    api.post_result(&id, &old, &invalid).await.assert_error(409, "stale_lease");
    let record = api.record(&id).await;
    assert_eq!(record["state"], json!("claimed"));
    assert!(record["failure_class"].is_null());

    let reply = api.post_result(&id, &current, &output(&[finding("R", "f.rs", 1, "s")])).await;
    assert_eq!(reply.status, 200, "{:#}", reply.body);
    stop_and_verify(server);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pending_work_is_claimed_in_intake_order() {
    let dir = temp_dir();
    let server = Server::start(dir.path());
    let api = server.api();
    let mut ids = Vec::new();
    for i in 0..4 {
        ids.push(api.create("acme", &format!("s{i}"), &format!("c{i}")).await);
    }
    let mut claimed = Vec::new();
    for _ in 0..2 {
        claimed.push(api.claim_one("w", 60).await.0);
    }
    claimed.extend(api.claim("w", 10, 60).await.iter().map(id_of));
    assert_eq!(claimed, ids);
}

/// A worker on a long document extends its lease with its token: the work stays its own
/// past the lease it claimed, and the extension answers the same token with a later expiry.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_extended_lease_keeps_the_claim_past_its_first_expiry_until_the_result() {
    let dir = temp_dir();
    let server = Server::start(dir.path());
    let api = server.api();
    let id = api.create("acme", "PR-5", &reviewed()).await;
    let (_, token) = api.claim_one("long-worker", 1).await;
    let first_expiry = api.record(&id).await["lease_expires_at"].as_str().expect("expiry").to_string();

    let extended = api.extend_lease(&id, &token, 60).await;
    assert_eq!(extended.status, 200, "{:#}", extended.body);
    assert_eq!(extended.body["lease_token"], json!(token), "an extension keeps the token");
    let new_expiry = extended.body["lease_expires_at"].as_str().expect("new expiry").to_string();
    assert!(new_expiry > first_expiry, "{new_expiry} is not after {first_expiry}");
    assert_eq!(api.record(&id).await["lease_expires_at"], json!(new_expiry), "the record shows the new expiry");

    tokio::time::sleep(PAST_ONE_SECOND_LEASE).await;
    assert!(api.claim("other", 10, 60).await.is_empty(), "the extended lease is still live");
    let committed = api.post_result(&id, &token, &output(&[finding("R1", "x.rs", 3, "s")])).await;
    assert_eq!((committed.status, &committed.body["replay"]), (200, &json!(false)), "{:#}", committed.body);

    // After the result there is no lease left to extend.
    api.extend_lease(&id, &token, 60).await.assert_error(409, "illegal_transition");
    assert_eq!(api.record(&id).await["state"], json!("committed"));
    // Bounds as for claims; an unknown extraction is 404.
    api.extend_lease(&id, &token, 0).await.assert_error(422, "invalid_input");
    api.extend_lease(&id, &token, 86_401).await.assert_error(422, "invalid_input");
    api.extend_lease(&"0".repeat(64), &token, 60).await.assert_error(404, "not_found");
    stop_and_verify(server);
}

/// A worker whose expired lease another worker took over cannot take it back by extending.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_superseded_token_cannot_extend_the_lease() {
    let dir = temp_dir();
    let server = Server::start(dir.path());
    let api = server.api();
    let id = api.create("acme", "PR-6", &reviewed()).await;
    let (_, first) = api.claim_one("worker-a", 1).await;
    tokio::time::sleep(PAST_ONE_SECOND_LEASE).await;
    let (_, second) = api.claim_one("worker-b", 60).await;
    let before = api.record(&id).await;

    api.extend_lease(&id, &first, 600).await.assert_error(409, "stale_lease");
    api.extend_lease(&id, "lt-never-issued", 600).await.assert_error(409, "stale_lease");
    assert_eq!(api.record(&id).await, before, "a refused extension writes nothing");
    assert_eq!(api.extend_lease(&id, &second, 120).await.status, 200, "the current holder still can");
    stop_and_verify(server);
}
