//! Evaluations (issue 26, docs/EVALUATIONS.md) on the real binary: a frozen set of 200
//! committed extractions sent to two simulated candidates, one answering well and one
//! told to cut answers off, send prose instead of JSON and read sources differently; the
//! report's numbers against what the simulators were told; a SIGKILL mid-evaluation that
//! neither resends a trial nor loses an answer; production untouched; then 50 pending
//! extractions promoted from a candidate's trials, once, without a second charge.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use commitpoint::simulator::{Faults, Simulator, SimulatorConfig, Stats};
use reqwest::Method;
use serde_json::{Value, json};

use crate::util::{Api, Server, stop_and_verify, temp_dir};

const TENANT: &str = "acme";
const COMMITTED: usize = 200;
const PENDING: usize = 50;
/// Members per trial batch: the faulty candidate's knobs count positions within a batch.
const BATCH: usize = 100;
const WAIT: Duration = Duration::from_secs(90);
const TRUNCATE_EVERY: usize = 7;
const NOT_JSON_EVERY: usize = 11;
const DISAGREE_EVERY: usize = 5;

async fn simulator(complete_after: Duration, faults: Faults) -> Simulator {
    let config =
        SimulatorConfig { api_key: Some("sk-eval".into()), complete_after, faults, ..SimulatorConfig::default() };
    Simulator::start("127.0.0.1:0".parse().expect("loopback address"), config).await.expect("start a simulator")
}

/// Two findings each (no-unwrap on line 2, todo-left on line 3), so a disagreeing answer
/// shares exactly one of them.
fn content(i: usize) -> String {
    format!("fn f{i}() -> u32 {{\n    let n = input{i}.parse::<u32>().unwrap();\n    // TODO handle {i}\n    n\n}}\n")
}

fn provider(name: &str, sim: &Simulator, budget: Option<u32>) -> String {
    let budget = budget.map(|b| format!("max_completion_tokens = {b}\n")).unwrap_or_default();
    format!(
        "[providers.{name}]\nkind = \"openai\"\nbase_url = \"{}\"\nmodel = \"gpt-4o-mini\"\napi_key_env = \"EVAL_KEY\"\n{budget}\n\
         [[prices]]\nprovider = \"{name}\"\nmodel = \"gpt-4o-mini\"\ninput_per_mtok = 0.15\noutput_per_mtok = 0.60\n\n",
        sim.base_url()
    )
}

/// `failpoint`: a crash point the process dies at (SIGKILL) when it reaches it.
fn serve(dir: &std::path::Path, config: &str, failpoint: Option<&str>) -> Server {
    let args = ["--config", config, "--batch-max-size", "100", "--batch-max-wait", "200ms", "--poll-interval", "100ms"];
    let mut env = vec![("EVAL_KEY", "sk-eval"), ("SINK_SECRET", "whsec_dGVzdHNlY3JldHRlc3RzZWNyZXQ=")];
    if let Some(point) = failpoint {
        env.push(("COMMITPOINT_FAILPOINTS", point));
    }
    Server::start_with_env(dir, &args, &env)
}

/// Waits for a server armed with a crash point to die at it.
fn dies_at(mut server: Server, point: &str) {
    let (status, log) = server.wait_exit(WAIT).unwrap_or_else(|| panic!("the server never reached {point}"));
    assert!(!status.success() && log.contains(point), "{status:?}: {log}");
}

async fn wait_for(api: &Api, what: &str, done: impl Fn(&Value) -> bool, path: &str) -> Value {
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

fn state_counts(stats: &Value) -> BTreeMap<String, u64> {
    stats["extractions"]
        .as_object()
        .map(|m| m.iter().map(|(k, v)| (k.clone(), v.as_u64().unwrap_or(0))).collect())
        .unwrap_or_default()
}

async fn outbox_events(api: &Api) -> usize {
    let reply = api.get("/v1/outbox?limit=1000").await;
    assert_eq!(reply.status, 200, "{:#}", reply.body);
    reply.body["events"].as_array().map_or(0, Vec::len)
}

async fn costs(api: &Api) -> Value {
    let reply = api.get(&format!("/v1/tenants/{TENANT}/costs?from=2000-01-01&to=2100-01-01")).await;
    assert_eq!(reply.status, 200, "{:#}", reply.body);
    reply.body
}

fn submitted_once(stats: &Stats, expected: usize, who: &str) {
    assert_eq!(stats.submissions_per_custom_id.len(), expected, "{who}: every member sent");
    let twice: Vec<_> = stats.submissions_per_custom_id.iter().filter(|(_, n)| **n != 1).collect();
    assert!(twice.is_empty(), "{who}: members sent more than once: {twice:?}");
}

/// Per batch of `BATCH` positions: what the faulty simulator was told to do.
fn faulty_expectations() -> (u64, u64, u64, u64) {
    let (mut truncated, mut not_json, mut disagree, mut valid) = (0, 0, 0, 0);
    for position in 1..=BATCH {
        if position % TRUNCATE_EVERY == 0 {
            truncated += 1;
        } else if position % NOT_JSON_EVERY == 0 {
            not_json += 1;
        } else {
            valid += 1;
            if position % DISAGREE_EVERY == 0 {
                disagree += 1;
            }
        }
    }
    let batches = (COMMITTED / BATCH) as u64;
    (truncated * batches, not_json * batches, disagree * batches, valid * batches)
}

fn candidate<'a>(report: &'a Value, name: &str) -> &'a Value {
    report["candidates"]
        .as_array()
        .and_then(|c| c.iter().find(|c| c["candidate"] == name))
        .expect("candidate in report")
}

