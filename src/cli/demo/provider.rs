//! The demo's second act: commitpoint drives the batch API itself, against the built-in
//! SIMULATED OpenAI Batch provider with its faults switched on.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use anyhow::bail;
use serde_json::Value;

use super::api::Api;
use super::corpus::{SOURCES, Source};
use super::scenario::Summary;
use crate::app::server::Server;
use crate::simulator::Faults;

const COPIES_PER_SOURCE: usize = 3;
const SETTLE_TIMEOUT: Duration = Duration::from_secs(60);
/// The output budget the demo's requests ask for (`max_completion_tokens`)…
pub(super) const DEMO_MAX_COMPLETION_TOKENS: u32 = 1000;
/// …and how many tokens the simulated model's long answer needs: more than the budget,
/// less than the doubled budget of the one retry.
const LONG_ANSWER_TOKENS: u32 = 1500;

/// Step 8's sources, in intake order: the first gets a long answer, the second a refusal.
const LONG: Source = Source {
    tenant: "acme",
    source_id: "ledger#55",
    content: "fn settle(batch: &[Tx]) {\n    let total = sum(batch).unwrap();\n    // TODO: overflow\n    post(total).unwrap();\n}\n",
};
const DECLINED: Source = Source {
    tenant: "globex",
    source_id: "scraper#2",
    content: "def harvest(site):\n    password = 'admin'\n    return crawl(site, password)\n",
};

pub(super) async fn run(server: &Server, summary: &mut Summary) -> anyhow::Result<()> {
    let Some(simulator) = server.simulator() else {
        bail!("the demo's provider act needs the built-in simulator");
    };
    let api = Api { base: format!("http://{}", server.addr()), http: reqwest::Client::new() };
    println!("== 7. the built-in provider: commitpoint drives a SIMULATED OpenAI Batch API with faults on ==");
    println!("  faults: the first batch create is answered by a dropped connection; the next 2 calls get 429 +");
    println!("  Retry-After; batches expire half done; every 3rd result line is duplicated, every 2nd is garbage");
    simulator.set_faults(Faults {
        drop_after_create_next: 1,
        rate_limit_next: 2,
        retry_after_secs: 1,
        expire_batches: true,
        duplicate_line_every: 3,
        malformed_line_every: 2,
        ..Faults::default()
    });
    let mut requests = tokio::task::JoinSet::new();
    for source in SOURCES {
        for _ in 0..COPIES_PER_SOURCE {
            let api = api.clone();
            requests.spawn(async move { api.intake(source).await });
        }
    }
    let mut ids = BTreeSet::new();
    let mut created = 0;
    while let Some(answer) = requests.join_next().await {
        let (status, body) = answer??;
        created += usize::from(status == 201);
        ids.insert(body["extraction_id"].as_str().unwrap_or_default().to_string());
    }
    println!("  {} intakes → {created} extractions", SOURCES.len() * COPIES_PER_SOURCE);
    summary.check("duplicate intakes become one batch member each", created == SOURCES.len() && ids.len() == created);

    let started = Instant::now();
    wait_for(&api, started, |h| h["batches_closed"].as_u64().unwrap_or(0) >= 1).await?;
    println!("  the first batch expired half done; expiry is switched off from here on");
    simulator.set_faults(Faults { duplicate_line_every: 3, malformed_line_every: 2, ..Faults::default() });
    let states = settle(&api, &ids, started).await?;
    let health = provider_health(&api).await?;
    let stats = simulator.stats();
    println!("  settled in {:.1}s:", started.elapsed().as_secs_f64());
    println!(
        "    batches: {} formed, {} submitted, {} recovered by batch key after the dropped create, {} closed",
        health["batches_formed"], health["batches_submitted"], health["batches_recovered"], health["batches_closed"]
    );
    println!(
        "    provider answers: {} rate-limited calls waited out, {} result lines read ({} malformed skipped), {} members requeued",
        health["rate_limited"], health["lines_ingested"], health["malformed_lines"], health["members_requeued"]
    );
    println!(
        "    simulator saw: {} batches created, {} billed lines, max live batches per member {}",
        stats.batches_created, stats.lines_completed, stats.max_live_batches_per_custom_id
    );
    summary.check("every extraction is committed", states.iter().all(|s| s == "committed"));
    summary.check(
        "a dropped create was found by its batch key, not resubmitted",
        health["batches_recovered"].as_u64() >= Some(1),
    );
    summary.check("no member was ever in two live batches", stats.max_live_batches_per_custom_id == 1);
    summary.check("429s were waited out, not fatal", health["rate_limited"].as_u64() >= Some(1));
    summary.check(
        "garbage result lines were skipped and their members answered by a later batch",
        health["malformed_lines"].as_u64() >= Some(1),
    );
    cut_off_and_declined(&api, simulator, summary).await?;
    let stats = simulator.stats();
    let unreadable = provider_health(&api).await?["malformed_lines"].as_u64().unwrap_or(0);
    ledger(&api, stats.lines_completed, unreadable, summary).await
}

