//! Providers as named tables (issue 12): two OpenAI accounts side by side, each pointed at
//! its own simulator with its own key and routed by tenant; each receives exactly its
//! tenant's work, the ledger names it, and it is paused by its table name. Plus the one
//! secret loader `config check` shares with `serve`, and an old form still working.

use std::collections::BTreeSet;
use std::path::Path;
use std::time::Duration;

use commitpoint::domain::identity::{ExtractionId, SourceHash};
use commitpoint::simulator::{Faults, Simulator, SimulatorConfig, Stats};
use reqwest::Method;
use serde_json::json;

use crate::provider::{CORPUS, Rig, Source, assert_findings, assert_submitted, settle};
use crate::providers_e2e::assert_billed_by;
use crate::util::{Api, SCHEMA, Server, assert_verifies, run_to_end, serve_command, stderr, stdout, temp_dir};

const EXIT_CONFIG: i32 = 78;
/// acct_a takes every tenant but this one, whose work goes to acct_b.
const ROUTED_TENANT: &str = "globex";
const DEFAULT_TENANT: &str = "acme";

async fn simulator(key: &str) -> Simulator {
    let config = SimulatorConfig {
        api_key: Some(key.into()),
        complete_after: Duration::from_millis(200),
        faults: Faults::default(),
        ..SimulatorConfig::default()
    };
    Simulator::start("127.0.0.1:0".parse().expect("loopback address"), config).await.expect("start a simulator")
}

fn id_for(tenant: &str, source: &Source) -> String {
    let hash = SourceHash::compute(source.content.as_bytes(), SCHEMA);
    ExtractionId::compute(tenant, source.id, &hash, SCHEMA).to_hex()
}

async fn intake_all(api: &Api, tenant: &str, sources: &[Source]) -> BTreeSet<String> {
    let mut ids = BTreeSet::new();
    for source in sources {
        let id = api.create(tenant, source.id, source.content).await;
        assert_eq!(id, id_for(tenant, source), "the extraction id is the identity hash");
        ids.insert(id);
    }
    ids
}

fn write(path: &Path, text: &str) -> String {
    std::fs::write(path, text).expect("write config");
    path.display().to_string()
}

async fn set_paused(api: &Api, name: &str, paused: bool) {
    let verb = if paused { "pause" } else { "resume" };
    let reply = api.send(Method::POST, &format!("/v1/admin/providers/{name}/{verb}"), None).await;
    assert_eq!(reply.status, 200, "{verb} {name}: {:#}", reply.body);
    assert_eq!((&reply.body["name"], &reply.body["operator_paused"]), (&json!(name), &json!(paused)));
}

