//! Export (issue 15, item 1) on the real binary: `GET /v1/export` streams one NDJSON line
//! per committed extraction in commit order, filters by schema and commit time, keeps
//! tenant tokens to their own tenant, and `commitpoint export` writes the same lines (or
//! one CSV row per finding) to a file. Counts are checked against the listing API.

use std::time::Duration;

use reqwest::Method;
use serde_json::{Value, json};

use crate::util::{Server, call_as, cli, finding, output, stderr, stop_and_verify, temp_dir, write_secret};

const ADMIN: &str = "admin-token-export-0000001";
const ACME: &str = "acme-token-export-00000001";

fn start(dir: &std::path::Path) -> Server {
    let admin = dir.join("admin");
    let tenants = dir.join("tenants");
    write_secret(&admin, &format!("{ADMIN}\n"));
    write_secret(&tenants, &format!("acme {ACME}\n"));
    let config = dir.join("config.toml");
    let text = format!(
        "[access]\nadmin_token_file = \"{}\"\ntenant_tokens_file = \"{}\"\n",
        admin.display(),
        tenants.display()
    );
    std::fs::write(&config, text).expect("write config");
    Server::start_with(&dir.join("data"), &["--config", config.to_str().expect("utf-8 path")])
}

/// The raw export: status, content type and the lines as JSON.
async fn export(base: &str, token: &str, query: &str) -> (u16, String, Vec<Value>) {
    let response = reqwest::Client::builder()
        .no_proxy()
        .build()
        .expect("client")
        .get(format!("{base}/v1/export?{query}"))
        .bearer_auth(token)
        .send()
        .await
        .expect("reach the server");
    let status = response.status().as_u16();
    let content_type = response.headers()["content-type"].to_str().expect("ascii").to_string();
    let text = response.text().await.expect("the whole body");
    if status != 200 {
        return (status, content_type, vec![serde_json::from_str(&text).expect("a JSON error")]);
    }
    assert!(text.is_empty() || text.ends_with('\n'), "every line is terminated");
    let lines = text.lines().map(|l| serde_json::from_str(l).expect("each line is JSON")).collect();
    (status, content_type, lines)
}

async fn get(base: &str, path: &str) -> Value {
    let (status, body) = call_as(&format!("{base}{path}"), Some(ADMIN), Method::GET, None).await;
    assert_eq!(status, 200, "{path}: {body}");
    body
}

/// Every extraction the listing API returns for `query`, following its cursors.
async fn list_all(base: &str, query: &str) -> Vec<Value> {
    let mut out = Vec::new();
    let mut after = String::new();
    loop {
        let page = get(base, &format!("/v1/extractions?{query}&limit=7&after={after}")).await;
        out.extend(page["extractions"].as_array().expect("page").iter().cloned());
        match page["next"].as_str() {
            Some(next) => after = next.to_string(),
            None => return out,
        }
    }
}

async fn post(api_base: &str, path: &str, body: Value) -> (u16, Value) {
    call_as(&format!("{api_base}{path}"), Some(ADMIN), Method::POST, Some(body)).await
}

