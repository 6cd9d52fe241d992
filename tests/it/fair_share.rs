//! Tenants treated fairly on the real binary with the simulated provider: a late tenant
//! is not queued behind another's backlog, and budgets hold money before it is spent
//! (batch members are reserved at their estimates, so spend never passes the budget).

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use commitpoint::simulator::Faults;
use reqwest::Method;
use serde_json::{Value, json};

use crate::provider::{CORPUS, Rig, TENANT, settle};
use crate::util::Api;

/// Answers capped at 300 tokens, which is what a member is reserved for, at gpt-4o-mini's
/// prices (`money::PRICES`).
fn provider_and_prices() -> String {
    format!("[provider]\nmax_completion_tokens = 300\n{}", crate::money::PRICES)
}

fn source(i: usize) -> (String, String) {
    let s = &CORPUS[i % CORPUS.len()];
    (format!("r{i:03}-{}", s.id), format!("// revision {i}\n{}", s.content))
}

async fn set_paused(api: &Api, paused: bool) {
    let verb = if paused { "pause" } else { "resume" };
    let reply = api.send(Method::POST, &format!("/v1/admin/providers/openai/{verb}"), None).await;
    assert_eq!(reply.status, 200, "{verb}: {:#}", reply.body);
}

#[tokio::test]
async fn a_late_tenant_is_served_before_a_backlog_ahead_of_it_drains() {
    let rig = Rig::start(Duration::from_millis(100), Faults::default()).await;
    // Batches of 10; the backlog is 30 batches deep when the late tenant's one source
    // arrives (the provider is paused meanwhile, so the backlog is all still waiting).
    let server = rig.serve(&["--batch-max-size", "10"], None);
    let api = server.api();
    set_paused(&api, true).await;
    let mut backlog = BTreeSet::new();
    for i in 0..300 {
        let (name, content) = source(i);
        backlog.insert(api.create("backlog", &name, &content).await);
    }
    let late = api.create("late", "one.rs", CORPUS[0].content).await;
    set_paused(&api, false).await;
    let mut all = backlog.clone();
    all.insert(late.clone());
    let records = settle(&api, &all).await;
    // Oldest first would put it in the 31st batch; the rotation puts it in the second.
    let late_at = records[&late]["committed_at"].as_str().expect("committed_at").to_string();
    let before = backlog
        .iter()
        .filter(|id| records[*id]["committed_at"].as_str().is_some_and(|at| at < late_at.as_str()))
        .count();
    assert!(before < 100, "{before} of the backlog committed before the late tenant's source");
    crate::util::stop_and_verify(server);
}

async fn budget_line(api: &Api) -> Value {
    let stats = api.get("/v1/stats").await;
    assert_eq!(stats.status, 200, "{:#}", stats.body);
    stats.body["budgets"]
        .as_array()
        .and_then(|b| b.iter().find(|l| l["tenant"] == json!(TENANT)).cloned())
        .unwrap_or_else(|| panic!("no budget line for {TENANT}: {:#}", stats.body))
}

