//! `commitpoint verify --store-url` on PostgreSQL: it holds on a live database, and each
//! kind of corruption written behind the store's back with SQL makes it exit 1 naming the
//! violation. The tests that need a server say so and pass without running unless
//! `COMMITPOINT_TEST_STORE=postgres`; the refusals that need none run everywhere.

use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use serde_json::json;

use crate::provider::{CORPUS, Rig, TENANT};
use crate::support::postgres::{self, cluster, database_for, verify_command};
use crate::util::{BIN, Server, assert_verifies, finding, output, reviewed, run_to_end, stderr, stdout, temp_dir};

/// `commitpoint verify ARGS…` with no store URL or config file from the environment.
fn verify_with(args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut cmd = Command::new(BIN);
    cmd.arg("verify").args(args).env_remove("COMMITPOINT_STORE_URL").env_remove("COMMITPOINT_CONFIG");
    cmd.stdin(Stdio::null());
    for (name, value) in env {
        cmd.env(name, value);
    }
    run_to_end(cmd)
}

/// A committed extraction (findings, raw result, a charged ledger entry, its spend row)
/// beside a pending one; the server keeps running.
async fn committed_and_pending() -> (tempfile::TempDir, Server) {
    let dir = temp_dir();
    let server = Server::start(dir.path());
    let api = server.api();
    let id = api.create(TENANT, "a.rs", &reviewed()).await;
    let (_, token) = api.claim_one("w1", 60).await;
    let body = json!({
        "lease_token": token,
        "output": output(&[finding("R1", "a.rs", 1, "one"), finding("R2", "a.rs", 2, "two")]),
        "usage": {"model": "m", "input_tokens": 1000, "output_tokens": 10, "cost_micros": 2000, "request_id": "req-1"},
    });
    let reply = api.post(&format!("/v1/extractions/{id}/result"), &body).await;
    assert_eq!(reply.status, 200, "{:#}", reply.body);
    api.create(TENANT, "b.rs", "let x = 1;").await;
    (dir, server)
}

/// Stops the server, then writes `sql` into its database behind the store's back.
fn corrupt(dir: &Path, server: Server, sql: &str) {
    let (status, log) = server.terminate();
    assert_eq!(status.code(), Some(0), "{log}");
    cluster().psql(&database_for(dir), sql);
}

/// `verify` exits 1 and its report names `violation`.
fn assert_fails_with(dir: &Path, violation: &str) -> String {
    let out = run_to_end(verify_command(dir));
    let text = stdout(&out);
    assert_eq!(out.status.code(), Some(1), "verify must find the damage\nstdout:\n{text}\nstderr:\n{}", stderr(&out));
    assert!(text.contains("PROBLEMS ("), "{text}");
    assert!(text.contains(violation), "expected {violation:?} in\n{text}");
    text
}

#[ignore = "PostgreSQL only: COMMITPOINT_TEST_STORE=postgres, --include-ignored (.ci/run does both)"]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn verify_holds_on_a_live_database_and_counts_what_sql_counts() {
    postgres::require();
    let (_dir, server) = committed_and_pending().await;
    // The server is still serving: verify reads one snapshot and writes nothing.
    let report = assert_verifies(&server.db_path());
    for line in ["extractions: 2", "  committed: 1", "  pending: 1", "findings: 2", "raw results: 1"] {
        assert!(report.lines().any(|l| l == line), "expected {line:?} in\n{report}");
    }
    assert!(report.lines().any(|l| l == "ledger entries: 1"), "{report}");
    assert!(report.starts_with("postgres://"), "the report names the store it read: {report}");
    let api = server.api();
    assert_eq!(api.create(TENANT, "c.rs", "after verify").await.len(), 64, "the server still takes intake");
}

/// The number a report line `label: N` gives.
fn count_in(report: &str, label: &str) -> u64 {
    let line = report.lines().find_map(|l| l.strip_prefix(label)).unwrap_or("0");
    line.trim().parse().unwrap_or_else(|_| panic!("{label} in\n{report}"))
}

