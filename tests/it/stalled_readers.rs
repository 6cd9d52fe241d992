//! Issue 30, items 2 and 10, on the real binary. An export handed its chunks over with no
//! deadline, so a client that stopped reading pinned a blocking thread (redb) or a pooled
//! connection inside an open transaction (PostgreSQL) for ever: 520 such readers hung
//! every read of every tenant, 16 hung everything on PostgreSQL. Exports now run under a
//! cap per server and per tenant (refused beyond it with `Retry-After`), a reader that
//! takes nothing for `server.stream_stall_timeout` loses its export, and such an export
//! ends cut short, never with a clean end that looks complete. An export still streaming
//! when its tenant is erased is cut the same way.

use std::time::Duration;

use reqwest::Method;
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::util::{Server, call_as, finding, output, stop_and_verify, temp_dir, write_secret};

const ADMIN: &str = "admin-token-stalled-000001";
/// Extractions of the big tenant, each a line of about 400 KB: 24 MB in all, far more
/// than the socket buffers and the export's own chunks hold, so a reader that stops is
/// noticed.
const BIG_LINES: usize = 60;
const FINDINGS: usize = 20;
const SUMMARY_BYTES: usize = 20_000;

fn start(dir: &std::path::Path, server: &str) -> Server {
    let admin = dir.join("admin");
    write_secret(&admin, &format!("{ADMIN}\n"));
    let config = dir.join("config.toml");
    std::fs::write(&config, format!("[access]\nadmin_token_file = \"{}\"\n\n[server]\n{server}", admin.display()))
        .expect("write config");
    Server::start_with(&dir.join("data"), &["--config", config.to_str().expect("utf-8 path")])
}

async fn post(base: &str, path: &str, body: Value) -> (u16, Value) {
    call_as(&format!("{base}{path}"), Some(ADMIN), Method::POST, Some(body)).await
}

/// `n` committed extractions of `tenant`, each with `findings` findings of `summary_bytes`.
async fn populate(base: &str, tenant: &str, n: usize, findings: usize, summary_bytes: usize) {
    let mut ids = Vec::new();
    for i in 0..n {
        let body = json!({"tenant": tenant, "source_id": format!("src/{i}.rs"), "schema": "code-review@1",
            "content": format!("fn f{i}() {{}}")});
        let (status, reply) = post(base, "/v1/extractions", body).await;
        assert_eq!(status, 201, "{reply}");
        ids.push(reply["extraction_id"].as_str().expect("id").to_string());
    }
    let (_, claims) = post(base, "/v1/claims", json!({"worker": "w", "limit": n, "lease_seconds": 600})).await;
    let summary = "s".repeat(summary_bytes);
    for claim in claims["claims"].as_array().expect("claims") {
        let id = claim["extraction_id"].as_str().expect("id");
        let file = claim["source_id"].as_str().expect("source_id");
        let all: Vec<Value> = (0..findings).map(|k| finding(&format!("R{k}"), file, 1, &summary)).collect();
        let result = json!({"lease_token": claim["lease_token"], "output": output(&all)});
        let (status, reply) = post(base, &format!("/v1/extractions/{id}/result"), result).await;
        assert_eq!(status, 200, "{reply}");
    }
}

/// An export request on a raw connection whose answer nobody reads (yet).
async fn stalled_export(base: &str, tenant: &str) -> TcpStream {
    let addr = base.trim_start_matches("http://");
    let mut stream = TcpStream::connect(addr).await.expect("connect");
    let request =
        format!("GET /v1/export?tenant={tenant} HTTP/1.1\r\nHost: {addr}\r\nAuthorization: Bearer {ADMIN}\r\n\r\n");
    stream.write_all(request.as_bytes()).await.expect("send the request");
    stream
}

/// Everything the server still sends on `stream`, until it closes or breaks it.
async fn rest(mut stream: TcpStream) -> Vec<u8> {
    let mut got = Vec::new();
    let mut buf = vec![0u8; 1 << 16];
    loop {
        match tokio::time::timeout(Duration::from_secs(20), stream.read(&mut buf)).await {
            Ok(Ok(0)) | Ok(Err(_)) => return got,
            Ok(Ok(n)) => got.extend_from_slice(&buf[..n]),
            Err(_) => panic!("the server neither sent more nor closed within 20 s"),
        }
    }
}

/// Export lines in a raw answer (each names its extraction once).
fn lines_in(raw: &[u8]) -> usize {
    raw.windows(b"\"extraction_id\"".len()).filter(|w| *w == b"\"extraction_id\"").count()
}

/// A chunked HTTP/1.1 body ends with a zero-size chunk; an answer cut short does not.
fn ended_cleanly(raw: &[u8]) -> bool {
    raw.ends_with(b"\r\n0\r\n\r\n")
}

