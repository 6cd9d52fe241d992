//! `[providers.mistral] kind = "mistral"` through the real binary against the simulator's
//! Mistral dialect: the corpus committed once, a SIGKILL between create and persisting the
//! job id, a create answered by a dropped connection, per-line errors (a prompt too large,
//! a rate-limited line), an unknown model, `provider check` and `config check`. Counters of
//! the simulator span restarts, so `batches_created` proves no second job.

use std::path::Path;
use std::process::Output;
use std::time::Duration;

use commitpoint::simulator::{Dialect, Faults, Simulator, SimulatorConfig};
use serde_json::json;

use crate::provider::assert_corpus_committed_once;
use crate::provider::{CORPUS, assert_report_counts, counter, finish, health, intake_corpus, settle, settle_failed};
use crate::providers_e2e::{
    KEY, KEY_ENV, ONE_BATCH, SimRig, a_dropped_create_is_looked_up_not_repeated, assert_billed_by,
    killed_after_the_create_the_job_is_found_again, write_config,
};
use crate::util::{cli_with_env, run_to_end, stderr, stdout, temp_dir};

const MODEL: &str = "mistral-small-latest";

/// The simulator's Mistral dialect, and a config naming it.
async fn mistral_rig(complete_after: Duration, faults: Faults) -> SimRig {
    let config = SimulatorConfig {
        dialect: Dialect::Mistral,
        api_key: Some(KEY.into()),
        complete_after,
        faults,
        ..SimulatorConfig::default()
    };
    SimRig::start(config, "mistral", |sim, _| section(sim, MODEL, "")).await
}

fn section(sim: &Simulator, model: &str, extra: &str) -> String {
    format!(
        "[providers.mistral]\nkind = \"mistral\"\nbase_url = \"{}\"\nmodel = \"{model}\"\napi_key_env = \"{KEY_ENV}\"\nmax_tokens = 4000\n{extra}\n",
        sim.base_url()
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mistral_commits_the_corpus_once_with_the_reviewers_findings() {
    let rig = mistral_rig(Duration::from_millis(200), Faults::default()).await;
    let server = rig.serve(ONE_BATCH, None);
    let api = server.api();
    let ids = intake_corpus(&api).await;

    let stats = assert_corpus_committed_once(&api, &ids, || rig.stats()).await;
    assert_eq!((stats.files_uploaded, stats.batches_created), (1, 1), "{stats:#?}");
    let health = health(&api).await;
    assert_eq!(counter(&health, "lines_ingested"), CORPUS.len() as u64, "{health:#}");
    assert_billed_by(&api, &ids, "mistral").await;
    // The input and the output file stay in the organisation's storage until deleted.
    rig.wait_stats("the files to be deleted", |s| s.files_deleted == 2).await;

    let report = finish(server);
    assert_report_counts(&report, CORPUS.len(), &[&format!("committed: {}", CORPUS.len())]);
}

/// Creation is not idempotent: the job created before the kill is found again by the batch
/// key in its `metadata`, past two pages of another client's jobs, never created twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mistral_kill_after_create_before_the_job_id_is_stored_finds_the_job() {
    let faults = Faults { foreign_batches: 150, ..Faults::default() };
    let rig = mistral_rig(Duration::from_millis(500), faults).await;
    let stats = killed_after_the_create_the_job_is_found_again(&rig).await;
    assert!(stats.batches_listed >= 2, "the lookup paged past 150 foreign jobs: {stats:#?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mistral_create_answered_by_a_dropped_connection_is_found_not_resubmitted() {
    let faults = Faults { drop_after_create_next: 1, ..Faults::default() };
    let rig = mistral_rig(Duration::from_millis(200), faults).await;
    a_dropped_create_is_looked_up_not_repeated(&rig).await;
}

/// A prompt over the model's context comes back as that line's 400 in the error file, in a
/// job that succeeds: it fails `invalid_request` after one batch. A line answered 429
/// `rate_limited` goes round again and commits; the rest commit once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mistral_per_line_errors_refuse_one_request_and_retry_another() {
    let faults = Faults { max_input_tokens: 5_000, failed_line_every: 3, ..Faults::default() };
    let rig = mistral_rig(Duration::from_millis(100), faults).await;
    let server = rig.serve(&["--batch-max-size", "7", "--batch-max-wait", "2s"], None);
    let api = server.api();
    let mut ids = intake_corpus(&api).await;
    let big = format!("// a long file\n{}", "fn filler() { let x = 1; }\n".repeat(1_000));
    let over = api.create(crate::provider::TENANT, "huge.rs", &big).await;
    ids.insert(over.clone());
    rig.wait_stats("the first job", |s| s.batches_created >= 1).await;
    rig.sim.set_faults(Faults { max_input_tokens: 5_000, ..Faults::default() });

    let records = settle(&api, &ids).await;
    let failed = &records[&over];
    assert_eq!(failed["state"], json!("failed"), "{failed:#}");
    assert_eq!(failed["failure_class"], json!("invalid_request"), "{failed:#}");
    let reason = failed["failure_reason"].as_str().unwrap_or_default();
    assert!(reason.contains("400") && reason.contains("too large for model"), "{failed:#}");
    let stats = rig.stats();
    assert_eq!(stats.submissions_per_custom_id.get(&over), Some(&1), "sent once: {stats:#?}");
    let others: Vec<_> = records.iter().filter(|(id, _)| **id != over).map(|(_, r)| r).collect();
    assert!(others.iter().all(|r| r["state"] == json!("committed")), "{records:#?}");
    assert!(others.iter().any(|r| r["attempts"] == json!(2)), "the rate-limited lines went again: {records:#?}");
    assert_eq!(stats.max_live_batches_per_custom_id, 1, "{stats:#?}");
    finish(server);
}

/// Mistral answers a create for a model it does not serve with 400 `invalid_model`: no
/// retry fixes that, so every member fails `invalid_request` without a job, and each
/// refused create's uploaded input is deleted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mistral_an_unknown_model_fails_invalid_request_without_leftover_files() {
    let faults = Faults { missing_models: vec![MODEL.to_string()], ..Faults::default() };
    let rig = mistral_rig(Duration::from_millis(100), faults).await;
    let server = rig.serve(&[], None);
    let api = server.api();
    let ids = intake_corpus(&api).await;
    settle_failed(&api, &ids, "invalid_request", &["Invalid model"]).await;
    let stats = rig.wait_stats("the uploads to be deleted", |s| s.files_deleted == s.files_uploaded).await;
    assert!(stats.files_uploaded >= 1 && stats.batches_created == 0, "{stats:#?}");
    finish(server);
}

