//! Running it as an appliance: configuration checks, online backup under load and
//! restore, Prometheus metrics, and access tokens (which must never reach the logs).

use std::collections::BTreeSet;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use serde_json::{Value, json};

use crate::util::*;

const EXIT_CONFIG: i32 = 78;

fn write_private(path: &Path, text: &str, mode: u32) {
    std::fs::write(path, text).expect("write a secret file");
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).expect("chmod a secret file");
}

#[test]
fn config_check_accepts_a_good_file_and_refuses_bad_ones_with_78() {
    let dir = temp_dir();
    let good = dir.path().join("good.toml");
    std::fs::write(&good, "[server]\nlisten = \"127.0.0.1:7000\"\n[scheduler]\npoll_interval = \"9s\"\n").unwrap();
    let out = cli(&["config", "check", "--config", good.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(stdout(&out).contains("poll_interval = \"9s\""), "{}", stdout(&out));

    let unknown = dir.path().join("unknown.toml");
    std::fs::write(&unknown, "[server]\nlisten_addr = \"127.0.0.1:7000\"\n").unwrap();
    let out = cli(&["config", "check", "--config", unknown.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(EXIT_CONFIG));
    assert!(stderr(&out).contains("listen_addr"), "{}", stderr(&out));

    let secret = dir.path().join("admin-token");
    write_private(&secret, "s3cr3t-admin-0123456\n", 0o644);
    let open = dir.path().join("open.toml");
    std::fs::write(&open, format!("[access]\nadmin_token_file = \"{}\"\n", secret.display())).unwrap();
    let out = cli(&["config", "check", "--config", open.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(EXIT_CONFIG));
    assert!(stderr(&out).contains("readable by group or others"), "{}", stderr(&out));
    write_private(&secret, "s3cr3t-admin-0123456\n", 0o600);
    let out = cli(&["config", "check", "--config", open.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(
        !stdout(&out).contains("s3cr3t-admin-0123456") && !stderr(&out).contains("s3cr3t-admin-0123456"),
        "secret printed"
    );

    let missing = dir.path().join("missing.toml");
    let out = cli(&["config", "check", "--config", missing.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(EXIT_CONFIG));
}

#[test]
fn serve_refuses_a_network_listen_without_an_admin_token() {
    let dir = temp_dir();
    let mut cmd = Command::new(BIN);
    cmd.arg("serve").arg("--data-dir").arg(dir.path()).args(["--listen", "0.0.0.0:0"]);
    let out = run_to_end(cmd);
    assert_eq!(out.status.code(), Some(EXIT_CONFIG), "{}", stderr(&out));
    assert!(stderr(&out).contains("admin token"), "{}", stderr(&out));
    assert!(!dir.path().join("commitpoint.redb").exists(), "nothing may be opened on a config error");
}

/// A snapshot taken while 32 clients submit holds every intake acknowledged before it
/// started, nothing that was never acknowledged, verifies, and restores into a server.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backup_under_load_holds_a_prefix_of_the_acknowledged_intakes_and_restores() {
    let dir = temp_dir();
    let server = Server::start(dir.path());
    let api = server.api();
    let acked: Arc<Mutex<Vec<String>>> = Arc::default();
    let stop = Arc::new(AtomicBool::new(false));
    let mut clients = Vec::new();
    for client in 0..32 {
        let (api, acked, stop) = (api.clone(), acked.clone(), stop.clone());
        clients.push(tokio::spawn(async move {
            let mut n = 0;
            while !stop.load(Ordering::Relaxed) {
                let reply = api.intake("acme", &format!("c{client}-{n}"), &format!("content {client} {n}")).await;
                assert_eq!(reply.status, 201, "{:?}", reply.body);
                acked.lock().unwrap().push(id_of(&reply.body));
                n += 1;
            }
        }));
    }
    tokio::time::sleep(std::time::Duration::from_millis(400)).await;
    let before: BTreeSet<String> = acked.lock().unwrap().iter().cloned().collect();
    let backup = dir.path().join("snapshot.redb");
    let out = tokio::task::spawn_blocking({
        let (url, backup) = (server.url.clone(), backup.clone());
        move || cli(&["backup", "--server", &url, "--out", backup.to_str().unwrap()])
    })
    .await
    .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}\n{}", stdout(&out), stderr(&out));
    stop.store(true, Ordering::Relaxed);
    for client in clients {
        client.await.unwrap();
    }
    let all: BTreeSet<String> = acked.lock().unwrap().iter().cloned().collect();
    assert!(all.len() > before.len(), "the load went on during the backup");
    assert_verifies(&backup);
    stop_and_verify(server);
    let reopened = Server::start(dir.path());
    let stats = reopened.api().get("/v1/stats").await.body;
    assert!(stats["last_backup_at"].is_string(), "the last backup time survives a restart: {stats}");
    stop_and_verify(reopened);

    let restored_dir = temp_dir();
    std::fs::copy(&backup, restored_dir.path().join("commitpoint.redb")).unwrap();
    let restored = Server::start(restored_dir.path());
    let in_snapshot: BTreeSet<String> = restored.api().list_all("").await.iter().map(id_of).collect();
    assert!(before.is_subset(&in_snapshot), "an intake acknowledged before the backup is missing from it");
    assert!(in_snapshot.is_subset(&all), "the snapshot holds something never acknowledged");
    stop_and_verify(restored);
}

fn metric(text: &str, series: &str) -> f64 {
    text.lines()
        .find_map(|line| line.strip_prefix(series).and_then(|rest| rest.trim().parse().ok()))
        .unwrap_or_else(|| panic!("{series} missing from:\n{text}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_match_the_api_and_pass_promtool() {
    let dir = temp_dir();
    let server = Server::start(dir.path());
    let api = server.api();
    for source in ["a", "b", "c"] {
        api.create("acme", source, &format!("text {source}")).await;
    }
    assert_eq!(api.intake("acme", "a", "text a").await.status, 200);
    let (id, token) = api.claim_one("w", 30).await;
    let done = api.post_result(&id, &token, &output(&[finding("R", "a", 1, "s")])).await;
    assert_eq!(done.status, 200);
    assert_eq!(api.post_result(&id, &token, &output(&[])).await.body["replay"], json!(true));

    let text = reqwest::get(format!("{}/metrics", server.url)).await.unwrap().text().await.unwrap();
    let stats = api.get("/v1/stats").await.body;
    for state in ["pending", "claimed", "committed", "failed"] {
        let series = format!("commitpoint_extractions{{state=\"{state}\"}}");
        assert_eq!(metric(&text, &series), stats["extractions"][state].as_f64().unwrap(), "{state}");
    }
    assert_eq!(metric(&text, "commitpoint_intakes_total{result=\"created\"}"), 3.0);
    assert_eq!(metric(&text, "commitpoint_intakes_total{result=\"duplicate\"}"), 1.0);
    assert_eq!(metric(&text, "commitpoint_commits_total{path=\"worker\"}"), 1.0);
    assert_eq!(metric(&text, "commitpoint_replays_total"), 1.0);
    for class in ["truncated", "refused", "attempts_exhausted"] {
        let series = format!("commitpoint_failures_total{{class=\"{class}\"}}");
        assert_eq!(metric(&text, &series), 0.0, "every failure class is exported from the start");
    }
    assert!(metric(&text, "commitpoint_db_file_size_bytes") > 0.0);
    // The per-tenant family (written per scrape) agrees with the stats and passes promtool below.
    assert_eq!(stats["tenants"][0]["tenant"], json!("acme"));
    for state in ["pending", "committed"] {
        let series = format!("commitpoint_tenant_extractions{{tenant=\"acme\",state=\"{state}\"}}");
        assert_eq!(metric(&text, &series), stats["tenants"][0]["extractions"][state].as_f64().unwrap(), "{state}");
    }

    match Command::new("promtool").args(["check", "metrics"]).stdin(std::process::Stdio::piped()).spawn() {
        Ok(mut promtool) => {
            use std::io::Write;
            promtool.stdin.take().unwrap().write_all(text.as_bytes()).unwrap();
            let status = promtool.wait().unwrap();
            assert!(status.success(), "promtool rejected the exposition:\n{text}");
        }
        // Not skipped on a box without it: a check that did not run must not read as passed.
        Err(e) => panic!("promtool is needed to lint the exposition (Debian: apt-get install prometheus): {e}"),
    }
    stop_and_verify(server);
}

async fn call(url: &str, token: Option<&str>, method: reqwest::Method, body: Option<Value>) -> (u16, Value) {
    let mut request = reqwest::Client::new().request(method, url);
    if let Some(token) = token {
        request = request.bearer_auth(token);
    }
    if let Some(body) = body {
        request = request.json(&body);
    }
    let response = request.send().await.expect("reach the server");
    let status = response.status().as_u16();
    (status, response.json().await.unwrap_or(Value::Null))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_scope_tenants_and_never_reach_the_logs() {
    let dir = temp_dir();
    let admin = dir.path().join("admin");
    let tenants = dir.path().join("tenants");
    write_private(&admin, "adm-9f2c1e-4b7d0a55\n", 0o600);
    write_private(&tenants, "acme tok-acme-77a1-c3d9e0\nglobex tok-globex-03bd-81fa2\n", 0o600);
    let config = dir.path().join("config.toml");
    std::fs::write(
        &config,
        format!(
            "[access]\nadmin_token_file = \"{}\"\ntenant_tokens_file = \"{}\"\n",
            admin.display(),
            tenants.display()
        ),
    )
    .unwrap();
    let data = dir.path().join("data");
    let server =
        Server::start_with_env(&data, &["--config", config.to_str().unwrap()], &[("COMMITPOINT_LOG", "debug")]);
    let base = server.url.clone();
    let intake = |tenant: &str| json!({"tenant": tenant, "source_id": "s1", "schema": SCHEMA, "content": "x.unwrap()"});
    let post = reqwest::Method::POST;
    let get = reqwest::Method::GET;

    let (status, body) = call(&format!("{base}/v1/extractions"), None, post.clone(), Some(intake("acme"))).await;
    assert_eq!((status, body["error"]["code"].as_str()), (401, Some("unauthenticated")));
    assert!(body["error"]["message"].as_str().is_some_and(|m| m.contains("token is required")), "{body:#}");
    let (status, body) =
        call(&format!("{base}/v1/extractions"), Some("nope"), post.clone(), Some(intake("acme"))).await;
    assert_eq!(status, 401);
    // A wrong token is called that, not "required".
    assert!(body["error"]["message"].as_str().is_some_and(|m| m.starts_with("invalid token")), "{body:#}");
    let (status, body) =
        call(&format!("{base}/v1/extractions"), Some("tok-acme-77a1-c3d9e0"), post.clone(), Some(intake("acme"))).await;
    assert_eq!(status, 201, "{body}");
    let id = id_of(&body);
    let (status, _) =
        call(&format!("{base}/v1/extractions"), Some("tok-globex-03bd-81fa2"), post.clone(), Some(intake("acme")))
            .await;
    assert_eq!(status, 403, "a tenant token cannot submit for another tenant");
    let (status, _) =
        call(&format!("{base}/v1/extractions/{id}"), Some("tok-globex-03bd-81fa2"), get.clone(), None).await;
    assert_eq!(status, 404, "another tenant's extraction does not exist for this token");
    let (status, _) =
        call(&format!("{base}/v1/extractions/{id}/findings"), Some("tok-globex-03bd-81fa2"), get.clone(), None).await;
    assert_eq!(status, 404);
    let (status, body) =
        call(&format!("{base}/v1/extractions"), Some("tok-globex-03bd-81fa2"), get.clone(), None).await;
    assert_eq!((status, body["extractions"].as_array().map(Vec::len)), (200, Some(0)), "globex sees only its own");
    let (status, body) = call(&format!("{base}/v1/extractions"), Some("tok-acme-77a1-c3d9e0"), get.clone(), None).await;
    assert_eq!((status, body["extractions"].as_array().map(Vec::len)), (200, Some(1)));
    let claim = json!({"worker": "w", "limit": 1, "lease_seconds": 5});
    let (status, _) =
        call(&format!("{base}/v1/claims"), Some("tok-acme-77a1-c3d9e0"), post.clone(), Some(claim.clone())).await;
    assert_eq!(status, 403, "claims are admin-only");
    let (status, body) = call(&format!("{base}/v1/claims"), Some("adm-9f2c1e-4b7d0a55"), post, Some(claim)).await;
    assert_eq!((status, body["claims"].as_array().map(Vec::len)), (200, Some(1)));
    let (status, _) = call(&format!("{base}/healthz"), None, get, None).await;
    assert_eq!(status, 200, "liveness needs no token");

    let db = server.db_path();
    let (exit, log) = server.terminate();
    assert_eq!(exit.code(), Some(0), "{log}");
    for secret in ["adm-9f2c1e-4b7d0a55", "tok-acme-77a1-c3d9e0", "tok-globex-03bd-81fa2"] {
        assert!(!log.contains(secret), "{secret} appeared in the log");
    }
    assert!(log.contains("DEBUG") || log.contains("INFO"), "the log was captured: {log}");
    assert_verifies(&db);
}
