//! Tenant erasure on the real binary (issue 15, item 3): `DELETE /v1/tenants/{tenant}` and
//! `commitpoint erase-tenant`. What remains is checked by `verify` and by a dump of every
//! row of every table: nothing of the erased tenant but its per-day spend totals, and the
//! other tenant's rows exactly as before.

use std::path::Path;
use std::process::Command;

use commitpoint::engine::webhook::{WebhookSecret, sign_standard};
use reqwest::Method;
use serde_json::{Value, json};

use crate::util::{Api, BIN, Server, assert_verifies, cli_with_env, finding, output, run_to_end, stdout, temp_dir};

const HOOK_SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
const GONE: &str = "gone-tenant";
const KEPT: &str = "kept-tenant";

/// An outbox sink nobody listens on (its events stay pending) and a webhook for `GONE`.
fn config(dir: &Path) -> String {
    let path = dir.join("config.toml");
    let text = format!(
        "[[outbox.sinks]]\nname = \"downstream\"\nurl = \"http://127.0.0.1:9/hook\"\nsecret_env = \"HOOK_SECRET\"\n\n\
         [[webhooks]]\nname = \"std\"\nscheme = \"standard\"\nsecret_env = \"HOOK_SECRET\"\ntenant = \"{GONE}\"\n\
         source_id_pointer = \"/id\"\ncontent_pointer = \"/text\"\nschema = \"code-review@1\"\n"
    );
    std::fs::write(&path, text).expect("config");
    path.display().to_string()
}

fn serve(dir: &Path) -> Server {
    Server::start_with_env(dir, &["--config", &config(dir)], &[("HOOK_SECRET", HOOK_SECRET)])
}

/// Commits `source` for `tenant` through the worker API, with a paid usage report.
async fn commit(api: &Api, tenant: &str, source: &str) -> String {
    let id = api.create(tenant, source, &format!("fn {source}() {{}} // body of {source}")).await;
    let (claimed, token) = api.claim_one("w1", 60).await;
    assert_eq!(claimed, id);
    let body = json!({"lease_token": token, "output": output(&[finding("R1", source, 1, "unused")]),
        "usage": {"model": "m", "input_tokens": 10, "output_tokens": 5, "cost_micros": 1234}});
    let reply = api.post(&format!("/v1/extractions/{id}/result"), &body).await;
    assert_eq!(reply.status, 200, "{:#}", reply.body);
    id
}

async fn webhook(server: &Server, delivery: &str, source: &str) -> Value {
    let body = json!({"id": source, "text": format!("fn hook() {{}} // {source}")}).to_string();
    let secret = WebhookSecret::standard(HOOK_SECRET).expect("secret");
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).expect("clock").as_secs();
    let response = reqwest::Client::new()
        .post(format!("{}/v1/webhooks/std", server.url))
        .header("webhook-id", delivery)
        .header("webhook-timestamp", now.to_string())
        .header("webhook-signature", sign_standard(&secret, delivery, now, body.as_bytes()))
        .body(body)
        .send()
        .await
        .expect("send");
    assert!(response.status().is_success(), "{}", response.status());
    response.json().await.expect("json")
}

fn dump(db: &Path) -> Vec<String> {
    if crate::support::postgres::enabled() {
        let data_dir = db.parent().expect("the store's data directory");
        return crate::support::postgres::dump(data_dir).lines().map(str::to_string).collect();
    }
    let mut cmd = Command::new(BIN);
    cmd.arg("debug-dump").arg(db);
    let out = run_to_end(cmd);
    assert_eq!(out.status.code(), Some(0), "debug-dump: {}", String::from_utf8_lossy(&out.stderr));
    stdout(&out).lines().map(str::to_string).collect()
}

/// The rows that mention any of `needles`.
fn mentioning<'a>(rows: &'a [String], needles: &[String]) -> Vec<&'a String> {
    rows.iter().filter(|r| needles.iter().any(|n| r.contains(n.as_str()))).collect()
}

