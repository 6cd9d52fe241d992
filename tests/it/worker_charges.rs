//! What an external worker may charge a tenant (issue 43, items 2 and 3): posted usage is
//! held to the pricing its claim declared, a cost it reports is bounded (by the declared
//! price, or `[limits] max_worker_charge`), every claim, a lease taken over included,
//! checks the tenant's budget, and an erasure clears the tenant's spend.

use std::path::Path;
use std::time::Duration;

use reqwest::Method;
use serde_json::{Value, json};

use crate::util::{Api, Server, id_of};

const TENANT: &str = "acme";

fn serve(dir: &Path, config: &str) -> Server {
    let path = dir.join("config.toml");
    std::fs::write(&path, config).expect("write config");
    Server::start_with(dir, &["--config", path.to_str().expect("utf-8")])
}

fn budget(dollars: &str) -> String {
    format!("[budgets]\nperiod = \"month\"\n[budgets.tenants]\n{TENANT} = {dollars}\n")
}

async fn budget_line(api: &Api) -> Value {
    let stats = api.get("/v1/stats").await;
    assert_eq!(stats.status, 200, "{:#}", stats.body);
    stats.body["budgets"]
        .as_array()
        .and_then(|b| b.iter().find(|l| l["tenant"] == json!(TENANT)).cloned())
        .unwrap_or_else(|| panic!("no budget line for {TENANT}: {:#}", stats.body))
}

async fn claim(api: &Api, limit: u32, lease_seconds: u64, priced_as: Option<Value>) -> Vec<Value> {
    let mut body = json!({"worker": "w", "limit": limit, "lease_seconds": lease_seconds});
    if let Some(priced) = priced_as {
        body["priced_as"] = priced;
    }
    let reply = api.post("/v1/claims", &body).await;
    assert_eq!(reply.status, 200, "{:#}", reply.body);
    reply.body["claims"].as_array().cloned().expect("claims")
}

async fn post(api: &Api, grant: &Value, usage: Value) -> crate::util::Reply {
    let body = json!({"lease_token": grant["lease_token"], "output": {"findings": []}, "usage": usage});
    api.post(&format!("/v1/extractions/{}/result", id_of(grant)), &body).await
}

async fn charged(api: &Api) -> u64 {
    let costs = api.get(&format!("/v1/tenants/{TENANT}/costs?from=2000-01-01&to=2100-01-01")).await;
    assert_eq!(costs.status, 200, "{:#}", costs.body);
    costs.body["charged_micros"].as_u64().expect("charged")
}

/// Item 2: a worker that claimed as a cheap model cannot post a dear model's usage, nor
/// more output than it declared, nor a cost above what the declared price allows; each is
/// refused `422 usage_refused` with nothing written, and the honest post then commits.
#[tokio::test]
async fn posted_usage_must_match_the_pricing_the_claim_declared() {
    let dir = crate::util::temp_dir();
    let prices = "[[prices]]\nprovider = \"workers\"\nmodel = \"cheap\"\ninput_per_mtok = 0.01\noutput_per_mtok = 0.01\n\
                  [[prices]]\nprovider = \"workers\"\nmodel = \"dear\"\ninput_per_mtok = 15.0\noutput_per_mtok = 75.0\n";
    let server = serve(dir.path(), &format!("{prices}{}", budget("0.01")));
    let api = server.api();
    api.create(TENANT, "a.rs", "fn a() {}").await;
    let cheap = json!({"provider": "workers", "model": "cheap", "max_output_tokens": 1000});
    let grants = claim(&api, 1, 300, Some(cheap)).await;
    assert_eq!(grants.len(), 1, "{grants:#?}");
    let grant = &grants[0];

    let dear = json!({"provider": "workers", "model": "dear", "input_tokens": 10_000_000, "output_tokens": 10_000_000});
    let refused = post(&api, grant, dear).await;
    refused.assert_error(422, "usage_refused");
    assert_eq!(api.record(&id_of(grant)).await["state"], json!("claimed"), "nothing was written");
    let other_provider = json!({"provider": "elsewhere", "model": "cheap", "input_tokens": 10, "output_tokens": 10});
    post(&api, grant, other_provider).await.assert_error(422, "usage_refused");
    let too_long = json!({"provider": "workers", "model": "cheap", "input_tokens": 10, "output_tokens": 5000});
    post(&api, grant, too_long).await.assert_error(422, "usage_refused");
    let dear_cost = json!({"provider": "workers", "model": "cheap", "input_tokens": 10, "output_tokens": 10, "cost_micros": 5_000_000});
    post(&api, grant, dear_cost).await.assert_error(422, "usage_refused");
    assert_eq!(charged(&api).await, 0, "a refused post charges nothing");

    let honest = json!({"provider": "workers", "model": "cheap", "input_tokens": 1000, "output_tokens": 900});
    let posted = post(&api, grant, honest).await;
    assert_eq!(posted.status, 200, "{:#}", posted.body);
    assert!(charged(&api).await < 100, "the cheap model's price");
    crate::util::stop_and_verify(server);
}

