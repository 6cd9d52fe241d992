//! Findings grounded in the source (issue 25): a worker's answer naming a file the diff does
//! not touch, or a line outside every hunk, is refused 422 with an issue at the finding's
//! field naming the rule; a grounded answer commits; a custom schema's `quote` rule refuses a
//! quote the source does not hold; an unknown `x-commitpoint-*` key stops the server at start.

use serde_json::{Value, json};

use crate::util::{Reply, Server, cli, finding, output, run_to_end, serve_command, stderr, stop_and_verify, temp_dir};

const EXIT_CONFIG: i32 = 78;

/// A real `git diff`: src/lib.rs changed in two hunks (new side 1-5 and 21-24), src/new.rs added.
const DIFF: &str = "\
diff --git a/src/lib.rs b/src/lib.rs
index 3b18e51..a9c2f0d 100644
--- a/src/lib.rs
+++ b/src/lib.rs
@@ -1,4 +1,5 @@
 use std::io;
+use std::fs;
 
 fn main() {
     let x = 1;
@@ -20,3 +21,4 @@ fn helper() {
     let y = 2;
-    y
+    let z = y.unwrap();
+    z
 }
diff --git a/src/new.rs b/src/new.rs
new file mode 100644
--- /dev/null
+++ b/src/new.rs
@@ -0,0 +1,2 @@
+pub fn fresh() {
+}
";

fn issues(reply: &Reply) -> Vec<(String, String)> {
    reply.body["error"]["details"]["issues"]
        .as_array()
        .unwrap_or_else(|| panic!("no issues in {:#}", reply.body))
        .iter()
        .map(|i| (i["path"].as_str().unwrap_or("").to_string(), i["message"].as_str().unwrap_or("").to_string()))
        .collect()
}

fn ungrounded_total(metrics: &str, schema: &str) -> Option<u64> {
    let series = format!("commitpoint_findings_ungrounded_total{{schema=\"{schema}\"}} ");
    metrics.lines().find_map(|l| l.strip_prefix(&series)).and_then(|v| v.trim().parse().ok())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_answer_must_name_the_diffs_files_and_lines() {
    let dir = temp_dir();
    let server = Server::start(dir.path());
    let api = server.api();
    let id = api.create("acme", "PR-25", DIFF).await;

    // A file the diff does not touch.
    let (_, token) = api.claim_one("w", 60).await;
    let elsewhere = output(&[finding("no-unwrap", "src/lib.rs", 23, "grounded"), finding("x", "src/main.rs", 3, "?")]);
    let reply = api.post_result(&id, &token, &elsewhere).await;
    reply.assert_error(422, "validation_failed");
    let found = issues(&reply);
    assert_eq!(found.len(), 1, "{found:?}");
    assert_eq!(found[0].0, "/findings/1/file");
    assert!(
        found[0].1.contains("rule `path`") && found[0].1.contains("\"src/main.rs\" is not a file in the diff"),
        "{found:?}"
    );
    assert_eq!(api.record(&id).await["state"], json!("failed"));

    // A line of a changed file outside every hunk.
    assert_eq!(api.retry(&id).await.status, 200);
    let (_, token) = api.claim_one("w", 60).await;
    let outside = output(&[finding("no-unwrap", "src/lib.rs", 12, "between the hunks")]);
    let reply = api.post_result(&id, &token, &outside).await;
    reply.assert_error(422, "validation_failed");
    let found = issues(&reply);
    assert_eq!(found.len(), 1, "{found:?}");
    assert_eq!(found[0].0, "/findings/0/line");
    assert!(found[0].1.contains("rule `line`") && found[0].1.contains("outside every hunk"), "{found:?}");
    let reason = api.record(&id).await["failure_reason"].as_str().unwrap_or("").to_string();
    assert!(reason.contains("/findings/0/line: ungrounded (rule `line`)"), "{reason}");

    // Grounded: a line of each hunk and of the new file.
    assert_eq!(api.retry(&id).await.status, 200);
    let (_, token) = api.claim_one("w", 60).await;
    let grounded = output(&[
        finding("no-unwrap", "src/lib.rs", 23, "unwrap on a value that may be absent"),
        finding("unused-import", "src/lib.rs", 2, "fs is never used"),
        finding("empty-fn", "src/new.rs", 1, "does nothing"),
    ]);
    let reply = api.post_result(&id, &token, &grounded).await;
    assert_eq!(reply.status, 200, "{:#}", reply.body);
    assert_eq!(reply.body, json!({"state": "committed", "findings": 3, "replay": false}));

    let metrics = reqwest::get(format!("{}/metrics", server.url)).await.expect("metrics").text().await.expect("text");
    assert_eq!(ungrounded_total(&metrics, "code-review@1"), Some(2), "{metrics}");
    stop_and_verify(server);
}

fn ticket_schema() -> Value {
    json!({
        "type": "object",
        "required": ["findings"],
        "properties": {"findings": {"type": "array", "items": {
            "type": "object",
            "required": ["category", "evidence"],
            "additionalProperties": false,
            "properties": {"category": {"type": "string"}, "evidence": {"type": "string"}}
        }}},
        "x-commitpoint-identity": ["/category"],
        "x-commitpoint-grounding": [{"pointer": "/evidence", "rule": "quote"}],
        "x-commitpoint-reask": 2
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_quote_rule_refuses_a_quote_the_source_does_not_hold() {
    let schemas = temp_dir();
    std::fs::write(schemas.path().join("ticket@1.json"), ticket_schema().to_string()).expect("write schema");
    let dir = temp_dir();
    let server = Server::start_with(dir.path(), &["--schema-dir", schemas.path().to_str().expect("utf-8 path")]);
    let api = server.api();
    let reply = api
        .post(
            "/v1/extractions",
            &json!({"tenant": "acme", "source_id": "TICKET-9", "schema": "ticket@1",
                    "content": "Hello,\nthe customer was  charged twice\non 3 May. Please refund."}),
        )
        .await;
    assert_eq!(reply.status, 201, "{:#}", reply.body);
    let id = reply.body["extraction_id"].as_str().expect("id").to_string();

    let (_, token) = api.claim_one("w", 60).await;
    let absent = json!({"findings": [{"category": "billing", "evidence": "charged three times"}]});
    let reply = api.post_result(&id, &token, &absent).await;
    reply.assert_error(422, "validation_failed");
    let found = issues(&reply);
    assert_eq!(found.len(), 1, "{found:?}");
    assert_eq!(found[0].0, "/findings/0/evidence");
    assert!(found[0].1.contains("rule `quote`") && found[0].1.contains("charged three times"), "{found:?}");

    assert_eq!(api.retry(&id).await.status, 200);
    let (_, token) = api.claim_one("w", 60).await;
    let quoted = json!({"findings": [{"category": "billing", "evidence": "charged twice on 3 May"}]});
    let reply = api.post_result(&id, &token, &quoted).await;
    assert_eq!(reply.status, 200, "whitespace is normalised: {:#}", reply.body);

    let metrics = reqwest::get(format!("{}/metrics", server.url)).await.expect("metrics").text().await.expect("text");
    assert_eq!(ungrounded_total(&metrics, "ticket@1"), Some(1), "{metrics}");
    assert_eq!(ungrounded_total(&metrics, "code-review@1"), Some(0), "every schema with rules has its series");
    stop_and_verify(server);
}

#[test]
fn an_unknown_schema_key_stops_serve_and_config_check() {
    let schemas = temp_dir();
    let file = schemas.path().join("ticket@1.json");
    let mut document = ticket_schema();
    document["x-commitpoint-foo"] = json!(true);
    std::fs::write(&file, document.to_string()).expect("write schema");
    let schema_dir = schemas.path().to_str().expect("utf-8 path");
    let dir = temp_dir();
    let config = dir.path().join("config.toml");
    std::fs::write(&config, "").expect("write config");
    let check_args = ["config", "check", "--config", config.to_str().expect("utf-8 path"), "--schema-dir", schema_dir];
    let serve = run_to_end(serve_command(dir.path(), &["--schema-dir", schema_dir]));
    let check = cli(&check_args);
    for (what, out) in [("serve", serve), ("config check", check)] {
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(EXIT_CONFIG), "{what}: {err}");
        assert!(err.contains(file.to_str().expect("utf-8 path")), "{what} names the file: {err}");
        assert!(err.contains("unknown key `x-commitpoint-foo`"), "{what} names the key: {err}");
    }

    // The same schema without the key starts; a non-integer re-ask count does not.
    document.as_object_mut().map(|o| o.remove("x-commitpoint-foo"));
    document["x-commitpoint-reask"] = json!("twice");
    std::fs::write(&file, document.to_string()).expect("write schema");
    let out = cli(&check_args);
    assert_eq!(out.status.code(), Some(EXIT_CONFIG), "{}", stderr(&out));
    assert!(stderr(&out).contains("`x-commitpoint-reask` must be an integer"), "{}", stderr(&out));
    document["x-commitpoint-reask"] = json!(0);
    std::fs::write(&file, document.to_string()).expect("write schema");
    let out = cli(&check_args);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
}
