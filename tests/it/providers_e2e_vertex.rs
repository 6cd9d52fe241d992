//! `[providers.vertex] kind = "vertex"` through the real binary against the simulator's
//! Vertex AI dialect over a REAL Cloud Storage (gcp-storage-emulator on loopback), with a
//! service-account key file whose `token_uri` is the simulator's token endpoint, so the
//! whole OAuth JWT-bearer flow runs: the corpus committed once with the input lines checked
//! field by field; a create answered by a dropped connection; a SIGKILL between create and persisting the job name, found again by its
//! label; a request over the input limit coming back as a per-line `status` and failing
//! `invalid_request` after one job; an expired job requeued whole; a job that ends `JOB_STATE_FAILED` every time ending its
//! members after `max_attempts`; a job Vertex pauses kept (shown in `/healthz`, never
//! requeued) and committed once it resumes; `provider check` (the model asked through
//! `:countTokens`, an unknown one named) and `config check`. Without a key file, tokens come
//! from the metadata server `GCE_METADATA_HOST` names (the simulator's), and one that cannot
//! be reached fails `provider check` naming it.

use std::collections::BTreeSet;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use commitpoint::simulator::{Dialect, Faults, SimulatorConfig};
use serde_json::{Value, json};

use crate::gcs_emulator::Gcs;
use crate::provider::assert_corpus_committed_once;
use crate::provider::{
    CORPUS, SETTLE, assert_all_committed_with_model_findings, assert_report_counts, counter, finish, health,
    intake_corpus, settle,
};
use crate::providers_e2e::{
    Answered, ONE_BATCH, SimRig, a_dropped_create_is_looked_up_not_repeated,
    a_job_cut_short_requeues_what_it_did_not_answer, a_request_over_the_input_limit_fails_alone, assert_billed_by,
    killed_after_the_create_the_job_is_found_again,
};
use crate::util::{cli, run_to_end, stderr, stdout};

const IN_BUCKET: &str = "cp-vertex-in";
const OUT_BUCKET: &str = "cp-vertex-out";
const PROJECT: &str = "commitpoint-test";
const LOCATION: &str = "us-central1";
const MODEL: &str = "gemini-2.5-flash";

/// The shared rig on the simulator's Vertex dialect, with the Cloud Storage it reads and
/// writes.
struct VertexRig {
    gcs: Gcs,
    rig: SimRig,
    /// `host:port` of the simulator's metadata server, for a rig without a key file.
    metadata_host: Option<String>,
}

/// Where the service account's tokens come from.
#[derive(Clone, Copy, PartialEq)]
enum Auth {
    KeyFile,
    MetadataServer,
}

/// A service-account key file as the console hands it out, with a fresh RSA key (PKCS#8,
/// made by openssl) and the simulator's token endpoint as `token_uri`.
fn key_file(dir: &Path, token_uri: &str) -> String {
    let pem = dir.join("sa.pem");
    let made = Command::new("openssl")
        .args(["genpkey", "-algorithm", "RSA", "-pkeyopt", "rsa_keygen_bits:2048", "-out"])
        .arg(&pem)
        .output()
        .expect("run openssl");
    assert!(made.status.success(), "openssl genpkey: {}", String::from_utf8_lossy(&made.stderr));
    let key = json!({
        "type": "service_account",
        "project_id": PROJECT,
        "private_key_id": "0123456789abcdef",
        "private_key": std::fs::read_to_string(&pem).expect("read the key"),
        "client_email": format!("batch@{PROJECT}.iam.gserviceaccount.com"),
        "client_id": "100000000000000000001",
        "token_uri": token_uri,
    });
    let path = dir.join("service-account.json");
    std::fs::write(&path, key.to_string()).expect("write the key file");
    path.display().to_string()
}

impl VertexRig {
    async fn start(complete_after: Duration, faults: Faults, extra: &str) -> VertexRig {
        Self::start_with(complete_after, faults, extra, Auth::KeyFile).await
    }

