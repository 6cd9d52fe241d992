//! Posting results: the commit is idempotent, findings are keyed by their identifying
//! fields, a schema violation is a terminal validation failure, and retry re-queues it.

use std::collections::BTreeSet;

use serde_json::{Value, json};

use crate::util::{Server, finding, id_of, output, reviewed, stop_and_verify, temp_dir};

fn finding_keys(findings: &Value) -> BTreeSet<String> {
    findings["findings"]
        .as_array()
        .expect("findings array")
        .iter()
        .map(|f| f["finding_key"].as_str().expect("finding_key").to_string())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replayed_results_change_no_row() {
    let dir = temp_dir();
    let server = Server::start(dir.path());
    let api = server.api();
    let id = api.create("acme", "PR-1", &reviewed()).await;
    let (_, token) = api.claim_one("w", 60).await;

    let first = output(&[
        finding("unwrap", "src/a.rs", 10, "unwrap on user input"),
        finding("sql", "src/db.rs", 3, "string-built query"),
    ]);
    let reply = api.post_result(&id, &token, &first).await;
    assert_eq!(reply.status, 200, "{:#}", reply.body);
    assert_eq!(reply.body, json!({"state": "committed", "findings": 2, "replay": false}));
    let record = api.record(&id).await;
    let findings = api.findings(&id).await;
    assert_eq!(record["state"], json!("committed"));
    assert_eq!(finding_keys(&findings).len(), 2);
    for f in findings["findings"].as_array().expect("array") {
        assert!(["unwrap", "sql"].contains(&f["rule"].as_str().expect("rule")));
        assert_eq!(f["severity"], json!("high"));
    }

    // The same post again, a different output, an invalid output, a stale token:
    // every one is a replay, and no row changes.
    let different = output(&[finding("new", "src/z.rs", 1, "not stored")]);
    let invalid = json!({"findings": [{"rule": "x"}]});
    for (token, out) in [
        (token.as_str(), &first),
        (token.as_str(), &different),
        (token.as_str(), &invalid),
        ("lt-9-someone-else", &first),
    ] {
        let again = api.post_result(&id, token, out).await;
        assert_eq!(again.status, 200, "{:#}", again.body);
        assert_eq!(again.body, json!({"state": "committed", "findings": 2, "replay": true}));
        assert_eq!(api.record(&id).await, record);
        assert_eq!(api.findings(&id).await, findings);
    }
    stop_and_verify(server);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reworded_summary_is_the_same_finding() {
    let dir = temp_dir();
    let server = Server::start(dir.path());
    let api = server.api();
    let id = api.create("acme", "PR-2", &reviewed()).await;
    let (_, token) = api.claim_one("w", 60).await;
    let out = output(&[
        finding("unwrap", "src/a.rs", 10, "first wording"),
        finding("unwrap", "src/a.rs", 10, "second wording"),
        finding("unwrap", "src/a.rs", 11, "another line"),
    ]);
    let reply = api.post_result(&id, &token, &out).await;
    assert_eq!(reply.status, 200, "{:#}", reply.body);
    assert_eq!(reply.body["findings"], json!(2));
    let findings = api.findings(&id).await;
    assert_eq!(findings["findings"].as_array().map(Vec::len), Some(2));
    assert_eq!(finding_keys(&findings).len(), 2);
    for f in findings["findings"].as_array().expect("array") {
        assert_eq!(f["rule"], json!("unwrap"));
        assert_eq!(f["file"], json!("src/a.rs"));
        for key in ["finding_key", "rule", "severity", "file", "line", "summary"] {
            assert!(!f[key].is_null(), "finding lacks {key}: {f:#}");
        }
    }
    stop_and_verify(server);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn finding_keys_are_per_extraction() {
    let dir = temp_dir();
    let server = Server::start(dir.path());
    let api = server.api();
    let a = api.create("acme", "PR-a", &reviewed()).await;
    let b = api.create("acme", "PR-b", &reviewed()).await;
    let out = output(&[finding("unwrap", "src/a.rs", 10, "same finding")]);
    for _ in 0..2 {
        let (id, token) = api.claim_one("w", 60).await;
        let reply = api.post_result(&id, &token, &out).await;
        assert_eq!(reply.status, 200, "{:#}", reply.body);
    }
    let ka = finding_keys(&api.findings(&a).await);
    let kb = finding_keys(&api.findings(&b).await);
    assert_eq!(ka.len(), 1);
    assert_eq!(kb.len(), 1);
    assert!(ka.is_disjoint(&kb), "same finding text, different extractions");
    stop_and_verify(server);
}

/// A worker's invalid output is asked again (one re-ask by default): 422 `reasked`, the
/// next claim of the same extraction carries the refused output and its issues with the
/// schema's instructions, a valid answer then commits once, and the ledger keeps both
/// calls. A second invalid output after the re-ask fails the extraction.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_invalid_output_is_reasked_with_its_issues_then_commits_once() {
    let dir = temp_dir();
    let server = Server::start(dir.path());
    let api = server.api();
    let id = api.create("acme", "PR-9", &reviewed()).await;
    let other = api.create("acme", "PR-10", &reviewed()).await;
    let usage = |request: &str| json!({"model": "m", "input_tokens": 10, "output_tokens": 2, "cost_micros": 7, "request_id": request});
    let mut bad = finding("unwrap", "src/a.rs", 3, "s");
    bad["severity"] = json!("urgent");
    let (_, token) = api.claim_one("w1", 60).await;
    let body = json!({"lease_token": token, "output": output(std::slice::from_ref(&bad)), "usage": usage("r1")});
    let reply = api.post(&format!("/v1/extractions/{id}/result"), &body).await;
    reply.assert_error(422, "reasked");
    assert_eq!(reply.body["error"]["details"]["reask"], json!(1));
    let record = api.get(&format!("/v1/extractions/{id}")).await.body;
    assert_eq!((&record["state"], &record["attempts"], &record["reasks"]), (&json!("pending"), &json!(2), &json!(1)));

    let grants = api.claim("w2", 10, 60).await;
    let grant = grants.iter().find(|g| id_of(g) == id).expect("the re-asked extraction is claimable again");
    let previous = &grant["previous_attempt"];
    let issues = previous["issues"].as_array().cloned().unwrap_or_default();
    assert!(issues.iter().any(|i| i["path"] == "/findings/0/severity"), "{grant:#}");
    assert!(previous["output"].as_str().is_some_and(|o| o.contains("urgent")), "{grant:#}");
    assert!(grant["instructions"].as_str().is_some_and(|i| !i.is_empty()), "{grant:#}");
    let other_grant = grants.iter().find(|g| id_of(g) == other).expect("the other extraction");
    assert!(other_grant["previous_attempt"].is_null(), "a first ask has no previous attempt: {other_grant:#}");
    let schema = api.get(grant["schema_url"].as_str().expect("schema_url")).await;
    assert_eq!((schema.status, &schema.body["json_schema"]["type"]), (200, &json!("object")), "{:#}", schema.body);

    let token = grant["lease_token"].as_str().expect("token");
    let good = output(&[finding("unwrap", "src/a.rs", 3, "s")]);
    let body = json!({"lease_token": token, "output": good, "usage": usage("r2")});
    let reply = api.post(&format!("/v1/extractions/{id}/result"), &body).await;
    assert_eq!((reply.status, &reply.body["replay"]), (200, &json!(false)), "{:#}", reply.body);
    let costs = api.get(&format!("/v1/extractions/{id}/costs")).await.body;
    let kinds: Vec<(&str, u64)> = costs["attempts"]
        .as_array()
        .expect("attempts")
        .iter()
        .filter_map(|a| Some((a["kind"].as_str()?, a["attempt"].as_u64()?)))
        .collect();
    assert_eq!(kinds, [("failed_validation", 1), ("fresh", 2)], "{costs:#}");
    assert_eq!(api.list_all("").await.len(), 2, "a re-ask is never a second record");

    // The other one fails twice: after its one re-ask the extraction fails `validation`.
    let token = other_grant["lease_token"].as_str().expect("token");
    let body = json!({"lease_token": token, "output": output(std::slice::from_ref(&bad))});
    api.post(&format!("/v1/extractions/{other}/result"), &body).await.assert_error(422, "reasked");
    let (_, token) = api.claim_one("w3", 60).await;
    let body = json!({"lease_token": token, "output": output(&[bad])});
    api.post(&format!("/v1/extractions/{other}/result"), &body).await.assert_error(422, "validation_failed");
    let record = api.get(&format!("/v1/extractions/{other}")).await.body;
    assert_eq!((&record["state"], &record["failure_class"]), (&json!("failed"), &json!("validation")), "{record:#}");
    stop_and_verify(server);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invalid_output_fails_the_extraction_and_retry_requeues_it() {
    let dir = temp_dir();
    let server = Server::start(dir.path());
    let api = server.api();
    let id = api.create("acme", "PR-3", &reviewed()).await;
    let (_, token) = api.claim_one("w1", 60).await;

    let mut bad = finding("unwrap", "src/a.rs", 0, "line zero");
    bad["severity"] = json!("urgent");
    let reply = api.post_result(&id, &token, &output(&[bad])).await;
    reply.assert_error(422, "validation_failed");
    let issues = reply.body["error"]["details"]["issues"].as_array().expect("details.issues");
    assert!(!issues.is_empty());
    let paths: BTreeSet<&str> = issues.iter().filter_map(|i| i["path"].as_str()).collect();
    assert!(paths.contains("/findings/0/line"), "{issues:#?}");
    assert!(paths.contains("/findings/0/severity"), "{issues:#?}");

    let failed = api.record(&id).await;
    assert_eq!(failed["state"], json!("failed"));
    assert_eq!(failed["failure_class"], json!("validation"));
    assert!(failed["failure_reason"].as_str().is_some_and(|r| r.contains("/findings/0/line")), "{failed:#}");
    assert!(failed["worker"].is_null());
    assert_eq!(api.findings(&id).await["findings"], json!([]));

    // A failed extraction takes no result (valid or not) and is not claimable.
    let good = output(&[finding("unwrap", "src/a.rs", 1, "fixed")]);
    api.post_result(&id, &token, &good).await.assert_error(409, "illegal_transition");
    assert!(api.claim("w2", 10, 60).await.is_empty());
    assert_eq!(api.record(&id).await, failed);

    let retried = api.retry(&id).await;
    assert_eq!(retried.status, 200, "{:#}", retried.body);
    assert_eq!(retried.body["state"], json!("pending"));
    assert_eq!(retried.body["attempts"], json!(2));
    assert!(retried.body["failure_class"].is_null());
    api.retry(&id).await.assert_error(409, "illegal_transition");

    let grants = api.claim("w2", 10, 60).await;
    assert_eq!(grants.len(), 1);
    assert_eq!(grants[0]["attempt"], json!(2));
    let new_token = grants[0]["lease_token"].as_str().expect("token");
    assert_ne!(new_token, token);
    api.post_result(&id, &token, &good).await.assert_error(409, "stale_lease");
    let reply = api.post_result(&id, new_token, &good).await;
    assert_eq!(reply.status, 200, "{:#}", reply.body);
    assert_eq!(reply.body, json!({"state": "committed", "findings": 1, "replay": false}));
    let committed = api.record(&id).await;
    assert_eq!(committed["state"], json!("committed"));
    assert_eq!(committed["attempts"], json!(2));
    assert_eq!(committed["claims"], json!(2));
    api.retry(&id).await.assert_error(409, "illegal_transition");
    stop_and_verify(server);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retry_is_only_for_failed_extractions() {
    let dir = temp_dir();
    let server = Server::start(dir.path());
    let api = server.api();
    let id = api.create("acme", "PR-4", &reviewed()).await;
    api.retry(&id).await.assert_error(409, "illegal_transition");
    api.claim_one("w", 60).await;
    api.retry(&id).await.assert_error(409, "illegal_transition");
    assert_eq!(api.record(&id).await["attempts"], json!(1));
    let unknown = "0".repeat(64);
    api.retry(&unknown).await.assert_error(404, "not_found");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_posts_of_one_result_commit_once() {
    let dir = temp_dir();
    let server = Server::start(dir.path());
    let api = server.api();
    let id = api.create("acme", "PR-5", &reviewed()).await;
    let (_, token) = api.claim_one("w", 60).await;
    let out = output(&[finding("a", "x.rs", 1, "one"), finding("b", "x.rs", 2, "two")]);
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..24 {
        let (api, id, token, out) = (api.clone(), id.clone(), token.clone(), out.clone());
        tasks.spawn(async move { api.post_result(&id, &token, &out).await });
    }
    let mut fresh = 0;
    while let Some(reply) = tasks.join_next().await {
        let reply = reply.expect("post task");
        assert_eq!(reply.status, 200, "{:#}", reply.body);
        assert_eq!(reply.body["findings"], json!(2));
        if reply.body["replay"] == json!(false) {
            fresh += 1;
        }
    }
    assert_eq!(fresh, 1, "exactly one post commits; the rest are replays");
    assert_eq!(finding_keys(&api.findings(&id).await).len(), 2);
    stop_and_verify(server);
}

/// JSON Schema counts `10.0` (and `1e1`) as the integer 10, so a finding on line `10.0`
/// passes validation. Its identity must then be line 10: one rule, one file, one line
/// is one finding, however the number was spelled.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_line_number_spelled_as_a_float_is_the_same_finding() {
    let dir = temp_dir();
    let server = Server::start(dir.path());
    let api = server.api();
    let id = api.create("acme", "PR-6", &reviewed()).await;
    let (_, token) = api.claim_one("w", 60).await;
    // Raw JSON, so the spellings reach the server unchanged.
    let body = format!(
        r#"{{"lease_token":"{token}","output":{{"findings":[
            {{"rule":"R","severity":"low","file":"f.rs","line":10,"summary":"a"}},
            {{"rule":"R","severity":"low","file":"f.rs","line":10.0,"summary":"b"}},
            {{"rule":"R","severity":"low","file":"f.rs","line":1e1,"summary":"c"}}]}}}}"#
    );
    let reply = api.send(reqwest::Method::POST, &format!("/v1/extractions/{id}/result"), Some(body.into_bytes())).await;
    if reply.status == 422 {
        // Rejecting non-integer spellings outright is also correct.
        reply.assert_error(422, "validation_failed");
        return;
    }
    assert_eq!(reply.status, 200, "{:#}", reply.body);
    let stored = api.findings(&id).await;
    assert_eq!(reply.body["findings"], json!(1), "line 10, 10.0 and 1e1 are one finding; stored: {stored:#}");
    assert_eq!(finding_keys(&stored).len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_huge_invalid_output_gets_a_bounded_error() {
    let dir = temp_dir();
    let server = Server::start(dir.path());
    let api = server.api();
    let id = api.create("acme", "PR-7", &reviewed()).await;
    let (_, token) = api.claim_one("w", 60).await;
    let bad: Vec<Value> =
        (0..500).map(|i| json!({"rule": "", "severity": "none", "file": "", "line": -i, "summary": 1})).collect();
    let reply = api.post_result(&id, &token, &output(&bad)).await;
    reply.assert_error(422, "validation_failed");
    let issues = reply.body["error"]["details"]["issues"].as_array().expect("issues");
    assert!(!issues.is_empty() && issues.len() <= 32, "{} issues", issues.len());
    let reason = api.record(&id).await["failure_reason"].as_str().expect("reason").to_string();
    assert!(reason.chars().count() <= 2001, "{} chars", reason.chars().count());
}

/// A failed validation keeps the refused answer and its issues, and an operator's retry
/// keeps why the earlier attempt failed, through a restart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rejected_answer_and_the_failures_retried_past_are_kept() {
    let dir = temp_dir();
    let server = Server::start(dir.path());
    let api = server.api();
    let id = api.create("t", "a.rs", "fn a() {}").await;
    let (_, lease) = api.claim_one("w", 60).await;
    let bad = json!({"findings": "not an array"});
    assert_eq!(api.post_result(&id, &lease, &bad).await.status, 422);
    let failed = api.record(&id).await;
    assert_eq!(failed["failure_class"], json!("validation"));
    let rejected = &failed["rejected_answer"];
    assert_eq!(rejected["output"].as_str().map(|o| serde_json::from_str::<Value>(o).ok()), Some(Some(bad.clone())));
    assert!(rejected["issues"][0]["path"].as_str().is_some_and(|p| p.starts_with("/findings")), "{failed}");
    assert_eq!(failed["earlier_failures"], json!([]));
    let reason = failed["failure_reason"].clone();

    assert_eq!(api.retry(&id).await.status, 200);
    let server = {
        let (status, log) = server.terminate();
        assert_eq!(status.code(), Some(0), "{log}");
        Server::start(dir.path())
    };
    let api = server.api();
    let retried = api.record(&id).await;
    assert_eq!((retried["state"].as_str(), retried["attempts"].as_u64()), (Some("pending"), Some(2)));
    assert_eq!(retried["rejected_answer"], Value::Null, "not failed any more");
    let earlier = retried["earlier_failures"].as_array().expect("earlier failures");
    assert_eq!(earlier.len(), 1, "{retried}");
    assert_eq!(
        (&earlier[0]["attempt"], &earlier[0]["failure_class"], &earlier[0]["failure_reason"]),
        (&json!(1), &json!("validation"), &reason)
    );
    // The retry asks again with the issues of the answer that failed.
    let grant = &api.claim("w", 1, 60).await[0];
    assert!(grant["previous_attempt"]["issues"][0]["path"].is_string(), "{grant}");
    stop_and_verify(server);
}
