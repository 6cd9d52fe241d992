//! Outputs with very many findings: over the cap an answer fails whole and clearly; the
//! findings of an output are read a page at a time.

use std::collections::BTreeSet;

use serde_json::{Value, json};

use crate::util::{Api, Server, diff_adding, finding, output, temp_dir};

fn findings(n: u32) -> Vec<Value> {
    (1..=n).map(|i| finding("r", "a.rs", i, "s")).collect()
}

/// Every finding key of an extraction, following `next` with pages of `limit`; and the
/// number of pages.
async fn read_all(api: &Api, id: &str, limit: usize) -> (Vec<String>, usize) {
    let mut keys = Vec::new();
    let mut after = String::new();
    let mut pages = 0;
    loop {
        let reply = api.get(&format!("/v1/extractions/{id}/findings?limit={limit}&after={after}")).await;
        assert_eq!(reply.status, 200, "{:#}", reply.body);
        let page = reply.body["findings"].as_array().expect("findings").clone();
        assert!(page.len() <= limit);
        keys.extend(page.iter().map(|f| f["finding_key"].as_str().expect("finding_key").to_string()));
        pages += 1;
        assert!(pages <= 100, "paging does not end");
        match &reply.body["next"] {
            Value::String(next) => after.clone_from(next),
            Value::Null => return (keys, pages),
            other => panic!("next: {other}"),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_output_over_the_findings_cap_fails_whole_with_its_own_code() {
    let dir = temp_dir();
    let config = dir.path().join("config.toml");
    std::fs::write(&config, "[limits]\nmax_findings_per_output = 50\n").expect("write config");
    let server = Server::start_with(&dir.path().join("data"), &["--config", config.to_str().unwrap()]);
    let api = server.api();

    api.create("acme", "big", &diff_adding(&["a.rs"], 1000)).await;
    let (id, token) = api.claim_one("w", 60).await;
    let reply = api.post_result(&id, &token, &output(&findings(51))).await;
    reply.assert_error(422, "too_many_findings");
    assert_eq!(reply.body["error"]["details"], json!({"count": 51, "max": 50}), "{:#}", reply.body);
    let record = api.record(&id).await;
    assert_eq!((record["state"].as_str(), record["failure_class"].as_str()), (Some("failed"), Some("validation")));
    assert!(record["failure_reason"].as_str().is_some_and(|r| r.contains("51 findings")), "{record:#}");
    assert_eq!(api.findings(&id).await["findings"], json!([]), "nothing of it was kept");

    // At the cap is fine.
    assert_eq!(api.retry(&id).await.status, 200);
    let (id, token) = api.claim_one("w", 60).await;
    let reply = api.post_result(&id, &token, &output(&findings(50))).await;
    assert_eq!(reply.status, 200, "{:#}", reply.body);
    crate::util::stop_and_verify(server);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn findings_are_read_a_page_at_a_time() {
    let dir = temp_dir();
    let server = Server::start(dir.path());
    let api = server.api();
    api.create("acme", "many", &diff_adding(&["a.rs"], 1000)).await;
    let (id, token) = api.claim_one("w", 60).await;
    let reply = api.post_result(&id, &token, &output(&findings(1000))).await;
    assert_eq!(reply.status, 200, "the default cap admits 1000: {:#}", reply.body);

    let whole = api.findings(&id).await;
    assert_eq!(whole["findings"].as_array().map(Vec::len), Some(1000), "the default page holds a whole output");
    assert_eq!(whole["next"], Value::Null);

    let (keys, pages) = read_all(&api, &id, 300).await;
    assert_eq!(pages, 4);
    assert_eq!(keys.len(), 1000);
    assert_eq!(keys.iter().collect::<BTreeSet<_>>().len(), 1000, "every finding once");
    let first = api.get(&format!("/v1/extractions/{id}/findings?limit=300")).await;
    let next = first.body["next"].as_str().expect("next").to_string();

    // A findings cursor belongs to its extraction; limits are bounded.
    api.create("acme", "other", &diff_adding(&["a.rs"], 2)).await;
    let other = api.list_all("").await.iter().find(|e| e["source_id"] == "other").cloned().expect("other");
    let other_id = other["extraction_id"].as_str().expect("id");
    api.get(&format!("/v1/extractions/{other_id}/findings?after={next}")).await.assert_error(400, "invalid_cursor");
    api.get(&format!("/v1/extractions/{id}/findings?after=abc")).await.assert_error(400, "invalid_cursor");
    api.get(&format!("/v1/extractions/{id}/findings?limit=1001")).await.assert_error(422, "invalid_input");
    crate::util::stop_and_verify(server);
}
