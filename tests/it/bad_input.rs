//! Every malformed request gets a JSON error with a stable code and the right status,
//! and none of them leaves anything behind in the database.

use reqwest::Method;
use serde_json::{Value, json};

use crate::util::{SCHEMA, Server, intake_body, stop_and_verify, temp_dir};

const LIMIT: usize = 2048;

fn intake_with(field: &str, value: Value) -> Vec<u8> {
    let mut body = intake_body("acme", "src-1", "some content");
    body[field] = value;
    body.to_string().into_bytes()
}

fn intake_without(field: &str) -> Vec<u8> {
    let mut body = intake_body("acme", "src-1", "some content");
    body.as_object_mut().map(|o| o.remove(field));
    body.to_string().into_bytes()
}

fn claim_with(field: &str, value: Value) -> Vec<u8> {
    let mut body = json!({"worker": "w", "limit": 1, "lease_seconds": 30});
    body[field] = value;
    body.to_string().into_bytes()
}

struct Case {
    what: &'static str,
    method: Method,
    path: String,
    body: Option<Vec<u8>>,
    status: u16,
    code: &'static str,
}

fn case(
    what: &'static str,
    method: Method,
    path: &str,
    body: Option<Vec<u8>>,
    status: u16,
    code: &'static str,
) -> Case {
    Case { what, method, path: path.to_string(), body, status, code }
}

