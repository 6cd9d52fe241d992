//! The no-key trial path with a custom schema: the simulated model answers in the shape of
//! whatever schema the request carries, not only `code-review@1`, so a `--schema-dir`
//! schema commits with findings grounded in the source.

use std::collections::BTreeSet;

use commitpoint::domain::identity::{ExtractionId, SourceHash};
use commitpoint::simulator::Faults;
use serde_json::json;

use crate::provider::{CORPUS, Rig, TENANT, settle};
use crate::util::{stop_and_verify, temp_dir};

const EVIDENCE: &str = "evidence@1";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_custom_schema_commits_on_the_simulator_with_findings_from_the_source() {
    let schema = json!({
        "type": "object",
        "required": ["findings"],
        "additionalProperties": false,
        "properties": {"findings": {"type": "array", "items": {
            "type": "object",
            "additionalProperties": false,
            "required": ["kind", "quote", "line"],
            "properties": {
                "kind": {"enum": ["bug", "smell", "risk"]},
                "quote": {"type": "string", "minLength": 1, "maxLength": 200},
                "line": {"type": "integer", "minimum": 1},
                "note": {"type": "string"}
            }
        }}},
        "x-commitpoint-identity": ["/kind", "/line"]
    });
    let rig = Rig::start(std::time::Duration::from_millis(50), Faults::default()).await;
    let schemas = temp_dir();
    std::fs::write(schemas.path().join(format!("{EVIDENCE}.json")), schema.to_string()).expect("write schema");
    let schema_dir = schemas.path().display().to_string();
    let server = rig.serve(&["--schema-dir", &schema_dir], None);
    let api = server.api();
    let mut ids = BTreeSet::new();
    for source in CORPUS {
        let reply = api
            .post(
                "/v1/extractions",
                &json!({"tenant": TENANT, "source_id": source.id, "schema": EVIDENCE, "content": source.content}),
            )
            .await;
        assert_eq!(reply.status, 201, "{:#}", reply.body);
        let hash = SourceHash::compute(source.content.as_bytes(), EVIDENCE);
        ids.insert(ExtractionId::compute(TENANT, source.id, &hash, EVIDENCE).to_hex());
    }
    let records = settle(&api, &ids).await;
    for (id, record) in &records {
        assert_eq!(record["state"], "committed", "{id}: {record:#}");
    }
    for source in CORPUS {
        let hash = SourceHash::compute(source.content.as_bytes(), EVIDENCE);
        let id = ExtractionId::compute(TENANT, source.id, &hash, EVIDENCE).to_hex();
        let body = api.findings(&id).await;
        let findings = body["findings"].as_array().expect("findings");
        assert!(!findings.is_empty(), "{}: {body:#}", source.id);
        for finding in findings {
            let finding = finding.get("body").unwrap_or(finding);
            let line = finding["line"].as_u64().expect("line") as usize;
            let quoted = source.content.lines().nth(line - 1).expect("a line of the source").trim();
            assert_eq!(finding["quote"], quoted, "{}: {finding:#}", source.id);
        }
    }
    assert_eq!(rig.stats().lines_failed, 0);
    stop_and_verify(server);
}
