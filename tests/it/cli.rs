//! The command line against a live server: `submit`, `get`, and `verify`.

use std::collections::BTreeSet;

use serde_json::{Value, json};

use crate::util::{Server, assert_verifies, cli, finding, id_of, output, stderr, stdout, temp_dir, verify};

fn write_sources(root: &std::path::Path) {
    std::fs::create_dir_all(root.join("sub")).expect("mkdir");
    std::fs::write(root.join("a.rs"), "fn a() {}\n").expect("write a");
    std::fs::write(root.join("b.md"), "# title\n").expect("write b");
    std::fs::write(root.join("sub").join("c.txt"), "nested\n").expect("write c");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn submit_twice_then_get_and_verify() {
    let dir = temp_dir();
    let sources = temp_dir();
    write_sources(sources.path());
    let server = Server::start(dir.path());
    let api = server.api();
    let root = sources.path().to_str().expect("utf-8 temp path");
    let submit = ["submit", "--server", &server.url, "--tenant", "cli-t", root];

    let first = cli(&submit);
    assert_eq!(first.status.code(), Some(0), "{}", stderr(&first));
    assert!(stdout(&first).contains("submitted: 3 created, 0 already known, 0 failed"), "{}", stdout(&first));
    let second = cli(&submit);
    assert_eq!(second.status.code(), Some(0), "{}", stderr(&second));
    assert!(stdout(&second).contains("submitted: 0 created, 3 already known, 0 failed"), "{}", stdout(&second));

    let listed = api.list_all("tenant=cli-t&").await;
    let source_ids: BTreeSet<&str> = listed.iter().filter_map(|r| r["source_id"].as_str()).collect();
    assert_eq!(source_ids, BTreeSet::from(["a.rs", "b.md", "sub/c.txt"]));
    assert_eq!(api.list_all("").await.len(), 3);

    let id = id_of(&listed[0]);
    let got = cli(&["get", &id, "--server", &server.url]);
    assert_eq!(got.status.code(), Some(0), "{}", stderr(&got));
    let printed: Value = serde_json::from_str(&stdout(&got)).expect("get prints JSON");
    assert_eq!(printed, api.record(&id).await);
    assert_eq!(printed["tenant"], json!("cli-t"));

    let missing = cli(&["get", &"0".repeat(64), "--server", &server.url]);
    assert_ne!(missing.status.code(), Some(0));
    let printed: Value = serde_json::from_str(&stdout(&missing)).expect("error JSON");
    assert_eq!(printed["error"]["code"], json!("not_found"));

    let db = server.db_path();
    let (status, log) = server.terminate();
    assert_eq!(status.code(), Some(0), "{log}");
    let report = assert_verifies(&db);
    assert!(report.contains("extractions: 3"), "{report}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn submit_counts_failures_and_exits_one() {
    let dir = temp_dir();
    let sources = temp_dir();
    std::fs::write(sources.path().join("good.txt"), "text\n").expect("write");
    std::fs::write(sources.path().join("binary.bin"), [0xff, 0xfe, 0x00]).expect("write");
    std::fs::write(sources.path().join("empty.txt"), "").expect("write");
    let server = Server::start(dir.path());
    let root = sources.path().to_str().expect("utf-8 temp path");
    let out = cli(&["submit", "--server", &server.url, "--tenant", "t", root]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert!(stdout(&out).contains("submitted: 1 created, 0 already known, 2 failed"), "{}", stdout(&out));
    // stderr is a pipe here, so the progress bar is hidden: the reasons must still show.
    assert!(stderr(&out).contains("binary.bin") && stderr(&out).contains("not UTF-8"), "{}", stderr(&out));
    assert!(stderr(&out).contains("empty.txt"), "{}", stderr(&out));
    assert_eq!(server.api().list_all("").await.len(), 1);

    let zero = cli(&["submit", "--server", &server.url, "--tenant", "u", "--concurrency", "0", root]);
    assert_ne!(zero.status.code(), Some(0), "{}", stdout(&zero));
    assert!(stderr(&zero).contains("--concurrency"), "{}", stderr(&zero));
    assert_eq!(server.api().list_all("").await.len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn get_takes_an_id_prefix_a_source_and_prints_findings() {
    let dir = temp_dir();
    let sources = temp_dir();
    write_sources(sources.path());
    let server = Server::start(dir.path());
    let api = server.api();
    let root = sources.path().to_str().expect("utf-8 temp path");
    let out = cli(&["submit", "--server", &server.url, "--tenant", "cli-t", root]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let listed = api.list_all("tenant=cli-t&").await;
    let nested = listed.iter().find(|r| r["source_id"] == "sub/c.txt").expect("sub/c.txt");
    let id = id_of(nested);

    let by_prefix = cli(&["get", &id[..12], "--server", &server.url]);
    assert_eq!(by_prefix.status.code(), Some(0), "{}", stderr(&by_prefix));
    let printed: Value = serde_json::from_str(&stdout(&by_prefix)).expect("JSON");
    assert_eq!(printed, api.record(&id).await, "the 12 characters the console shows name the record");

    let by_source = cli(&["get", "--source", "cli-t/sub/c.txt", "--server", &server.url]);
    assert_eq!(by_source.status.code(), Some(0), "{}", stderr(&by_source));
    let printed: Value = serde_json::from_str(&stdout(&by_source)).expect("JSON");
    assert_eq!(printed["extraction_id"], json!(id), "a source id with a slash in it");

    // Commit it with two findings; --findings prints them.
    let (claimed, lease) = api.claim_one("w", 60).await;
    let file = api.record(&claimed).await["source_id"].as_str().expect("source_id").to_string();
    let findings = [finding("r1", &file, 1, "one"), finding("r2", &file, 1, "two")];
    let reply = api.post_result(&claimed, &lease, &output(&findings)).await;
    assert_eq!(reply.status, 200, "{}", reply.body);
    let printed = cli(&["get", &claimed[..8], "--findings", "--server", &server.url]);
    assert_eq!(printed.status.code(), Some(0), "{}", stderr(&printed));
    let printed: Value = serde_json::from_str(&stdout(&printed)).expect("JSON");
    let rules: BTreeSet<&str> =
        printed.as_array().expect("an array").iter().filter_map(|f| f["rule"].as_str()).collect();
    assert_eq!(rules, BTreeSet::from(["r1", "r2"]), "{printed}");

    // Names that pick nothing, or more than one, are usage errors that say so.
    let common = common_prefix(&listed.iter().map(id_of).collect::<Vec<_>>());
    let cases = [
        (vec!["get", "ffff0000"], "no extraction id starts with"),
        (vec!["get", "xyz1"], "4 to 64 lowercase hex"),
        (vec!["get", "--source", "no-slash"], "TENANT/SOURCE_ID"),
    ];
    for (args, message) in cases {
        let out = cli(&[&args[..], &["--server", &server.url]].concat());
        assert_eq!(out.status.code(), Some(64), "{args:?}: {}", stderr(&out));
        assert!(stderr(&out).contains(message), "{args:?}: {}", stderr(&out));
    }
    if common.len() >= 4 {
        let out = cli(&["get", &common, "--server", &server.url]);
        assert_eq!(out.status.code(), Some(64));
        assert!(stderr(&out).contains("give more characters"), "{}", stderr(&out));
    }
    let unknown = cli(&["get", "--source", "cli-t/missing.rs", "--server", &server.url]);
    assert_eq!(unknown.status.code(), Some(1));
    assert!(stdout(&unknown).contains("unknown_source"), "{}", stdout(&unknown));
}

fn common_prefix(ids: &[String]) -> String {
    let first = &ids[0];
    let len = (0..first.len()).take_while(|&i| ids.iter().all(|id| id.as_bytes()[i] == first.as_bytes()[i])).count();
    first[..len].to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn submit_json_metadata_and_wait_report_each_file_and_each_failure() {
    let dir = temp_dir();
    let sources = temp_dir();
    std::fs::write(sources.path().join("good.rs"), "fn good() {}\n").expect("write");
    std::fs::write(sources.path().join("bad.rs"), "fn bad() {}\n").expect("write");
    std::fs::write(sources.path().join("binary.bin"), [0xff, 0xfe]).expect("write");
    let server = Server::start(dir.path());
    let api = server.api();
    let root = sources.path().to_str().expect("utf-8 temp path").to_string();
    let url = server.url.clone();
    // No provider: a worker answers while `submit --wait` waits, one answer valid, one not.
    let submit = tokio::task::spawn_blocking(move || {
        cli(&[
            "submit",
            "--server",
            &url,
            "--tenant",
            "w-t",
            "--json",
            "--wait",
            "--wait-timeout",
            "60s",
            "--metadata",
            r#"{"team": "payments"}"#,
            &root,
        ])
    });
    let mut answered = 0;
    while answered < 2 {
        for grant in api.claim("w", 2, 60).await {
            let (id, lease) = (id_of(&grant), grant["lease_token"].as_str().expect("lease").to_string());
            assert_eq!(grant["metadata"], json!({"team": "payments"}), "--metadata reached the source");
            let body = if grant["source_id"] == "good.rs" {
                output(&[finding("r1", "good.rs", 1, "ok")])
            } else {
                json!({"findings": "not an array"})
            };
            api.post_result(&id, &lease, &body).await;
            answered += 1;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    let out = submit.await.expect("submit ran");
    assert_eq!(out.status.code(), Some(1), "one failed: {}", stderr(&out));
    let lines: Vec<Value> =
        stdout(&out).lines().map(|l| serde_json::from_str(l).expect("one JSON object per line")).collect();
    let by_source: std::collections::BTreeMap<&str, &Value> =
        lines.iter().map(|l| (l["source_id"].as_str().expect("source_id"), l)).collect();
    assert_eq!(by_source.len(), 3, "{lines:?}");
    assert_eq!(by_source["good.rs"]["state"], json!("committed"));
    assert_eq!(by_source["good.rs"]["created"], json!(true));
    assert_eq!(by_source["good.rs"]["extraction_id"].as_str().map(str::len), Some(64));
    assert_eq!(by_source["bad.rs"]["state"], json!("failed"));
    assert_eq!(by_source["bad.rs"]["failure_class"], json!("validation"));
    assert!(by_source["binary.bin"]["error"].as_str().expect("error").contains("not UTF-8"));
    let err = stderr(&out);
    assert!(err.contains("bad.rs: failed (validation):"), "each failure with its class and reason: {err}");
    assert!(err.contains("settled: 1 committed, 1 failed, 0 cancelled"), "{err}");

    let bad_metadata = cli(&["submit", "--server", &server.url, "--tenant", "w-t", "--metadata", "[1]", "x"]);
    assert_eq!(bad_metadata.status.code(), Some(64));
    assert!(stderr(&bad_metadata).contains("must be a JSON object"), "{}", stderr(&bad_metadata));
}

#[test]
fn verify_reports_an_unreadable_file() {
    let dir = temp_dir();
    let missing = verify(&dir.path().join("commitpoint.redb"));
    assert_eq!(missing.status.code(), Some(74), "{}", stderr(&missing));

    let garbage = dir.path().join("garbage.redb");
    std::fs::write(&garbage, b"this is not a redb file").expect("write");
    let out = verify(&garbage);
    assert_ne!(out.status.code(), Some(0), "{}", stdout(&out));
}

/// A second `serve` on a data directory whose database another process holds exits 74
/// (an I/O failure systemd does not restart into a loop, `RestartPreventExitStatus`), not
/// 70, and says why.
#[test]
fn serve_on_a_locked_database_exits_74() {
    if crate::support::postgres::enabled() {
        eprintln!("skipped: the redb file lock is what this test is about");
        return;
    }
    let dir = temp_dir();
    let _first = Server::start(dir.path());
    let second = std::process::Command::new(env!("CARGO_BIN_EXE_commitpoint"))
        .args(["serve", "--listen", "127.0.0.1:0", "--data-dir"])
        .arg(dir.path())
        .env_remove("COMMITPOINT_CONFIG")
        .env_remove("COMMITPOINT_STORE_URL")
        .output()
        .expect("run a second serve");
    assert_eq!(second.status.code(), Some(74), "{}", stderr(&second));
    assert!(stderr(&second).contains("cannot open the database"), "{}", stderr(&second));
}

/// The CLI finds a server bound to port 0 through the address it wrote to its data
/// directory, and reads its token from `--token-file`; a wrong token is called that.
#[test]
fn the_cli_finds_a_port_zero_server_and_reads_its_token_from_a_file() {
    use std::os::unix::fs::PermissionsExt;
    let dir = temp_dir();
    let secret = dir.path().join("admin-token");
    std::fs::write(&secret, "adm-41c0e7-b29d55aa\n").expect("write");
    std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o600)).expect("chmod");
    let config = dir.path().join("config.toml");
    std::fs::write(&config, format!("[access]\nadmin_token_file = \"{}\"\n", secret.display())).expect("write");
    let data = dir.path().join("data");
    let server = Server::start_with(&data, &["--config", config.to_str().expect("utf-8")]);
    let written = std::fs::read_to_string(data.join("address")).expect("serve wrote its address");
    assert!(server.url.ends_with(written.trim().rsplit(':').next().expect("a port")), "{written} vs {}", server.url);

    let data_dir = data.to_str().expect("utf-8");
    let wrong = dir.path().join("wrong-token");
    std::fs::write(&wrong, "not-the-admin-token\n").expect("write");
    let ctl = |extra: &[&str]| {
        let mut args = vec!["ctl", "status"];
        args.extend_from_slice(extra);
        crate::util::cli_with_env(&args, &[("COMMITPOINT_DATA_DIR", data_dir)])
    };
    let out = ctl(&["--token-file", secret.to_str().expect("utf-8")]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(stdout(&out).contains("store: redb") || stdout(&out).contains("store: postgres"), "{}", stdout(&out));
    let out = ctl(&["--token-file", wrong.to_str().expect("utf-8")]);
    assert_ne!(out.status.code(), Some(0));
    assert!(stderr(&out).contains("invalid token"), "{}", stderr(&out));
    let out = ctl(&["--token-file", dir.path().join("absent").to_str().expect("utf-8")]);
    assert_ne!(out.status.code(), Some(0));
    assert!(stderr(&out).contains("cannot read the token file"), "{}", stderr(&out));
}
