//! Evaluations under budgets (issue 43, item 1): trials reserve what they may cost, as
//! production batch members do, so they stop at the evaluation's `budget_micros` (its
//! first batch too) and at their tenant's budget, and a tiny evaluation budget neither
//! spends the tenant's money nor holds its production work.

use std::time::{Duration, Instant};

use commitpoint::simulator::{Faults, Simulator, SimulatorConfig};
use serde_json::{Value, json};

use crate::util::{Api, Server, stop_and_verify, temp_dir};

const TENANT: &str = "acme";
const MEMBERS: usize = 20;
const WAIT: Duration = Duration::from_secs(60);

async fn simulator() -> Simulator {
    let config = SimulatorConfig {
        api_key: Some("sk-eval".into()),
        complete_after: Duration::from_millis(100),
        faults: Faults::default(),
        ..SimulatorConfig::default()
    };
    Simulator::start("127.0.0.1:0".parse().expect("loopback address"), config).await.expect("start a simulator")
}

fn content(i: usize) -> String {
    format!("fn f{i}() -> u32 {{\n    let n = input{i}.parse::<u32>().unwrap();\n    // TODO handle {i}\n    n\n}}\n")
}

async fn wait_for(api: &Api, what: &str, path: &str, done: impl Fn(&Value) -> bool) -> Value {
    let deadline = Instant::now() + WAIT;
    loop {
        let reply = api.get(path).await;
        if reply.status == 200 && done(&reply.body) {
            return reply.body;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}: {:#}", reply.body);
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn charged(api: &Api) -> u64 {
    let costs = api.get(&format!("/v1/tenants/{TENANT}/costs?from=2000-01-01&to=2100-01-01")).await;
    assert_eq!(costs.status, 200, "{:#}", costs.body);
    costs.body["charged_micros"].as_u64().expect("charged")
}

#[tokio::test]
async fn trials_stop_at_the_evaluations_budget_and_at_the_tenants() {
    let prod = simulator().await;
    let cand = simulator().await;
    let dir = temp_dir();
    let config = dir.path().join("config.toml");
    // Production's model has no price row: its commits cost the tenant nothing, so all of
    // the tenant's $0.20 is there for the trials. The candidate's output is dear (a
    // trial's 64 output tokens may cost 32,000 µ$ at the batch price), so a few trials fill
    // the budget.
    std::fs::write(
        &config,
        format!(
            "[providers.prod]\nkind = \"openai\"\nbase_url = \"{}\"\nmodel = \"gpt-4o-mini\"\napi_key_env = \"EVAL_KEY\"\n\n\
             [providers.cand]\nkind = \"openai\"\nbase_url = \"{}\"\nmodel = \"gpt-4o-mini\"\napi_key_env = \"EVAL_KEY\"\n\
             max_completion_tokens = 64\n\n\
             [[prices]]\nprovider = \"cand\"\nmodel = \"gpt-4o-mini\"\ninput_per_mtok = 0.15\noutput_per_mtok = 1000.0\n\n\
             [routing]\ndefault = \"prod\"\n\n[budgets]\nperiod = \"month\"\n[budgets.tenants]\n{TENANT} = 0.2\n",
            prod.base_url(),
            cand.base_url()
        ),
    )
    .expect("write config");
    let args = ["--config", config.to_str().expect("utf-8"), "--batch-max-size", "100", "--batch-max-wait", "200ms"];
    let server = Server::start_with_env(
        dir.path(),
        &[&args[..], &["--poll-interval", "100ms"]].concat(),
        &[("EVAL_KEY", "sk-eval")],
    );
    let api = server.api();
    for i in 0..MEMBERS {
        api.create(TENANT, &format!("src/f{i}.rs"), &content(i)).await;
    }
    wait_for(&api, "production commits", "/v1/stats", |s| s["extractions"]["committed"] == json!(MEMBERS)).await;
    assert_eq!(charged(&api).await, 0, "production is unpriced");

    // An evaluation budget of one micro-dollar covers no trial: none is sent, nothing is
    // spent, and the evaluation says its budget is reached.
    let select = json!({"sample": MEMBERS, "seed": 1});
    let created = api
        .post(
            "/v1/evaluations",
            &json!({"name": "tiny", "schema": "code-review@1", "select": select, "candidates": ["cand"], "budget_micros": 1}),
        )
        .await;
    assert_eq!(created.status, 201, "{:#}", created.body);
    let tiny = wait_for(&api, "the tiny budget", "/v1/evaluations/tiny", |e| e["state"] == "budget_reached").await;
    assert_eq!(tiny["spent_micros"], json!(0), "{tiny:#}");
    assert_eq!(tiny["candidates"][0]["finished"], json!(0), "{tiny:#}");
    assert_eq!(cand.stats().batches_created, 0, "no trial batch reached the candidate");
    assert_eq!(charged(&api).await, 0);
    // The tenant's production work is not held by it.
    let fresh = api.create(TENANT, "src/new.rs", &content(999)).await;
    wait_for(&api, "a production commit", &format!("/v1/extractions/{fresh}"), |r| r["state"] == "committed").await;

    // Without an evaluation budget, the tenant's $0.20 bounds the trials: what they cost
    // never passes it, and the rest wait for the tenant's budget.
    let created = api
        .post(
            "/v1/evaluations",
            &json!({"name": "tenant", "schema": "code-review@1", "select": select, "candidates": ["cand"]}),
        )
        .await;
    assert_eq!(created.status, 201, "{:#}", created.body);
    let path = "/v1/evaluations/tenant";
    wait_for(&api, "the first trials", path, |e| e["candidates"][0]["finished"].as_u64() > Some(0)).await;
    // Let whatever still fits go out and come back.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let status = wait_for(&api, "nothing waiting", path, |e| e["candidates"][0]["waiting"] == json!(0)).await;
    let finished = status["candidates"][0]["finished"].as_u64().expect("finished");
    let spent = charged(&api).await;
    println!("{finished} trials spent {spent} µ$ of the tenant's 200,000");
    assert!(spent <= 200_000, "the tenant's budget is never passed: {spent} µ$ after {finished} trials");
    assert!(finished < MEMBERS as u64, "the rest wait for the tenant's budget: {status:#}");
    assert!(status["candidates"][0]["not_sent"].as_u64() > Some(0), "{status:#}");
    stop_and_verify(server);
}
