//! The cost ledger against the simulator's own count of billed lines: retries, replayed
//! (duplicated) lines and validation failures included; and budgets that hold work.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use commitpoint::simulator::Faults;
use serde_json::{Value, json};

use crate::provider::{CORPUS, Rig, TENANT, intake_corpus, settle};
use crate::util::Api;

/// gpt-4o-mini list prices, half through the batch API.
pub(crate) const PRICES: &str = r#"
[[prices]]
provider = "openai"
model = "gpt-4o-mini"
input_per_mtok = 0.15
output_per_mtok = 0.60
"#;

fn write_config(rig: &Rig, extra: &str) -> String {
    let path = rig.dir.path().join("config.toml");
    std::fs::write(&path, format!("{PRICES}\n{extra}")).expect("write config");
    path.display().to_string()
}

async fn costs(api: &Api, tenant: &str) -> Value {
    let reply = api.get(&format!("/v1/tenants/{tenant}/costs?from=2000-01-01&to=2100-01-01")).await;
    assert_eq!(reply.status, 200, "{:#}", reply.body);
    reply.body
}

#[tokio::test]
async fn the_ledger_adds_up_to_the_paid_attempts() {
    let steady = Faults { duplicate_line_every: 2, invalid_output_every: 2, ..Faults::default() };
    // The first batch also meets a 5xx and a 429, and expires half done.
    let first = Faults { server_error_next: 1, rate_limit_next: 1, expire_batches: true, ..steady.clone() };
    let rig = Rig::start(Duration::from_millis(300), first).await;
    let config = write_config(&rig, "");
    let server = rig.serve(&["--config", &config], None);
    let api = server.api();
    let ids = intake_corpus(&api).await;
    rig.wait_stats("an expired batch", |s| s.lines_failed > 0).await;
    rig.sim.set_faults(steady);
    let records = settle(&api, &ids).await;
    let failed = records.values().filter(|r| r["state"] == json!("failed")).count() as u64;
    // Each invalid answer was either asked again (counted in `reasks`) or failed its extraction.
    let reasked: u64 = records.values().filter_map(|r| r["reasks"].as_u64()).sum();
    assert!(failed + reasked > 0, "the fault plan makes some answers fail validation");
    assert!(records.values().any(|r| r["attempts"].as_u64() >= Some(2)), "the expired batch requeued members");
    let stats = rig.stats();

    let report = costs(&api, TENANT).await;
    let attempts = |kind: &str| report[kind]["attempts"].as_u64().expect("attempts");
    // Every billed line is exactly one charged entry; duplicates are counted, not charged.
    assert_eq!(attempts("fresh") + attempts("failed_validation"), stats.lines_completed, "{report:#}");
    assert_eq!(attempts("failed_validation"), failed + reasked, "{report:#}");
    assert!(attempts("replay") > 0, "duplicated result lines are counted as replays: {report:#}");
    assert_eq!(report["replay"]["cost_micros"], json!(0), "{report:#}");
    let charged = report["charged_micros"].as_u64().expect("charged");
    assert!(charged > 0, "{report:#}");

    // The tenant's totals are the sum of its entries.
    let mut sum = 0;
    let mut entries = 0;
    for id in &ids {
        let reply = api.get(&format!("/v1/extractions/{id}/costs")).await;
        assert_eq!(reply.status, 200, "{:#}", reply.body);
        for attempt in reply.body["attempts"].as_array().expect("attempts") {
            assert_eq!(attempt["provider"], json!("openai"));
            assert_eq!(attempt["cost_source"], json!("price_table"), "{attempt:#}");
            sum += attempt["cost_micros"].as_u64().expect("cost");
            entries += 1;
        }
    }
    assert_eq!(sum, charged);
    assert_eq!(entries, attempts("fresh") + attempts("failed_validation") + attempts("replay"));
    assert_eq!(ids.len(), CORPUS.len());

    // Grouping splits the same totals; another tenant has nothing.
    let grouped = api.get(&format!("/v1/tenants/{TENANT}/costs?from=2000-01-01&to=2100-01-01&group_by=model")).await;
    assert_eq!(grouped.body["groups"]["gpt-4o-mini"]["fresh"], report["fresh"], "{:#}", grouped.body);
    assert_eq!(costs(&api, "nobody").await["charged_micros"], json!(0));
    let bad = api.get(&format!("/v1/tenants/{TENANT}/costs?from=yesterday")).await;
    bad.assert_error(400, "invalid_query");

    // The CLI prints the same totals.
    let args = ["costs", "--tenant", TENANT, "--from", "2000-01-01", "--to", "2100-01-01", "--csv", "--server"];
    let out = crate::util::cli(&[&args[..], &[server.url.as_str()]].concat());
    assert!(out.status.success(), "{}", crate::util::stderr(&out));
    let csv = crate::util::stdout(&out);
    let fresh = format!(
        "\"total\",fresh,{},{},{},{},0",
        attempts("fresh"),
        report["fresh"]["input_tokens"],
        report["fresh"]["output_tokens"],
        report["fresh"]["cost_micros"]
    );
    assert!(csv.lines().any(|l| l == fresh), "{fresh} not in\n{csv}");
    crate::util::stop_and_verify(server);
}

