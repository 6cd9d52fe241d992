//! What the real provider APIs refuse, commitpoint never sends: the simulator checks every
//! batch line's `response_format` the way OpenAI's strict mode does (and refuses it per
//! line, as the real API does), so these runs fail if a view strays from the allowlist.

use std::collections::BTreeSet;

use commitpoint::domain::identity::{ExtractionId, SourceHash};
use commitpoint::simulator::Faults;
use serde_json::{Value, json};

use crate::provider::{CORPUS, Rig, TENANT, assert_findings, corpus_ids, expected_id, settle};
use crate::util::{run_to_end, serve_command, stderr, stop_and_verify, temp_dir};

const PLUS: &str = "review-plus@1";

/// A schema a user would write: optional fields, and keywords strict mode refuses
/// (`minLength`, `maxLength`, `uniqueItems`, an unsupported `format`).
fn review_plus() -> Value {
    json!({
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "type": "object",
        "required": ["findings"],
        "properties": {"findings": {
            "type": "array",
            "uniqueItems": true,
            "items": {
                "type": "object",
                "required": ["rule", "severity", "file", "line", "summary"],
                "properties": {
                    "rule": {"type": "string", "minLength": 1, "maxLength": 64},
                    "severity": {"enum": ["low", "medium", "high", "critical"]},
                    "file": {"type": "string", "minLength": 1},
                    "line": {"type": "integer", "minimum": 1},
                    "summary": {"type": "string", "maxLength": 500},
                    "fix": {"type": "string", "maxLength": 200},
                    "reviewer": {"type": "string", "format": "email"},
                    "link": {"type": "string", "format": "uri"}
                }
            }
        }},
        "x-commitpoint-identity": ["/rule", "/file", "/line"]
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batches_carry_only_what_strict_mode_accepts_and_optional_nulls_read_as_absent() {
    let rig = Rig::start(std::time::Duration::from_millis(50), Faults::default()).await;
    let schemas = temp_dir();
    std::fs::write(schemas.path().join(format!("{PLUS}.json")), review_plus().to_string()).expect("write schema");
    let schema_dir = schemas.path().display().to_string();
    let server = rig.serve(&["--schema-dir", &schema_dir], None);
    let api = server.api();

    // The built-in schema (it carries minLength) and the custom one, side by side.
    crate::provider::intake_corpus(&api).await;
    let mut plus_ids = BTreeSet::new();
    for source in CORPUS {
        let reply = api
            .post(
                "/v1/extractions",
                &json!({"tenant": TENANT, "source_id": source.id, "schema": PLUS, "content": source.content}),
            )
            .await;
        assert_eq!(reply.status, 201, "{:#}", reply.body);
        let hash = SourceHash::compute(source.content.as_bytes(), PLUS);
        plus_ids.insert(ExtractionId::compute(TENANT, source.id, &hash, PLUS).to_hex());
    }
    let records = settle(&api, &plus_ids).await;
    for (id, record) in &records {
        assert_eq!(record["state"], "committed", "{id}: {record:#}");
    }
    let stats = rig.stats();
    assert_eq!(stats.lines_failed, 0, "the simulator refused lines: {stats:#?}");
    for id in &plus_ids {
        let body = api.findings(id).await;
        for finding in body["findings"].as_array().expect("findings") {
            // The model sent `fix`, `reviewer` and `link` as null (strict mode makes every
            // property required); the registered schema says they are optional strings.
            for absent in ["fix", "reviewer", "link"] {
                assert!(finding.get(absent).is_none(), "{absent} kept: {finding:#}");
            }
        }
    }
    let builtin = settle(&api, &corpus_ids()).await;
    for source in CORPUS {
        let id = expected_id(source);
        assert_eq!(builtin[&id]["state"], "committed", "{}: {:#}", source.id, builtin[&id]);
        assert_findings(&api, source, &id).await;
    }
    stop_and_verify(server);
}

fn write_patterned(dir: &std::path::Path) {
    let schema = json!({
        "type": "object",
        "properties": {"findings": {"type": "array", "items": {"type": "object", "properties": {
            "key": {"type": "string"},
            "labels": {"type": "object", "patternProperties": {"^x-": {"type": "string"}}}
        }}}},
        "x-commitpoint-identity": ["/key"]
    });
    std::fs::write(dir.join("labels@1.json"), schema.to_string()).expect("write schema");
}

#[test]
fn a_schema_no_configured_provider_can_take_stops_serve_and_config_check() {
    let schemas = temp_dir();
    write_patterned(schemas.path());
    let schema_dir = schemas.path().display().to_string();
    let dir = temp_dir();
    let args = ["--schema-dir", schema_dir.as_str(), "--provider", "simulator"];
    let mut serve = serve_command(dir.path(), &args);
    serve.env("COMMITPOINT_LOG", "warn");
    let check = {
        let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_commitpoint"));
        cmd.args(["config", "check", "--data-dir", &dir.path().display().to_string()]).args(args);
        cmd
    };
    for (what, out) in [("serve", run_to_end(serve)), ("config check", run_to_end(check))] {
        let text = stderr(&out);
        assert_eq!(out.status.code(), Some(78), "{what}:\n{text}");
        for needle in
            ["labels@1.json", "/properties/findings/items/properties/labels", "patternProperties", "simulator"]
        {
            assert!(text.contains(needle), "{what} does not name {needle}:\n{text}");
        }
    }
    // Without a provider the schema is fine: external workers validate against it locally.
    let workers = temp_dir();
    let mut check = std::process::Command::new(env!("CARGO_BIN_EXE_commitpoint"));
    check.args(["config", "check", "--data-dir", &workers.path().display().to_string(), "--schema-dir", &schema_dir]);
    let out = run_to_end(check);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
}

#[test]
fn config_check_says_how_each_schema_is_adapted_per_provider() {
    let dir = temp_dir();
    let mut check = std::process::Command::new(env!("CARGO_BIN_EXE_commitpoint"));
    check.args(["config", "check", "--data-dir", &dir.path().display().to_string(), "--provider", "simulator"]);
    let out = run_to_end(check);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("# schema code-review@1 -> simulator (openai-strict): adapted:"), "{text}");
    assert!(text.contains("/properties/findings/items/properties/rule: dropped `minLength`"), "{text}");
}

/// The embedded simulator (`--provider simulator`) keeps nothing across a restart of
/// `serve`: a batch it was running when the process died is unknown to the new one. The
/// scheduler takes the first 404 as the job gone and requeues its members at once, saying
/// so once, instead of polling a job nobody has for ten minutes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_the_embedded_simulator_forgot_in_a_restart_is_requeued_at_once() {
    let dir = temp_dir();
    let args = ["--provider", "simulator", "--batch-max-wait", "200ms", "--poll-interval", "100ms"];
    let mut first = crate::util::Server::start_with_env(
        dir.path(),
        &args,
        &[("COMMITPOINT_FAILPOINTS", "after-job-id-before-poll")],
    );
    let id = first.api().create("acme", "PR-1", "fn main() { x.unwrap() }").await;
    crate::providers_e2e::expect_crash(&mut first, "after-job-id-before-poll");
    let restarted = crate::util::Server::start_with_env(dir.path(), &args, &[]);
    let ids = std::collections::BTreeSet::from([id]);
    // On PostgreSQL the restarted instance first waits for its predecessor's lease to lapse (10 s).
    let records = crate::provider::settle_within(&restarted.api(), &ids, std::time::Duration::from_secs(30)).await;
    assert!(records.values().all(|r| r["state"] == "committed"), "{records:#?}");
    assert!(records.values().all(|r| r["attempts"] == 2), "the forgotten job cost one attempt: {records:#?}");
    let (exit, log) = restarted.terminate();
    assert_eq!(exit.code(), Some(0), "{log}");
    let forgotten = log.lines().filter(|l| l.contains("class=Gone")).count();
    assert_eq!(forgotten, 1, "said once, not at every poll:\n{log}");
}
