//! Retention on the real binary (issue 15, item 2). The crate's clock cannot be moved, so
//! the configuration uses second-long retentions and a fast sweep: the same code path as
//! "30d", only sooner.

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::util::{Api, BIN, Server, finding, output, run_to_end, stdout, stop_and_verify, temp_dir};

fn config(dir: &Path, retention: &str) -> String {
    let path = dir.join("config.toml");
    std::fs::write(&path, retention).expect("config");
    path.display().to_string()
}

async fn commit(api: &Api, source: &str, content: &str) -> String {
    let id = api.create("acme", source, content).await;
    let (claimed, token) = api.claim_one("w1", 60).await;
    assert_eq!(claimed, id);
    let reply = api.post_result(&id, &token, &output(&[finding("R1", source, 1, "kept for ever")])).await;
    assert_eq!(reply.status, 200, "{:#}", reply.body);
    id
}

/// Polls the record until `done`, for at most ten seconds.
async fn wait_record(api: &Api, id: &str, what: &str, done: impl Fn(&Value) -> bool) -> Value {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let record = api.record(id).await;
        if done(&record) {
            return record;
        }
        assert!(Instant::now() < deadline, "{what} never happened: {record:#}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn dump(db: &Path) -> String {
    if crate::support::postgres::enabled() {
        return crate::support::postgres::dump(db.parent().expect("the store's data directory"));
    }
    let mut cmd = Command::new(BIN);
    cmd.arg("debug-dump").arg(db);
    let out = run_to_end(cmd);
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
    stdout(&out)
}

#[tokio::test]
async fn content_then_raw_result_are_dropped_after_commit_and_duplicates_are_still_known() {
    let dir = temp_dir();
    let text =
        "[retention]\ncontent_after_commit = \"1s\"\nraw_results_after_commit = \"2s\"\nsweep_interval = \"100ms\"\n";
    let server = Server::start_with(dir.path(), &["--config", &config(dir.path(), text)]);
    let api = server.api();
    let content = "fn secret_sauce() {} // MARKER-CONTENT";
    let id = commit(&api, "a.rs", content).await;
    let fresh = api.record(&id).await;
    assert_eq!((fresh["content_retained"].clone(), fresh["raw_result_retained"].clone()), (json!(true), json!(true)));
    let findings = api.findings(&id).await;
    let waiting = api.create("acme", "b.rs", "fn waiting() {} // MARKER-PENDING").await;

    let record = wait_record(&api, &id, "dropping the content", |r| r["content_retained"] == json!(false)).await;
    assert_eq!(record["state"], json!("committed"));
    let record = wait_record(&api, &id, "dropping the raw result", |r| r["raw_result_retained"] == json!(false)).await;
    assert_eq!(record["content_retained"], json!(false));
    assert_eq!(api.findings(&id).await, findings, "findings stay");
    let listed = api.list_all("").await;
    let listed: Vec<&Value> = listed.iter().filter(|r| r["extraction_id"] == json!(id)).collect();
    assert_eq!(listed[0]["content_retained"], json!(false), "listings show it too");

    // A redelivery of the same source is still the same extraction: deduplication stays.
    let again = api.intake("acme", "a.rs", content).await;
    assert_eq!(again.status, 200, "{:#}", again.body);
    assert_eq!((again.body["created"].clone(), again.body["extraction_id"].clone()), (json!(false), json!(id)));
    // Uncommitted work keeps its content, and a worker still gets it.
    assert_eq!(api.record(&waiting).await["content_retained"], json!(true));
    let grants = api.claim("w2", 1, 60).await;
    assert_eq!(grants[0]["content"], json!("fn waiting() {} // MARKER-PENDING"));

    let db = server.db_path();
    stop_and_verify(server);
    let rows = dump(&db);
    assert!(!rows.contains("MARKER-CONTENT"), "the content is gone from the file");
    assert!(rows.contains("MARKER-PENDING"), "the pending content is not");
    assert!(!rows.lines().any(|r| r.starts_with("results\t")), "no raw result is left");
    assert!(rows.lines().any(|r| r.starts_with("findings\t")), "findings are");
}

#[tokio::test]
async fn without_retention_everything_is_kept() {
    let dir = temp_dir();
    let server = Server::start(dir.path());
    let api = server.api();
    let id = commit(&api, "a.rs", "fn a() {} // MARKER-KEPT").await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let record = api.record(&id).await;
    assert_eq!((record["content_retained"].clone(), record["raw_result_retained"].clone()), (json!(true), json!(true)));
    let db = server.db_path();
    stop_and_verify(server);
    let rows = dump(&db);
    assert!(rows.contains("MARKER-KEPT") && rows.lines().any(|r| r.starts_with("results\t")));
}

#[test]
fn bad_retention_values_are_configuration_errors() {
    let dir = temp_dir();
    let path = config(dir.path(), "[retention]\ncontent_after_commit = \"a month\"\n");
    let out = crate::util::cli(&["config", "check", "--config", &path]);
    assert_eq!(out.status.code(), Some(78), "{}", String::from_utf8_lossy(&out.stderr));
    let text = format!("{}{}", stdout(&out), String::from_utf8_lossy(&out.stderr));
    assert!(text.contains("retention.content_after_commit"), "{text}");
}

/// Commits, fails and leaves claimed seven sources in intake order: committed are the
/// 1st, 2nd, 4th, 5th and 7th, so a sweep's steps cross work it must not touch.
async fn interleaved(api: &Api) {
    let mut ids = Vec::new();
    for i in 1..=7 {
        ids.push(api.create("acme", &format!("s{i}.rs"), &format!("fn s{i}() {{}}")).await);
    }
    let grants = api.claim("w", 7, 600).await;
    for (i, id) in ids.iter().enumerate() {
        let grant = grants.iter().find(|g| g["extraction_id"] == json!(id)).expect("granted");
        let token = grant["lease_token"].as_str().expect("token");
        let (body, status) = match i + 1 {
            3 => (json!({"findings": "not a list"}), 422),
            6 => continue,
            _ => (output(&[finding("R1", &format!("s{}.rs", i + 1), 1, "x")]), 200),
        };
        assert_eq!(api.post_result(id, token, &body).await.status, status);
    }
}

/// A whole sweep in steps of two: (contents dropped, raw results dropped, next start).
async fn sweep(store: &dyn commitpoint::store::seam::Upkeep) -> Vec<(u64, u64, Option<u64>)> {
    let policy = commitpoint::store::RetentionPolicy { content_after_ms: Some(0), raw_results_after_ms: Some(0) };
    let (mut steps, mut after) = (Vec::new(), 0);
    loop {
        let step = store.retention_step(policy, after, 2).await.expect("a retention step");
        steps.push((step.contents_dropped, step.raw_results_dropped, step.next_after));
        match step.next_after {
            Some(next) => after = next,
            None => return steps,
        }
        assert!(steps.len() < 10, "the sweep never ends: {steps:?}");
    }
}

/// Each step looks at no more than `scan` committed extractions and says where the next
/// one starts; a second sweep finds nothing left to drop. redb and PostgreSQL take the
/// same steps over the same work (the PostgreSQL half with COMMITPOINT_TEST_STORE=postgres).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sweep_goes_in_steps_of_scan_and_both_backends_take_the_same_steps() {
    let dir = temp_dir();
    let redb_dir = dir.path().join("redb");
    let server = Server::spawn_as_is(crate::util::serve_command(&redb_dir, &[]), &redb_dir);
    interleaved(&server.api()).await;
    let (status, log) = server.terminate();
    assert_eq!(status.code(), Some(0), "{log}");
    let (store, guard) = commitpoint::store::Store::open(&redb_dir, 16 << 20).expect("open the redb store");
    let steps = sweep(&store).await;
    let again = sweep(&store).await;
    drop(store);
    tokio::task::spawn_blocking(move || guard.join()).await.expect("close the writer");
    let counts: Vec<(u64, u64)> = steps.iter().map(|s| (s.0, s.1)).collect();
    assert_eq!(counts, [(2, 2), (2, 2), (1, 1)], "{steps:?}");
    assert!(steps[0].2 < steps[1].2 && steps[1].2.is_some() && steps[2].2.is_none(), "{steps:?}");
    assert!(again.iter().all(|s| (s.0, s.1) == (0, 0)), "everything was dropped already: {again:?}");
    let verified = crate::util::verify(&redb_dir.join(commitpoint::store::FILE_NAME));
    assert_eq!(verified.status.code(), Some(0), "{}", stdout(&verified));

    if !crate::support::postgres::enabled() {
        eprintln!("PostgreSQL half skipped: needs {}=postgres", crate::support::postgres::STORE_ENV);
        return;
    }
    let pg_dir = dir.path().join("pg");
    let server = Server::start(&pg_dir);
    interleaved(&server.api()).await;
    let (status, log) = server.terminate();
    assert_eq!(status.code(), Some(0), "{log}");
    let url = crate::support::postgres::cluster().url(&crate::support::postgres::database_for(&pg_dir));
    let options = commitpoint::store::postgres::PgOptions { url, password: None };
    let store = commitpoint::store::postgres::PgStore::open(&options).await.expect("open the PostgreSQL store");
    assert_eq!(sweep(&store).await, steps, "the same steps as on redb");
    assert_eq!(sweep(&store).await, again);
    crate::util::assert_verifies(&pg_dir.join(commitpoint::store::FILE_NAME));
}
