//! Answers a provider really returns that must never be committed (issue 11): a reply cut
//! off at its output budget (OpenAI `finish_reason: "length"`, Anthropic `stop_reason:
//! "max_tokens"`) — even when the cut-off content is a valid prefix that passes the schema
//! — and a model's refusal. Both are paid for and charged; a truncation is retried once
//! with a doubled budget, a refusal fails `refused`. Also the attempt cap that stops a
//! member from being requeued for ever, and the batch discount, which a synchronous chat
//! provider never gets. Each runs the real binary against the simulator's fault knobs.
//!
//! Before this, the valid-prefix half of the truncated answers committed with half their
//! findings, the torn half and every refusal failed `validation`, a member whose result
//! line was always unreadable went round the queue for ever, and the chat provider's calls
//! were priced at the batch discount.

use std::collections::BTreeSet;
use std::time::Duration;

use commitpoint::simulator::{Faults, Simulator, SimulatorConfig};
use serde_json::{Value, json};

use crate::provider::{
    CORPUS, Rig, assert_all_committed_with_model_findings, assert_report_counts, assert_submitted, corpus_ids, counter,
    finish, health, intake_corpus, settle,
};
use crate::providers_e2e::{KEY, KEY_ENV, anthropic_rig, serve, write_config};
use crate::util::{Api, temp_dir};

/// What a truncated answer's request asks for, and what the simulated long answer needs:
/// more than the budget, less than twice it.
const BUDGET: u32 = 1000;
const LONG_ANSWER: u32 = 1500;

fn long_answers(needs: u32) -> Faults {
    Faults { truncate_every: 1, long_answer_tokens: needs, ..Faults::default() }
}

/// `serve --provider openai` at the simulator with `config` (TOML) as its file.
fn serve_openai(rig: &Rig, config: &str) -> crate::util::Server {
    let path = rig.dir.path().join("config.toml");
    std::fs::write(&path, config).expect("write config");
    let path = path.display().to_string();
    rig.serve(&["--config", &path], None)
}

/// (kind, attempt, output tokens) of every ledger entry of one extraction.
async fn ledger(api: &Api, id: &str) -> Vec<(String, u64, u64)> {
    let reply = api.get(&format!("/v1/extractions/{id}/costs")).await;
    assert_eq!(reply.status, 200, "{:#}", reply.body);
    let entries = reply.body["attempts"].as_array().expect("attempts").iter();
    entries
        .map(|e| {
            let number = |k: &str| e[k].as_u64().unwrap_or_else(|| panic!("{k} in {e:#}"));
            (e["kind"].as_str().unwrap_or_default().to_string(), number("attempt"), number("output_tokens"))
        })
        .collect()
}

/// Every answer of the first attempt is cut off at `max_completion_tokens = 1000`; the
/// simulator alternates a torn JSON prefix with a *valid* one (half the findings, passing
/// `code-review@1`). None is committed: each goes back once with a budget of 2000, which
/// the long answer fits, and commits with all its findings. The simulator keeps cutting off
/// every answer that does not fit, so it is the larger budget that completes them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_truncated_answer_is_never_committed_and_is_retried_once_with_a_doubled_budget() {
    let rig = Rig::start(Duration::from_millis(200), long_answers(LONG_ANSWER)).await;
    let server = serve_openai(&rig, &format!("[provider]\nmax_completion_tokens = {BUDGET}\n"));
    let api = server.api();
    let ids = intake_corpus(&api).await;

    assert_all_committed_with_model_findings(&api).await;
    let records = settle(&api, &ids).await;
    for record in records.values() {
        assert_eq!(record["attempts"], json!(2), "{record:#}");
        assert_eq!(record["requeues"], json!(1), "{record:#}");
        assert_eq!(record["output_budget"], json!(2 * BUDGET), "{record:#}");
    }
    let stats = rig.stats();
    assert_eq!(stats.lines_truncated, CORPUS.len() as u64, "{stats:#?}");
    assert_eq!(stats.lines_completed, 2 * CORPUS.len() as u64, "cut-off answers are billed too: {stats:#?}");
    assert_submitted(&stats, &corpus_ids(), 2);
    for id in &ids {
        let want = [("unusable".to_string(), 1, u64::from(BUDGET)), ("fresh".to_string(), 2, u64::from(LONG_ANSWER))];
        assert_eq!(ledger(&api, id).await, want, "the truncated answer was paid for and is charged");
    }
    let health = health(&api).await;
    assert_eq!(counter(&health, "truncated"), CORPUS.len() as u64, "{health:#}");
    assert_eq!(counter(&health, "budget_retries"), CORPUS.len() as u64, "{health:#}");
    assert_eq!(counter(&health, "members_requeued"), CORPUS.len() as u64, "{health:#}");

    let report = finish(server);
    assert_report_counts(&report, CORPUS.len(), &[&format!("committed: {}", CORPUS.len())]);
}

