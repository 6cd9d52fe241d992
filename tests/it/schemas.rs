//! `--schema-dir`: custom schemas are registered, enforced, and keyed by their declared
//! identity fields; a schema that cannot be used stops `serve` with a config error.

use std::path::Path;

use serde_json::{Value, json};

use crate::util::{Server, id_of, run_to_end, serve_command, stderr, stop_and_verify, temp_dir};

const EXIT_CONFIG: i32 = 78;

fn ticket_schema() -> Value {
    json!({
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "type": "object",
        "required": ["findings"],
        "properties": {
            "findings": {
                "type": "array",
                "items": {
                    "type": "object",
                    "required": ["category", "text"],
                    "properties": {
                        "category": {"enum": ["billing", "outage", "other"]},
                        "text": {"type": "string"}
                    }
                }
            }
        },
        "x-commitpoint-identity": ["/category"]
    })
}

fn write_schema(dir: &Path, file: &str, document: &str) {
    std::fs::write(dir.join(file), document).expect("write schema");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_custom_schema_is_accepted_validated_and_keyed_by_its_identity() {
    let schemas = temp_dir();
    write_schema(schemas.path(), "ticket@1.json", &ticket_schema().to_string());
    let dir = temp_dir();
    let schema_dir = schemas.path().to_str().expect("utf-8 path");
    let server = Server::start_with(dir.path(), &["--schema-dir", schema_dir]);
    let api = server.api();

    let health = api.get("/healthz").await;
    let names = health.body["schemas"].as_array().expect("schemas").clone();
    assert!(names.contains(&json!("ticket@1")), "{names:?}");
    assert!(names.contains(&json!("code-review@1")), "{names:?}");

    // A code-review extraction first, so the schema filter on claims has something to skip.
    api.create("acme", "PR-1", "diff").await;
    let mut ids = Vec::new();
    for source in ["TICKET-1", "TICKET-2"] {
        let reply = api
            .post(
                "/v1/extractions",
                &json!({"tenant": "acme", "source_id": source, "schema": "ticket@1",
                        "content": format!("customer writes about {source}")}),
            )
            .await;
        assert_eq!(reply.status, 201, "{:#}", reply.body);
        ids.push(id_of(&reply.body));
    }
    assert_eq!(api.record(&ids[0]).await["schema"], json!("ticket@1"));

    let claim = |n: u32| json!({"worker": "w", "limit": n, "lease_seconds": 60, "schema": "ticket@1"});
    let reply = api.post("/v1/claims", &claim(10)).await;
    assert_eq!(reply.status, 200, "{:#}", reply.body);
    let grants = reply.body["claims"].as_array().expect("claims").clone();
    assert_eq!(grants.len(), 2, "only the ticket extractions: {grants:#?}");
    assert!(grants.iter().all(|g| g["schema"] == json!("ticket@1")));
    let token_of = |id: &str| {
        grants
            .iter()
            .find(|g| g["extraction_id"] == json!(id))
            .and_then(|g| g["lease_token"].as_str())
            .expect("granted")
            .to_string()
    };

    // The custom schema is enforced: an unknown category fails validation.
    let bad = api
        .post_result(&ids[0], &token_of(&ids[0]), &json!({"findings": [{"category": "weather", "text": "sunny"}]}))
        .await;
    bad.assert_error(422, "validation_failed");
    assert_eq!(api.record(&ids[0]).await["failure_class"], json!("validation"));

    // Identity is the category alone: two texts in one category are one finding.
    let good = api
        .post_result(
            &ids[1],
            &token_of(&ids[1]),
            &json!({"findings": [
                {"category": "billing", "text": "charged twice"},
                {"category": "billing", "text": "double charge, reworded"},
                {"category": "outage", "text": "site down"}
            ]}),
        )
        .await;
    assert_eq!(good.status, 200, "{:#}", good.body);
    assert_eq!(good.body["findings"], json!(2));
    let findings = api.findings(&ids[1]).await;
    let mut categories: Vec<&str> =
        findings["findings"].as_array().expect("array").iter().filter_map(|f| f["category"].as_str()).collect();
    categories.sort_unstable();
    assert_eq!(categories, ["billing", "outage"]);
    stop_and_verify(server);
}

/// Runs `serve` expecting it to refuse to start; returns its stderr.
fn serve_refuses(schema_dir: &Path) -> String {
    let dir = temp_dir();
    let mut cmd = serve_command(dir.path(), &["--schema-dir", &schema_dir.display().to_string()]);
    cmd.env("COMMITPOINT_LOG", "warn");
    let out = run_to_end(cmd);
    let text = stderr(&out);
    assert_eq!(out.status.code(), Some(EXIT_CONFIG), "stderr:\n{text}");
    assert!(
        !String::from_utf8_lossy(&out.stdout).contains("listening"),
        "a refused start must not announce an address"
    );
    text
}

#[test]
fn a_schema_without_identity_fields_stops_serve() {
    let schemas = temp_dir();
    write_schema(schemas.path(), "ticket@1.json", &ticket_schema().to_string());
    let mut document = ticket_schema();
    document.as_object_mut().map(|o| o.remove("x-commitpoint-identity"));
    write_schema(schemas.path(), "survey@1.json", &document.to_string());
    let text = serve_refuses(schemas.path());
    assert!(text.contains("survey@1.json"), "names the file:\n{text}");
    assert!(text.contains("x-commitpoint-identity"), "says what is missing:\n{text}");
}

#[test]
fn an_unparsable_schema_file_stops_serve() {
    let schemas = temp_dir();
    write_schema(schemas.path(), "broken@1.json", "{ not json");
    let text = serve_refuses(schemas.path());
    assert!(text.contains("broken@1.json"), "names the file:\n{text}");
}

/// Identity fields may be objects; their canonical form must not depend on key order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_object_identity_field_is_canonical_whatever_its_key_order() {
    let schemas = temp_dir();
    let document = json!({
        "type": "object",
        "required": ["findings"],
        "x-commitpoint-identity": ["/where", "/kind"]
    });
    write_schema(schemas.path(), "spot@2.json", &document.to_string());
    let dir = temp_dir();
    let schema_dir = schemas.path().to_str().expect("utf-8 path");
    let server = Server::start_with(dir.path(), &["--schema-dir", schema_dir]);
    let api = server.api();
    let reply = api
        .post("/v1/extractions", &json!({"tenant": "t", "source_id": "s", "schema": "spot@2", "content": "c"}))
        .await;
    assert_eq!(reply.status, 201, "{:#}", reply.body);
    let id = id_of(&reply.body);
    let (_, token) = api.claim_one("w", 60).await;
    let body = format!(
        r#"{{"lease_token":"{token}","output":{{"findings":[
            {{"where":{{"file":"a","line":1}},"kind":"x","note":"first"}},
            {{"where":{{"line":1,"file":"a"}},"kind":"x","note":"second"}},
            {{"where":{{"line":1,"file":"a"}},"kind":"y","note":"other kind"}}]}}}}"#
    );
    let reply = api.send(reqwest::Method::POST, &format!("/v1/extractions/{id}/result"), Some(body.into_bytes())).await;
    assert_eq!(reply.status, 200, "{:#}", reply.body);
    assert_eq!(reply.body["findings"], json!(2));
    stop_and_verify(server);
}
