//! Refusing before reading: unknown webhook names and oversized bodies are answered
//! while the client still holds its body back; gzip bodies count at their decoded size;
//! the small items of the hostile-client review (auth scheme case, byte limits, log floods).

use std::io::Write;
use std::net::TcpStream;
use std::time::Duration;

use commitpoint::engine::webhook::{WebhookSecret, sign_github};
use serde_json::json;

use crate::raw::{addr, config, exchange, get, read_head, status};
use crate::util::{SCHEMA, Server, temp_dir};

const HOOK_SECRET: &str = "gh-hook-secret-for-early-refusal";

fn hooks_config(dir: &std::path::Path) -> String {
    config(
        dir,
        "[[webhooks]]\nname = \"small\"\nscheme = \"github\"\nsecret_env = \"HOOK_SECRET\"\ntenant = \"acme\"\n\
         source_id_pointer = \"/id\"\ncontent_pointer = \"/text\"\nschema = \"code-review@1\"\nmax_body_bytes = 2048\n\n\
         [[webhooks]]\nname = \"default\"\nscheme = \"github\"\nsecret_env = \"HOOK_SECRET\"\ntenant = \"acme\"\n\
         source_id_pointer = \"/id\"\ncontent_pointer = \"/text\"\nschema = \"code-review@1\"\n",
    )
}

fn start_with_hooks(dir: &std::path::Path) -> Server {
    let config = hooks_config(dir);
    Server::start_with_env(&dir.join("data"), &["--config", &config], &[("HOOK_SECRET", HOOK_SECRET)])
}

/// Sends a request head announcing `length` body bytes, sends none of them, and returns
/// the first answer head that arrives within two seconds.
fn head_only(addr: &str, path: &str, length: usize, expect_continue: bool) -> String {
    let mut stream = TcpStream::connect(addr).expect("connect");
    let expect = if expect_continue { "expect: 100-continue\r\n" } else { "" };
    let head = format!(
        "POST {path} HTTP/1.1\r\nhost: localhost\r\ncontent-type: application/json\r\ncontent-length: {length}\r\n{expect}\r\n"
    );
    stream.write_all(head.as_bytes()).expect("send head");
    read_head(&mut stream, Duration::from_secs(2))
}

#[test]
fn unknown_webhooks_and_oversized_bodies_are_refused_before_the_body_is_sent() {
    let dir = temp_dir();
    let server = start_with_hooks(dir.path());
    let addr = addr(&server);
    for expect in [false, true] {
        let answer = head_only(&addr, "/v1/webhooks/nope", 4 << 20, expect);
        assert_eq!(status(&answer), 404, "unknown name, expect={expect}: {answer:?}");
        // Its own limit, the 1 MiB default, and the API's 8 MiB limit: each answered at once.
        for (path, length) in
            [("/v1/webhooks/small", 4096), ("/v1/webhooks/default", 2 << 20), ("/v1/extractions", 9 << 20)]
        {
            let answer = head_only(&addr, path, length, expect);
            assert_eq!(status(&answer), 413, "{path} with {length} bytes, expect={expect}: {answer:?}");
        }
    }
    // Within the limit, the body is read and checked as before.
    let body = br#"{"id":"doc-1","text":"fn a() {}"}"#;
    let signature = sign_github(&WebhookSecret::github(HOOK_SECRET).expect("secret"), body);
    let mut request = format!(
        "POST /v1/webhooks/small HTTP/1.1\r\nhost: localhost\r\nx-hub-signature-256: {signature}\r\nx-github-delivery: d-1\r\n\
         content-length: {}\r\nconnection: close\r\n\r\n",
        body.len()
    )
    .into_bytes();
    request.extend_from_slice(body);
    let answer = exchange(&addr, &request);
    assert_eq!(status(&answer), 201, "{answer}");
    crate::util::stop_and_verify(server);
}

#[test]
fn forged_webhook_signatures_are_logged_at_a_limited_rate() {
    let dir = temp_dir();
    let server = start_with_hooks(dir.path());
    let addr = addr(&server);
    let body = br#"{"id":"doc-1","text":"x"}"#;
    for i in 0..40 {
        let mut request = format!(
            "POST /v1/webhooks/small HTTP/1.1\r\nhost: localhost\r\nx-hub-signature-256: sha256={}\r\nx-github-delivery: f-{i}\r\n\
             content-length: {}\r\nconnection: close\r\n\r\n",
            "0".repeat(64),
            body.len()
        )
        .into_bytes();
        request.extend_from_slice(body);
        assert_eq!(status(&exchange(&addr, &request)), 401);
    }
    let (exit, log) = server.terminate();
    assert_eq!(exit.code(), Some(0), "{log}");
    let lines = log.lines().filter(|l| l.contains("rejected a webhook delivery")).count();
    assert!((1..=2).contains(&lines), "40 forgeries in a few seconds logged {lines} lines:\n{log}");
}