/// `verify` beside a server that keeps committing: each run reads one snapshot, so the
/// counts it prints agree with each other exactly (two findings, one raw result and one
/// ledger entry per committed extraction), however the commits interleave with its reads.
#[ignore = "PostgreSQL only: COMMITPOINT_TEST_STORE=postgres, --include-ignored (.ci/run does both)"]
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn verify_while_workers_commit_reads_one_consistent_snapshot() {
    postgres::require();
    let dir = temp_dir();
    let server = Server::start(dir.path());
    let stop = Arc::new(AtomicBool::new(false));
    let mut workers = Vec::new();
    for w in 0..4 {
        let (stop, api) = (Arc::clone(&stop), server.api());
        workers.push(tokio::spawn(async move {
            let mut n = 0u64;
            while !stop.load(Ordering::Relaxed) {
                api.create(TENANT, &format!("w{w}-{n}.rs"), &reviewed()).await;
                // Each worker claims after its own intake, so there is always one to take.
                let (id, token) = api.claim_one(&format!("w{w}"), 60).await;
                let body = json!({
                    "lease_token": token,
                    "output": output(&[finding("R1", "a.rs", 1, "one"), finding("R2", "a.rs", 2, "two")]),
                    "usage": {"model": "m", "input_tokens": 10, "output_tokens": 1, "cost_micros": 5},
                });
                let reply = api.post(&format!("/v1/extractions/{id}/result"), &body).await;
                assert_eq!(reply.status, 200, "{:#}", reply.body);
                n += 1;
            }
            n
        }));
    }
    let mut seen = Vec::new();
    for _ in 0..10 {
        let path = dir.path().to_path_buf();
        let out = tokio::task::spawn_blocking(move || run_to_end(verify_command(&path))).await.expect("verify task");
        let text = stdout(&out);
        assert_eq!(out.status.code(), Some(0), "stdout:\n{text}\nstderr:\n{}", stderr(&out));
        let committed = count_in(&text, "  committed: ");
        assert_eq!(count_in(&text, "findings: "), 2 * committed, "{text}");
        assert_eq!(count_in(&text, "raw results: "), committed, "{text}");
        assert_eq!(count_in(&text, "ledger entries: "), committed, "{text}");
        seen.push(committed);
    }
    stop.store(true, Ordering::Relaxed);
    let mut posted = 0;
    for worker in workers {
        posted += worker.await.expect("worker task");
    }
    assert!(posted > 0 && seen.iter().any(|&c| c > 0), "the worker committed nothing while verify ran: {seen:?}");
    let report = crate::util::stop_and_verify(server);
    assert_eq!(count_in(&report, "  committed: "), posted, "{report}");
}

#[ignore = "PostgreSQL only: COMMITPOINT_TEST_STORE=postgres, --include-ignored (.ci/run does both)"]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_committed_extraction_without_its_raw_result_fails_verify() {
    postgres::require();
    let (dir, server) = committed_and_pending().await;
    corrupt(dir.path(), server, "DELETE FROM results");
    assert_fails_with(dir.path(), "committed without its raw result, and retention did not drop it (invariant 2)");
}

/// Retention's marks must say what is gone: content emptied without a mark, or a mark on
/// work that is not committed, is damage; with the right mark the same row verifies.
#[ignore = "PostgreSQL only: COMMITPOINT_TEST_STORE=postgres, --include-ignored (.ci/run does both)"]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn content_or_raw_results_gone_without_a_retention_mark_fail_verify() {
    postgres::require();
    let (dir, server) = committed_and_pending().await;
    let committed = "(SELECT min(seq) FROM extractions WHERE state_code = 3)";
    corrupt(dir.path(), server, &format!("UPDATE extractions SET content = NULL WHERE seq = {committed}"));
    assert_fails_with(dir.path(), "its content is missing without a retention mark");

    let database = database_for(dir.path());
    cluster().psql(&database, &format!("INSERT INTO retired (extraction_seq, bits) VALUES ({committed}, 1)"));
    crate::util::assert_verifies(&dir.path().join(commitpoint::store::FILE_NAME));

    let pending = "(SELECT min(seq) FROM extractions WHERE state_code = 1)";
    cluster().psql(&database, &format!("INSERT INTO retired (extraction_seq, bits) VALUES ({pending}, 2)"));
    assert_fails_with(dir.path(), "marked as retired but is pending");
}

#[ignore = "PostgreSQL only: COMMITPOINT_TEST_STORE=postgres, --include-ignored (.ci/run does both)"]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ledger_entry_for_a_missing_extraction_fails_verify() {
    postgres::require();
    let (dir, server) = committed_and_pending().await;
    corrupt(dir.path(), server, "UPDATE ledger SET extraction_seq = extraction_seq + 1000");
    assert_fails_with(dir.path(), "names an extraction or tenant that does not exist");
}

#[ignore = "PostgreSQL only: COMMITPOINT_TEST_STORE=postgres, --include-ignored (.ci/run does both)"]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_state_column_that_disagrees_with_its_record_fails_verify() {
    postgres::require();
    let (dir, server) = committed_and_pending().await;
    // What claims select on says pending; the record says committed.
    corrupt(dir.path(), server, "UPDATE extractions SET state_code = 1, committed_at_ms = NULL WHERE state_code = 3");
    assert_fails_with(dir.path(), "its state_code column disagrees with its record, which is committed");
}