/// Status, `Retry-After`, error code and the number of lines of a full export.
async fn export(base: &str, tenant: &str) -> (u16, Option<String>, String, usize) {
    let response = reqwest::Client::builder()
        .no_proxy()
        .build()
        .expect("client")
        .get(format!("{base}/v1/export?tenant={tenant}"))
        .bearer_auth(ADMIN)
        .send()
        .await
        .expect("reach the server");
    let status = response.status().as_u16();
    let retry_after = response.headers().get("retry-after").map(|v| v.to_str().expect("ascii").to_string());
    let text = response.text().await.expect("the whole body");
    if status == 200 {
        return (status, retry_after, String::new(), text.lines().count());
    }
    let body: Value = serde_json::from_str(&text).expect("a JSON error");
    let message = body["error"]["message"].as_str().expect("a message");
    assert!(!message.is_empty());
    (status, retry_after, body["error"]["code"].as_str().expect("a code").to_string(), 0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reader_that_stops_holds_one_export_place_until_the_stall_timeout_and_gets_a_cut_answer() {
    let dir = temp_dir();
    let server = start(dir.path(), "stream_stall_timeout = \"1s\"\nmax_exports = 2\nmax_exports_per_tenant = 1\n");
    let base = server.url.clone();
    populate(&base, "acme", BIG_LINES, FINDINGS, SUMMARY_BYTES).await;
    populate(&base, "globex", 3, 1, 10).await;

    let stalled = stalled_export(&base, "acme").await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    // The tenant's one place is taken: refused at once, told when to come back.
    let (status, retry_after, code, _) = export(&base, "acme").await;
    assert_eq!((status, code.as_str()), (429, "too_many_exports"));
    assert!(retry_after.is_some_and(|s| s.parse::<u64>().is_ok_and(|s| s > 0)), "Retry-After");
    // Another tenant still exports, lists and takes intake.
    assert_eq!(export(&base, "globex").await.3, 3);
    let (status, listed) =
        call_as(&format!("{base}/v1/extractions?tenant=globex"), Some(ADMIN), Method::GET, None).await;
    assert_eq!((status, listed["extractions"].as_array().map(Vec::len)), (200, Some(3)));

    // Past the stall timeout the stalled export lets go of its place (a stall is timed
    // from when the socket's buffers filled, so it is waited for, bounded, not slept on:
    // without the timeout the place would never come back).
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    let lines = loop {
        tokio::time::sleep(Duration::from_millis(500)).await;
        let (status, _, code, lines) = export(&base, "acme").await;
        if status == 200 {
            break lines;
        }
        assert_eq!((status, code.as_str()), (429, "too_many_exports"));
        assert!(std::time::Instant::now() < deadline, "the stalled export still holds its place after 20 s");
    };
    assert_eq!(lines, BIG_LINES, "a reader that reads gets it all");
    // What the stalled reader gets when it reads at last is visibly incomplete.
    let raw = rest(stalled).await;
    assert!(raw.starts_with(b"HTTP/1.1 200"), "{:?}", String::from_utf8_lossy(&raw[..raw.len().min(200)]));
    assert!(!ended_cleanly(&raw), "a cut export must not end like a complete one");
    let lines = lines_in(&raw);
    assert!(lines < BIG_LINES, "only part of the export arrived ({lines} lines)");
    stop_and_verify(server);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_server_wide_export_cap_answers_503_with_retry_after() {
    let dir = temp_dir();
    let server = start(dir.path(), "max_exports = 1\nmax_exports_per_tenant = 1\n");
    let base = server.url.clone();
    populate(&base, "acme", BIG_LINES, FINDINGS, SUMMARY_BYTES).await;
    populate(&base, "globex", 1, 1, 10).await;
    let stalled = stalled_export(&base, "acme").await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let (status, retry_after, code, _) = export(&base, "globex").await;
    assert_eq!((status, code.as_str()), (503, "exports_busy"));
    assert!(retry_after.is_some(), "Retry-After");
    drop(stalled);
    // A client that goes away gives its place back at once.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(export(&base, "globex").await.3, 1);
    stop_and_verify(server);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_export_still_streaming_when_its_tenant_is_erased_is_cut_short() {
    let dir = temp_dir();
    let server = start(dir.path(), "");
    let base = server.url.clone();
    populate(&base, "acme", BIG_LINES, FINDINGS, SUMMARY_BYTES).await;
    let mut reading = stalled_export(&base, "acme").await;
    // Some of it arrives, then the reader pauses mid-export.
    let mut head = vec![0u8; 1 << 16];
    let n = reading.read(&mut head).await.expect("the first bytes");
    assert!(head[..n].starts_with(b"HTTP/1.1 200"));
    let (status, erased) = call_as(&format!("{base}/v1/tenants/acme"), Some(ADMIN), Method::DELETE, None).await;
    assert_eq!(status, 200, "{erased}");
    assert_eq!(erased["extractions"], json!(BIG_LINES));
    let raw = rest(reading).await;
    assert!(!ended_cleanly(&raw), "an export of an erased tenant must not run to a clean end");
    let lines = lines_in(&raw);
    assert!(lines < BIG_LINES, "the erased tenant's export stopped early ({lines} lines)");
    stop_and_verify(server);
}