#[tokio::test]
async fn erasure_leaves_nothing_of_the_tenant_but_spend_totals_and_spares_the_others() {
    let dir = temp_dir();
    let server = serve(dir.path());
    let api = server.api();
    // Committed work first: a claim takes the oldest pending extraction.
    let mut gone = vec![commit(&api, GONE, "g1").await, commit(&api, GONE, "g2").await];
    let kept = [commit(&api, KEPT, "k1").await, commit(&api, KEPT, "k2").await];
    gone.push(api.create(GONE, "g3", "fn g3() {} // pending").await);
    let hooked = webhook(&server, "msg_gone_1", "g4").await;
    gone.push(hooked["extraction_id"].as_str().expect("id").to_string());
    let pending_kept = api.create(KEPT, "k3", "fn k3() {} // pending").await;
    let mut kept_views = Vec::new();
    for id in kept.iter().chain([&pending_kept]) {
        kept_views.push((api.record(id).await, api.findings(id).await));
    }
    let db = server.db_path();
    crate::util::stop_and_verify(server);
    let before = dump(&db);
    let mut gone_needles: Vec<String> = gone.clone();
    gone_needles.extend([GONE, "g1", "g2", "g3", "g4", "msg_gone_1", "body of g"].map(String::from));
    // redb keeps index tables of its own (identity, state, tenant, commit and ledger
    // indexes); PostgreSQL's indexes are not rows, so fewer rows name the tenant there.
    let least = if crate::support::postgres::enabled() { 12 } else { 20 };
    assert!(mentioning(&before, &gone_needles).len() > least, "the tenant is all over the store before");
    let kept_needles: Vec<String> = kept.iter().chain([&pending_kept]).cloned().chain([KEPT.to_string()]).collect();
    let kept_before: Vec<String> =
        mentioning(&before, &kept_needles).into_iter().filter(|r| !r.starts_with("outbox")).cloned().collect();

    let server = serve(dir.path());
    let api = server.api();
    let reply = api.send(Method::DELETE, &format!("/v1/tenants/{GONE}"), None).await;
    assert_eq!(reply.status, 200, "{:#}", reply.body);
    let counts = &reply.body;
    assert_eq!(counts["tenant"], json!(GONE));
    assert_eq!(counts["extractions"], json!(4), "{counts:#}");
    assert_eq!(counts["contents"], json!(4), "{counts:#}");
    assert_eq!(counts["findings"], json!(2), "{counts:#}");
    assert_eq!(counts["raw_results"], json!(2), "{counts:#}");
    assert_eq!(counts["ledger_entries"], json!(2), "{counts:#}");
    assert_eq!(counts["outbox_events"], json!(2), "one event per commit, one sink: {counts:#}");
    assert_eq!(counts["webhook_deliveries"], json!(1), "{counts:#}");
    for id in &gone {
        api.get(&format!("/v1/extractions/{id}")).await.assert_error(404, "not_found");
    }
    assert!(api.list_all(&format!("tenant={GONE}&")).await.is_empty());
    // Per-day spend stays: the ledger entries are gone, what they charged is still billed.
    let costs = api.get(&format!("/v1/tenants/{GONE}/costs")).await;
    assert_eq!(costs.status, 200, "{:#}", costs.body);
    assert_eq!((costs.body["charged_micros"].clone(), costs.body["erased_micros"].clone()), (json!(0), json!(2468)));
    let kept_costs = api.get(&format!("/v1/tenants/{KEPT}/costs")).await;
    assert_eq!(
        (kept_costs.body["charged_micros"].clone(), kept_costs.body["erased_micros"].clone()),
        (json!(2468), json!(0))
    );
    let again = api.send(Method::DELETE, &format!("/v1/tenants/{GONE}"), None).await;
    assert_eq!(again.status, 200, "{:#}", again.body);
    for key in ["extractions", "contents", "findings", "ledger_entries", "outbox_events", "webhook_deliveries"] {
        assert_eq!(again.body[key], json!(0), "a second erasure finds nothing: {:#}", again.body);
    }
    api.send(Method::DELETE, "/v1/tenants/not%20a%20tenant", None).await.assert_error(422, "invalid_input");
    for (id, (record, findings)) in kept.iter().chain([&pending_kept]).zip(&kept_views) {
        assert_eq!(&api.record(id).await, record, "the other tenant's record is untouched");
        assert_eq!(&api.findings(id).await, findings);
    }
    crate::util::stop_and_verify(server);

    let after = dump(&db);
    let left: Vec<&String> = mentioning(&after, &gone_needles);
    assert!(!left.is_empty(), "the spend totals stay");
    for row in &left {
        assert!(
            row.starts_with("spend\t") || row.starts_with("erased_spend\t"),
            "only per-day spend totals may name the erased tenant: {row}"
        );
    }
    let kept_after: Vec<String> =
        mentioning(&after, &kept_needles).into_iter().filter(|r| !r.starts_with("outbox")).cloned().collect();
    assert_eq!(kept_after, kept_before, "every row of the other tenant is as it was");

    // The same source again is new work: the erasure forgot it.
    let server = serve(dir.path());
    let api = server.api();
    let reply = api.intake(GONE, "g1", "fn g1() {} // body of g1").await;
    assert_eq!(reply.status, 201, "{:#}", reply.body);
    assert_eq!(reply.body["created"], json!(true));
    assert_eq!(reply.body["extraction_id"], json!(gone[0]), "the same identity, a new extraction");
    crate::util::stop_and_verify(server);
}

#[tokio::test]
async fn the_cli_asks_for_yes_and_prints_the_counts() {
    let dir = temp_dir();
    let server = Server::start(dir.path());
    let api = server.api();
    api.create(GONE, "a", "fn a() {}").await;
    let env = [("COMMITPOINT_ADMIN", server.url.as_str())];
    let refused = cli_with_env(&["erase-tenant", GONE], &env);
    assert_eq!(refused.status.code(), Some(64), "no --yes: usage error");
    assert!(String::from_utf8_lossy(&refused.stderr).contains("--yes"));
    assert_eq!(api.list_all("").await.len(), 1, "nothing erased without --yes");
    let done = cli_with_env(&["erase-tenant", GONE, "--yes"], &env);
    assert_eq!(done.status.code(), Some(0), "{}", String::from_utf8_lossy(&done.stderr));
    let counts: Value = serde_json::from_str(&stdout(&done)).expect("the counts as JSON");
    assert_eq!(counts["extractions"], json!(1), "{counts:#}");
    assert!(api.list_all("").await.is_empty());
    let bad = cli_with_env(&["erase-tenant", "no/such", "--yes"], &env);
    assert_eq!(bad.status.code(), Some(1), "a refused erasure: {}", String::from_utf8_lossy(&bad.stderr));
    let db = server.db_path();
    crate::util::stop_and_verify(server);
    assert_verifies(&db);
}