    async fn start_with(complete_after: Duration, faults: Faults, extra: &str, auth: Auth) -> VertexRig {
        let gcs = Gcs::start(&[IN_BUCKET, OUT_BUCKET]).await;
        let config = SimulatorConfig {
            dialect: Dialect::Vertex,
            complete_after,
            faults,
            gcs_endpoint: Some(gcs.endpoint.clone()),
            ..SimulatorConfig::default()
        };
        let gcs_endpoint = gcs.endpoint.clone();
        let mut rig = SimRig::start(config, "vertex", |sim, dir| {
            let credentials = match auth {
                Auth::KeyFile => format!("credentials_file = \"{}\"\n", key_file(dir, &format!("{}/token", sim.origin()))),
                Auth::MetadataServer => String::new(),
            };
            format!(
                "[providers.vertex]\nkind = \"vertex\"\nproject = \"{PROJECT}\"\nlocation = \"{LOCATION}\"\nmodel = \"{MODEL}\"\n\
                 input_gcs_uri = \"gs://{IN_BUCKET}/commitpoint/in/\"\noutput_gcs_uri = \"gs://{OUT_BUCKET}/commitpoint/out/\"\n\
                 {credentials}endpoint = \"{}\"\ngcs_endpoint = \"{gcs_endpoint}\"\n{extra}\n",
                sim.base_url(),
            )
        })
        .await;
        let metadata_host =
            (auth == Auth::MetadataServer).then(|| rig.sim.origin().trim_start_matches("http://").to_string());
        if let Some(host) = &metadata_host {
            rig = rig.with_env("GCE_METADATA_HOST", host.clone());
        }
        VertexRig { gcs, rig, metadata_host }
    }
}

impl std::ops::Deref for VertexRig {
    type Target = SimRig;

    fn deref(&self) -> &SimRig {
        &self.rig
    }
}

/// The input commitpoint wrote to Cloud Storage, checked against the documented line:
/// `{"key", "request"}` with a `GenerateContentRequest` asking for JSON under the schema.
async fn assert_input_follows_the_contract(gcs: &Gcs, ids: &BTreeSet<String>) {
    let names = gcs.names(IN_BUCKET, "commitpoint/in/").await;
    assert_eq!(names.len(), 1, "one input file per job: {names:?}");
    assert!(
        names[0].starts_with("commitpoint/in/commitpoint-cpb-") && names[0].ends_with("/requests.jsonl"),
        "{names:?}"
    );
    let text = gcs.object(IN_BUCKET, &names[0]).await;
    let mut seen = BTreeSet::new();
    for line in text.lines() {
        let value: Value = serde_json::from_str(line).expect("a JSON line");
        let fields: BTreeSet<&str> = value.as_object().expect("object").keys().map(String::as_str).collect();
        assert_eq!(fields, BTreeSet::from(["key", "request"]), "{value:#}");
        seen.insert(value["key"].as_str().expect("key").to_string());
        let request = &value["request"];
        assert_eq!(request["contents"][0]["role"], json!("user"), "{request:#}");
        assert_eq!(request["generationConfig"]["responseMimeType"], json!("application/json"), "{request:#}");
        assert!(request["generationConfig"]["responseJsonSchema"].is_object(), "{request:#}");
        assert!(request["systemInstruction"]["parts"][0]["text"].is_string(), "{request:#}");
        // The key again in the request's labels, in two halves (a label value is at most 63).
        let halves = ["commitpoint_key_a", "commitpoint_key_b"].map(|l| request["labels"][l].as_str().unwrap_or(""));
        assert_eq!(halves.concat(), value["key"].as_str().unwrap_or("-"), "{request:#}");
    }
    assert_eq!(&seen, ids, "one line per extraction, keyed by its id");
}