#[tokio::test]
async fn spend_never_passes_a_budget_and_the_work_it_cannot_cover_waits_with_the_reason() {
    let rig = Rig::start(Duration::from_millis(100), Faults::default()).await;
    let config = rig.dir.path().join("config.toml");
    std::fs::write(&config, provider_and_prices()).expect("write config");
    let config = config.display().to_string();
    let sources: Vec<(String, String)> = (0..40).map(source).collect();

    // What one member is reserved at: the estimate with the output budget as its output.
    let server = rig.serve(&["--config", &config], None);
    let (name, content) = &sources[0];
    let one =
        json!({"tenant": TENANT, "schema": "code-review@1", "items": [{"source_id": name, "bytes": content.len()}]});
    let asked = server.api().post("/v1/estimates", &one).await;
    assert_eq!(asked.status, 200, "{:#}", asked.body);
    assert_eq!(asked.body["estimates"][0]["output_basis"], json!("budget"), "{:#}", asked.body);
    let reserve = asked.body["estimates"][0]["cost_micros"].as_u64().expect("priced");
    crate::util::stop_and_verify(server);

    // A budget for five and a half reservations. A reservation is what an answer costs at
    // most (its output at the budget); the simulator's answers cost about a quarter of
    // that, so forty answers cost more than this budget.
    let budget = reserve * 5 + reserve / 2;
    let dollars = format!("{:.6}", budget as f64 / 1e6);
    std::fs::write(
        &config,
        format!("{}\n[budgets]\nperiod = \"month\"\n[budgets.tenants]\n{TENANT} = {dollars}\n", provider_and_prices()),
    )
    .expect("write config");
    let budget = (dollars.parse::<f64>().expect("dollars") * 1e6).round() as u64;
    let server = rig.serve(&["--config", &config], None);
    let api = server.api();
    let mut ids = BTreeSet::new();
    for (name, content) in &sources {
        ids.insert(api.create(TENANT, name, content).await);
    }

    // Until nothing is with the provider any more: spend and reservations never pass the
    // budget, and what is left waits, pending, with the reason.
    let deadline = Instant::now() + Duration::from_secs(60);
    let (mut peak_reserved, mut quiet_since) = (0, None::<Instant>);
    let line = loop {
        let line = budget_line(&api).await;
        let spent = line["spent_micros"].as_u64().expect("spent");
        let reserved = line["reserved_micros"].as_u64().expect("reserved");
        assert!(spent + reserved <= budget, "spent {spent} + reserved {reserved} passed the budget {budget}: {line:#}");
        peak_reserved = peak_reserved.max(reserved);
        let stats = api.get("/v1/stats").await.body;
        let in_flight =
            ["submitted", "ready"].iter().map(|s| stats["extractions"][s].as_u64().unwrap_or(0)).sum::<u64>();
        if in_flight == 0 && !line["waiting"].is_null() {
            match quiet_since {
                Some(since) if since.elapsed() > Duration::from_secs(1) => break line,
                Some(_) => {}
                None => quiet_since = Some(Instant::now()),
            }
        } else {
            quiet_since = None;
        }
        assert!(Instant::now() < deadline, "never settled: {line:#}\n{stats:#}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert!(peak_reserved > 0, "batches reserved their members");
    let spent = line["spent_micros"].as_u64().expect("spent");
    assert!(spent <= budget, "spent {spent} of {budget}");
    let waiting = &line["waiting"];
    let (needed, left) =
        (waiting["needed_micros"].as_u64().expect("needed"), waiting["left_micros"].as_u64().expect("left"));
    assert!(needed > left, "waiting only when the next estimate does not fit: {line:#}");
    assert_eq!(left, budget - spent, "nothing is reserved once the provider has nothing: {line:#}");
    assert_eq!(line["held"], json!(false), "not spent out: waiting on reservations' room");
    let status = crate::util::cli(&["ctl", "status", "--server", &server.url]);
    let status = crate::util::stdout(&status);
    assert!(
        status.contains(&format!("budget {TENANT}:")) && status.contains("waiting: the next source needs"),
        "{status}"
    );
    let states: Vec<Value> =
        api.list_all(&format!("tenant={TENANT}&")).await.into_iter().map(|r| r["state"].clone()).collect();
    let committed = states.iter().filter(|s| **s == json!("committed")).count();
    let pending = states.iter().filter(|s| **s == json!("pending")).count();
    assert!(committed > 0 && pending > 0 && committed + pending == 40, "{states:?}");

    // A raised budget lets the rest go; nothing was lost while it waited.
    std::fs::write(
        &config,
        format!("{}\n[budgets]\nperiod = \"month\"\n[budgets.tenants]\n{TENANT} = 100.0\n", provider_and_prices()),
    )
    .expect("write config");
    let data_dir = rig.dir.path().display().to_string();
    let pid = server.pid().to_string();
    let reloaded = crate::util::cli(&["ctl", "reload", "--pid", &pid, "--config", &config, "--data-dir", &data_dir]);
    assert!(reloaded.status.success(), "{}", crate::util::stderr(&reloaded));
    let records = settle(&api, &ids).await;
    assert!(records.values().all(|r| r["state"] == json!("committed")), "{records:#?}");
    assert_eq!(budget_line(&api).await["reserved_micros"], json!(0));
    crate::util::stop_and_verify(server);
}

/// An external worker that declares its model has each source it claims reserved like a
/// batch member: claims stop where the budget's room ends, and a charged answer frees what
/// it did not use.
#[tokio::test]
async fn a_worker_that_declares_its_model_claims_within_the_budget() {
    let dir = crate::util::temp_dir();
    let config = dir.path().join("config.toml");
    // $10 per million output tokens: a claim of at most 1,000 output tokens is reserved at
    // about 10,000 µ$ (plus a few µ$ of input); $0.025 is room for two.
    std::fs::write(
        &config,
        format!(
            "[[prices]]\nprovider = \"workers\"\nmodel = \"m1\"\ninput_per_mtok = 1.0\noutput_per_mtok = 10.0\n\
             [budgets]\nperiod = \"month\"\n[budgets.tenants]\n{TENANT} = 0.025\n"
        ),
    )
    .expect("write config");
    let server = crate::util::Server::start_with(dir.path(), &["--config", config.to_str().expect("utf-8")]);
    let api = server.api();
    for i in 0..5 {
        let (name, content) = source(i);
        api.create(TENANT, &name, &content).await;
    }
    let priced = json!({"provider": "workers", "model": "m1", "max_output_tokens": 1000});
    let claim = |priced: Value| {
        let api = api.clone();
        async move {
            let body = json!({"worker": "w", "limit": 5, "lease_seconds": 300, "priced_as": priced});
            let reply = api.post("/v1/claims", &body).await;
            assert_eq!(reply.status, 200, "{:#}", reply.body);
            reply.body["claims"].as_array().cloned().expect("claims")
        }
    };
    let first = claim(priced.clone()).await;
    assert_eq!(first.len(), 2, "room for two reservations: {first:#?}");
    let line = budget_line(&api).await;
    assert_eq!(line["reserved_members"], json!(2), "{line:#}");
    assert!(line["waiting"]["needed_micros"].as_u64() > line["waiting"]["left_micros"].as_u64(), "{line:#}");
    assert!(claim(priced.clone()).await.is_empty(), "nothing more fits");

    // One answer, charged about 1,000 µ$ of output: what it did not use is free again.
    let (id, token) = (crate::util::id_of(&first[0]), first[0]["lease_token"].as_str().expect("token").to_string());
    let usage = json!({"model": "m1", "provider": "workers", "input_tokens": 200, "output_tokens": 100});
    let body = json!({"lease_token": token, "output": {"findings": []}, "usage": usage});
    let posted = api.post(&format!("/v1/extractions/{id}/result"), &body).await;
    assert_eq!(posted.status, 200, "{:#}", posted.body);
    let line = budget_line(&api).await;
    assert_eq!((line["reserved_members"].clone(), line["spent_micros"].clone()), (json!(1), json!(1200)), "{line:#}");
    assert_eq!(claim(priced).await.len(), 1, "25,000 - 1,200 spent - one reservation leaves room for one");

    // A model no price row prices cannot be reserved: the claim is refused, not unbounded.
    let unknown = json!({"worker": "w", "limit": 1, "lease_seconds": 300,
        "priced_as": {"provider": "workers", "model": "m2", "max_output_tokens": 1000}});
    api.post("/v1/claims", &unknown).await.assert_error(422, "invalid_input");
    crate::util::stop_and_verify(server);
}

/// Issue 43, item 8: `priced_as` (and the charge after it) took any model that merely
/// starts with a priced one: with a row for `o1`, a worker declaring `o1-pro` (ten times
/// the price) was reserved at `o1`'s. Only a dated snapshot of a priced model
/// (`o1-2024-12-17`) still takes that model's row.
#[tokio::test]
async fn priced_as_takes_a_dated_snapshot_of_a_priced_model_but_no_other_model_by_prefix() {
    let dir = crate::util::temp_dir();
    let config = dir.path().join("config.toml");
    std::fs::write(
        &config,
        "[[prices]]\nprovider = \"workers\"\nmodel = \"o1\"\ninput_per_mtok = 15.0\noutput_per_mtok = 60.0\n",
    )
    .expect("write config");
    let server = crate::util::Server::start_with(dir.path(), &["--config", config.to_str().expect("utf-8")]);
    let api = server.api();
    let (name, content) = source(0);
    api.create(TENANT, &name, &content).await;
    let claim = |model: &str| {
        json!({"worker": "w", "limit": 1, "lease_seconds": 300,
            "priced_as": {"provider": "workers", "model": model, "max_output_tokens": 1000}})
    };
    for other in ["o1-pro", "o1-mini", "o1x", "o1-2024-12-17-pro", "o1-preview-2024-09-12"] {
        let reply = api.post("/v1/claims", &claim(other)).await;
        reply.assert_error(422, "invalid_input");
        assert_eq!(reply.body["error"]["details"]["field"], json!("priced_as"), "{other}: {:#}", reply.body);
    }
    let reply = api.post("/v1/claims", &claim("o1-2024-12-17")).await;
    assert_eq!(reply.status, 200, "{:#}", reply.body);
    let grant = &reply.body["claims"][0];
    let (id, token) = (crate::util::id_of(grant), grant["lease_token"].as_str().expect("token").to_string());
    // The charge follows the same rule: 1,000 in and 100 out of the snapshot at o1's price.
    let usage = json!({"model": "o1-2024-12-17", "provider": "workers", "input_tokens": 1000, "output_tokens": 100});
    let body = json!({"lease_token": token, "output": {"findings": []}, "usage": usage});
    let posted = api.post(&format!("/v1/extractions/{id}/result"), &body).await;
    assert_eq!(posted.status, 200, "{:#}", posted.body);
    let costs = api.get(&format!("/v1/extractions/{id}/costs")).await;
    assert_eq!(costs.body["charged_micros"], json!(21_000), "{:#}", costs.body);
    crate::util::stop_and_verify(server);
}