fn submitted(stats: &Stats) -> BTreeSet<String> {
    stats.submissions_per_custom_id.keys().cloned().collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_openai_accounts_routed_by_tenant_each_get_exactly_their_tenants_work() {
    let (sim_a, sim_b) = (simulator("sk-account-a").await, simulator("sk-account-b").await);
    let dir = temp_dir();
    // Each key fits only its own simulator (401 otherwise), so a swapped key cannot pass.
    let config = write(
        &dir.path().join("config.toml"),
        &format!(
            "[providers.acct_a]\nkind = \"openai\"\nbase_url = \"{}\"\napi_key_env = \"NAMED_KEY_A\"\n\n\
             [providers.acct_b]\nkind = \"openai\"\nbase_url = \"{}\"\nmodel = \"gpt-4o-mini\"\napi_key_env = \"NAMED_KEY_B\"\n\n\
             [routing]\ndefault = \"acct_a\"\nrules = [{{ tenant = \"{ROUTED_TENANT}\", provider = \"acct_b\" }}]\n",
            sim_a.base_url(),
            sim_b.base_url()
        ),
    );
    let args = ["--config", config.as_str(), "--batch-max-wait", "200ms", "--poll-interval", "100ms"];
    let env = [("NAMED_KEY_A", "sk-account-a"), ("NAMED_KEY_B", "sk-account-b")];
    let server = Server::start_with_env(dir.path(), &args, &env);
    let api = server.api();

    let (first, later) = CORPUS.split_at(CORPUS.len() - 1);
    let for_a = intake_all(&api, DEFAULT_TENANT, first).await;
    let for_b = intake_all(&api, ROUTED_TENANT, first).await;
    let all: BTreeSet<String> = for_a.union(&for_b).cloned().collect();
    let records = settle(&api, &all).await;
    for (id, record) in &records {
        assert_eq!(record["state"], json!("committed"), "{id}: {record:#}");
    }
    for source in first {
        for tenant in [DEFAULT_TENANT, ROUTED_TENANT] {
            assert_findings(&api, source, &id_for(tenant, source)).await;
        }
    }
    assert_submitted(&sim_a.stats(), &for_a, 1);
    assert_submitted(&sim_b.stats(), &for_b, 1);
    assert_billed_by(&api, &for_a, "acct_a").await;
    assert_billed_by(&api, &for_b, "acct_b").await;

    let health = api.get("/healthz").await;
    let names: BTreeSet<&str> =
        health.body["providers"].as_array().expect("providers").iter().filter_map(|p| p["name"].as_str()).collect();
    assert_eq!(names, BTreeSet::from(["acct_a", "acct_b"]), "{:#}", health.body);

    // Paused by its table name, acct_b holds its tenant's new work; acct_a does not take it.
    set_paused(&api, "acct_b", true).await;
    let unknown = api.send(Method::POST, "/v1/admin/providers/openai/pause", None).await;
    unknown.assert_error(404, "unknown_provider");
    let held = intake_all(&api, ROUTED_TENANT, later).await;
    let batches_b = sim_b.stats().batches_created;
    tokio::time::sleep(Duration::from_millis(800)).await;
    for id in &held {
        assert_eq!(api.record(id).await["state"], json!("pending"), "held while acct_b is paused");
    }
    assert_eq!(sim_b.stats().batches_created, batches_b, "no batch to a paused provider");
    assert!(submitted(&sim_a.stats()).is_disjoint(&held), "acct_a never takes acct_b's tenant");
    set_paused(&api, "acct_b", false).await;
    let records = settle(&api, &held).await;
    assert!(records.values().all(|r| r["state"] == json!("committed")), "{records:#?}");
    let b_ids: BTreeSet<String> = for_b.union(&held).cloned().collect();
    assert_submitted(&sim_b.stats(), &b_ids, 1);
    assert_submitted(&sim_a.stats(), &for_a, 1);

    let db = server.db_path();
    let (status, log) = server.terminate();
    assert_eq!(status.code(), Some(0), "{log}");
    assert_verifies(&db);
    assert!(!log.contains("old form"), "the new form needs no note:\n{log}");

    // `provider check --provider NAME` takes the table name and probes that account only.
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_commitpoint"));
    cmd.args(["provider", "check", "--config", &config, "--provider", "acct_b"]).envs(env);
    let out = run_to_end(cmd);
    assert_eq!(out.status.code(), Some(0), "{}\n{}", stdout(&out), stderr(&out));
    assert!(stdout(&out).contains("acct_b / code-review@1: accepted"), "{}", stdout(&out));
    assert!(!stdout(&out).contains("acct_a"), "{}", stdout(&out));
}

/// The config check used to load only the OpenAI key: an Anthropic provider whose key
/// variable is unset passed the check and then failed `serve` with 78.
#[test]
fn config_check_loads_every_providers_secret_as_serve_does() {
    let dir = temp_dir();
    let config = write(
        &dir.path().join("config.toml"),
        "[providers.claude]\nkind = \"anthropic\"\nmodel = \"claude-x\"\napi_key_env = \"NAMED_ANTHROPIC_KEY\"\n\n\
         [providers.anthropic]\nmodel = \"claude-y\"\napi_key_env = \"NAMED_ANTHROPIC_KEY\"\n\n\
         [routing]\ndefault = \"claude\"\n",
    );
    let check = |key: Option<&str>| {
        let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_commitpoint"));
        cmd.args(["config", "check", "--config", &config]).env_remove("NAMED_ANTHROPIC_KEY");
        if let Some(key) = key {
            cmd.env("NAMED_ANTHROPIC_KEY", key);
        }
        run_to_end(cmd)
    };
    let mut serve = serve_command(&dir.path().join("data"), &["--config", &config]);
    serve.env_remove("NAMED_ANTHROPIC_KEY");
    for (what, out) in [("config check", check(None)), ("serve", run_to_end(serve))] {
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(EXIT_CONFIG), "{what}:\n{err}");
        assert!(err.contains("NAMED_ANTHROPIC_KEY") && err.contains("anthropic"), "{what} names the secret:\n{err}");
    }

    let out = check(Some("sk-ant-test-key"));
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let text = stdout(&out);
    assert!(text.contains("[providers.claude]\nkind = \"anthropic\""), "{text}");
    assert!(!text.contains("sk-ant-test-key") && !stderr(&out).contains("sk-ant-test-key"), "secret printed");
    // The kind-less table is the old form: it works, and says what to write instead.
    assert!(stderr(&out).contains("[providers.anthropic] without `kind` is the old form"), "{}", stderr(&out));

    let bad = write(
        &dir.path().join("bad.toml"),
        "[providers.acct]\nkind = \"generic\"\nmodel = \"m\"\napi_key_env = \"K\"\n",
    );
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_commitpoint"));
    cmd.args(["config", "check", "--config", &bad]);
    let out = run_to_end(cmd);
    assert_eq!(out.status.code(), Some(EXIT_CONFIG), "{}", stderr(&out));
    assert!(stderr(&out).contains("providers.acct: missing field `base_url`"), "{}", stderr(&out));
}

/// The old `[provider]` table still drives work under the name `openai` (batches stored
/// before the upgrade carry it) and prints a note pointing to the new form.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_old_provider_table_still_works_and_points_to_the_new_form() {
    let rig = Rig::start(Duration::from_millis(200), Faults::default()).await;
    let config = write(
        &rig.dir.path().join("config.toml"),
        &format!("[provider]\nkind = \"openai\"\nbase_url = \"{}\"\napi_key_env = \"SIM_KEY\"\n", rig.sim.base_url()),
    );
    let args = ["--config", config.as_str(), "--batch-max-wait", "200ms", "--poll-interval", "100ms"];
    let server = Server::start_with_env(rig.dir.path(), &args, &[("SIM_KEY", "sk-test")]);
    let api = server.api();
    let ids = intake_all(&api, DEFAULT_TENANT, &CORPUS[..2]).await;
    let records = settle(&api, &ids).await;
    assert!(records.values().all(|r| r["state"] == json!("committed")), "{records:#?}");
    assert_submitted(&rig.stats(), &ids, 1);
    assert_billed_by(&api, &ids, "openai").await;
    let (status, log) = server.terminate();
    assert_eq!(status.code(), Some(0), "{log}");
    assert_verifies(&rig.db());
    let note = "[provider] is the old form and still works; the new form is [providers.openai] with kind = \"openai\"";
    assert!(log.contains(note), "{log}");

    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_commitpoint"));
    cmd.args(["config", "check", "--config", &config]).env("SIM_KEY", "sk-test");
    let out = run_to_end(cmd);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(stderr(&out).contains(note), "{}", stderr(&out));
    assert!(stdout(&out).contains("[providers.openai]\nkind = \"openai\""), "{}", stdout(&out));
}
