//! `commitpoint compact DB` on the real binary (issue 15, item 4): offline only (a file a
//! running server holds is refused with exit 74), prints the size before and after, and
//! verifies the compacted file. After an erasure the file gets smaller.

use reqwest::Method;

use crate::util::{Server, cli, stderr, stdout, stop_and_verify, temp_dir};

/// "size before: N bytes" → N.
fn size(text: &str, label: &str) -> u64 {
    let line = text.lines().find(|l| l.starts_with(label)).unwrap_or_else(|| panic!("no {label:?} line in {text}"));
    line.trim_start_matches(label).trim().trim_end_matches("bytes").trim().parse().expect("a byte count")
}

#[tokio::test]
async fn compaction_is_offline_shrinks_the_file_after_an_erasure_and_verifies() {
    let dir = temp_dir();
    let server = Server::start(dir.path());
    let api = server.api();
    let big = "x".repeat(64 * 1024);
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..200 {
        let (api, content) = (api.clone(), format!("// source {i}\n{big}"));
        tasks.spawn(async move {
            api.create(if i % 10 == 0 { "stays" } else { "leaves" }, &format!("s{i}"), &content).await
        });
    }
    while let Some(done) = tasks.join_next().await {
        done.expect("intake task");
    }
    let db = server.db_path();
    let db_arg = db.to_str().expect("utf-8 path").to_string();

    let locked = cli(&["compact", &db_arg]);
    assert_eq!(locked.status.code(), Some(74), "a served file is refused: {}", stderr(&locked));
    assert!(stderr(&locked).contains("server"), "{}", stderr(&locked));

    let erased = api.send(Method::DELETE, "/v1/tenants/leaves", None).await;
    assert_eq!(erased.status, 200, "{:#}", erased.body);
    assert_eq!(erased.body["extractions"], serde_json::json!(180));
    stop_and_verify(server);

    let out = cli(&["compact", &db_arg]);
    let text = stdout(&out);
    assert_eq!(out.status.code(), Some(0), "{text}\n{}", stderr(&out));
    let (before, after) = (size(&text, "size before:"), size(&text, "size after:"));
    assert_eq!(before, std::fs::metadata(&db).expect("stat").len().max(before), "{text}");
    assert_eq!(after, std::fs::metadata(&db).expect("stat").len(), "the size printed is the file's");
    assert!(after * 2 < before, "erasing 90% of the content at least halves the file: {before} → {after}");
    assert!(text.contains("ok: every invariant holds"), "compact runs verify: {text}");

    let missing = cli(&["compact", dir.path().join("nope.redb").to_str().expect("path")]);
    assert_eq!(missing.status.code(), Some(74), "{}", stderr(&missing));

    let server = Server::start(dir.path());
    assert_eq!(server.api().list_all("").await.len(), 20, "the compacted file serves what it kept");
    stop_and_verify(server);
}
