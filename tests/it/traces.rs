//! OpenTelemetry trace export from the real binary to a fake OTLP/HTTP collector (protobuf
//! `POST /v1/traces`, decoded with the project's own `opentelemetry-proto`): one trace per
//! extraction, the batch's provider calls linked both ways, nothing secret or sourced in an
//! attribute, everything flushed by SIGTERM, nothing sent with the switch off.

use std::collections::{BTreeSet, HashMap};
use std::process::Command;
use std::sync::{Arc, Mutex};

use commitpoint::simulator::Faults;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::{AnyValue, KeyValue, any_value};
use opentelemetry_proto::tonic::trace::v1::Span;
use prost::Message;

use crate::provider::{CORPUS, ONE_BATCH, Rig, SIM_KEY, TENANT, corpus_ids, settle};
use crate::util::{Server, serve_command};

/// What the collector was sent: every span, with its resource's `service.name`.
#[derive(Default)]
struct Received {
    requests: usize,
    spans: Vec<Span>,
    services: BTreeSet<String>,
}

async fn collector() -> (String, Arc<Mutex<Received>>) {
    let received: Arc<Mutex<Received>> = Arc::default();
    let log = Arc::clone(&received);
    let app = axum::Router::new().route(
        "/v1/traces",
        axum::routing::post(move |body: axum::body::Bytes| {
            let log = Arc::clone(&log);
            async move {
                let request = ExportTraceServiceRequest::decode(body).expect("an OTLP protobuf export request");
                let mut log = log.lock().expect("log");
                log.requests += 1;
                for resource in request.resource_spans {
                    let attributes = resource.resource.map(|r| r.attributes).unwrap_or_default();
                    if let Some(name) = string_attr(&attributes, "service.name") {
                        log.services.insert(name);
                    }
                    log.spans.extend(resource.scope_spans.into_iter().flat_map(|s| s.spans));
                }
                ([("content-type", "application/x-protobuf")], Vec::<u8>::new())
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind the collector");
    let url = format!("http://{}", listener.local_addr().expect("addr"));
    tokio::spawn(async move { axum::serve(listener, app).await });
    (url, received)
}

fn string_attr(attributes: &[KeyValue], key: &str) -> Option<String> {
    attributes.iter().find(|kv| kv.key == key).and_then(|kv| match &kv.value {
        Some(AnyValue { value: Some(any_value::Value::StringValue(s)) }) => Some(s.clone()),
        _ => None,
    })
}

/// Every string an attribute carries, however nested.
fn strings(value: &AnyValue, out: &mut Vec<String>) {
    match &value.value {
        Some(any_value::Value::StringValue(s)) => out.push(s.clone()),
        Some(any_value::Value::ArrayValue(a)) => a.values.iter().for_each(|v| strings(v, out)),
        Some(any_value::Value::KvlistValue(l)) => {
            l.values.iter().filter_map(|kv| kv.value.as_ref()).for_each(|v| strings(v, out))
        }
        _ => {}
    }
}

/// `serve` against the simulator with the OTLP environment cleared but for `env`.
fn serve(rig: &Rig, extra: &[&str], env: &[(&str, &str)]) -> Server {
    let base = rig.sim.base_url();
    let mut args = vec!["--provider", "openai", "--provider-base-url", &base, "--provider-key-env", "SIM_KEY"];
    args.extend_from_slice(&["--poll-interval", "100ms"]);
    args.extend_from_slice(ONE_BATCH);
    args.extend_from_slice(extra);
    let mut cmd: Command = serve_command(rig.dir.path(), &args);
    cmd.env("SIM_KEY", SIM_KEY).env_remove("COMMITPOINT_FAILPOINTS");
    for var in ["OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_HEADERS"] {
        cmd.env_remove(var);
    }
    cmd.envs(env.iter().copied());
    Server::spawn(cmd, rig.dir.path())
}

/// Submits the corpus, waits until all of it is committed, then stops the server with SIGTERM.
async fn run_corpus(server: Server) -> String {
    let api = server.api();
    for source in CORPUS {
        api.create(TENANT, source.id, source.content).await;
    }
    stop_once_committed(server).await
}

/// Waits until all of the corpus is committed, then stops the server with SIGTERM.
async fn stop_once_committed(server: Server) -> String {
    let api = server.api();
    let records = settle(&api, &corpus_ids()).await;
    assert!(records.values().all(|r| r["state"] == "committed"), "{records:#?}");
    // Off this thread: the collector answers the final flush on it.
    let (status, log) = tokio::task::spawn_blocking(move || server.terminate()).await.expect("terminate");
    assert_eq!(status.code(), Some(0), "SIGTERM: {log}");
    log
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[tokio::test]
async fn each_extraction_is_one_trace_from_intake_to_commit() {
    let (url, received) = collector().await;
    let rig = Rig::start(std::time::Duration::from_millis(100), Faults::default()).await;
    let config = rig.dir.path().join("config.toml");
    std::fs::write(&config, "[telemetry]\nservice_name = \"commitpoint-it\"\n").expect("config");
    let config = config.display().to_string();
    // The standard variable switches it on; the file names the service.
    let log = run_corpus(serve(&rig, &["--config", &config], &[("OTEL_EXPORTER_OTLP_ENDPOINT", &url)])).await;
    assert!(log.contains("trace export flushed"), "{log}");

    let received = received.lock().expect("log");
    assert!(received.requests > 0 && !received.spans.is_empty(), "nothing exported; log:\n{log}");
    assert_eq!(received.services, BTreeSet::from(["commitpoint-it".to_string()]));
    let by_id: HashMap<(String, String), &Span> =
        received.spans.iter().map(|s| ((hex(&s.trace_id), hex(&s.span_id)), s)).collect();

    for source in CORPUS {
        let id = crate::provider::expected_id(source);
        let (trace, root) = (&id[..32], &id[32..48]);
        let spans: Vec<&Span> = received.spans.iter().filter(|s| hex(&s.trace_id) == trace).collect();
        let named = |name: &str| spans.iter().copied().filter(|s| s.name == name).collect::<Vec<_>>();
        let names: Vec<&str> = spans.iter().map(|s| s.name.as_str()).collect();
        // The intake is the root, under the span id the identity gives it.
        let intake = named("intake");
        assert_eq!(intake.len(), 1, "{}: {names:?}", source.id);
        assert_eq!(hex(&intake[0].span_id), root, "{}", source.id);
        assert!(intake[0].parent_span_id.is_empty(), "{}: the intake is the root", source.id);
        assert_eq!(string_attr(&intake[0].attributes, "extraction").as_deref(), Some(id.as_str()));
        assert_eq!(string_attr(&intake[0].attributes, "outcome").as_deref(), Some("created"));
        assert_eq!(string_attr(&intake[0].attributes, "tenant").as_deref(), Some(TENANT));
        assert!(!intake[0].attributes.iter().any(|kv| kv.key == "commitpoint.root"), "the mark is taken off");
        // Everything else about it hangs under that root.
        for span in &spans {
            assert!(span.name == "intake" || hex(&span.parent_span_id) == root, "{}: {span:#?}", source.id);
        }
        let commit = named("commit");
        assert_eq!(commit.len(), 1, "{}: {names:?}", source.id);
        // Committed in the result file's own transaction: a valid answer, written.
        assert_eq!(string_attr(&commit[0].attributes, "verdict").as_deref(), Some("valid"));
        assert_eq!(string_attr(&commit[0].attributes, "outcome").as_deref(), Some("written"));
        // The provider call: the member's span links to the batch's submit, in the batch's
        // own trace, which links back to this extraction's root.
        let member = named("batch.member");
        assert_eq!(member.len(), 1, "{}: {names:?}", source.id);
        let link = member[0].links.first().expect("the member span links to the batch's submit");
        let submit = by_id.get(&(hex(&link.trace_id), hex(&link.span_id))).expect("the linked span was exported");
        assert_eq!(submit.name, "provider.submit");
        assert_ne!(hex(&submit.trace_id), trace, "the batch has a trace of its own");
        assert!(
            submit.links.iter().any(|l| hex(&l.trace_id) == trace && hex(&l.span_id) == root),
            "{}: the submit links to the member's root: {submit:#?}",
            source.id
        );
        let batch_key = string_attr(&member[0].attributes, "batch_key").expect("batch_key");
        assert_eq!(string_attr(&submit.attributes, "batch_key"), Some(batch_key));
        assert_eq!(string_attr(&commit[0].attributes, "job_id"), string_attr(&submit.attributes, "job_id"));
    }
    // The batch's trace is rooted at its formation and holds its polls and the results.
    let submit = received.spans.iter().find(|s| s.name == "provider.submit").expect("a submit");
    let batch: Vec<&Span> = received.spans.iter().filter(|s| s.trace_id == submit.trace_id).collect();
    let form = batch.iter().find(|s| s.name == "batch.form").expect("the formation span");
    assert!(form.parent_span_id.is_empty(), "{form:#?}");
    for name in ["provider.poll", "provider.results"] {
        let span = batch.iter().find(|s| s.name == name).unwrap_or_else(|| panic!("no {name}: {batch:#?}"));
        assert_eq!(span.parent_span_id, form.span_id, "{name}");
    }

    // Identities, names and counts only: no source text and no key in any attribute.
    for span in &received.spans {
        let mut values = Vec::new();
        span.attributes.iter().filter_map(|kv| kv.value.as_ref()).for_each(|v| strings(v, &mut values));
        for value in values {
            assert!(!value.contains(SIM_KEY), "{}: {value}", span.name);
            for source in CORPUS {
                for line in source.content.lines().filter(|l| l.trim().len() > 8) {
                    assert!(!value.contains(line.trim()), "{} carries source text: {value}", span.name);
                }
            }
        }
    }
}

#[tokio::test]
async fn nothing_is_sent_with_the_switch_off() {
    let (url, received) = collector().await;
    let rig = Rig::start(std::time::Duration::from_millis(100), Faults::default()).await;
    // The exporter crate reads this one too, but it is not one of our switches: still off.
    let traces = format!("{url}/v1/traces");
    let log = run_corpus(serve(&rig, &[], &[("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", &traces)])).await;
    assert!(!log.contains("exporting traces"), "{log}");
    let received = received.lock().expect("log");
    assert_eq!((received.requests, received.spans.len()), (0, 0));
}

#[tokio::test]
async fn a_workers_commit_lands_in_the_trace_of_its_extraction() {
    let (url, received) = collector().await;
    let dir = crate::util::temp_dir();
    let mut cmd = serve_command(dir.path(), &["--otlp-endpoint", &url]);
    cmd.env_remove("OTEL_EXPORTER_OTLP_ENDPOINT");
    let server = Server::spawn(cmd, dir.path());
    let api = server.api();
    let id = api.create(TENANT, "a.rs", "fn main() {}").await;
    let (claimed, token) = api.claim_one("w1", 60).await;
    assert_eq!(claimed, id);
    let output = crate::util::output(&[crate::util::finding("R1", "a.rs", 1, "unused")]);
    assert_eq!(api.post_result(&id, &token, &output).await.status, 200);
    let (status, log) = tokio::task::spawn_blocking(move || server.terminate()).await.expect("terminate");
    assert_eq!(status.code(), Some(0), "{log}");

    let received = received.lock().expect("log");
    let spans: Vec<&Span> = received.spans.iter().filter(|s| hex(&s.trace_id) == id[..32]).collect();
    let commit = spans.iter().find(|s| s.name == "commit").expect("a commit span");
    assert_eq!(hex(&commit.parent_span_id), id[32..48], "under the intake's root");
    assert_eq!(string_attr(&commit.attributes, "provider").as_deref(), Some("worker"));
    assert_eq!(string_attr(&commit.attributes, "outcome").as_deref(), Some("committed"));
    assert!(spans.iter().any(|s| s.name == "intake" && s.parent_span_id.is_empty()), "{spans:#?}");
}

/// Killed between the create and storing the job id, the restart's lookup finds the job
/// instead of sending it again. That lookup is a span of the batch's trace saying what it
/// found, linked to each member's root, and each member's trace gets a `batch.member` span
/// linked to it, as it would to a submit: the trace tells where the work went across the kill.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_found_again_after_a_kill_is_traced_from_its_lookup() {
    let (url, received) = collector().await;
    let rig = Rig::start(std::time::Duration::from_millis(300), Faults::default()).await;
    let point = "after-submit-before-job-id";
    let mut first = serve(&rig, &[], &[("OTEL_EXPORTER_OTLP_ENDPOINT", &url), ("COMMITPOINT_FAILPOINTS", point)]);
    let api = first.api();
    for source in CORPUS {
        api.create(TENANT, source.id, source.content).await;
    }
    let (status, stderr) = first.wait_exit(crate::provider::SETTLE).expect("the server reached the crash point");
    assert_eq!(std::os::unix::process::ExitStatusExt::signal(&status), Some(9), "{stderr}");
    assert_eq!(rig.stats().batches_created, 1);

    stop_once_committed(serve(&rig, &[], &[("OTEL_EXPORTER_OTLP_ENDPOINT", &url)])).await;
    assert_eq!(rig.stats().batches_created, 1, "found, not sent again");
    let received = received.lock().expect("log");
    let lookups: Vec<&Span> = received.spans.iter().filter(|s| s.name == "provider.lookup").collect();
    assert_eq!(lookups.len(), 1, "{lookups:#?}");
    let lookup = lookups[0];
    assert_eq!(string_attr(&lookup.attributes, "outcome").as_deref(), Some("found"), "{lookup:#?}");
    let job_id = string_attr(&lookup.attributes, "job_id").expect("the job it found");
    let batch_key = string_attr(&lookup.attributes, "batch_key").expect("batch_key");
    // In the batch's own trace, under its root: both derived from the batch key.
    let derived = blake3::hash(batch_key.as_bytes());
    assert_eq!(hex(&lookup.trace_id), hex(&derived.as_bytes()[..16]));
    assert_eq!(hex(&lookup.parent_span_id), hex(&derived.as_bytes()[16..24]));
    assert!(
        !received.spans.iter().any(|s| s.name == "provider.submit" && s.trace_id == lookup.trace_id),
        "the restart submitted nothing"
    );
    for source in CORPUS {
        let id = crate::provider::expected_id(source);
        let (trace, root) = (&id[..32], &id[32..48]);
        assert!(
            lookup.links.iter().any(|l| hex(&l.trace_id) == trace && hex(&l.span_id) == root),
            "{}: the lookup links to the member's root",
            source.id
        );
        // The killed process may have exported a member span of its own submit: the one
        // that matters is the one linked to the lookup.
        let member = received
            .spans
            .iter()
            .filter(|s| s.name == "batch.member" && hex(&s.trace_id) == trace)
            .find(|s| s.links.iter().any(|l| l.trace_id == lookup.trace_id && l.span_id == lookup.span_id))
            .unwrap_or_else(|| panic!("{}: no batch.member span linked to the lookup", source.id));
        assert_eq!(string_attr(&member.attributes, "job_id").as_deref(), Some(job_id.as_str()));
        let commit = received.spans.iter().find(|s| s.name == "commit" && hex(&s.trace_id) == trace);
        assert!(commit.is_some(), "{}: committed in its trace", source.id);
    }
}

/// An evaluation's trial batch is a trace of its own, rooted at its formation and named by
/// its evaluation, holding the submit, polls and results of its job; no production trace
/// gets a span of it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_evaluations_trial_batch_is_a_trace_of_its_own() {
    let (url, received) = collector().await;
    let rig = Rig::start(std::time::Duration::from_millis(100), Faults::default()).await;
    let server = serve(&rig, &[], &[("OTEL_EXPORTER_OTLP_ENDPOINT", &url)]);
    let api = server.api();
    for source in CORPUS {
        api.create(TENANT, source.id, source.content).await;
    }
    settle(&api, &corpus_ids()).await;
    let evaluation = serde_json::json!({"name": "bake", "schema": crate::util::SCHEMA,
        "select": {"sample": CORPUS.len(), "state": "committed", "seed": 1}, "candidates": ["openai"]});
    let created = api.post("/v1/evaluations", &evaluation).await;
    assert_eq!(created.status, 201, "{:#}", created.body);
    let deadline = std::time::Instant::now() + crate::provider::SETTLE;
    loop {
        let reply = api.get("/v1/evaluations/bake").await;
        if reply.body["state"] == "done" {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "the evaluation did not finish: {:#}", reply.body);
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    let (status, log) = tokio::task::spawn_blocking(move || server.terminate()).await.expect("terminate");
    assert_eq!(status.code(), Some(0), "{log}");

    let received = received.lock().expect("log");
    let forms: Vec<&Span> = received.spans.iter().filter(|s| s.name == "trial.form").collect();
    assert_eq!(forms.len(), 1, "one trial batch: {forms:#?}");
    let form = forms[0];
    assert!(form.parent_span_id.is_empty(), "the formation is the root: {form:#?}");
    assert_eq!(string_attr(&form.attributes, "evaluation").as_deref(), Some("bake"));
    let batch_key = string_attr(&form.attributes, "batch_key").expect("batch_key");
    let derived = blake3::hash(batch_key.as_bytes());
    assert_eq!(hex(&form.trace_id), hex(&derived.as_bytes()[..16]), "the trace is the trial batch key's");
    let trial: Vec<&Span> = received.spans.iter().filter(|s| s.trace_id == form.trace_id).collect();
    let submit = trial.iter().find(|s| s.name == "provider.submit").expect("the trial batch's submit");
    assert_eq!(string_attr(&submit.attributes, "evaluation").as_deref(), Some("bake"));
    assert_eq!(string_attr(&submit.attributes, "outcome").as_deref(), Some("submitted"));
    assert!(submit.links.is_empty(), "trials are no extraction's: nothing to link to");
    let job_id = string_attr(&submit.attributes, "job_id").expect("the job id");
    for name in ["provider.submit", "provider.poll", "provider.results"] {
        let span = trial.iter().find(|s| s.name == name).unwrap_or_else(|| panic!("no {name}: {trial:#?}"));
        assert_eq!(span.parent_span_id, form.span_id, "{name} under the formation");
        if name != "provider.submit" {
            assert_eq!(string_attr(&span.attributes, "job_id").as_deref(), Some(job_id.as_str()), "{name}");
        }
    }
    let polled = trial.iter().filter(|s| s.name == "provider.poll").count();
    assert!(polled >= 1, "{trial:#?}");
    // The production traces got nothing of it: one batch.member span each, from production.
    for source in CORPUS {
        let id = crate::provider::expected_id(source);
        let members =
            received.spans.iter().filter(|s| s.name == "batch.member" && hex(&s.trace_id) == id[..32]).count();
        assert_eq!(members, 1, "{}", source.id);
    }
}