#[tokio::test]
async fn a_tenant_over_budget_is_held_until_the_budget_is_raised() {
    let rig = Rig::start(Duration::from_millis(100), Faults::default()).await;
    let budget = |dollars: &str| format!("[budgets]\nperiod = \"day\"\n[budgets.tenants]\n{TENANT} = {dollars}\n");
    let roomy = write_config(&rig, &budget("100.0"));
    let server = rig.serve(&["--config", &roomy], None);
    let api = server.api();
    let first = api.create(TENANT, "first.rs", CORPUS[0].content).await;
    settle(&api, &BTreeSet::from([first])).await;
    assert!(costs(&api, TENANT).await["charged_micros"].as_u64().expect("charged") >= 1);
    drop(server);
    // The budget lowered below what was spent: the tenant is held.
    let tight = write_config(&rig, &budget("0.000001"));
    let mut server = rig.serve(&["--config", &tight], None);
    let api = server.api();

    let held = api.create(TENANT, "held.rs", CORPUS[1].content).await;
    let other = api.create("other-tenant", "free.rs", CORPUS[1].content).await;
    settle(&api, &BTreeSet::from([other])).await;
    let deadline = Instant::now() + Duration::from_secs(2);
    while Instant::now() < deadline {
        assert_eq!(api.record(&held).await["state"], json!("pending"), "held work must not be submitted");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // Operators see the hold: `ctl status` in text and JSON.
    let text = crate::util::cli(&["ctl", "status", "--server", &server.url]);
    assert!(text.status.success(), "{}", crate::util::stderr(&text));
    let text = crate::util::stdout(&text);
    assert!(text.contains(&format!("budget {TENANT}:")) && text.contains("REACHED"), "{text}");
    assert!(text.contains("outbox: 0 pending"), "{text}");
    // Without --admin the CLI finds the server through $COMMITPOINT_ADMIN, or through the
    // listen address of the config file $COMMITPOINT_CONFIG names.
    let via_env = crate::util::cli_with_env(&["ctl", "status"], &[("COMMITPOINT_ADMIN", &server.url)]);
    assert!(via_env.status.success(), "{}", crate::util::stderr(&via_env));
    let client_config = rig.dir.path().join("client.toml");
    let addr = server.url.trim_start_matches("http://");
    std::fs::write(&client_config, format!("[server]\nlisten = \"{addr}\"\n")).expect("write client config");
    let via_config = client_config.display().to_string();
    let via_config = crate::util::cli_with_env(&["ctl", "status"], &[("COMMITPOINT_CONFIG", &via_config)]);
    assert!(via_config.status.success(), "{}", crate::util::stderr(&via_config));
    let json = crate::util::cli(&["ctl", "status", "--json", "--admin", &server.url]);
    let status: Value = serde_json::from_str(&crate::util::stdout(&json)).expect("status JSON");
    assert_eq!(status["budgets"][0]["tenant"], json!(TENANT), "{status:#}");
    assert_eq!(status["budgets"][0]["held"], json!(true), "{status:#}");
    assert_eq!(status["extractions"]["pending"], json!(1), "{status:#}");
    server.kill9();
    drop(server);

    let raised = write_config(&rig, &format!("[budgets]\nperiod = \"day\"\n[budgets.tenants]\n{TENANT} = 100.0\n"));
    let server = rig.serve(&["--config", &raised], None);
    let api = server.api();
    let records = settle(&api, &BTreeSet::from([held.clone()])).await;
    assert_eq!(records[&held]["state"], json!("committed"), "nothing was lost while held");
    assert_eq!(api.list_all("").await.len(), 3);
    crate::util::stop_and_verify(server);
}

#[tokio::test]
async fn ctl_reload_applies_a_raised_budget_without_a_restart() {
    let rig = Rig::start(Duration::from_millis(100), Faults::default()).await;
    let budget = |dollars: &str| format!("[budgets]\nperiod = \"day\"\n[budgets.tenants]\n{TENANT} = {dollars}\n");
    // A micro-dollar covers no member's reservation: the work waits before any is spent.
    let config = write_config(&rig, &budget("0.000001"));
    let server = rig.serve(&["--config", &config], None);
    let api = server.api();
    let held = api.create(TENANT, "held.rs", CORPUS[1].content).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(api.record(&held).await["state"], json!("pending"));
    let stats = api.get("/v1/stats").await.body;
    let line = &stats["budgets"][0];
    assert_eq!((line["spent_micros"].clone(), line["held"].clone()), (json!(0), json!(false)), "{stats:#}");
    assert!(line["waiting"]["needed_micros"].as_u64() > Some(1), "waiting, with the reason: {stats:#}");

    let data_dir = rig.dir.path().display().to_string();
    let pid = server.pid().to_string();
    // A broken file is refused (78) and changes nothing.
    std::fs::write(&config, "[budgets]\nperiod = \"fortnight\"\n").expect("write config");
    let refused = crate::util::cli(&["ctl", "reload", "--pid", &pid, "--config", &config, "--data-dir", &data_dir]);
    assert_eq!(refused.status.code(), Some(78), "{}", crate::util::stderr(&refused));
    write_config(&rig, &budget("100.0"));
    let reloaded = crate::util::cli(&["ctl", "reload", "--pid", &pid, "--config", &config, "--data-dir", &data_dir]);
    assert!(reloaded.status.success(), "{}", crate::util::stderr(&reloaded));
    let records = settle(&api, &BTreeSet::from([held.clone()])).await;
    assert_eq!(records[&held]["state"], json!("committed"));
    crate::util::stop_and_verify(server);
}

/// A worker that resends the same answer (its first reply was lost, or it was refused)
/// reports the same provider request id: that call is charged once, the resends are
/// replays. Here an invalid answer is posted twice: failed validation, then a refusal.
#[tokio::test]
async fn one_provider_request_is_charged_once_however_often_it_is_posted() {
    let dir = crate::util::temp_dir();
    let server = crate::util::Server::start(dir.path());
    let api = server.api();
    let id = api.create(TENANT, "twice.rs", "fn main() {}").await;
    let (_, token) = api.claim_one("w1", 60).await;
    let body = json!({
        "lease_token": token,
        "output": {"findings": "not an array"},
        "usage": {"model": "m", "input_tokens": 1000, "output_tokens": 10, "cost_micros": 2000, "request_id": "req-1"},
    });
    let first = api.post(&format!("/v1/extractions/{id}/result"), &body).await;
    assert_eq!(first.status, 422, "{:#}", first.body);
    let again = api.post(&format!("/v1/extractions/{id}/result"), &body).await;
    assert_eq!(again.status, 409, "{:#}", again.body);
    let costs = api.get(&format!("/v1/extractions/{id}/costs")).await;
    assert_eq!(costs.body["charged_micros"], json!(2000), "{:#}", costs.body);
    let kinds: Vec<&str> =
        costs.body["attempts"].as_array().expect("attempts").iter().filter_map(|a| a["kind"].as_str()).collect();
    assert_eq!(kinds, ["failed_validation", "replay"]);
    crate::util::stop_and_verify(server);
}

/// A model with no price row (issue 27, items 5 and 6): `config check` names it, the log
/// warns once for it however many calls it makes, and every paid attempt, unusable ones
/// included, is counted as unpriced by the API, the CLI's text and CSV.
#[tokio::test]
async fn unpriced_calls_are_named_before_the_first_call_warned_once_and_counted() {
    let faults = Faults { refuse_every: 3, ..Faults::default() };
    let rig = Rig::start(Duration::from_millis(100), faults).await;
    // A price for another model only: gpt-4o-mini, the one this provider uses, has none.
    let path = rig.dir.path().join("config.toml");
    std::fs::write(&path, PRICES.replace("gpt-4o-mini", "gpt-4o-large")).expect("write config");
    let config = path.display().to_string();

    let check = crate::util::cli_with_env(
        &["config", "check", "--config", &config, "--provider", "openai", "--provider-key-env", "SIM_KEY"],
        &[("SIM_KEY", "sk-sim")],
    );
    assert!(check.status.success(), "{}", crate::util::stderr(&check));
    let warning = "provider \"openai\" model \"gpt-4o-mini\" has no [[prices]] row";
    assert!(crate::util::stderr(&check).contains(&format!("warning: {warning}")), "{}", crate::util::stderr(&check));
    assert!(crate::util::stdout(&check).contains(&format!("# unpriced: {warning}")), "{}", crate::util::stdout(&check));

    let server = rig.serve(&["--config", &config], None);
    let api = server.api();
    let ids = intake_corpus(&api).await;
    let records = settle(&api, &ids).await;
    assert!(records.values().any(|r| r["state"] == json!("failed")), "every third answer is refused");

    let report = costs(&api, TENANT).await;
    let bucket = |kind: &str, field: &str| report[kind][field].as_u64().expect("a count");
    let paid = bucket("fresh", "attempts") + bucket("failed_validation", "attempts") + bucket("unusable", "attempts");
    assert!(bucket("unusable", "attempts") > 0, "refused answers are paid: {report:#}");
    for kind in ["fresh", "failed_validation", "unusable"] {
        assert_eq!(bucket(kind, "unpriced_attempts"), bucket(kind, "attempts"), "{kind}: {report:#}");
    }
    assert_eq!(report["unpriced_attempts"].as_u64(), Some(paid), "{report:#}");
    assert_eq!(report["charged_micros"], json!(0), "{report:#}");

    let args = ["costs", "--tenant", TENANT, "--from", "2000-01-01", "--to", "2100-01-01", "--server", &server.url];
    let text = crate::util::stdout(&crate::util::cli(&args));
    assert!(text.contains(&format!("unpriced attempts: {paid} (booked at $0")), "{text}");
    let csv = crate::util::stdout(&crate::util::cli(&[&args[..], &["--csv"]].concat()));
    let unusable = format!(
        "\"total\",unusable,{},{},{},0,{}",
        bucket("unusable", "attempts"),
        bucket("unusable", "input_tokens"),
        bucket("unusable", "output_tokens"),
        bucket("unusable", "attempts")
    );
    assert!(csv.lines().any(|l| l == unusable), "{unusable} not in\n{csv}");

    let (status, log) = server.terminate();
    assert!(status.success(), "{log}");
    assert!(log.contains(warning), "serve names the gap at start:\n{log}");
    let per_call = log.lines().filter(|l| l.contains("a paid call has no [[prices]] row")).count();
    assert_eq!(per_call, 1, "one warning for the model, not one per call ({paid} calls):\n{log}");
    crate::util::assert_verifies(&rig.db());
}

/// Estimates before spending (issue 27, item 4): after one run of the corpus (the tenant's
/// history), the estimate for 60 more sources is checked against what the simulator then
/// bills them: input tokens exactly (the simulator counts 4 bytes a token, as the estimator
/// documents), cost within 15 %. `submit --max-cost` below the estimate sends nothing.
#[tokio::test]
async fn an_estimate_is_within_15_percent_of_the_bill_and_max_cost_refuses_above_it() {
    use commitpoint::domain::identity::{ExtractionId, SourceHash};
    let rig = Rig::start(Duration::from_millis(100), Faults::default()).await;
    let config = write_config(&rig, &format!("[budgets]\nperiod = \"month\"\n[budgets.tenants]\n{TENANT} = 5.0\n"));
    let server = rig.serve(&["--config", &config], None);
    let api = server.api();
    settle(&api, &intake_corpus(&api).await).await;

    let dir = rig.dir.path().join("second");
    std::fs::create_dir_all(&dir).expect("mkdir");
    let mut files = Vec::new();
    for i in 0..60 {
        let source = &CORPUS[i % CORPUS.len()];
        // Sources like the history's (the output estimate is the tenant's mean answer):
        // the corpus again, each under a header of its own.
        let content = format!("// revision {i} of {}\n{}", source.id, source.content);
        let name = format!("f{i:02}.rs");
        std::fs::write(dir.join(&name), &content).expect("write source");
        files.push((name, content));
    }
    let items: Vec<Value> = files.iter().map(|(n, c)| json!({"source_id": n, "bytes": c.len()})).collect();
    let asked = api.post("/v1/estimates", &json!({"tenant": TENANT, "schema": "code-review@1", "items": items})).await;
    assert_eq!(asked.status, 200, "{:#}", asked.body);
    let estimate = asked.body["estimates"][0].clone();
    assert_eq!(estimate["provider"], json!("openai"), "{:#}", asked.body);
    assert_eq!(estimate["output_basis"], json!("history"), "the corpus run is the tenant's history");
    assert_eq!(estimate["covered_by_budget"], json!(true));
    let estimated_cost = estimate["cost_micros"].as_u64().expect("priced");
    let both = api.post("/v1/estimates", &json!({"tenant": TENANT, "schema": "code-review@1", "count": 1})).await;
    both.assert_error(422, "invalid_input");

    let text =
        crate::util::cli(&["estimate", "--tenant", TENANT, "--server", &server.url, dir.to_str().expect("path")]);
    assert!(text.status.success(), "{}", crate::util::stderr(&text));
    let table = crate::util::stdout(&text);
    let row = table.lines().find(|l| l.starts_with("openai")).unwrap_or_else(|| panic!("{table}"));
    assert!(row.contains("history") && row.contains("covers"), "{table}");

    let before = api.get("/v1/stats").await.body["total"].clone();
    let submit = |max: &str| {
        crate::util::cli(&[
            "submit",
            "--tenant",
            TENANT,
            "--max-cost",
            max,
            "--server",
            &server.url,
            dir.to_str().expect("path"),
        ])
    };
    let refused = submit("0.000010");
    assert_eq!(refused.status.code(), Some(1), "{}", crate::util::stderr(&refused));
    assert!(crate::util::stderr(&refused).contains("refusing to submit: the estimate at openai is"));
    assert_eq!(api.get("/v1/stats").await.body["total"], before, "nothing was sent");
    let sent = submit("5");
    assert!(sent.status.success(), "{}", crate::util::stderr(&sent));

    let ids: BTreeSet<String> = files
        .iter()
        .map(|(name, content)| {
            let hash = SourceHash::compute(content.as_bytes(), "code-review@1");
            ExtractionId::compute(TENANT, name, &hash, "code-review@1").to_hex()
        })
        .collect();
    let records = settle(&api, &ids).await;
    assert!(records.values().all(|r| r["state"] == json!("committed")), "{records:#?}");
    let (mut input, mut cost) = (0, 0);
    for id in &ids {
        let reply = api.get(&format!("/v1/extractions/{id}/costs")).await;
        for attempt in reply.body["attempts"].as_array().expect("attempts") {
            input += attempt["input_tokens"].as_u64().expect("tokens");
            cost += attempt["cost_micros"].as_u64().expect("cost");
        }
    }
    assert_eq!(estimate["input_tokens"].as_u64(), Some(input), "the simulator bills input as the estimator counts it");
    let error = (estimated_cost as f64 - cost as f64).abs() / cost as f64;
    println!("estimate {estimated_cost} µ$ against a bill of {cost} µ$: {:.1} % off", error * 100.0);
    assert!(error <= 0.15, "estimate {estimated_cost} against {cost} ({:.1} %)", error * 100.0);
    crate::util::stop_and_verify(server);
}
