//! The command line against a live server: `submit`, `get`, and `verify`.

use std::collections::BTreeSet;

use serde_json::{Value, json};

use crate::util::{Server, assert_verifies, cli, id_of, stderr, stdout, temp_dir, verify};

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
    assert_eq!(server.api().list_all("").await.len(), 1);

    let zero = cli(&["submit", "--server", &server.url, "--tenant", "u", "--concurrency", "0", root]);
    assert_ne!(zero.status.code(), Some(0), "{}", stdout(&zero));
    assert!(stderr(&zero).contains("--concurrency"), "{}", stderr(&zero));
    assert_eq!(server.api().list_all("").await.len(), 1);
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