/// Run where the service keeps the input line's `key` beside the request (the other reading
/// of the docs; every other Vertex test drops it): the lines are matched by it as well as by
/// the labels.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn vertex_commits_the_corpus_once_through_gcs_with_oauth() {
    let prices = format!(
        "[[prices]]\nprovider = \"vertex\"\nmodel = \"{MODEL}\"\ninput_per_mtok = 300\noutput_per_mtok = 2500\n"
    );
    let faults = Faults { vertex_echoes_key: true, ..Faults::default() };
    let rig = VertexRig::start(Duration::from_millis(300), faults, &prices).await;
    let server = rig.serve(ONE_BATCH, None);
    let api = server.api();
    let ids = intake_corpus(&api).await;

    let stats = assert_corpus_committed_once(&api, &ids, || rig.stats()).await;
    assert_eq!(stats.batches_created, 1, "{stats:#?}");
    // Once ingested, the input and the predictions are deleted from the buckets.
    let deadline = Instant::now() + SETTLE;
    loop {
        let left = rig.gcs.names(OUT_BUCKET, "commitpoint/out/").await;
        if left.is_empty() {
            break;
        }
        assert!(Instant::now() < deadline, "the ingested predictions were never deleted: {left:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let health = health(&api).await;
    assert_eq!(counter(&health, "lines_ingested"), CORPUS.len() as u64, "{health:#}");
    assert_eq!(counter(&health, "malformed_lines"), 0, "{health:#}");
    assert_billed_by(&api, &ids, "vertex").await;
    for id in &ids {
        let costs = api.get(&format!("/v1/extractions/{id}/costs")).await;
        let attempt = &costs.body["attempts"][0];
        assert!(attempt["input_tokens"].as_u64().is_some_and(|n| n > 0), "usageMetadata read: {attempt:#}");
        assert!(attempt["output_tokens"].as_u64().is_some_and(|n| n > 0), "{attempt:#}");
    }
    let report = finish(server);
    assert_report_counts(&report, CORPUS.len(), &[&format!("committed: {}", CORPUS.len())]);
}

/// Vertex names jobs under the project *number* whatever id the caller used (the
/// simulator does too), and a job killed while it runs is polled again under that name
/// after the restart: one job, each member sent and committed once, nothing submitted anew.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn vertex_a_job_named_under_the_project_number_commits_once_across_a_sigkill_while_it_runs() {
    let rig = VertexRig::start(Duration::from_secs(3), Faults::default(), "").await;
    let mut server = rig.serve(ONE_BATCH, None);
    let ids = intake_corpus(&server.api()).await;
    // Polled means the job's name came back, was accepted and stored.
    rig.wait_stats("the job polled", |s| s.batches_created == 1 && s.polls >= 1).await;
    server.kill9();
    let report = crate::util::assert_verifies(&rig.db());
    assert_report_counts(&report, CORPUS.len(), &[&format!("submitted: {}", CORPUS.len())]);

    let server = rig.serve(ONE_BATCH, None);
    let api = server.api();
    assert_all_committed_with_model_findings(&api).await;
    settle(&api, &ids).await;
    let stats = rig.stats();
    assert_eq!(stats.batches_created, 1, "the job was polled again, not made again: {stats:#?}");
    crate::provider::assert_submitted(&stats, &ids, 1);
    let health = health(&api).await;
    assert_eq!(counter(&health, "batches_submitted"), 0, "{health:#}");
    assert_eq!(counter(&health, "malformed_lines"), 0, "every line matched by its labels: {health:#}");
    assert_billed_by(&api, &ids, "vertex").await;
    let report = finish(server);
    assert_report_counts(&report, CORPUS.len(), &[&format!("committed: {}", CORPUS.len())]);
}

/// The input file is checked before it is deleted: a run that never ingests (the job
/// outlives the test's look) leaves it in place.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn vertex_input_lines_carry_the_key_and_a_gemini_request() {
    let rig = VertexRig::start(Duration::from_secs(600), Faults::default(), "").await;
    let server = rig.serve(ONE_BATCH, None);
    let api = server.api();
    let ids = intake_corpus(&api).await;
    let deadline = Instant::now() + SETTLE;
    while rig.stats().batches_created == 0 {
        assert!(Instant::now() < deadline, "no job was created: {:#?}", rig.stats());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_input_follows_the_contract(&rig.gcs, &ids).await;
    finish(server);
}

