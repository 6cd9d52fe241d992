//! `[providers.bedrock] kind = "bedrock"` through the real binary against the simulator's
//! Bedrock dialect over a REAL S3 (moto's server on loopback): the corpus committed once
//! with the S3 records checked field by field (the create's fields are checked by the
//! simulator, which refuses a missing or malformed one in Bedrock's validation words) and the
//! batch discount charged, a SIGKILL between create and persisting the job ARN, a create
//! answered by a dropped connection, a throttled create, an expired job's partial results, a
//! job under the service's minimum failing validation, a batch under the configured minimum
//! held rather than sent, `provider check` and `config check`. The simulator's counters span
//! restarts, so `batches_created` proves no second job.

use std::collections::BTreeSet;
use std::path::Path;
use std::time::{Duration, Instant};

use commitpoint::simulator::{Dialect, Faults, S3Access, Simulator, SimulatorConfig};
use serde_json::{Value, json};

use crate::moto::{ACCESS_KEY_ID, Moto, SECRET_ACCESS_KEY};
use crate::provider::{
    CORPUS, SETTLE, assert_all_committed_with_model_findings, assert_report_counts, assert_submitted, counter, finish,
    health, intake_corpus, settle,
};
use crate::providers_e2e::{
    Answered, ONE_BATCH, Pricing, SimRig, a_dropped_create_is_looked_up_not_repeated,
    a_job_cut_short_requeues_what_it_did_not_answer, assert_charged, killed_after_the_create_the_job_is_found_again,
};
use crate::util::{cli_with_env, run_to_end, stderr, stdout, temp_dir};

pub(crate) const IN_BUCKET: &str = "cp-batch-in";
const OUT_BUCKET: &str = "cp-batch-out";
const ROLE: &str = "arn:aws:iam::123456789012:role/commitpoint-batch";
pub(crate) const MODEL: &str = "anthropic.claude-3-5-haiku-20241022-v1:0";

/// The shared rig on the simulator's Bedrock dialect, with the S3 it reads and writes.
pub(crate) struct BedrockRig {
    pub(crate) moto: Moto,
    rig: SimRig,
}

impl BedrockRig {
    /// The simulator's minimum is lowered to 1 and so is the provider's (an account whose
    /// quota was adjusted) unless `extra` sets `min_records` itself.
    pub(crate) async fn start(complete_after: Duration, faults: Faults, extra: &str) -> BedrockRig {
        let moto = Moto::start(&[IN_BUCKET, OUT_BUCKET]).await;
        let config = SimulatorConfig {
            dialect: Dialect::Bedrock,
            api_key: Some(ACCESS_KEY_ID.into()),
            complete_after,
            faults: Faults { bedrock_min_records: 1, ..faults },
            s3: Some(S3Access {
                endpoint: moto.endpoint.clone(),
                access_key_id: ACCESS_KEY_ID.into(),
                secret_access_key: SECRET_ACCESS_KEY.into(),
            }),
            ..SimulatorConfig::default()
        };
        let mut rig = SimRig::start(config, "bedrock", |sim, _| section(sim, &moto, extra)).await;
        for (name, value) in aws_env() {
            rig = rig.with_env(name, value);
        }
        BedrockRig { moto, rig }
    }
}

impl std::ops::Deref for BedrockRig {
    type Target = SimRig;

    fn deref(&self) -> &SimRig {
        &self.rig
    }
}

/// The standard chain's first link: fake keys in the environment, never in the config.
pub(crate) fn aws_env() -> [(&'static str, &'static str); 3] {
    [
        ("AWS_ACCESS_KEY_ID", ACCESS_KEY_ID),
        ("AWS_SECRET_ACCESS_KEY", SECRET_ACCESS_KEY),
        ("AWS_EC2_METADATA_DISABLED", "true"),
    ]
}