#[ignore = "PostgreSQL only: COMMITPOINT_TEST_STORE=postgres, --include-ignored (.ci/run does both)"]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_spend_row_that_disagrees_with_its_ledger_entries_fails_verify() {
    postgres::require();
    let (dir, server) = committed_and_pending().await;
    corrupt(dir.path(), server, "UPDATE spend SET micros = micros + 1");
    assert_fails_with(dir.path(), &format!("spend of {TENANT} on day"));
}

/// Outbox events: the state column puts an event on the list its state needs, and the
/// extraction it names exists with the identity it names.
#[ignore = "PostgreSQL only: COMMITPOINT_TEST_STORE=postgres, --include-ignored (.ci/run does both)"]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_outbox_event_off_its_list_or_naming_a_missing_extraction_fails_verify() {
    postgres::require();
    let dir = temp_dir();
    // A sink nobody listens on: the event stays pending (due).
    let config = dir.path().join("config.toml");
    let sink =
        "[[outbox.sinks]]\nname = \"downstream\"\nurl = \"http://127.0.0.1:1/hook\"\nsecret_env = \"SINK_SECRET\"\n";
    std::fs::write(&config, sink).expect("write the config file");
    let config = config.to_str().expect("utf-8 temp path");
    let secret = ("SINK_SECRET", "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw");
    let server = Server::start_with_env(dir.path(), &["--config", config], &[secret]);
    let api = server.api();
    let id = api.create(TENANT, "a.rs", &reviewed()).await;
    let (_, token) = api.claim_one("w1", 60).await;
    let reply = api.post_result(&id, &token, &output(&[finding("R1", "a.rs", 1, "one")])).await;
    assert_eq!(reply.status, 200, "{:#}", reply.body);
    let (status, log) = server.terminate();
    assert_eq!(status.code(), Some(0), "{log}");
    let report = assert_verifies(&crate::support::process::db_path(dir.path()));
    assert!(report.lines().any(|l| l == "outbox events: 1"), "{report}");

    let database = database_for(dir.path());
    cluster().psql(&database, "UPDATE outbox SET state_code = 3");
    assert_fails_with(dir.path(), "outbox #1 is not on the list its state needs");
    cluster().psql(&database, "UPDATE extractions SET id = sha256(id)");
    assert_fails_with(dir.path(), "outbox #1 names an extraction that does not exist");
}

/// Invariant 4: a member of a live job is in no second live batch. A second live batch
/// (a copy of the first under another key) listing the same submitted members breaks it.
#[ignore = "PostgreSQL only: COMMITPOINT_TEST_STORE=postgres, --include-ignored (.ci/run does both)"]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_in_two_live_batches_fails_verify() {
    postgres::require();
    // A provider slower than the test: the batch stays live.
    let rig = Rig::start(Duration::from_secs(3_600), commitpoint::simulator::Faults::default()).await;
    let server = rig.serve(&[], None);
    let api = server.api();
    for source in &CORPUS[..2] {
        api.create(TENANT, source.id, source.content).await;
    }
    rig.wait_stats("the batch to be created", |s| s.batches_created == 1).await;
    let database = database_for(rig.dir.path());
    let deadline = Instant::now() + Duration::from_secs(30);
    while cluster().psql(&database, "SELECT count(*) FROM batches WHERE job_id IS NOT NULL") != "1" {
        assert!(Instant::now() < deadline, "the job id was never recorded");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let (status, log) = server.terminate();
    assert_eq!(status.code(), Some(0), "{log}");
    let report = assert_verifies(&crate::support::process::db_path(rig.dir.path()));
    assert!(report.lines().any(|l| l == "  submitted: 2"), "{report}");
    cluster().psql(
        &database,
        "INSERT INTO batches (seq, batch_key, provider, state_code, job_id, next_action_at_ms, created_at_ms, format, \
         record) SELECT seq + 1000, batch_key || '-copy', provider, state_code, job_id, next_action_at_ms, \
         created_at_ms, format, record FROM batches; \
         INSERT INTO batch_members SELECT batch_seq + 1000, extraction_seq FROM batch_members",
    );
    let text = assert_fails_with(rig.dir.path(), "is a member of two live batches (invariant 4)");
    assert_eq!(text.matches("is a member of two live batches").count(), 2, "both members: {text}");
}