/// Killed after the create, before the job name was stored: the restart lists jobs by the
/// batch key's label and polls the one it finds; no second job is created.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn vertex_kill_after_create_before_the_job_name_is_stored_finds_the_job_by_label() {
    let rig = VertexRig::start(Duration::from_millis(500), Faults::default(), "").await;
    killed_after_the_create_the_job_is_found_again(&rig).await;
}

/// A create answered by a dropped connection (the job exists, the answer is lost): the
/// lookup by label finds it, and no second job is made; a throttled call before it is
/// waited out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn vertex_create_answered_by_a_dropped_connection_makes_no_second_job() {
    let faults = Faults { drop_after_create_next: 1, rate_limit_next: 1, ..Faults::default() };
    let rig = VertexRig::start(Duration::from_millis(300), faults, "").await;
    let stats = a_dropped_create_is_looked_up_not_repeated(&rig).await;
    assert_eq!(stats.rate_limited, 1, "{stats:#?}");
    assert!(stats.batches_listed >= 1, "looked up by label: {stats:#?}");
}

/// A job that ends `JOB_STATE_EXPIRED` wrote nothing: every member goes back to the queue
/// and commits once from the next job, its attempt counted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn vertex_expired_job_is_requeued_whole_and_commits_once() {
    let faults = Faults { expire_batches: true, ..Faults::default() };
    let rig = VertexRig::start(Duration::from_millis(300), faults, "").await;
    a_job_cut_short_requeues_what_it_did_not_answer(&rig, "vertex", Faults::default(), Answered::Nothing).await;
}

/// A request over the model's input limit comes back as a prediction line whose `status`
/// is Google's `INVALID_ARGUMENT` error, in a job that succeeds: it fails `invalid_request`
/// after one job, never retried; the rest commit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn vertex_a_line_with_an_invalid_argument_status_fails_after_one_job() {
    let faults = Faults { max_input_tokens: 5_000, ..Faults::default() };
    let rig = VertexRig::start(Duration::from_millis(200), faults, "").await;
    let reason = a_request_over_the_input_limit_fails_alone(&rig).await;
    assert!(reason.contains("INVALID_ARGUMENT") && reason.contains("exceeds the maximum"), "{reason}");
}

/// A job that ends `JOB_STATE_FAILED` names no request: each member's attempt is counted,
/// so after `max_attempts` the members fail `attempts_exhausted` with Vertex's reason,
/// and `/healthz` counts the failed jobs; no third job is made.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn vertex_job_failing_every_time_ends_its_members_after_max_attempts() {
    let faults = Faults { fail_batch_validation: true, ..Faults::default() };
    let rig = VertexRig::start(Duration::from_millis(200), faults, "\n[scheduler]\nmax_attempts = 2").await;
    let server = rig.serve(ONE_BATCH, None);
    let api = server.api();
    let ids = intake_corpus(&api).await;
    let deadline = Instant::now() + SETTLE;
    let records = loop {
        let mut records = Vec::new();
        for id in &ids {
            records.push(api.record(id).await);
        }
        if records.iter().all(|r| r["state"] == json!("failed")) {
            break records;
        }
        assert!(Instant::now() < deadline, "not all failed: {records:#?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    for record in records {
        assert_eq!(record["failure_class"], json!("attempts_exhausted"), "{record:#}");
        let reason = record["failure_reason"].as_str().unwrap_or_default();
        assert!(reason.contains("fail_batch_validation"), "Vertex's reason is kept: {record:#}");
        assert_eq!(record["attempts"], json!(2), "{record:#}");
    }
    let stats = rig.stats();
    assert_eq!(stats.batches_created, 2, "one job per attempt, then no more: {stats:#?}");
    let now = health(&api).await;
    assert_eq!(counter(&now, "batches_failed"), 2, "{now:#}");
    finish(server);
}