fn intake_cases() -> Vec<Case> {
    let post =
        |what, body: Vec<u8>, status, code| case(what, Method::POST, "/v1/extractions", Some(body), status, code);
    let mut invalid_utf8 = br#"{"tenant":"acme","source_id":"s","schema":"code-review@1","content":""#.to_vec();
    invalid_utf8.extend_from_slice(&[0xff, 0xfe, 0x80]);
    invalid_utf8.extend_from_slice(br#""}"#);
    vec![
        post("truncated JSON", br#"{"tenant": "acme","#.to_vec(), 400, "malformed_json"),
        post("empty body", Vec::new(), 400, "malformed_json"),
        post("not JSON at all", b"tenant=acme".to_vec(), 400, "malformed_json"),
        post("invalid UTF-8", invalid_utf8, 400, "malformed_json"),
        post("missing content", intake_without("content"), 422, "invalid_input"),
        post("missing tenant", intake_without("tenant"), 422, "invalid_input"),
        post("content is a number", intake_with("content", json!(5)), 422, "invalid_input"),
        post("unknown field", intake_with("colour", json!("red")), 422, "invalid_input"),
        post("array body", b"[]".to_vec(), 422, "invalid_input"),
        post("unknown schema", intake_with("schema", json!("nope@1")), 422, "unknown_schema"),
        post("badly named schema", intake_with("schema", json!("Code Review")), 422, "unknown_schema"),
        post("tenant with a space", intake_with("tenant", json!("acme corp")), 422, "invalid_input"),
        post("tenant too long", intake_with("tenant", json!("t".repeat(129))), 422, "invalid_input"),
        post("empty tenant", intake_with("tenant", json!("")), 422, "invalid_input"),
        post("empty content", intake_with("content", json!("")), 422, "invalid_input"),
        post("empty source_id", intake_with("source_id", json!("")), 422, "invalid_input"),
        post("source_id over 1024 bytes", intake_with("source_id", json!("s".repeat(1025))), 422, "invalid_input"),
        post("control character in source_id", intake_with("source_id", json!("a\nb")), 422, "invalid_input"),
        post(
            "bidi override in source_id",
            intake_with("source_id", json!("invoice\u{202E}fdp.exe")),
            422,
            "invalid_input",
        ),
        post("bidi isolate in source_id", intake_with("source_id", json!("a\u{2067}b")), 422, "invalid_input"),
        post("line separator in source_id", intake_with("source_id", json!("a\u{2028}b")), 422, "invalid_input"),
        post("metadata not an object", intake_with("metadata", json!([1, 2])), 422, "invalid_input"),
        post(
            "body over --max-body-bytes",
            intake_with("content", json!("x".repeat(2 * LIMIT))),
            413,
            "payload_too_large",
        ),
    ]
}

fn id_and_route_cases() -> Vec<Case> {
    let unknown = "0".repeat(64);
    let upper = "A".repeat(64);
    let long = "a".repeat(65);
    let result = Some(br#"{"lease_token":"t","output":{"findings":[]}}"#.to_vec());
    vec![
        case("id not hex", Method::GET, "/v1/extractions/not-an-id", None, 400, "invalid_id"),
        case("id upper-case hex", Method::GET, &format!("/v1/extractions/{upper}"), None, 400, "invalid_id"),
        case("id too long", Method::GET, &format!("/v1/extractions/{long}"), None, 400, "invalid_id"),
        case("findings, bad id", Method::GET, "/v1/extractions/xyz/findings", None, 400, "invalid_id"),
        case("result, bad id", Method::POST, "/v1/extractions/xyz/result", result.clone(), 400, "invalid_id"),
        case("retry, bad id", Method::POST, "/v1/extractions/xyz/retry", None, 400, "invalid_id"),
        case("unknown id", Method::GET, &format!("/v1/extractions/{unknown}"), None, 404, "not_found"),
        case(
            "findings, unknown id",
            Method::GET,
            &format!("/v1/extractions/{unknown}/findings"),
            None,
            404,
            "not_found",
        ),
        case(
            "result, unknown id",
            Method::POST,
            &format!("/v1/extractions/{unknown}/result"),
            result,
            404,
            "not_found",
        ),
        case("unknown state", Method::GET, "/v1/extractions?state=bogus", None, 400, "invalid_query"),
        case("limit not a number", Method::GET, "/v1/extractions?limit=abc", None, 400, "invalid_query"),
        case("cursor not a cursor", Method::GET, "/v1/extractions?after=xyz", None, 400, "invalid_cursor"),
        case("unknown query parameter", Method::GET, "/v1/extractions?colour=red", None, 400, "invalid_query"),
        case("limit zero", Method::GET, "/v1/extractions?limit=0", None, 422, "invalid_input"),
        case("limit too large", Method::GET, "/v1/extractions?limit=1001", None, 422, "invalid_input"),
        case("bad tenant filter", Method::GET, "/v1/extractions?tenant=a%20b", None, 422, "invalid_input"),
        // Issue 43, item 8: this one answered axum's plain text.
        case("schema name not UTF-8", Method::GET, "/v1/schemas/%FF%FE", None, 400, "invalid_path"),
        case("unknown route", Method::GET, "/nope", None, 404, "not_found"),
        case("root", Method::GET, "/", None, 404, "not_found"),
        case("unknown sub-resource", Method::GET, &format!("/v1/extractions/{unknown}/nope"), None, 404, "not_found"),
        case("DELETE the collection", Method::DELETE, "/v1/extractions", None, 405, "method_not_allowed"),
        case("PUT a record", Method::PUT, &format!("/v1/extractions/{unknown}"), None, 405, "method_not_allowed"),
        case("GET claims", Method::GET, "/v1/claims", None, 405, "method_not_allowed"),
        case(
            "GET a result",
            Method::GET,
            &format!("/v1/extractions/{unknown}/result"),
            None,
            405,
            "method_not_allowed",
        ),
        case("POST healthz", Method::POST, "/healthz", None, 405, "method_not_allowed"),
    ]
}

fn claim_cases() -> Vec<Case> {
    let post = |what, body: Vec<u8>, status, code| case(what, Method::POST, "/v1/claims", Some(body), status, code);
    vec![
        post("claim limit zero", claim_with("limit", json!(0)), 422, "invalid_input"),
        post("claim limit too large", claim_with("limit", json!(1001)), 422, "invalid_input"),
        post("lease zero", claim_with("lease_seconds", json!(0)), 422, "invalid_input"),
        post("lease over a day", claim_with("lease_seconds", json!(86_401)), 422, "invalid_input"),
        post("negative lease", claim_with("lease_seconds", json!(-1)), 422, "invalid_input"),
        post("empty worker", claim_with("worker", json!("")), 422, "invalid_input"),
        post("claim unknown schema", claim_with("schema", json!("nope@1")), 422, "unknown_schema"),
        post("claim malformed", b"{".to_vec(), 400, "malformed_json"),
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_requests_get_json_errors_and_leave_no_trace() {
    let dir = temp_dir();
    let limit = LIMIT.to_string();
    let server = Server::start_with(dir.path(), &["--max-body-bytes", &limit]);
    let api = server.api();

    let cases = [intake_cases(), id_and_route_cases(), claim_cases()].into_iter().flatten();
    let mut failures = Vec::new();
    for c in cases {
        let reply = api.send(c.method.clone(), &c.path, c.body).await;
        let message_ok = reply.body["error"]["message"].as_str().is_some_and(|m| !m.is_empty());
        if reply.status != c.status || reply.error_code() != c.code || !message_ok {
            failures.push(format!(
                "{}: {} {} → expected {} {}, got {} {}",
                c.what, c.method, c.path, c.status, c.code, reply.status, reply.body
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));

    // Invalid input names the offending field.
    let reply = api.post("/v1/extractions", &intake_body("acme corp", "s", "c")).await;
    assert_eq!(reply.body["error"]["details"]["field"], json!("tenant"));

    let health = api.get("/healthz").await;
    assert_eq!(health.status, 200);
    assert_eq!(health.body["status"], json!("ok"));
    assert!(api.list_all("").await.is_empty(), "bad input created rows");
    let report = stop_and_verify(server);
    assert!(report.contains("extractions: 0"), "{report}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn body_limit_is_configurable() {
    let dir = temp_dir();
    let server = Server::start_with(dir.path(), &["--max-body-bytes", "1024"]);
    let api = server.api();
    let small = api.intake("acme", "small", &"x".repeat(512)).await;
    assert_eq!(small.status, 201, "{:#}", small.body);
    let big = api.intake("acme", "big", &"x".repeat(1024)).await;
    big.assert_error(413, "payload_too_large");
    let listed = api.list_all("").await;
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0]["source_id"], json!("small"));
    assert_eq!(listed[0]["schema"], json!(SCHEMA));
}

/// Issue 43, items 7 and 8: docs/API.md allows whole numbers written `225.0` or `1e3`, but
/// estimates and evaluations refused them; and an evaluation could be named `.` or `..`,
/// names its own URL (`/v1/evaluations/{name}`) cannot reach.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn estimates_and_evaluations_take_whole_floats_and_evaluations_refuse_dot_names() {
    let dir = temp_dir();
    let config = dir.path().join("config.toml");
    std::fs::write(&config, "[providers.sim]\nkind = \"simulator\"\n").expect("write config");
    let server = Server::start_with(&dir.path().join("data"), &["--config", config.to_str().expect("utf-8")]);
    let api = server.api();
    let id = api.create("acme", "src/a.rs", "fn a() {}").await;

    let estimate = |sources: Value| {
        let mut body = json!({"tenant": "acme", "schema": SCHEMA});
        body.as_object_mut().expect("object").extend(sources.as_object().expect("object").clone());
        body
    };
    for sources in [json!({"count": 3.0, "bytes": 1e3}), json!({"items": [{"source_id": "a", "bytes": 225.0}]})] {
        let reply = api.post("/v1/estimates", &estimate(sources.clone())).await;
        assert_eq!(reply.status, 200, "{sources}: {:#}", reply.body);
    }
    api.post("/v1/estimates", &estimate(json!({"count": 2.5, "bytes": 1e3}))).await.assert_error(422, "invalid_input");
    let retried = api.post("/v1/admin/retry", &json!({"tenant": "acme", "limit": 5.0})).await;
    assert_eq!(retried.status, 200, "{:#}", retried.body);

    let evaluation = |name: &str, select: Value| json!({"name": name, "schema": SCHEMA, "select": select, "candidates": ["sim"], "budget_micros": 1e6});
    for name in [".", ".."] {
        let reply = api.post("/v1/evaluations", &evaluation(name, json!({"ids": [id]}))).await;
        reply.assert_error(422, "invalid_input");
        assert_eq!(reply.body["error"]["details"]["field"], json!("name"), "{name}: {:#}", reply.body);
    }
    let reply =
        api.post("/v1/evaluations", &evaluation("floats", json!({"sample": 1.0, "seed": 7e0, "state": "any"}))).await;
    assert!(reply.status == 200 || reply.status == 201, "{:#}", reply.body);
    assert_eq!(reply.body["budget_micros"], json!(1_000_000), "{:#}", reply.body);
    let listed = api.get("/v1/evaluations").await;
    let names: Vec<&str> =
        listed.body["evaluations"].as_array().expect("evaluations").iter().filter_map(|e| e["name"].as_str()).collect();
    assert_eq!(names, ["floats"], "{:#}", listed.body);
    stop_and_verify(server);
}