/// Step 8: answers that are paid for but can never be committed. The batch's first line
/// gets a long answer, cut off at the request's output budget (`finish_reason: "length"`)
/// with content that is a *valid* prefix — it would pass the schema; the second is declined
/// (`message.refusal`). Every later line of every batch gets the long answer too, so the
/// retry shows the larger budget, not luck, is what completes it.
async fn cut_off_and_declined(
    api: &Api,
    simulator: &crate::simulator::Simulator,
    summary: &mut Summary,
) -> anyhow::Result<()> {
    println!("\n== 8. answers paid for but never committed: a truncation and a refusal ==");
    println!(
        "  faults: every answer needs {LONG_ANSWER_TOKENS} output tokens while requests ask for max_completion_tokens = \
         {DEMO_MAX_COMPLETION_TOKENS}; every 2nd line of a batch is declined"
    );
    simulator.set_faults(Faults {
        truncate_every: 1,
        long_answer_tokens: LONG_ANSWER_TOKENS,
        refuse_every: 2,
        ..Faults::default()
    });
    let before = simulator.stats();
    let mut ids = Vec::new();
    for source in [&LONG, &DECLINED] {
        let (status, body) = api.intake(source).await?;
        if status != 201 {
            bail!("intake of {}: {status} {body}", source.source_id);
        }
        ids.push(body["extraction_id"].as_str().unwrap_or_default().to_string());
    }
    let started = Instant::now();
    settle(api, &ids.iter().cloned().collect(), started).await?;
    simulator.set_faults(Faults::default());
    let long = api.get(&format!("/v1/extractions/{}", ids[0])).await?;
    let declined = api.get(&format!("/v1/extractions/{}", ids[1])).await?;
    let stats = simulator.stats();
    let (truncations, refusals) =
        (stats.lines_truncated - before.lines_truncated, stats.lines_refused - before.lines_refused);
    println!(
        "  {}: cut off at {DEMO_MAX_COMPLETION_TOKENS} tokens (its cut-off content was valid JSON, not committed) → \
         retried once with output_budget {} → {} on attempt {} ({} findings)",
        LONG.source_id,
        long["output_budget"],
        long["state"].as_str().unwrap_or("?"),
        long["attempts"],
        api.get(&format!("/v1/extractions/{}/findings", ids[0])).await?["findings"].as_array().map_or(0, Vec::len),
    );
    println!(
        "  {}: declined by the model → {} `{}` (\"{}\"), not retried",
        DECLINED.source_id,
        declined["state"].as_str().unwrap_or("?"),
        declined["failure_class"].as_str().unwrap_or("?"),
        declined["failure_reason"].as_str().unwrap_or("?"),
    );
    let health = provider_health(api).await?;
    println!(
        "  provider counted {} truncated answer(s), {} retried with a larger budget, {} refusal(s); the simulator \
         billed {truncations} cut-off and {refusals} declined answer(s)",
        health["truncated"], health["budget_retries"], health["model_refusals"]
    );
    summary.check(
        "a truncated answer was never committed; its retry with a doubled budget was",
        long["state"] == "committed"
            && long["attempts"] == 2
            && long["output_budget"] == 2 * DEMO_MAX_COMPLETION_TOKENS
            && truncations == 1,
    );
    summary.check(
        "a refusal failed `refused` (not `validation`) and was not retried",
        declined["state"] == "failed"
            && declined["failure_class"] == "refused"
            && declined["attempts"] == 1
            && refusals == 1,
    );
    let charged = |costs: &Value| {
        costs["attempts"].as_array().map_or(0, |a| a.iter().filter(|e| e["kind"] == "unusable").count())
    };
    let long_costs = api.get(&format!("/v1/extractions/{}/costs", ids[0])).await?;
    let declined_costs = api.get(&format!("/v1/extractions/{}/costs", ids[1])).await?;
    summary.check(
        "both unusable answers were charged: they were paid for",
        charged(&long_costs) == 1 && charged(&declined_costs) == 1,
    );
    Ok(())
}