fn gzip(data: &[u8]) -> Vec<u8> {
    let mut encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
    encoder.write_all(data).expect("compress");
    encoder.finish().expect("compress")
}

fn post_encoded(addr: &str, encoding: &str, body: &[u8]) -> String {
    let mut request = format!(
        "POST /v1/extractions HTTP/1.1\r\nhost: localhost\r\ncontent-type: application/json\r\ncontent-encoding: {encoding}\r\n\
         content-length: {}\r\nconnection: close\r\n\r\n",
        body.len()
    )
    .into_bytes();
    request.extend_from_slice(body);
    exchange(addr, &request)
}

#[tokio::test]
async fn gzip_bodies_are_decoded_within_the_limit_and_other_encodings_refused() {
    let dir = temp_dir();
    let server = Server::start_with(dir.path(), &["--max-body-bytes", "65536"]);
    let addr = addr(&server);
    let intake = json!({"tenant": "acme", "source_id": "gz-1", "schema": SCHEMA, "content": "fn zipped() {}"});
    let answer = post_encoded(&addr, "gzip", &gzip(intake.to_string().as_bytes()));
    assert_eq!(status(&answer), 201, "{answer}");
    let listed = server.api().list_all("").await;
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0]["source_id"], json!("gz-1"), "the decoded body was taken: {listed:?}");

    // 1 MiB of JSON whitespace is a few KiB on the wire, but 16 times the decoded limit.
    let mut bomb = vec![b' '; 1 << 20];
    bomb.extend_from_slice(intake.to_string().as_bytes());
    let answer = post_encoded(&addr, "gzip", &gzip(&bomb));
    assert_eq!(status(&answer), 413, "{answer}");
    assert!(answer.contains("\"payload_too_large\""), "{answer}");
    for encoding in ["br", "deflate", "zstd"] {
        let answer = post_encoded(&addr, encoding, intake.to_string().as_bytes());
        assert_eq!(status(&answer), 415, "{encoding}: {answer}");
        assert!(answer.contains("\"unsupported_encoding\""), "{encoding}: {answer}");
    }
    assert_eq!(server.api().list_all("").await.len(), 1, "nothing else was stored");
    crate::util::stop_and_verify(server);
}

#[tokio::test]
async fn source_id_limits_count_bytes() {
    let dir = temp_dir();
    let server = Server::start(dir.path());
    let api = server.api();
    // 1,024 characters but 4,096 bytes.
    let reply = api.intake("acme", &"😀".repeat(1024), "x").await;
    reply.assert_error(422, "invalid_input");
    assert_eq!(reply.body["error"]["details"]["field"], json!("source_id"));
    let reply = api.intake("acme", &"😀".repeat(256), "x").await;
    assert_eq!(reply.status, 201, "exactly 1,024 bytes: {:#}", reply.body);
    crate::util::stop_and_verify(server);
}

#[test]
fn the_bearer_scheme_is_case_insensitive() {
    let dir = temp_dir();
    let token_file = dir.path().join("admin-token");
    std::fs::write(&token_file, "adm-case-test-5c1d9e\n").expect("token");
    std::fs::set_permissions(&token_file, std::os::unix::fs::PermissionsExt::from_mode(0o600)).expect("chmod");
    let config = config(dir.path(), &format!("[access]\nadmin_token_file = \"{}\"\n", token_file.display()));
    let server = Server::start_with(&dir.path().join("data"), &["--config", &config]);
    let addr = addr(&server);
    for scheme in ["Bearer", "bearer", "BEARER", "bEaReR"] {
        let request = format!(
            "GET /v1/stats HTTP/1.1\r\nhost: localhost\r\nauthorization: {scheme} adm-case-test-5c1d9e\r\nconnection: close\r\n\r\n"
        );
        let answer = exchange(&addr, request.as_bytes());
        assert_eq!(status(&answer), 200, "{scheme}: {answer}");
    }
    for wrong in ["Basic adm-case-test-5c1d9e", "Bearer", "adm-case-test-5c1d9e"] {
        let request =
            format!("GET /v1/stats HTTP/1.1\r\nhost: localhost\r\nauthorization: {wrong}\r\nconnection: close\r\n\r\n");
        assert_eq!(status(&exchange(&addr, request.as_bytes())), 401, "{wrong}");
    }
    assert_eq!(status(&exchange(&addr, &get("/v1/stats", None))), 401);
    crate::util::stop_and_verify(server);
}