/// Intakes `n` sources for `tenant`; commits those where `commit(i)` holds with `i % 4`
/// findings each, in reverse intake order a few milliseconds apart (so commit order is
/// not intake order), and fails every fifth. Returns the committed ids in commit order.
async fn populate(base: &str, tenant: &str, n: usize, commit: impl Fn(usize) -> bool) -> Vec<String> {
    let mut ids = Vec::new();
    for i in 0..n {
        let body = json!({"tenant": tenant, "source_id": format!("src/{i}.rs"), "schema": "code-review@1",
            "content": format!("fn f{i}() {{}}")});
        let (status, reply) = post(base, "/v1/extractions", body).await;
        assert_eq!(status, 201, "{reply}");
        ids.push(reply["extraction_id"].as_str().expect("id").to_string());
    }
    let (_, claims) = post(base, "/v1/claims", json!({"worker": "w", "limit": n, "lease_seconds": 600})).await;
    let tokens: std::collections::HashMap<String, String> = claims["claims"]
        .as_array()
        .expect("claims")
        .iter()
        .map(|c| (c["extraction_id"].as_str().expect("id").into(), c["lease_token"].as_str().expect("t").into()))
        .collect();
    let mut committed = Vec::new();
    for (i, id) in ids.iter().enumerate().rev() {
        let token = &tokens[id];
        let result = if i % 5 == 4 {
            json!({"lease_token": token, "output": {"findings": "not a list"}, "reask": false})
        } else if commit(i) {
            let findings: Vec<Value> =
                (0..i % 4).map(|k| finding(&format!("R{k}"), &format!("src/{i}.rs"), 1, "x")).collect();
            json!({"lease_token": token, "output": output(&findings)})
        } else {
            continue;
        };
        let (status, reply) = post(base, &format!("/v1/extractions/{id}/result"), result).await;
        if i % 5 == 4 {
            assert_eq!(status, 422, "{reply}");
        } else {
            assert_eq!(status, 200, "{reply}");
            committed.push(id.clone());
        }
        tokio::time::sleep(Duration::from_millis(3)).await;
    }
    committed
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn export_streams_committed_extractions_in_commit_order_and_the_cli_writes_the_same() {
    let dir = temp_dir();
    let server = start(dir.path());
    let base = server.url.clone();
    let committed = populate(&base, "acme", 24, |i| i % 7 != 3).await;
    populate(&base, "globex", 5, |_| true).await;
    // Line count and content against the listing API.
    let listed = list_all(&base, "tenant=acme&state=committed").await;
    let (status, content_type, lines) = export(&base, ADMIN, "tenant=acme").await;
    assert_eq!((status, content_type.as_str()), (200, "application/x-ndjson"));
    assert_eq!(lines.len(), listed.len(), "one line per committed extraction");
    assert_eq!(lines.len(), committed.len());
    let order: Vec<&str> = lines.iter().map(|l| l["extraction_id"].as_str().expect("id")).collect();
    assert_eq!(order, committed, "commit order, not intake order");
    let mut findings_total = 0;
    for line in &lines {
        let id = line["extraction_id"].as_str().expect("id");
        assert_eq!(line["tenant"], "acme");
        assert_eq!(line["schema"], "code-review@1");
        assert!(line["source_id"].as_str().is_some_and(|s| s.starts_with("src/")));
        let api_findings = get(&base, &format!("/v1/extractions/{id}/findings")).await;
        assert_eq!(line["findings"], api_findings["findings"], "the findings as the API shows them");
        let record = get(&base, &format!("/v1/extractions/{id}")).await;
        assert_eq!(line["committed_at"], record["committed_at"]);
        findings_total += line["findings"].as_array().expect("findings").len();
    }
    assert!(findings_total > 0);

    // Filters: schema, and a commit-time window (since inclusive, until exclusive).
    assert_eq!(export(&base, ADMIN, "tenant=acme&schema=code-review@1").await.2.len(), lines.len());
    let (status, _, error) = export(&base, ADMIN, "tenant=acme&schema=nope@1").await;
    assert_eq!((status, &error[0]["error"]["code"]), (422, &json!("unknown_schema")));
    let since = lines[5]["committed_at"].as_str().expect("time");
    let until = lines[9]["committed_at"].as_str().expect("time");
    let window = export(&base, ADMIN, &format!("tenant=acme&since={since}&until={until}")).await.2;
    let ids = |ls: &[Value]| ls.iter().map(|l| l["extraction_id"].clone()).collect::<Vec<_>>();
    assert_eq!(ids(&window), ids(&lines[5..9]));
    let (status, _, error) = export(&base, ADMIN, &format!("tenant=acme&since={until}&until={since}")).await;
    assert_eq!((status, &error[0]["error"]["code"]), (422, &json!("invalid_input")));
    assert_eq!(export(&base, ADMIN, "tenant=acme&since=yesterday").await.0, 400);
    assert_eq!(export(&base, ADMIN, "schema=code-review@1").await.0, 400, "the tenant is required");
    assert!(export(&base, ADMIN, "tenant=nobody").await.2.is_empty());

    // A tenant token exports its own tenant only.
    assert_eq!(export(&base, ACME, "tenant=acme").await.2.len(), lines.len());
    let (status, _, error) = export(&base, ACME, "tenant=globex").await;
    assert_eq!((status, &error[0]["error"]["code"]), (403, &json!("forbidden")));

    // The CLI: the same lines as JSON, and one row per finding (plus a header) as CSV.
    let jsonl = dir.path().join("acme.jsonl");
    let csv = dir.path().join("acme.csv");
    for (format, out) in [("jsonl", &jsonl), ("csv", &csv)] {
        let args = ["export", "--tenant", "acme", "--format", format, "--out", out.to_str().expect("utf-8")];
        let run = cli(&[&args[..], &["--admin", &base, "--token", ACME]].concat());
        assert_eq!(run.status.code(), Some(0), "{}", stderr(&run));
        let summary = format!("{} extractions, {findings_total} findings", lines.len());
        assert!(stderr(&run).contains(&summary), "{}", stderr(&run));
    }
    let written: Vec<Value> = std::fs::read_to_string(&jsonl)
        .expect("the export file")
        .lines()
        .map(|l| serde_json::from_str(l).expect("JSON"))
        .collect();
    assert_eq!(written, lines);
    let text = std::fs::read_to_string(&csv).expect("the CSV file");
    let rows: Vec<&str> = text.split("\r\n").filter(|r| !r.is_empty()).collect();
    assert_eq!(rows.len(), findings_total + 1, "a header and one row per finding");
    assert!(rows[0].starts_with("extraction_id,finding_key,tenant,source_id,schema,committed_at,"), "{}", rows[0]);
    assert!(rows[0].contains("rule") && rows[0].ends_with("other_fields"), "{}", rows[0]);

    // A refusal leaves no file behind and exits 1.
    let refused = dir.path().join("globex.jsonl");
    let run = cli(&[
        "export",
        "--tenant",
        "globex",
        "--out",
        refused.to_str().expect("utf-8"),
        "--admin",
        &base,
        "--token",
        ACME,
    ]);
    assert_eq!(run.status.code(), Some(1), "{}", stderr(&run));
    assert!(stderr(&run).contains("403"), "{}", stderr(&run));
    assert!(!refused.exists() && !refused.with_extension("partial").exists());
    stop_and_verify(server);
}