fn close(a: &Value, b: f64) -> bool {
    a.as_f64().is_some_and(|a| (a - b).abs() < 1e-9)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bake_off_reports_what_the_candidates_did_survives_a_kill_and_promotes_once() {
    let prod = simulator(Duration::from_millis(100), Faults::default()).await;
    let good = simulator(Duration::from_millis(1500), Faults::default()).await;
    let faults = Faults {
        truncate_every: TRUNCATE_EVERY as u32,
        not_json_every: NOT_JSON_EVERY as u32,
        disagree_every: DISAGREE_EVERY as u32,
        ..Faults::default()
    };
    let faulty = simulator(Duration::from_millis(1500), faults).await;
    let dir = temp_dir();
    let config = dir.path().join("config.toml");
    std::fs::write(
        &config,
        format!(
            "{}{}{}[routing]\ndefault = \"prod\"\n\n[[outbox.sinks]]\nname = \"down\"\nurl = \"http://127.0.0.1:9/hook\"\nsecret_env = \"SINK_SECRET\"\n",
            provider("prod", &prod, None),
            provider("good", &good, None),
            provider("faulty", &faulty, Some(1000)),
        ),
    )
    .expect("write config");
    let config = config.display().to_string();
    let data = dir.path().join("data");
    std::fs::create_dir_all(&data).expect("data dir");
    let mut server = serve(&data, &config, None);
    let api = server.api();

    // 200 committed by production, then 50 left pending behind a paused production provider.
    let mut ids = Vec::new();
    for i in 0..COMMITTED {
        ids.push(api.create(TENANT, &format!("src/f{i}.rs"), &content(i)).await);
    }
    wait_for(
        &api,
        "production commits",
        |s| state_counts(s).get("committed") == Some(&(COMMITTED as u64)),
        "/v1/stats",
    )
    .await;
    let paused = api.send(Method::POST, "/v1/admin/providers/prod/pause", None).await;
    assert_eq!(paused.status, 200, "{:#}", paused.body);
    let mut pending_ids = Vec::new();
    for i in COMMITTED..COMMITTED + PENDING {
        pending_ids.push(api.create(TENANT, &format!("src/f{i}.rs"), &content(i)).await);
    }
    let before_stats = state_counts(&api.get("/v1/stats").await.body);
    assert_eq!(before_stats.get("pending"), Some(&(PENDING as u64)), "{before_stats:?}");
    let before_findings = api.findings(&ids[0]).await;
    let before_events = outbox_events(&api).await;
    let before_costs = costs(&api).await;

    // Bad requests are refused whole, with the field named.
    let unknown = api
        .post(
            "/v1/evaluations",
            &json!({"name": "x", "schema": "code-review@1",
        "select": {"sample": 5}, "candidates": ["nobody"]}),
        )
        .await;
    unknown.assert_error(404, "unknown_provider");
    let empty = api
        .post(
            "/v1/evaluations",
            &json!({"name": "x", "schema": "code-review@1",
        "select": {"sample": 5, "state": "any"}, "candidates": ["good"], "tenant": "nobody"}),
        )
        .await;
    empty.assert_error(422, "invalid_input");

    // The next server dies right after a provider accepted a trial batch, before the job
    // id is stored: the one window where a careless restart would pay for it twice.
    server.kill9();
    let server = serve(&data, &config, Some("after-trial-submit-before-job-id"));
    let api = server.api();
    let created = api
        .post(
            "/v1/evaluations",
            &json!({"name": "bake", "schema": "code-review@1",
        "select": {"sample": COMMITTED + 10, "state": "committed", "seed": 3}, "candidates": ["good", "faulty"]}),
        )
        .await;
    assert_eq!(created.status, 201, "{:#}", created.body);
    assert_eq!(created.body["members"], json!(COMMITTED), "the set is frozen to what exists: {:#}", created.body);
    api.post(
        "/v1/evaluations",
        &json!({"name": "bake", "schema": "code-review@1",
        "select": {"sample": 1}, "candidates": ["good"]}),
    )
    .await
    .assert_error(409, "evaluation_exists");

    dies_at(server, "after-trial-submit-before-job-id");
    // Each candidate's scheduler submits on its own: the other may have got its batch in too.
    assert!(good.stats().batches_created + faulty.stats().batches_created >= 1, "it died after a provider took one");
    // Then one dies after storing a batch's answers, before closing it: the file is read
    // again, and nothing is written or charged twice.
    dies_at(serve(&data, &config, Some("after-trial-answers-before-close")), "after-trial-answers-before-close");
    let server = serve(&data, &config, None);
    let api = server.api();
    let done = wait_for(&api, "the evaluation", |e| e["state"] == "done", "/v1/evaluations/bake").await;
    assert_eq!(done["candidates"][0]["finished"], json!(COMMITTED), "{done:#}");

    // No trial paid twice, none lost.
    let (good_stats, faulty_stats) = (good.stats(), faulty.stats());
    submitted_once(&good_stats, COMMITTED, "good");
    submitted_once(&faulty_stats, COMMITTED, "faulty");
    assert_eq!((good_stats.batches_created, faulty_stats.batches_created), (2, 2), "one job per 100 trials");

    let report = api.get("/v1/evaluations/bake/report").await;
    assert_eq!(report.status, 200, "{:#}", report.body);
    let report = report.body;
    assert_eq!(report["reference"], "production", "{report:#}");
    let g = candidate(&report, "good");
    assert_eq!((g["sent"].as_u64(), g["valid"].as_u64()), (Some(200), Some(200)), "{g:#}");
    assert!(close(&g["agreement"]["precision"], 1.0) && close(&g["agreement"]["recall"], 1.0), "{g:#}");
    assert_eq!(g["agreement"]["exact_sets"], json!(200));
    assert!(close(&g["findings_per_answer"], 2.0), "{g:#}");

    let (truncated, not_json, disagree, valid) = faulty_expectations();
    let f = candidate(&report, "faulty");
    assert_eq!(f["truncated"].as_u64(), Some(truncated), "{f:#}");
    assert_eq!(f["invalid"].as_u64(), Some(not_json), "prose instead of JSON is invalid: {f:#}");
    assert_eq!(f["valid"].as_u64(), Some(valid), "{f:#}");
    assert_eq!((f["refused"].as_u64(), f["failed"].as_u64()), (Some(0), Some(0)), "{f:#}");
    let agreement = &f["agreement"];
    assert_eq!(agreement["compared"].as_u64(), Some(valid));
    // A disagreeing answer keeps one of its source's two findings and adds another.
    let shared = (valid - disagree) * 2 + disagree;
    assert_eq!(agreement["true_positive"].as_u64(), Some(shared), "{agreement:#}");
    assert!(close(&agreement["precision"], shared as f64 / (valid * 2) as f64), "{agreement:#}");
    assert!(close(&agreement["recall"], shared as f64 / (valid * 2) as f64), "{agreement:#}");
    assert_eq!(agreement["exact_sets"].as_u64(), Some(valid - disagree));
    assert_eq!(f["disagreements_total"].as_u64(), Some(disagree));
    let first = &f["disagreements"][0];
    assert_eq!(first["only_reference"].as_array().map(Vec::len), Some(1), "{first:#}");
    assert!(first["only_candidate"][0].as_str().is_some_and(|i| i.contains("readability")), "{first:#}");
    assert!(f["latency"]["p50_ms"].as_u64().is_some_and(|ms| ms >= 1000), "answers came after 1.5 s: {f:#}");

    // Costs: the report's are the ledger's `evaluation` entries, and production's did not move.
    let after_costs = costs(&api).await;
    let trial_cost = g["cost_micros"].as_u64().unwrap_or(0) + f["cost_micros"].as_u64().unwrap_or(0);
    assert!(trial_cost > 0, "priced trials: {report:#}");
    assert_eq!(after_costs["evaluation"]["cost_micros"].as_u64(), Some(trial_cost), "{after_costs:#}");
    // Every trial was answered and billed, the cut-off and the prose ones too.
    assert_eq!(after_costs["evaluation"]["attempts"].as_u64(), Some(2 * COMMITTED as u64), "{after_costs:#}");
    assert_eq!(after_costs["fresh"], before_costs["fresh"], "production's spend is unchanged");
    assert_eq!(
        after_costs["charged_micros"].as_u64(),
        before_costs["charged_micros"].as_u64().map(|c| c + trial_cost),
        "the tenant is charged for its trials"
    );
    assert_eq!(done["spent_micros"].as_u64(), Some(trial_cost));

    // Production untouched: states, findings, outbox.
    assert_eq!(state_counts(&api.get("/v1/stats").await.body), before_stats, "trials are no commits");
    assert_eq!(api.findings(&ids[0]).await, before_findings);
    assert_eq!(outbox_events(&api).await, before_events, "no event for a trial");

    // The same report as CSV and as the CLI's table.
    let csv = api.get_text("/v1/evaluations/bake/report?format=csv").await;
    assert_eq!(csv.lines().count(), 3, "a header and one row per candidate:\n{csv}");
    assert!(csv.lines().nth(2).is_some_and(|row| row.starts_with("faulty,")), "{csv}");
    let table = api.get_text("/v1/evaluations/bake/report?format=text").await;
    assert!(table.contains("good") && table.contains("faulty") && table.contains("precision"), "{table}");

    // A budget holds the trials once they have cost it: the first batch is 10 trials, the
    // next ones are sized by what is left at their mean cost.
    let mean = g["cost_micros"].as_u64().unwrap_or(0) / COMMITTED as u64;
    let budget = mean * 12;
    let created = api
        .post(
            "/v1/evaluations",
            &json!({"name": "capped", "schema": "code-review@1",
        "select": {"sample": COMMITTED, "seed": 1}, "candidates": ["good"], "budget_micros": budget}),
        )
        .await;
    assert_eq!(created.status, 201, "{:#}", created.body);
    let held = wait_for(&api, "the budget", |e| e["state"] == "budget_reached", "/v1/evaluations/capped").await;
    let spent = held["spent_micros"].as_u64().unwrap_or(0);
    assert!(spent >= budget && spent < budget + 2 * mean, "spent {spent} of {budget} (a trial is ~{mean}): {held:#}");
    let sent = held["candidates"][0]["finished"].as_u64().unwrap_or(0);
    assert!((10..20).contains(&sent), "held after {sent} trials: {held:#}");

    // Promotion: the 50 pending, from a second evaluation with the good candidate.
    let created = api
        .post(
            "/v1/evaluations",
            &json!({"name": "pending", "tenant": TENANT, "schema": "code-review@1",
        "select": {"ids": pending_ids}, "candidates": ["good"]}),
        )
        .await;
    assert_eq!(created.status, 201, "{:#}", created.body);
    wait_for(&api, "the second evaluation", |e| e["state"] == "done", "/v1/evaluations/pending").await;
    let charged_before_promotion = costs(&api).await["charged_micros"].as_u64();
    let events_before_promotion = outbox_events(&api).await;
    let promoted = api.post("/v1/evaluations/pending/promote", &json!({"candidate": "good"})).await;
    assert_eq!(promoted.status, 200, "{:#}", promoted.body);
    assert_eq!(promoted.body["committed"], json!(PENDING), "{:#}", promoted.body);
    let rule = promoted.body["routing_rule"].as_str().unwrap_or_default();
    assert!(rule.contains("\"good\"") && rule.contains("\"acme\""), "{rule}");
    let again = api.post("/v1/evaluations/pending/promote", &json!({"candidate": "good"})).await;
    assert_eq!((again.body["committed"].clone(), again.body["already_committed"].clone()), (json!(0), json!(PENDING)));
    assert_eq!(costs(&api).await["charged_micros"].as_u64(), charged_before_promotion, "promotion charges nothing");
    assert_eq!(outbox_events(&api).await, events_before_promotion + PENDING, "one committed event each, once");
    let mut kinds = BTreeSet::new();
    for id in &pending_ids {
        let record = api.record(id).await;
        assert_eq!(record["state"], "committed", "{record:#}");
        assert_eq!(api.findings(id).await["findings"].as_array().map(Vec::len), Some(2));
        let ledger = api.get(&format!("/v1/extractions/{id}/costs")).await.body;
        for entry in ledger["attempts"].as_array().expect("ledger entries") {
            kinds.insert(entry["kind"].as_str().unwrap_or("?").to_string());
        }
    }
    assert_eq!(kinds, BTreeSet::from(["evaluation".to_string()]), "only the trial's charge, never a second");
    // Promoted commits are the candidate's own answers: never its reference.
    let own = api.get("/v1/evaluations/pending/report").await.body;
    assert_eq!(candidate(&own, "good")["agreement"]["compared"], json!(0), "{own:#}");

    // Erasing the tenant takes its trials: the evaluation drawn from it alone goes whole,
    // the other keeps its members' places without their source ids or answers.
    let erased = api.send(Method::DELETE, &format!("/v1/tenants/{TENANT}"), None).await;
    assert_eq!(erased.status, 200, "{:#}", erased.body);
    api.get("/v1/evaluations/pending").await.assert_error(404, "unknown_evaluation");
    let after = api.get("/v1/evaluations/bake/report").await.body;
    assert_eq!(candidate(&after, "faulty")["sent"], json!(0), "{after:#}");
    assert_eq!(api.get("/v1/evaluations/bake").await.body["state"], "done", "nothing left to send");
    stop_and_verify(server);
}