fn section(sim: &Simulator, moto: &Moto, extra: &str) -> String {
    let min = if extra.contains("min_records") { "" } else { "min_records = 1\n" };
    format!(
        "[providers.bedrock]\nkind = \"bedrock\"\nregion = \"us-east-1\"\nmodel = \"{MODEL}\"\nrole_arn = \"{ROLE}\"\n\
         input_s3_uri = \"s3://{IN_BUCKET}/commitpoint/in/\"\noutput_s3_uri = \"s3://{OUT_BUCKET}/commitpoint/out/\"\n\
         endpoint = \"{}\"\ns3_endpoint = \"{}\"\n{min}{extra}\n",
        sim.base_url(),
        moto.endpoint
    )
}

/// The records commitpoint wrote to S3, checked field by field against the documented
/// contract: `{recordId, modelInput}`, Claude's Messages body with Bedrock's
/// `anthropic_version`, no `model`, and the forced tool of the Anthropic adapter.
async fn assert_records_follow_the_contract(moto: &Moto, ids: &BTreeSet<String>) {
    let keys = moto.keys(IN_BUCKET, "commitpoint/in/").await;
    assert_eq!(keys.len(), 1, "one input file per job: {keys:?}");
    assert!(keys[0].starts_with("commitpoint/in/commitpoint-cpb-") && keys[0].ends_with("/records.jsonl"), "{keys:?}");
    let text = moto.object(IN_BUCKET, &keys[0]).await;
    let mut seen = BTreeSet::new();
    for line in text.lines() {
        let record: Value = serde_json::from_str(line).expect("a JSON record");
        let fields: BTreeSet<&str> = record.as_object().expect("object").keys().map(String::as_str).collect();
        assert_eq!(fields, BTreeSet::from(["modelInput", "recordId"]), "{record:#}");
        seen.insert(record["recordId"].as_str().expect("recordId").to_string());
        let input = &record["modelInput"];
        assert_eq!(input["anthropic_version"], json!("bedrock-2023-05-31"), "{input:#}");
        assert!(input.get("model").is_none(), "Bedrock names the model in the job: {input:#}");
        assert!(input["max_tokens"].as_u64().is_some_and(|n| n > 0), "{input:#}");
        assert_eq!(input["tool_choice"]["type"], json!("tool"), "{input:#}");
        assert_eq!(input["tool_choice"]["name"], input["tools"][0]["name"], "{input:#}");
        // Only what Bedrock documents for Claude: `disable_parallel_tool_use` is refused for
        // Claude 3 models ("extraneous key … is not permitted", anthropic-sdk-python#739).
        let choice: BTreeSet<&str> =
            input["tool_choice"].as_object().expect("object").keys().map(String::as_str).collect();
        assert_eq!(choice, BTreeSet::from(["name", "type"]), "{input:#}");
        assert_eq!(input["tools"][0]["input_schema"]["type"], json!("object"), "{input:#}");
        assert_eq!(input["messages"][0]["role"], json!("user"), "{input:#}");
    }
    assert_eq!(&seen, ids, "one record per extraction, keyed by its id");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bedrock_commits_the_corpus_once_through_s3_with_signed_calls() {
    let prices = format!(
        "[[prices]]\nprovider = \"bedrock\"\nmodel = \"{MODEL}\"\ninput_per_mtok = 800\noutput_per_mtok = 4000\n"
    );
    let rig = BedrockRig::start(Duration::from_millis(300), Faults::default(), &prices).await;
    let server = rig.serve(ONE_BATCH, None);
    let api = server.api();
    let ids = intake_corpus(&api).await;

    assert_all_committed_with_model_findings(&api).await;
    let records = settle(&api, &ids).await;
    assert!(records.values().all(|r| r["attempts"] == json!(1)), "{records:#?}");
    let stats = rig.stats();
    assert_submitted(&stats, &ids, 1);
    assert_eq!(stats.batches_created, 1, "{stats:#?}");
    assert_eq!(stats.lines_completed, CORPUS.len() as u64, "each extraction billed once: {stats:#?}");
    assert_records_follow_the_contract(&rig.moto, &ids).await;
    // Bedrock wrote the output and the manifest under {prefix}/{job id}/; once ingested,
    // the output records are deleted (their answers are in the store), the manifest stays.
    let deadline = Instant::now() + SETTLE;
    let out = loop {
        let out = rig.moto.keys(OUT_BUCKET, "commitpoint/out/").await;
        if !out.iter().any(|k| k.ends_with("/records.jsonl.out")) {
            break out;
        }
        assert!(Instant::now() < deadline, "the ingested output was never deleted: {out:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(out.len(), 1, "{out:?}");
    let manifest: Value = serde_json::from_str(&rig.moto.object(OUT_BUCKET, &out[0]).await).expect("manifest JSON");
    assert_eq!(manifest["successRecordCount"], json!(CORPUS.len()), "{manifest:#}");
    assert!(manifest["inputTokenCount"].as_u64().is_some_and(|n| n > 0), "{manifest:#}");

    let health = health(&api).await;
    assert_eq!(health["name"], json!("bedrock"), "{health:#}");
    assert_eq!(counter(&health, "lines_ingested"), CORPUS.len() as u64, "{health:#}");
    // $800 and $4000 per million tokens is 800 and 4000 micros a token, on demand.
    assert_charged(&api, &ids, "bedrock", (800, 4000), Pricing::Batch).await;

    let report = finish(server);
    assert_report_counts(&report, CORPUS.len(), &[&format!("committed: {}", CORPUS.len())]);
}

/// Killed after the create, before the job ARN was stored: the restart finds the job by
/// its name (and a repeated create would carry the same clientRequestToken anyway).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bedrock_kill_after_create_before_the_arn_is_stored_finds_the_job() {
    let rig = BedrockRig::start(Duration::from_millis(500), Faults::default(), "").await;
    killed_after_the_create_the_job_is_found_again(&rig).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bedrock_create_answered_by_a_dropped_connection_makes_no_second_job() {
    let faults = Faults { drop_after_create_next: 1, ..Faults::default() };
    let rig = BedrockRig::start(Duration::from_millis(300), faults, "").await;
    a_dropped_create_is_looked_up_not_repeated(&rig).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bedrock_throttling_is_waited_out_then_the_job_runs() {
    let faults = Faults { rate_limit_next: 2, ..Faults::default() };
    let rig = BedrockRig::start(Duration::from_millis(300), faults, "").await;
    let server = rig.serve(ONE_BATCH, None);
    let api = server.api();
    let ids = intake_corpus(&api).await;

    assert_all_committed_with_model_findings(&api).await;
    let stats = rig.stats();
    assert_eq!((stats.rate_limited, stats.batches_created), (2, 1), "{stats:#?}");
    assert_submitted(&stats, &ids, 1);
    let health = health(&api).await;
    assert_eq!(counter(&health, "rate_limited"), 2, "{health:#}");
    assert!(health["last_error"].as_str().is_some_and(|e| e.contains("ThrottlingException")), "{health:#}");
    let report = finish(server);
    assert_report_counts(&report, CORPUS.len(), &[&format!("committed: {}", CORPUS.len())]);
}

/// `Expired` is a job that was scheduled but never began before its timeout (service model
/// `ModelInvocationJobStatus`): nothing ran, so every record goes back to the queue and
/// commits once from the next job.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bedrock_expired_job_never_ran_and_is_requeued_whole() {
    let faults = Faults { expire_batches: true, ..Faults::default() };
    let rig = BedrockRig::start(Duration::from_millis(300), faults, "").await;
    let then = Faults { bedrock_min_records: 1, ..Faults::default() };
    a_job_cut_short_requeues_what_it_did_not_answer(&rig, "bedrock", then, Answered::Nothing).await;
}

/// Records missing from a `PartiallyCompleted` job (its timeout came while it ran: "not
/// all of your records could be processed in time"): those it answered commit from it,
/// the missing ones go back to the queue and commit once from the next job.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bedrock_records_missing_from_a_partially_completed_job_are_requeued() {
    let faults = Faults { partial_batches: true, ..Faults::default() };
    let rig = BedrockRig::start(Duration::from_millis(300), faults, "").await;
    let then = Faults { bedrock_min_records: 1, ..Faults::default() };
    a_job_cut_short_requeues_what_it_did_not_answer(&rig, "bedrock", then, Answered::FirstHalf).await;
}

/// Waits (bounded) until every one of `ids` has failed; returns their records.
pub(crate) async fn all_failed(api: &crate::util::Api, ids: &BTreeSet<String>, within: Duration) -> Vec<Value> {
    let deadline = Instant::now() + within;
    loop {
        let mut records = Vec::new();
        for id in ids {
            records.push(api.record(id).await);
        }
        if records.iter().all(|r| r["state"] == json!("failed")) {
            return records;
        }
        assert!(Instant::now() < deadline, "not all failed within {within:?}: {records:#?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// With Bedrock's default minimum of 100 records, six wait for more (said in the provider's
/// health), never sent as a job the service would refuse; once `min_batch_wait` is over
/// they fail `transient`, naming the minimum, and nothing was uploaded or created.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bedrock_work_under_the_minimum_waits_then_fails_naming_it() {
    let rig =
        BedrockRig::start(Duration::from_millis(300), Faults::default(), "min_records = 100\nmin_batch_wait = \"4s\"")
            .await;
    let server = rig.serve(ONE_BATCH, None);
    let api = server.api();
    let ids = intake_corpus(&api).await;
    let deadline = Instant::now() + SETTLE;
    let waiting = loop {
        let now = health(&api).await;
        // Intakes are looked at as they come: the note counts all six once they are in.
        if now["waiting_for_minimum"]
            .as_str()
            .is_some_and(|w| w.contains("6 extractions") && w.contains("at least 100"))
        {
            break now;
        }
        assert!(Instant::now() < deadline, "never said it waits for the minimum: {now:#}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert!(waiting["waiting_for_minimum"].as_str().is_some_and(|w| w.contains("min_batch_wait")), "{waiting:#}");
    for id in &ids {
        assert_eq!(api.record(id).await["state"], json!("pending"), "waiting work stays pending");
    }
    for record in all_failed(&api, &ids, SETTLE).await {
        assert_eq!(record["failure_class"], json!("transient"), "{record:#}");
        let reason = record["failure_reason"].as_str().unwrap_or_default();
        assert!(reason.contains("takes at least 100 in one job"), "{record:#}");
    }
    let stats = rig.stats();
    assert_eq!(stats.batches_created, 0, "no job under the minimum: {stats:#?}");
    assert!(rig.moto.keys(IN_BUCKET, "commitpoint/").await.is_empty(), "nothing uploaded either");
    assert!(health(&api).await["waiting_for_minimum"].is_null(), "the note goes with the work");
    let report = finish(server);
    assert_report_counts(&report, CORPUS.len(), &[&format!("failed: {}", CORPUS.len())]);
}

/// Work under the minimum is not sent on its own: later work joins it, and one job of
/// the minimum's size goes out with both.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bedrock_later_work_joins_work_under_the_minimum() {
    let rig = BedrockRig::start(Duration::from_millis(300), Faults::default(), "min_records = 6").await;
    let server = rig.serve(ONE_BATCH, None);
    let api = server.api();
    let (first, second) = CORPUS.split_at(3);
    let mut ids = BTreeSet::new();
    for source in first {
        ids.insert(api.create(crate::provider::TENANT, source.id, source.content).await);
    }
    // Past the batch wait (2 s): three are still waiting, for three more.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(rig.stats().batches_created, 0, "{:#?}", rig.stats());
    let waiting = health(&api).await;
    assert!(waiting["waiting_for_minimum"].as_str().is_some_and(|w| w.contains("3 extractions")), "{waiting:#}");
    for source in second {
        ids.insert(api.create(crate::provider::TENANT, source.id, source.content).await);
    }
    let records = settle(&api, &ids).await;
    assert!(records.values().all(|r| r["state"] == json!("committed")), "{records:#?}");
    let stats = rig.stats();
    assert_eq!(stats.batches_created, 1, "one job with all six: {stats:#?}");
    assert!(stats.submissions_per_custom_id.values().all(|n| *n == 1), "{stats:#?}");
    finish(server);
}

/// Sent anyway (the provider's `min_records` set below the account's real quota), a job
/// under Bedrock's minimum fails validation in the simulator as at the service, naming both
/// counts. A failure that blames no record counts each member's attempt, so the job is not
/// re-created for ever: after `max_attempts` the members fail `attempts_exhausted` with
/// Bedrock's reason, and `/healthz` counts the failed jobs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bedrock_job_failing_validation_every_time_ends_its_members_after_max_attempts() {
    let rig = BedrockRig::start(Duration::from_millis(300), Faults::default(), "\n[scheduler]\nmax_attempts = 2").await;
    rig.sim.set_faults(Faults::default());
    assert_eq!(Faults::default().bedrock_min_records, 100, "the simulator's default is Bedrock's quota");
    let server = rig.serve(ONE_BATCH, None);
    let api = server.api();
    let ids = intake_corpus(&api).await;
    for record in all_failed(&api, &ids, SETTLE).await {
        assert_eq!(record["failure_class"], json!("attempts_exhausted"), "{record:#}");
        let reason = record["failure_reason"].as_str().unwrap_or_default();
        assert!(reason.contains("less than the minimum required (100)"), "Bedrock's reason is kept: {record:#}");
        assert_eq!(record["attempts"], json!(2), "{record:#}");
    }
    let stats = rig.stats();
    assert_eq!(stats.batches_created, 2, "one job per attempt, then no more: {stats:#?}");
    let now = health(&api).await;
    assert_eq!(counter(&now, "batches_failed"), 2, "{now:#}");
    assert!(now["last_error"].as_str().is_some_and(|e| e.contains("minimum required")), "{now:#}");
    finish(server);
}

fn provider_check(dir: &Path, rig: &BedrockRig, env: &[(&str, &str)]) -> std::process::Output {
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_commitpoint"));
    cmd.args(["provider", "check", "--config", rig.config_path()]).current_dir(dir);
    cmd.env("COMMITPOINT_LOG", "warn").env_remove("AWS_ACCESS_KEY_ID").env_remove("AWS_SECRET_ACCESS_KEY");
    for (name, value) in env {
        cmd.env(name, value);
    }
    run_to_end(cmd)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bedrock_provider_check_and_config_check() {
    let rig = BedrockRig::start(Duration::from_millis(300), Faults::default(), "").await;
    let dir = temp_dir();
    let out = provider_check(dir.path(), &rig, &aws_env());
    assert_eq!(out.status.code(), Some(0), "{}\n{}", stdout(&out), stderr(&out));
    assert!(stdout(&out).contains("accepted"), "{}", stdout(&out));
    let wrong =
        [("AWS_ACCESS_KEY_ID", "AKIAWRONGKEY"), ("AWS_SECRET_ACCESS_KEY", "x"), ("AWS_EC2_METADATA_DISABLED", "true")];
    let out = provider_check(dir.path(), &rig, &wrong);
    assert_eq!(out.status.code(), Some(1), "{}", stdout(&out));
    assert!(stdout(&out).contains("UnrecognizedClientException"), "{}", stdout(&out));
    assert_eq!(rig.stats().batches_created, 0, "a check creates no job");

    let out = cli_with_env(&["config", "check", "--config", rig.config_path()], &aws_env());
    let text = stdout(&out);
    assert_eq!(out.status.code(), Some(0), "{text}\n{}", stderr(&out));
    assert!(text.contains("kind = \"bedrock\""), "{text}");
    assert!(text.contains(&format!("role_arn = \"{ROLE}\"")), "{text}");
    assert!(!text.contains(SECRET_ACCESS_KEY), "no credential is ever printed: {text}");
}
