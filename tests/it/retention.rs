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