/// `JOB_STATE_PAUSED`: "stopped, and can be resumed", by someone else (the v1 API has no
/// resume call for batch prediction jobs). The job is kept and polled, its members stay
/// with it (no second job, nothing requeued), and `/healthz` says it is paused and what to
/// do; once resumed it ends and its answers commit once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn vertex_paused_job_is_kept_and_shown_then_commits_once_resumed() {
    let faults = Faults { pause_jobs: true, ..Faults::default() };
    let rig = VertexRig::start(Duration::from_millis(200), faults, "").await;
    let server = rig.serve(ONE_BATCH, None);
    let api = server.api();
    let ids = intake_corpus(&api).await;
    let deadline = Instant::now() + SETTLE;
    let shown = loop {
        let now = health(&api).await;
        if now["last_error"].as_str().is_some_and(|e| e.contains("JOB_STATE_PAUSED")) {
            break now;
        }
        assert!(Instant::now() < deadline, "the pause was never shown: {now:#}\n{:#?}", rig.stats());
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert!(shown["last_error"].as_str().is_some_and(|e| e.contains("resume it, or cancel it")), "{shown:#}");
    // Polled on while paused, with nothing requeued or resubmitted.
    let polls = rig.stats().polls;
    while rig.stats().polls < polls + 3 {
        assert!(Instant::now() < deadline, "polling stopped: {:#?}", rig.stats());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    for id in &ids {
        let record = api.record(id).await;
        assert_eq!(record["state"], json!("submitted"), "{record:#}");
    }
    assert_eq!(rig.stats().batches_created, 1);

    rig.sim.set_faults(Faults::default());
    let records = settle(&api, &ids).await;
    assert_all_committed_with_model_findings(&api).await;
    assert!(records.values().all(|r| r["attempts"] == json!(1)), "{records:#?}");
    let stats = rig.stats();
    assert_eq!(stats.batches_created, 1, "{stats:#?}");
    assert_eq!(stats.lines_completed, CORPUS.len() as u64, "each answered once: {stats:#?}");
    // The pause is over: /healthz no longer shows it as the provider's trouble.
    let after = health(&api).await;
    assert!(after["last_error"].is_null(), "{after:#}");
    let report = finish(server);
    assert_report_counts(&report, CORPUS.len(), &[&format!("committed: {}", CORPUS.len())]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn vertex_provider_check_and_config_check() {
    let rig = VertexRig::start(Duration::from_millis(300), Faults::default(), "").await;
    let check = |config: &str| {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_commitpoint"));
        cmd.args(["provider", "check", "--config", config]).current_dir(rig.dir.path()).env("COMMITPOINT_LOG", "warn");
        run_to_end(cmd)
    };
    // Another model missing changes nothing for the configured one.
    rig.sim.set_faults(Faults { missing_models: vec!["gemini-gone".to_string()], ..Faults::default() });
    let out = check(rig.config_path());
    assert_eq!(out.status.code(), Some(0), "{}\n{}", stdout(&out), stderr(&out));
    let verdict =
        "vertex / code-review@1: accepted (key and model); schema not checked: countTokens counts the request";
    assert!(stdout(&out).contains(verdict), "{}", stdout(&out));
    let stats = rig.stats();
    assert_eq!(stats.batches_created, 0, "a check creates no job");
    assert_eq!(stats.tokens_counted, 1, "the model was asked, through countTokens: {stats:#?}");

    // A model this project cannot use fails the check, named, in Vertex's words.
    let text = std::fs::read_to_string(rig.config_path()).expect("read config");
    let gone = rig.dir.path().join("gone.toml");
    std::fs::write(&gone, text.replace(&format!("model = \"{MODEL}\""), "model = \"gemini-gone\"")).expect("write");
    let out = check(&gone.display().to_string());
    let shown = stdout(&out);
    assert_eq!(out.status.code(), Some(1), "{shown}\n{}", stderr(&out));
    assert!(shown.contains("unknown model gemini-gone"), "{shown}");
    assert!(shown.contains("publishers/google/models/gemini-gone` was not found"), "{shown}");
    rig.sim.set_faults(Faults::default());

    // A token Vertex no longer accepts is refused in Google's words.
    rig.sim.set_faults(Faults { unauthorized_next: 1, ..Faults::default() });
    let out = check(rig.config_path());
    assert_eq!(out.status.code(), Some(1), "{}", stdout(&out));
    assert!(stdout(&out).contains("UNAUTHENTICATED"), "{}", stdout(&out));

    let text = std::fs::read_to_string(rig.config_path()).expect("read config");
    let out = cli(&["config", "check", "--config", rig.config_path()]);
    let shown = stdout(&out);
    assert_eq!(out.status.code(), Some(0), "{shown}\n{}", stderr(&out));
    assert!(shown.contains("kind = \"vertex\"") && shown.contains(&format!("project = \"{PROJECT}\"")), "{shown}");
    let key = std::fs::read_to_string(rig.dir.path().join("service-account.json")).expect("key");
    let private: Value = serde_json::from_str(&key).expect("key JSON");
    let pem = private["private_key"].as_str().expect("pem");
    let body = pem.lines().nth(1).expect("a PEM body line");
    assert!(!shown.contains(body), "the key never shows");

    // Settings Vertex would refuse stop the start with the rule (exit 78).
    let bad = rig.dir.path().join("bad.toml");
    std::fs::write(&bad, text.replace(&format!("project = \"{PROJECT}\""), "project = \"Not_A_Project\""))
        .expect("write");
    let out = cli(&["config", "check", "--config", &bad.display().to_string()]);
    assert_eq!(out.status.code(), Some(78), "{}\n{}", stdout(&out), stderr(&out));
    assert!(stderr(&out).contains("6-30"), "{}", stderr(&out));
    std::fs::write(&bad, text.replace("service-account.json", "missing.json")).expect("write");
    let out = cli(&["config", "check", "--config", &bad.display().to_string()]);
    assert_eq!(out.status.code(), Some(78), "{}\n{}", stdout(&out), stderr(&out));
    assert!(stderr(&out).contains("credentials_file"), "{}", stderr(&out));
}

/// No key file: the token comes from the metadata server `GCE_METADATA_HOST` names (the
/// simulator's), asked with `Metadata-Flavor: Google` and the `cloud-platform` scope, once
/// for the whole run (it lives an hour); every Vertex call is admitted on it, and the corpus
/// commits once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn vertex_without_a_key_file_takes_its_token_from_the_metadata_server() {
    let rig = VertexRig::start_with(Duration::from_millis(300), Faults::default(), "", Auth::MetadataServer).await;
    let server = rig.serve(ONE_BATCH, None);
    let api = server.api();
    let ids = intake_corpus(&api).await;

    let stats = assert_corpus_committed_once(&api, &ids, || rig.stats()).await;
    assert_eq!(stats.batches_created, 1, "{stats:#?}");
    assert_eq!(stats.metadata_refused, 0, "every token request said Metadata-Flavor: Google: {stats:#?}");
    assert_eq!(stats.metadata_tokens_issued, 1, "one token, kept while it lives: {stats:#?}");
    assert_eq!(stats.metadata_token_scopes.as_deref(), Some("https://www.googleapis.com/auth/cloud-platform"));
    assert!(
        stats.calls_with_metadata_tokens >= stats.batches_created + stats.polls,
        "the create and every poll carried the metadata server's token: {stats:#?}"
    );
    let report = finish(server);
    assert_report_counts(&report, CORPUS.len(), &[&format!("committed: {}", CORPUS.len())]);
}

/// `provider check` without a key file: through the simulator's metadata server it passes;
/// with `GCE_METADATA_HOST` on a closed port it fails naming the host and what to do; a
/// value that is no host stops `config check` with 78.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn vertex_provider_check_names_an_unreachable_metadata_server() {
    let rig = VertexRig::start_with(Duration::from_millis(300), Faults::default(), "", Auth::MetadataServer).await;
    let check = |host: &str| {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_commitpoint"));
        cmd.args(["provider", "check", "--config", rig.config_path()])
            .current_dir(rig.dir.path())
            .env("COMMITPOINT_LOG", "warn")
            .env("GCE_METADATA_HOST", host);
        run_to_end(cmd)
    };
    let reachable = rig.metadata_host.clone().expect("a metadata host");
    let out = check(&reachable);
    assert_eq!(out.status.code(), Some(0), "{}\n{}", stdout(&out), stderr(&out));
    assert!(stdout(&out).contains("vertex / code-review@1: accepted"), "{}", stdout(&out));
    assert_eq!(rig.stats().metadata_tokens_issued, 1, "{:#?}", rig.stats());

    let closed = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        listener.local_addr().expect("address").port()
    };
    let host = format!("127.0.0.1:{closed}");
    let out = check(&host);
    let shown = stdout(&out);
    assert_eq!(out.status.code(), Some(1), "{shown}\n{}", stderr(&out));
    assert!(shown.contains(&format!("metadata server at {host}")), "the host is named: {shown}");
    assert!(shown.contains("credentials_file"), "says what to do: {shown}");
    assert_eq!(rig.stats().metadata_tokens_issued, 1, "nothing reached the simulator's: {:#?}", rig.stats());

    // A host that is not `host[:port]` is a configuration error: refused at start, named.
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_commitpoint"));
    cmd.args(["config", "check", "--config", rig.config_path()])
        .current_dir(rig.dir.path())
        .env("GCE_METADATA_HOST", "http://metadata.example/");
    let out = run_to_end(cmd);
    assert_eq!(out.status.code(), Some(78), "{}\n{}", stdout(&out), stderr(&out));
    assert!(stderr(&out).contains("GCE_METADATA_HOST \"http://metadata.example/\""), "{}", stderr(&out));
}

