//! The PostgreSQL backend's invariants, checked against a real PostgreSQL server
//! (`COMMITPOINT_TEST_STORE=postgres`, which `.ci/run` sets in its postgres step). Without
//! the switch these tests say so and pass without running: they need the server.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use serde_json::json;

use crate::support::postgres::{self, cluster, database_for};
use crate::util::{Server, finding, id_of, output, reviewed, temp_dir};

fn rows(database: &str, sql: &str) -> u64 {
    cluster().psql(database, sql).parse().expect("a count")
}

/// Many clients deliver the same source at once: one row, one `created: true`, and every
/// answer names the same identity.
#[ignore = "PostgreSQL only: COMMITPOINT_TEST_STORE=postgres, --include-ignored (.ci/run does both)"]
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_duplicate_intakes_make_one_row() {
    postgres::require();
    let dir = temp_dir();
    let server = Server::start(dir.path());
    let api = server.api();
    let mut tasks = Vec::new();
    for _ in 0..48 {
        let api = api.clone();
        tasks.push(tokio::spawn(async move { api.intake("acme", "PR-1", "fn main() {}").await }));
    }
    let mut created = 0;
    let mut ids = std::collections::BTreeSet::new();
    for task in tasks {
        let reply = task.await.expect("intake task");
        assert!(reply.status == 201 || reply.status == 200, "{:#}", reply.body);
        if reply.body["created"] == json!(true) {
            created += 1;
        }
        ids.insert(id_of(&reply.body));
    }
    assert_eq!(created, 1, "exactly one delivery creates the extraction");
    assert_eq!(ids.len(), 1, "every answer names the same identity: {ids:?}");
    let database = database_for(dir.path());
    assert_eq!(rows(&database, "SELECT count(*) FROM extractions"), 1);
}

/// A worker whose lease expired and was taken over cannot commit: its token is refused by
/// the same transaction that would have written its findings, and the current holder's
/// answer is the one committed.
#[ignore = "PostgreSQL only: COMMITPOINT_TEST_STORE=postgres, --include-ignored (.ci/run does both)"]
#[tokio::test]
async fn a_stale_lease_token_is_refused_and_writes_nothing() {
    postgres::require();
    let dir = temp_dir();
    let server = Server::start(dir.path());
    let api = server.api();
    let id = api.create("acme", "PR-2", &reviewed()).await;
    let (_, stale) = api.claim_one("w1", 1).await;
    tokio::time::sleep(Duration::from_millis(1_300)).await;
    let (again, current) = api.claim_one("w2", 60).await;
    assert_eq!(again, id);
    assert_ne!(stale, current);
    let late = output(&[finding("R1", "a.rs", 1, "late")]);
    api.post_result(&id, &stale, &late).await.assert_error(409, "stale_lease");
    let database = database_for(dir.path());
    assert_eq!(rows(&database, "SELECT count(*) FROM findings"), 0, "the stale answer wrote nothing");
    let fresh = output(&[finding("R1", "a.rs", 2, "fresh"), finding("R2", "b.rs", 3, "also")]);
    let reply = api.post_result(&id, &current, &fresh).await;
    assert_eq!(reply.status, 200, "{:#}", reply.body);
    assert_eq!(api.record(&id).await["state"], json!("committed"));
    assert_eq!(rows(&database, "SELECT count(*) FROM findings"), 2);
    assert_eq!(rows(&database, "SELECT count(*) FROM results"), 1);
    // A replay of the committed answer by its own lease is answered, not written again.
    assert_eq!(api.post_result(&id, &current, &fresh).await.status, 200);
    assert_eq!(rows(&database, "SELECT count(*) FROM findings"), 2);
}