/// The one retry asks for at most `max_completion_tokens_cap`; an answer that does not fit
/// that either fails `truncated`, with both cut-off answers charged and nothing committed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_answer_truncated_again_after_its_retry_fails_truncated() {
    let rig = Rig::start(Duration::from_millis(200), long_answers(5000)).await;
    let config = format!("[provider]\nmax_completion_tokens = {BUDGET}\nmax_completion_tokens_cap = 1500\n");
    let server = serve_openai(&rig, &config);
    let api = server.api();
    let ids = intake_corpus(&api).await;

    let records = settle(&api, &ids).await;
    for (id, record) in &records {
        assert_eq!(record["state"], json!("failed"), "{record:#}");
        assert_eq!(record["failure_class"], json!("truncated"), "{record:#}");
        let reason = record["failure_reason"].as_str().unwrap_or_default();
        assert!(reason.contains("length") && reason.contains("1500"), "{reason}");
        assert_eq!((record["attempts"].clone(), record["output_budget"].clone()), (json!(2), json!(1500)));
        assert_eq!(api.findings(id).await["findings"], json!([]), "nothing of a cut-off answer is stored");
        let charged: Vec<(String, u64)> = ledger(&api, id).await.into_iter().map(|(k, a, _)| (k, a)).collect();
        assert_eq!(charged, [("unusable".to_string(), 1), ("unusable".to_string(), 2)]);
    }
    // Retried once, never again.
    tokio::time::sleep(Duration::from_millis(800)).await;
    let stats = rig.stats();
    assert_eq!(stats.batches_created, 2, "{stats:#?}");
    assert_eq!(stats.lines_truncated, 2 * CORPUS.len() as u64, "{stats:#?}");
    let health = health(&api).await;
    assert_eq!(counter(&health, "truncated"), 2 * CORPUS.len() as u64, "{health:#}");
    assert_eq!(counter(&health, "budget_retries"), CORPUS.len() as u64, "{health:#}");

    let report = finish(server);
    assert_report_counts(&report, CORPUS.len(), &[&format!("failed: {}", CORPUS.len())]);
}

/// A refusal (`message.content: null`, `message.refusal: "I'm sorry…"`) fails `refused`,
/// not `validation`, is charged, and is not retried by the scheduler.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refusal_fails_refused_is_charged_and_is_not_retried() {
    let rig = Rig::start(Duration::from_millis(200), Faults { refuse_every: 1, ..Faults::default() }).await;
    let server = rig.serve(&[], None);
    let api = server.api();
    let ids = intake_corpus(&api).await;

    let records = settle(&api, &ids).await;
    for (id, record) in &records {
        assert_eq!(record["state"], json!("failed"), "{record:#}");
        assert_eq!(record["failure_class"], json!("refused"), "{record:#}");
        let reason = record["failure_reason"].as_str().unwrap_or_default();
        assert!(reason.contains("I'm sorry, I cannot help with that."), "{reason}");
        assert_eq!(record["attempts"], json!(1), "{record:#}");
        let kinds: Vec<String> = ledger(&api, id).await.into_iter().map(|(k, _, _)| k).collect();
        assert_eq!(kinds, ["unusable"], "a refusal is paid for");
    }
    tokio::time::sleep(Duration::from_millis(600)).await;
    let stats = rig.stats();
    assert_eq!((stats.batches_created, stats.lines_refused), (1, CORPUS.len() as u64), "{stats:#?}");
    assert_eq!(counter(&health(&api).await, "model_refusals"), CORPUS.len() as u64);

    // An operator's retry sends it again, and this time the model answers.
    rig.sim.set_faults(Faults::default());
    for id in &ids {
        assert_eq!(api.retry(id).await.status, 200);
    }
    assert_all_committed_with_model_findings(&api).await;

    let report = finish(server);
    assert_report_counts(&report, CORPUS.len(), &[&format!("committed: {}", CORPUS.len())]);
}

/// Anthropic: `stop_reason: "max_tokens"` is a truncation even when the forced tool call's
/// input would validate; the retry asks for twice the configured `max_tokens` (1024).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn anthropic_max_tokens_is_retried_with_a_doubled_max_tokens() {
    let rig = anthropic_rig(Duration::from_millis(200), long_answers(LONG_ANSWER)).await;
    let server = rig.serve(&[], None);
    let api = server.api();
    let ids = intake_corpus(&api).await;

    assert_all_committed_with_model_findings(&api).await;
    for (id, record) in settle(&api, &ids).await {
        assert_eq!((record["attempts"].clone(), record["output_budget"].clone()), (json!(2), json!(2048)));
        let kinds: Vec<String> = ledger(&api, &id).await.into_iter().map(|(k, _, _)| k).collect();
        assert_eq!(kinds, ["unusable", "fresh"]);
    }
    assert_eq!(rig.stats().lines_truncated, CORPUS.len() as u64);

    let report = finish(server);
    assert_report_counts(&report, CORPUS.len(), &[&format!("committed: {}", CORPUS.len())]);
}