/// On a Compute Engine VM created with the default access scopes the metadata server's
/// token lacks `cloud-platform`, whatever scopes the client asks for (google-auth-library-
/// python #333 and #633: "On Compute Engine you can request custom scopes, but they are
/// ignored"), and every Vertex call is 403 `ACCESS_TOKEN_SCOPE_INSUFFICIENT`. `provider
/// check` fails quoting Google and says what to change on the VM.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn vertex_on_a_vm_without_the_cloud_platform_scope_provider_check_says_what_to_change() {
    let faults = Faults { vm_lacks_cloud_platform_scope: true, ..Faults::default() };
    let rig = VertexRig::start_with(Duration::from_millis(300), faults, "", Auth::MetadataServer).await;
    let host = rig.metadata_host.clone().expect("a metadata host");
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_commitpoint"));
    cmd.args(["provider", "check", "--config", rig.config_path()])
        .current_dir(rig.dir.path())
        .env("COMMITPOINT_LOG", "warn")
        .env("GCE_METADATA_HOST", &host);
    let out = run_to_end(cmd);
    let shown = stdout(&out);
    assert_eq!(out.status.code(), Some(1), "{shown}\n{}", stderr(&out));
    assert!(shown.contains("Request had insufficient authentication scopes"), "Google's words: {shown}");
    assert!(shown.contains("access scopes") && shown.contains("cloud-platform"), "what to change: {shown}");
    assert!(shown.contains("credentials_file"), "the other way out: {shown}");
    let stats = rig.stats();
    assert_eq!(stats.metadata_token_scopes.as_deref(), Some("https://www.googleapis.com/auth/cloud-platform"));
}