/// The cost ledger, per tenant, against what the simulator billed. A garbage result line
/// was billed by the provider but names no request we can read, so it cannot be charged
/// to a tenant: it is counted apart (the malformed-lines counter), not hidden.
async fn ledger(api: &Api, billed_lines: u64, unreadable: u64, summary: &mut Summary) -> anyhow::Result<()> {
    let tenants: BTreeSet<&str> = SOURCES.iter().map(|s| s.tenant).collect();
    println!("  cost ledger (simulated reviewer priced like gpt-4o-mini, batch discount):");
    let mut charged_attempts = 0;
    let mut replays = 0;
    for tenant in tenants {
        let costs = api.get(&format!("/v1/tenants/{tenant}/costs?from=2000-01-01&to=2100-01-01")).await?;
        let count = |kind: &str| costs[kind]["attempts"].as_u64().unwrap_or(0);
        charged_attempts += count("fresh") + count("failed_validation") + count("unusable");
        replays += count("replay");
        println!(
            "    {tenant}: {} fresh, {} replayed (not charged), {} failed validation, {} unusable (truncated or \
             refused); charged {} micro-dollars",
            count("fresh"),
            count("replay"),
            count("failed_validation"),
            count("unusable"),
            costs["charged_micros"]
        );
    }
    println!("    plus {unreadable} billed result lines that were garbage: paid, but attributable to no tenant");
    summary.check(
        "ledger charges + unreadable lines = lines the provider billed; replays counted, not charged",
        charged_attempts + unreadable == billed_lines && replays >= 1,
    );
    Ok(())
}

async fn provider_health(api: &Api) -> anyhow::Result<Value> {
    let health = api.get("/healthz").await?;
    Ok(health["providers"][0].clone())
}

async fn wait_for(api: &Api, started: Instant, done: impl Fn(&Value) -> bool) -> anyhow::Result<()> {
    while !done(&provider_health(api).await?) {
        if started.elapsed() > SETTLE_TIMEOUT {
            bail!("the provider act did not progress within {SETTLE_TIMEOUT:?}");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Ok(())
}

/// Waits until no extraction is still on its way, and returns their states.
async fn settle(api: &Api, ids: &BTreeSet<String>, started: Instant) -> anyhow::Result<Vec<String>> {
    loop {
        let mut states = Vec::with_capacity(ids.len());
        for id in ids {
            let record = api.get(&format!("/v1/extractions/{id}")).await?;
            states.push(record["state"].as_str().unwrap_or("?").to_string());
        }
        if states.iter().all(|s| s == "committed" || s == "failed") {
            return Ok(states);
        }
        if started.elapsed() > SETTLE_TIMEOUT {
            bail!("extractions still in flight after {SETTLE_TIMEOUT:?}: {states:?}");
        }
        tokio::time::sleep(Duration::from_millis(150)).await;
    }
}