/// Anthropic refusals in both shapes — `stop_reason: "refusal"`, and an `end_turn` text
/// that never calls the forced tool — fail `refused`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn anthropic_refusals_and_missing_tool_calls_fail_refused() {
    let rig = anthropic_rig(Duration::from_millis(200), Faults { refuse_every: 1, ..Faults::default() }).await;
    let server = rig.serve(&[], None);
    let api = server.api();
    let ids = intake_corpus(&api).await;

    let records = settle(&api, &ids).await;
    let mut reasons = BTreeSet::new();
    for record in records.values() {
        assert_eq!(record["failure_class"], json!("refused"), "{record:#}");
        let reason = record["failure_reason"].as_str().unwrap_or_default();
        reasons.insert(if reason.contains("did not call the forced tool") { "no tool call" } else { "refusal" });
    }
    assert_eq!(reasons, BTreeSet::from(["no tool call", "refusal"]), "both shapes were served");
    assert_eq!(rig.stats().lines_refused, CORPUS.len() as u64);

    let report = finish(server);
    assert_report_counts(&report, CORPUS.len(), &[&format!("failed: {}", CORPUS.len())]);
}

/// Every result line of every batch is torn: billed, but unreadable, so no member is ever
/// answered. Each is requeued until it has used `max_attempts` (default 5) provider
/// attempts, then fails `attempts_exhausted` instead of going round for ever.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn members_never_answered_stop_at_the_attempt_cap() {
    let rig = Rig::start(Duration::from_millis(150), Faults { malformed_line_every: 1, ..Faults::default() }).await;
    let server = rig.serve(&[], None);
    let api = server.api();
    let ids = intake_corpus(&api).await;

    let records = crate::provider::settle_within(&api, &ids, Duration::from_secs(40)).await;
    for record in records.values() {
        assert_eq!(record["state"], json!("failed"), "{record:#}");
        assert_eq!(record["failure_class"], json!("attempts_exhausted"), "{record:#}");
        assert_eq!((record["attempts"].clone(), record["requeues"].clone()), (json!(5), json!(4)), "{record:#}");
        let reason = record["failure_reason"].as_str().unwrap_or_default();
        assert!(reason.contains("5 provider attempts used"), "{reason}");
    }
    tokio::time::sleep(Duration::from_millis(800)).await;
    let stats = rig.stats();
    assert_eq!(stats.batches_created, 5, "five attempts, then no more: {stats:#?}");
    assert_submitted(&stats, &ids, 5);
    let health = health(&api).await;
    assert_eq!(counter(&health, "attempts_exhausted"), CORPUS.len() as u64, "{health:#}");
    assert_eq!(counter(&health, "members_requeued"), 4 * CORPUS.len() as u64, "{health:#}");

    // An operator's retry grants a fresh allowance, and a healthy provider answers.
    rig.sim.set_faults(Faults::default());
    for id in &ids {
        let reply = api.retry(id).await;
        assert_eq!((reply.body["attempts"].clone(), reply.body["requeues"].clone()), (json!(6), json!(0)));
    }
    assert_all_committed_with_model_findings(&api).await;

    let report = finish(server);
    assert_report_counts(&report, CORPUS.len(), &[&format!("committed: {}", CORPUS.len())]);
}

/// `[scheduler] max_attempts` is the cap.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_attempt_cap_is_configurable() {
    let rig = Rig::start(Duration::from_millis(150), Faults { malformed_line_every: 1, ..Faults::default() }).await;
    let server = serve_openai(&rig, "[scheduler]\nmax_attempts = 2\n");
    let api = server.api();
    let ids = intake_corpus(&api).await;

    let records = settle(&api, &ids).await;
    assert!(records.values().all(|r| r["failure_class"] == json!("attempts_exhausted") && r["attempts"] == json!(2)));
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert_eq!(rig.stats().batches_created, 2);
    finish(server);
}