/// SIGKILL while many clients submit, then a restart on the same database: every intake
/// the server acknowledged is there exactly once, under the identity it was answered with.
#[ignore = "PostgreSQL only: COMMITPOINT_TEST_STORE=postgres, --include-ignored (.ci/run does both)"]
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn every_acknowledged_intake_survives_a_sigkill_once() {
    postgres::require();
    let dir = temp_dir();
    let mut server = Server::start(dir.path());
    let api = server.api();
    let stop = Arc::new(AtomicBool::new(false));
    let acks = Arc::new(std::sync::Mutex::new(BTreeMap::new()));
    let mut clients = Vec::new();
    for c in 0..16 {
        let (api, stop, acks) = (api.clone(), Arc::clone(&stop), Arc::clone(&acks));
        clients.push(tokio::spawn(async move {
            for n in 0.. {
                if stop.load(Ordering::Relaxed) {
                    return;
                }
                // Every fourth source is shared by all clients: concurrent duplicates.
                let source = if n % 4 == 3 { format!("shared-{}", n % 8) } else { format!("c{c}-{n}") };
                match api.try_intake("acme", &source, &format!("content of {source}")).await {
                    Ok(reply) if reply.status == 200 || reply.status == 201 => {
                        acks.lock().expect("acks").insert(source, id_of(&reply.body));
                    }
                    _ => return,
                }
            }
        }));
    }
    while acks.lock().expect("acks").len() < 300 {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    server.kill9();
    stop.store(true, Ordering::Relaxed);
    for client in clients {
        let _ = client.await;
    }
    let acks = acks.lock().expect("acks").clone();
    let restarted = Server::start(dir.path());
    let api = restarted.api();
    for (source, id) in &acks {
        let record = api.record(id).await;
        assert_eq!(record["source_id"], json!(source), "{id}");
    }
    let database = database_for(dir.path());
    let distinct = rows(&database, "SELECT count(DISTINCT id) FROM extractions");
    let total = rows(&database, "SELECT count(*) FROM extractions");
    assert_eq!(distinct, total, "no identity stored twice");
    assert!(total >= acks.len() as u64, "{total} rows for {} acknowledged sources", acks.len());
}

/// A database migrated by a newer build is refused at start, with a message that says so.
#[ignore = "PostgreSQL only: COMMITPOINT_TEST_STORE=postgres, --include-ignored (.ci/run does both)"]
#[test]
fn a_newer_schema_is_refused_at_start() {
    postgres::require();
    let dir = temp_dir();
    drop(Server::start(dir.path()));
    let database = database_for(dir.path());
    cluster().psql(
        &database,
        "INSERT INTO refinery_schema_history (version, name, applied_on, checksum) VALUES (999, 'future', 'x', '0')",
    );
    let mut cmd = crate::util::serve_command(dir.path(), &[]);
    postgres::apply(&mut cmd, dir.path());
    let out = crate::util::run_to_end(cmd);
    assert!(!out.status.success(), "serve must refuse a newer schema");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("schema is at version 999"), "{err}");
}

/// One instance at a time drives a provider's batches. A second `serve` with the same
/// provider on the same database starts and stands by: it takes intake and serves reads
/// while the first drives (`/v1/stats` names the driver), and it takes the provider over
/// when the first stops, its lock having gone with its session.
#[ignore = "PostgreSQL only: COMMITPOINT_TEST_STORE=postgres, --include-ignored (.ci/run does both)"]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_instance_with_the_same_provider_stands_by_and_takes_over_when_the_first_stops() {
    postgres::require();
    let rig = crate::provider::Rig::start(Duration::from_millis(50), commitpoint::simulator::Faults::default()).await;
    let first = rig.serve(&[], None);
    let other_dir = temp_dir();
    let base = rig.sim.base_url();
    let provider = ["--provider", "openai", "--provider-base-url", &base, "--provider-key-env", "SIM_KEY"];
    let mut cmd = crate::util::serve_command(other_dir.path(), &provider);
    cmd.args(["--batch-max-wait", "200ms", "--poll-interval", "100ms"]).env("SIM_KEY", "sk-test");
    // The first instance's database, from another data directory.
    postgres::apply(&mut cmd, rig.dir.path());
    let second = Server::spawn(cmd, rig.dir.path());
    let driver_of = |stats: &serde_json::Value| stats["store"]["drivers"]["openai"].as_str().map(str::to_string);

    // Both take intake; the first drives the batches of both.
    let mut ids = std::collections::BTreeSet::new();
    for (api, source) in [(first.api(), "PR-1"), (second.api(), "PR-2")] {
        let reply = api.intake("acme", source, &format!("fn {}() {{ x.unwrap() }}", source.replace('-', "_"))).await;
        assert_eq!(reply.status, 201, "{:#}", reply.body);
        ids.insert(crate::util::id_of(&reply.body));
    }
    let records = crate::provider::settle(&second.api(), &ids).await;
    assert!(records.values().all(|r| r["state"] == "committed"), "{records:#?}");
    let stats = second.api().get("/v1/stats").await.body;
    let first_instance = driver_of(&stats).expect("a driver of openai");
    assert!(first_instance.ends_with(&format!(":{}", first.pid())), "the first drives: {stats:#}");
    assert_ne!(stats["store"]["instance"].as_str(), Some(first_instance.as_str()), "{stats:#}");
    let (exit, log) = first.terminate();
    assert_eq!(exit.code(), Some(0), "{log}");

    // The standby takes over: new work is submitted through it and commits.
    let reply = second.api().intake("acme", "PR-3", "fn later() { y.unwrap() }").await;
    assert_eq!(reply.status, 201, "{:#}", reply.body);
    let later = std::collections::BTreeSet::from([crate::util::id_of(&reply.body)]);
    let records = crate::provider::settle(&second.api(), &later).await;
    assert!(records.values().all(|r| r["state"] == "committed"), "{records:#?}");
    let stats = second.api().get("/v1/stats").await.body;
    assert_eq!(driver_of(&stats).as_deref(), stats["store"]["instance"].as_str(), "the second drives now: {stats:#}");
    let batches = rig.stats();
    assert_eq!(batches.max_live_batches_per_custom_id, 1, "{batches:#?}");
    assert!(batches.submissions_per_custom_id.values().all(|n| *n == 1), "{batches:#?}");
    let (exit, log) = second.terminate();
    assert_eq!(exit.code(), Some(0), "{log}");
    assert!(log.contains("standing by") && log.contains("took over driving"), "{log}");
}