/// Item 2: work whose lease expired is handed out again only if its tenant's budget
/// allows, as pending work is: a held tenant's expired lease stays where it is.
#[tokio::test]
async fn an_expired_lease_is_claimed_again_only_within_the_budget() {
    let dir = crate::util::temp_dir();
    let server = serve(dir.path(), &budget("0.01"));
    let api = server.api();
    api.create(TENANT, "a.rs", "fn a() {}").await;
    api.create(TENANT, "b.rs", "fn b() {}").await;
    let grants = claim(&api, 2, 1, None).await;
    assert_eq!(grants.len(), 2, "{grants:#?}");
    // The second answer spends twice the budget: the tenant is held from now on.
    let spent =
        post(&api, &grants[1], json!({"model": "m", "input_tokens": 1, "output_tokens": 1, "cost_micros": 20_000}))
            .await;
    assert_eq!(spent.status, 200, "{:#}", spent.body);
    assert_eq!(budget_line(&api).await["held"], json!(true));
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert!(claim(&api, 5, 60, None).await.is_empty(), "the expired lease of a held tenant is not handed out");
    let priced = json!({"provider": "workers", "model": "m", "max_output_tokens": 10});
    let again =
        api.post("/v1/claims", &json!({"worker": "w", "limit": 5, "lease_seconds": 60, "priced_as": priced})).await;
    // No price row for it: a declared model must be priced (422), and nothing is handed out.
    again.assert_error(422, "invalid_input");
    assert_eq!(api.record(&id_of(&grants[0])).await["state"], json!("claimed"));
    crate::util::stop_and_verify(server);
}

/// Item 3: a cost a worker reports past `[limits] max_worker_charge` (2^63 micro-dollars
/// here) is refused, so spend never saturates; a tenant held by a real charge is free
/// again after its erasure, whose spend it clears; backup and verify agree throughout.
#[tokio::test]
async fn a_reported_cost_is_bounded_and_erasure_clears_the_spend() {
    let dir = crate::util::temp_dir();
    let server = serve(dir.path(), &format!("{}[limits]\nmax_worker_charge = 2.0\n", budget("1.0")));
    let api = server.api();
    api.create(TENANT, "a.rs", "fn a() {}").await;
    let grants = claim(&api, 1, 300, None).await;
    let huge =
        json!({"model": "m", "input_tokens": 1, "output_tokens": 1, "cost_micros": 9_223_372_036_854_775_808_u64});
    post(&api, &grants[0], huge.clone()).await.assert_error(422, "usage_refused");
    post(&api, &grants[0], huge).await.assert_error(422, "usage_refused");
    let over = json!({"model": "m", "input_tokens": 1, "output_tokens": 1, "cost_micros": 2_000_001});
    post(&api, &grants[0], over).await.assert_error(422, "usage_refused");
    assert_eq!(charged(&api).await, 0);
    let real = json!({"model": "m", "input_tokens": 1, "output_tokens": 1, "cost_micros": 1_500_000});
    let posted = post(&api, &grants[0], real).await;
    assert_eq!(posted.status, 200, "{:#}", posted.body);
    let line = budget_line(&api).await;
    assert_eq!((line["spent_micros"].clone(), line["held"].clone()), (json!(1_500_000), json!(true)), "{line:#}");
    api.create(TENANT, "b.rs", "fn b() {}").await;
    assert!(claim(&api, 1, 300, None).await.is_empty(), "held");

    let erased = api.send(Method::DELETE, &format!("/v1/tenants/{TENANT}"), None).await;
    assert_eq!(erased.status, 200, "{:#}", erased.body);
    let line = budget_line(&api).await;
    assert_eq!((line["spent_micros"].clone(), line["held"].clone()), (json!(0), json!(false)), "{line:#}");
    let costs = api.get(&format!("/v1/tenants/{TENANT}/costs?from=2000-01-01&to=2100-01-01")).await;
    assert_eq!(costs.body["erased_micros"], json!(1_500_000), "the invoice still adds up: {:#}", costs.body);
    api.create(TENANT, "c.rs", "fn c() {}").await;
    assert_eq!(claim(&api, 1, 300, None).await.len(), 1, "the erased tenant's budget starts over");
    if !crate::support::postgres::enabled() {
        let backup = dir.path().join("backup.redb");
        let out = crate::util::cli(&["backup", "--server", &server.url, "--out", backup.to_str().expect("utf-8")]);
        assert_eq!(out.status.code(), Some(0), "{}\n{}", crate::util::stdout(&out), crate::util::stderr(&out));
        crate::util::assert_verifies(&backup);
    }
    crate::util::stop_and_verify(server);
}