/// The synchronous chat provider against the simulator's `POST /v1/chat/completions`:
/// `finish_reason: "length"` is retried with twice the configured `max_tokens`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chat_truncations_are_retried_with_a_doubled_max_tokens() {
    let sim = start_sim(long_answers(LONG_ANSWER)).await;
    let dir = temp_dir();
    let sections = format!(
        "[providers.chat]\nbase_url = \"{}\"\nmodel = \"gpt-4o-mini\"\nmax_tokens = {BUDGET}\napi_key_env = \"{KEY_ENV}\"\n",
        sim.base_url()
    );
    let config = write_config(dir.path(), &sections, "chat");
    let server = serve(dir.path(), &config, &[], None);
    let api = server.api();
    let ids = intake_corpus(&api).await;

    assert_all_committed_with_model_findings(&api).await;
    for (id, record) in settle(&api, &ids).await {
        assert_eq!((record["attempts"].clone(), record["output_budget"].clone()), (json!(2), json!(2 * BUDGET)));
        let kinds: Vec<String> = ledger(&api, &id).await.into_iter().map(|(k, _, _)| k).collect();
        assert_eq!(kinds, ["unusable", "fresh"]);
    }
    let stats = sim.stats();
    assert_eq!((stats.chat_completions, stats.lines_truncated), (2 * CORPUS.len() as u64, CORPUS.len() as u64));

    let report = finish(server);
    assert_report_counts(&report, CORPUS.len(), &[&format!("committed: {}", CORPUS.len())]);
}

async fn start_sim(faults: Faults) -> Simulator {
    let config = SimulatorConfig {
        api_key: Some(KEY.into()),
        complete_after: Duration::from_millis(200),
        faults,
        ..SimulatorConfig::default()
    };
    Simulator::start("127.0.0.1:0".parse().expect("loopback address"), config).await.expect("start the simulator")
}

/// The same source for the same model at the same list price, once through the batch API
/// (tenant `batch`, provider `openai`) and once through the synchronous chat provider
/// (tenant `sync`): the batch call is charged half, the synchronous one in full.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_batch_discount_never_applies_to_the_synchronous_chat_provider() {
    let sim = start_sim(Faults::default()).await;
    let dir = temp_dir();
    let base = sim.base_url();
    let config = format!(
        "[provider]\nkind = \"openai\"\nbase_url = \"{base}\"\nmodel = \"gpt-4o-mini\"\napi_key_env = \"{KEY_ENV}\"\n\n\
         [providers.chat]\nbase_url = \"{base}\"\nmodel = \"gpt-4o-mini\"\napi_key_env = \"{KEY_ENV}\"\n\n\
         [[routing.rules]]\ntenant = \"sync\"\nprovider = \"chat\"\n\n\
         [[prices]]\nprovider = \"openai\"\nmodel = \"gpt-4o-mini\"\ninput_per_mtok = 150\noutput_per_mtok = 600\n\n\
         [[prices]]\nprovider = \"chat\"\nmodel = \"gpt-4o-mini\"\ninput_per_mtok = 150\noutput_per_mtok = 600\n"
    );
    let path = dir.path().join("config.toml");
    std::fs::write(&path, config).expect("write config");
    let path = path.display().to_string();
    let server = serve(dir.path(), &path, &[], None);
    let api = server.api();
    let source = &CORPUS[4];
    let batch_id = api.create("batch", source.id, source.content).await;
    let sync_id = api.create("sync", source.id, source.content).await;
    settle(&api, &BTreeSet::from([batch_id.clone(), sync_id.clone()])).await;

    let entry = |body: Value| body["attempts"][0].clone();
    let batch = entry(api.get(&format!("/v1/extractions/{batch_id}/costs")).await.body);
    let sync = entry(api.get(&format!("/v1/extractions/{sync_id}/costs")).await.body);
    let figure = |e: &Value, k: &str| e[k].as_u64().unwrap_or_else(|| panic!("{k} in {e:#}"));
    assert_eq!((batch["provider"].clone(), sync["provider"].clone()), (json!("openai"), json!("chat")));
    for k in ["input_tokens", "output_tokens"] {
        assert_eq!(figure(&batch, k), figure(&sync, k), "the same call: {batch:#} vs {sync:#}");
    }
    // $150 / $600 per million tokens: whole micro-dollars per token, so no rounding.
    let list = 150 * figure(&sync, "input_tokens") + 600 * figure(&sync, "output_tokens");
    assert_eq!(figure(&sync, "cost_micros"), list, "a synchronous call is charged the list price: {sync:#}");
    assert_eq!(figure(&batch, "cost_micros"), list / 2, "a batch call is charged half: {batch:#}");
    let charged = |tenant: &'static str| {
        let api = api.clone();
        async move {
            let reply = api.get(&format!("/v1/tenants/{tenant}/costs?from=2000-01-01&to=2100-01-01")).await;
            reply.body["charged_micros"].as_u64().expect("charged")
        }
    };
    assert_eq!(charged("sync").await, list);
    assert_eq!(charged("batch").await, list / 2);
    assert_eq!(sim.stats().chat_completions, 1);

    let report = finish(server);
    assert_report_counts(&report, 2, &["committed: 2"]);
}