/// The schema check comes before anything is read: a newer schema is refused (not judged)
/// with the message `serve` gives, and exit 78.
#[ignore = "PostgreSQL only: COMMITPOINT_TEST_STORE=postgres, --include-ignored (.ci/run does both)"]
#[test]
fn verify_refuses_a_newer_schema() {
    postgres::require();
    let dir = temp_dir();
    drop(Server::start(dir.path()));
    cluster().psql(
        &database_for(dir.path()),
        "INSERT INTO refinery_schema_history (version, name, applied_on, checksum) VALUES (999, 'future', 'x', '0')",
    );
    let out = run_to_end(verify_command(dir.path()));
    assert_eq!(out.status.code(), Some(78), "stdout:\n{}\nstderr:\n{}", stdout(&out), stderr(&out));
    assert!(stderr(&out).contains("schema is at version 999, newer than this build knows"), "{}", stderr(&out));
    assert!(stdout(&out).is_empty(), "no report for a schema it does not know: {}", stdout(&out));
}

/// `--config` takes `[store]` as `serve` does, the password by reference; a missing
/// password variable is a configuration error.
#[ignore = "PostgreSQL only: COMMITPOINT_TEST_STORE=postgres, --include-ignored (.ci/run does both)"]
#[test]
fn verify_reads_the_store_and_its_password_from_a_config_file() {
    postgres::require();
    let dir = temp_dir();
    drop(Server::start(dir.path()));
    let url = cluster().url(&database_for(dir.path()));
    let config = dir.path().join("config.toml");
    let text = format!("[store]\nbackend = \"postgres\"\nurl = {url:?}\npassword_env = \"CP_VERIFY_DB_PASSWORD\"\n");
    std::fs::write(&config, text).expect("write the config file");
    let config = config.to_str().expect("utf-8 temp path");
    // The test server trusts loopback logins, so any password will do.
    let out = verify_with(&["--config", config], &[("CP_VERIFY_DB_PASSWORD", "unused-by-trust-auth")]);
    assert_eq!(out.status.code(), Some(0), "stdout:\n{}\nstderr:\n{}", stdout(&out), stderr(&out));
    assert!(stdout(&out).contains("ok: every invariant holds"), "{}", stdout(&out));
    let missing = verify_with(&["--config", config], &[]);
    assert_eq!(missing.status.code(), Some(78), "{}", stderr(&missing));
    assert!(stderr(&missing).contains("CP_VERIFY_DB_PASSWORD"), "{}", stderr(&missing));
}

/// Refused before any connection, so these run without PostgreSQL too: a password written
/// into the URL (never echoed), no store named at all, a URL given where a file goes.
#[test]
fn verify_refuses_a_password_in_the_url_and_a_missing_store() {
    let inline = verify_with(&["--store-url", "postgres://cp:hunter2@127.0.0.1:1/cp"], &[]);
    assert_eq!(inline.status.code(), Some(78), "{}", stderr(&inline));
    assert!(stderr(&inline).contains("holds a password"), "{}", stderr(&inline));
    assert!(!stderr(&inline).contains("hunter2") && !stdout(&inline).contains("hunter2"), "{}", stderr(&inline));
    let from_env = verify_with(&[], &[("COMMITPOINT_STORE_URL", "postgres://cp:hunter2@127.0.0.1:1/cp")]);
    assert_eq!(from_env.status.code(), Some(78), "{}", stderr(&from_env));

    let config = temp_dir();
    let empty = config.path().join("config.toml");
    std::fs::write(&empty, "").expect("write the config file");
    let none = verify_with(&["--config", empty.to_str().expect("utf-8 temp path")], &[]);
    assert_eq!(none.status.code(), Some(64), "{}", stderr(&none));
    assert!(stderr(&none).contains("--store-url"), "{}", stderr(&none));

    let url_as_file = verify_with(&["postgres://cp@127.0.0.1:1/cp"], &[]);
    assert_eq!(url_as_file.status.code(), Some(64), "{}", stderr(&url_as_file));
    assert!(stderr(&url_as_file).contains("--store-url"), "{}", stderr(&url_as_file));

    let both = verify_with(&["some.redb", "--store-url", "postgres://cp@127.0.0.1:1/cp"], &[]);
    assert_eq!(both.status.code(), Some(64), "a file and a URL at once: {}", stderr(&both));
}

/// A database that cannot be reached is exit 69, not a report.
#[test]
fn verify_of_an_unreachable_database_exits_69() {
    let port = std::net::TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).expect("a free port").port();
    let out = verify_with(&["--store-url", &format!("postgres://cp@127.0.0.1:{port}/cp")], &[]);
    assert_eq!(out.status.code(), Some(69), "{}", stderr(&out));
    assert!(stderr(&out).contains("cannot connect"), "{}", stderr(&out));
}