fn provider_check(dir: &Path, sim: &Simulator, model: &str, key: &str) -> Output {
    let path = dir.join("config.toml");
    let config = format!("[server]\ndata_dir = \"{}\"\n{}", dir.join("data").display(), section(sim, model, ""));
    std::fs::write(&path, config).expect("write config");
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_commitpoint"));
    cmd.args(["provider", "check", "--config", &path.display().to_string()]).env(KEY_ENV, key);
    cmd.env("COMMITPOINT_LOG", "warn");
    run_to_end(cmd)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mistral_provider_check_accepts_the_key_and_model_and_quotes_refusals() {
    let faults = Faults { missing_models: vec!["mistral-gone".to_string()], ..Faults::default() };
    let rig = mistral_rig(Duration::from_millis(200), faults).await;
    let dir = temp_dir();
    let out = provider_check(dir.path(), &rig.sim, MODEL, KEY);
    assert_eq!(out.status.code(), Some(0), "{}\n{}", stdout(&out), stderr(&out));
    assert!(stdout(&out).contains("mistral / code-review@1: accepted"), "{}", stdout(&out));
    let out = provider_check(dir.path(), &rig.sim, "mistral-gone", KEY);
    assert_eq!(out.status.code(), Some(1), "{}", stdout(&out));
    assert!(stdout(&out).contains("Invalid model: mistral-gone"), "{}", stdout(&out));
    let out = provider_check(dir.path(), &rig.sim, MODEL, "wrong-key");
    assert_eq!(out.status.code(), Some(1), "{}", stdout(&out));
    assert!(stdout(&out).contains("Unauthorized"), "{}", stdout(&out));
    assert_eq!(rig.stats().batches_created, 0, "a check creates no job");
}

/// `config check` shows the table back and refuses settings Mistral would refuse or that
/// would send every call to the wrong place, naming the key (exit 78).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mistral_config_check_describes_the_provider_and_refuses_bad_settings() {
    let rig = mistral_rig(Duration::from_millis(200), Faults::default()).await;
    let env = [(KEY_ENV, KEY)];
    let out = cli_with_env(&["config", "check", "--config", rig.config_path()], &env);
    let text = stdout(&out);
    assert_eq!(out.status.code(), Some(0), "{text}\n{}", stderr(&out));
    assert!(text.contains("kind = \"mistral\"") && text.contains("max_tokens = 4000"), "{text}");

    for (extra, named) in
        [("timeout_hours = 0", "timeout_hours"), ("max_completion_tokens = 10", "max_completion_tokens")]
    {
        let dir = temp_dir();
        let config = write_config(dir.path(), &section(&rig.sim, MODEL, extra), "mistral");
        let out = cli_with_env(&["config", "check", "--config", &config], &env);
        assert_eq!(out.status.code(), Some(78), "{extra}: {}", stderr(&out));
        assert!(stderr(&out).contains(named), "{extra}: {}", stderr(&out));
    }
    let dir = temp_dir();
    let v1 = section(&rig.sim, MODEL, "").replace(&rig.sim.base_url(), &format!("{}/v1", rig.sim.base_url()));
    let config = write_config(dir.path(), &v1, "mistral");
    let out = cli_with_env(&["config", "check", "--config", &config], &env);
    assert_eq!(out.status.code(), Some(78), "{}", stderr(&out));
    assert!(stderr(&out).contains("without /v1"), "{}", stderr(&out));
}
