//! Issue 30, item 4, on the real binary: `metadata` had no cap of its own (up to the whole
//! 8 MiB body), and a listing built its whole page in memory, so one tenant's listing
//! reached 1.2 GB. Metadata is now capped (`[limits] max_metadata_bytes`, 16 KiB by
//! default; 413 `metadata_too_large`), and a listing page stops at a byte budget
//! (`[server] max_page_bytes`), handing back `next` as a short page always could.

use serde_json::{Value, json};

use crate::util::{Server, intake_body, stop_and_verify, temp_dir};

/// An intake whose metadata is exactly `bytes` long as compact JSON.
fn with_metadata(source_id: &str, bytes: usize) -> Value {
    let mut body = intake_body("acme", source_id, "fn a() {}");
    // `{"m":""}` is 8 bytes around the padding.
    body["metadata"] = json!({ "m": "x".repeat(bytes - 8) });
    body
}

fn start(dir: &std::path::Path, config: &str) -> Server {
    let path = dir.join("config.toml");
    std::fs::write(&path, config).expect("write config");
    Server::start_with(&dir.join("data"), &["--config", path.to_str().expect("utf-8 path")])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metadata_over_its_cap_is_refused_with_413_and_the_cap_is_configurable() {
    let dir = temp_dir();
    let server = Server::start(&dir.path().join("data"));
    let api = server.api();
    let at_cap = api.post("/v1/extractions", &with_metadata("a", 16 * 1024)).await;
    assert_eq!(at_cap.status, 201, "{:#}", at_cap.body);
    let over = api.post("/v1/extractions", &with_metadata("b", 16 * 1024 + 1)).await;
    over.assert_error(413, "metadata_too_large");
    assert_eq!(over.body["error"]["details"]["max"], json!(16 * 1024));
    assert_eq!(api.list_all("").await.len(), 1, "the refused intake left nothing behind");
    stop_and_verify(server);

    let dir = temp_dir();
    let server = start(dir.path(), "[limits]\nmax_metadata_bytes = 1024\n");
    let api = server.api();
    api.post("/v1/extractions", &with_metadata("c", 1025)).await.assert_error(413, "metadata_too_large");
    assert_eq!(api.post("/v1/extractions", &with_metadata("d", 1024)).await.status, 201);
    stop_and_verify(server);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_listing_page_stops_at_its_byte_budget_and_the_cursor_carries_on() {
    let dir = temp_dir();
    let server = start(dir.path(), "[server]\nmax_page_bytes = 65536\n");
    let api = server.api();
    let mut ids = Vec::new();
    for i in 0..12 {
        let reply = api.post("/v1/extractions", &with_metadata(&format!("src/{i}"), 15_000)).await;
        assert_eq!(reply.status, 201, "{:#}", reply.body);
        ids.push(reply.body["extraction_id"].as_str().expect("id").to_string());
    }
    let mut seen = Vec::new();
    let mut after = String::new();
    let mut pages = 0;
    loop {
        let page = api.get(&format!("/v1/extractions?tenant=acme&limit=100&after={after}")).await;
        assert_eq!(page.status, 200, "{:#}", page.body);
        let records = page.body["extractions"].as_array().expect("a page");
        let bytes = page.body.to_string().len();
        assert!(bytes <= 65536 + 16 * 1024, "a page of {bytes} bytes is over its budget");
        assert!(!records.is_empty() && records.len() < 12, "{} records on one page", records.len());
        seen.extend(records.iter().map(|r| r["extraction_id"].as_str().expect("id").to_string()));
        pages += 1;
        match page.body["next"].as_str() {
            Some(next) => after = next.to_string(),
            None => break,
        }
    }
    assert!(pages >= 3, "{pages} pages");
    assert_eq!(seen, ids, "every record once, in intake order");
    stop_and_verify(server);
}

/// Issue 43, item 4: a worker's `usage.model`, `provider` and `request_id` had no cap, so
/// 20 posts of megabyte names added 104 MB of log (the unpriced-model warning) and 65 MB
/// of memory (the set that warning dedupes by). Each is now at most 256 bytes: more is
/// `422 invalid_input` naming the field and the limit, and nothing is committed or logged.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn usage_strings_over_256_bytes_are_refused_and_never_logged() {
    let dir = temp_dir();
    let server = Server::start(&dir.path().join("data"));
    let api = server.api();
    let id = api.create("acme", "src/a.rs", "fn a() {}").await;
    let (_, token) = api.claim_one("w", 60).await;
    let long = "m".repeat(64 * 1024);
    let post = |usage: Value| {
        let body = json!({"lease_token": token, "output": {"findings": []}, "usage": usage});
        let api = api.clone();
        let path = format!("/v1/extractions/{id}/result");
        async move { api.post(&path, &body).await }
    };
    let usage = |field: &str, value: &str| {
        let mut usage = json!({"model": "gpt-4.1-mini", "input_tokens": 10, "output_tokens": 1});
        usage[field] = json!(value);
        usage
    };
    for field in ["model", "provider", "request_id"] {
        for value in [long.as_str(), &"x".repeat(257)] {
            let reply = post(usage(field, value)).await;
            reply.assert_error(422, "invalid_input");
            assert_eq!(reply.body["error"]["details"]["field"], json!(format!("usage.{field}")), "{:#}", reply.body);
            let message = reply.body["error"]["message"].as_str().unwrap_or_default();
            assert!(message.contains("256 bytes") && !message.contains("xxxxxxxx"), "{message}");
        }
    }
    assert_eq!(api.record(&id).await["state"], json!("claimed"), "nothing was committed");
    // At the limit is fine: an unpriced 256-byte model commits (and is warned of once).
    let at_limit = "y".repeat(256);
    let reply = post(usage("model", &at_limit)).await;
    assert_eq!(reply.status, 200, "{:#}", reply.body);
    let db = server.db_path();
    let (status, log) = server.terminate();
    assert_eq!(status.code(), Some(0), "{log}");
    assert!(!log.contains(&"m".repeat(257)) && !log.contains(&"x".repeat(257)), "a refused name was logged");
    assert!(log.len() < 64 * 1024, "the log is {} bytes", log.len());
    crate::util::assert_verifies(&db);
}
