//! The Azure flavour's requests, field by field, against Azure OpenAI's documented batch
//! contract (learn.microsoft.com, "Getting started with Azure OpenAI batch deployments",
//! REST tab; docs/PROVIDERS.md "Azure OpenAI"), by a server that records what arrived.

use std::sync::{Arc, Mutex};

use axum::Router;
use axum::extract::{Multipart, Request, State};
use axum::http::HeaderMap;
use axum::routing::{get, post};
use serde_json::{Value, json};

use super::*;
use crate::domain::batch::BatchMember;
use crate::domain::identity::{ExtractionId, SourceHash};
use crate::domain::schema::{BUILTIN_CODE_REVIEW, Registry};

#[derive(Debug, Default)]
struct Seen {
    /// (method, path, query, `api-key`, `authorization`) of every request.
    requests: Vec<(String, String, String, String, String)>,
    upload_fields: Vec<(String, Option<String>, Vec<u8>)>,
    create_body: Option<Value>,
}

type Shared = Arc<Mutex<Seen>>;

fn header(headers: &HeaderMap, name: &str) -> String {
    headers.get(name).and_then(|v| v.to_str().ok()).unwrap_or("").to_string()
}

async fn record(
    State(seen): State<Shared>,
    request: Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    let uri = request.uri().clone();
    let headers = request.headers();
    seen.lock().unwrap().requests.push((
        request.method().to_string(),
        uri.path().to_string(),
        uri.query().unwrap_or("").to_string(),
        header(headers, "api-key"),
        header(headers, "authorization"),
    ));
    next.run(request).await
}

async fn upload(State(seen): State<Shared>, mut form: Multipart) -> axum::Json<Value> {
    while let Some(field) = form.next_field().await.unwrap() {
        let name = field.name().unwrap_or_default().to_string();
        let file_name = field.file_name().map(str::to_string);
        let bytes = field.bytes().await.unwrap().to_vec();
        seen.lock().unwrap().upload_fields.push((name, file_name, bytes));
    }
    // Azure's answer as the REST how-to shows it.
    axum::Json(json!({"status": "processed", "bytes": 817, "purpose": "batch", "filename": "x.jsonl",
        "expires_at": 1744607747, "id": "file-7733bc35e32841e297a62a9ee50b3461", "created_at": 1743398147, "object": "file"}))
}

/// A batch as Azure's dated API versions answer it: capitalised status, ISO timestamps.
fn batch(status: &str) -> Value {
    json!({"cancelled_at": null, "completion_window": "24h", "created_at": "2024-07-19T17:13:57.2491382+00:00",
        "error_file_id": null, "expires_at": "2024-07-20T17:13:57.1918498+00:00",
        "id": "batch_fe3f047a-de39-4068-9008-346795bfc1db", "input_file_id": "file-7733bc35e32841e297a62a9ee50b3461",
        "errors": null, "metadata": {"commitpoint_batch_key": "cpb-az"}, "object": "batch", "output_file_id": null,
        "request_counts": {"total": null, "completed": null, "failed": null}, "status": status})
}

async fn create(State(seen): State<Shared>, body: axum::Json<Value>) -> axum::Json<Value> {
    seen.lock().unwrap().create_body = Some(body.0);
    axum::Json(batch("Validating"))
}

async fn start(prefix: &str) -> (String, Shared) {
    let seen: Shared = Arc::default();
    let api = Router::new()
        .route("/files", post(upload))
        .route(
            "/batches",
            post(create).get(|| async {
                axum::Json(json!({"object": "list", "data": [batch("Completed")], "has_more": false}))
            }),
        )
        .route("/batches/{id}", get(|| async { axum::Json(batch("Completed")) }))
        .route("/deployments/{d}/chat/completions", post(|| async { axum::Json(json!({"choices": []})) }))
        .route("/chat/completions", post(|| async { axum::Json(json!({"choices": []})) }));
    let app = Router::new()
        .nest(prefix, api)
        .layer(axum::middleware::from_fn_with_state(seen.clone(), record))
        .with_state(seen.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (format!("http://{addr}"), seen)
}

fn options(endpoint: String, extra: &str) -> crate::app::config::AzureOptions {
    let text = format!("endpoint = \"{endpoint}\"\ndeployment = \"gpt-4o-batch\"\napi_key_env = \"K\"\n{extra}");
    let raw: crate::app::config::RawAzure = toml::from_str(&text).unwrap();
    raw.resolve().unwrap()
}

fn member(source: &str) -> BatchMember {
    let hash = SourceHash::compute(source.as_bytes(), BUILTIN_CODE_REVIEW);
    BatchMember {
        id: ExtractionId::compute("t", source, &hash, BUILTIN_CODE_REVIEW),
        source_id: source.into(),
        content: "x.unwrap()".into(),
        output_budget: None,
        previous_attempt: None,
    }
}

#[tokio::test]
async fn v1_api_sends_the_resource_key_the_deployment_and_the_file_expiry() {
    let (origin, seen) = start("/openai/v1").await;
    let provider = azure_adapter("az", &options(origin, "").target(), ApiKey::new("azure-key-1".into())).unwrap();
    let schema = Registry::builtin().get(BUILTIN_CODE_REVIEW).unwrap();
    let members = [member("a.rs"), member("b.rs")];
    let job = provider.submit(&BatchSpec { batch_key: "cpb-az", schema: &schema, members: &members }).await.unwrap();
    assert_eq!(job, "batch_fe3f047a-de39-4068-9008-346795bfc1db");

    let seen = seen.lock().unwrap();
    let paths: Vec<(&str, &str)> = seen.requests.iter().map(|r| (r.0.as_str(), r.1.as_str())).collect();
    assert_eq!(paths, [("POST", "/openai/v1/files"), ("POST", "/openai/v1/batches")]);
    for (_, _, query, api_key, authorization) in &seen.requests {
        assert_eq!(
            (query.as_str(), api_key.as_str(), authorization.as_str()),
            ("", "azure-key-1", ""),
            "v1: no api-version, key in api-key"
        );
    }
    let field = |name: &str| seen.upload_fields.iter().find(|f| f.0 == name).map(|f| f.2.clone());
    assert_eq!(field("purpose").unwrap(), b"batch");
    assert_eq!(field("expires_after.anchor").unwrap(), b"created_at");
    assert_eq!(field("expires_after.seconds").unwrap(), b"1209600", "14 days: 10,000 files instead of 500");
    let file = seen.upload_fields.iter().find(|f| f.0 == "file").unwrap();
    assert_eq!(file.1.as_deref(), Some("commitpoint-cpb-az.jsonl"));
    let text = String::from_utf8(file.2.clone()).unwrap();
    for line in text.lines().map(|l| serde_json::from_str::<Value>(l).unwrap()) {
        assert_eq!(line["url"], "/v1/chat/completions");
        assert_eq!(line["body"]["model"], "gpt-4o-batch", "Azure's model field is the deployment name");
        assert_eq!(line["body"]["response_format"]["json_schema"]["strict"], true);
    }
    let create = seen.create_body.as_ref().unwrap();
    assert_eq!(create["input_file_id"], "file-7733bc35e32841e297a62a9ee50b3461");
    assert_eq!(create["endpoint"], "/v1/chat/completions", "the create's endpoint matches the lines' url");
    assert_eq!(create["completion_window"], "24h", "Azure fails any other window");
    assert_eq!(create["metadata"]["commitpoint_batch_key"], "cpb-az");
    assert_eq!(create["output_expires_after"], json!({"anchor": "created_at", "seconds": 1209600}));
}

#[tokio::test]
async fn a_dated_api_version_goes_on_every_request_and_statuses_are_read_in_any_case() {
    let (origin, seen) = start("/openai").await;
    let extra = "api_version = \"2024-10-21\"\nauth = \"bearer\"\ncheck_deployment = \"gpt-4o-std\"";
    let provider = azure_adapter("az", &options(origin, extra).target(), ApiKey::new("entra-token".into())).unwrap();
    let schema = Registry::builtin().get(BUILTIN_CODE_REVIEW).unwrap();
    let members = [member("a.rs")];
    provider.submit(&BatchSpec { batch_key: "cpb-az", schema: &schema, members: &members }).await.unwrap();
    let status = provider.poll("batch_fe3f047a-de39-4068-9008-346795bfc1db").await.unwrap();
    assert_eq!(status.phase, JobPhase::Completed, "\"Completed\" is completed");
    let intent = IntentRef { batch_key: "cpb-az", created_at_ms: 0, members: &[], known_jobs: &[] };
    assert!(matches!(provider.find_job(&intent).await.unwrap(), Lookup::Found(_)), "ISO created_at is no obstacle");
    assert!(matches!(provider.probe(&schema).await, Probe::Passed(c) if c == Checked::everything()));

    let seen = seen.lock().unwrap();
    for (_, path, query, api_key, authorization) in &seen.requests {
        assert_eq!(query.split('&').find(|p| p.starts_with("api-version=")), Some("api-version=2024-10-21"), "{path}");
        assert_eq!((api_key.as_str(), authorization.as_str()), ("", "Bearer entra-token"));
    }
    assert!(
        seen.requests.iter().any(|r| r.1 == "/openai/deployments/gpt-4o-std/chat/completions"),
        "{:?}",
        seen.requests
    );
    let file = seen.upload_fields.iter().find(|f| f.0 == "file").unwrap();
    let line: Value = serde_json::from_str(String::from_utf8(file.2.clone()).unwrap().lines().next().unwrap()).unwrap();
    assert_eq!(line["url"], "/chat/completions");
    assert_eq!(seen.create_body.as_ref().unwrap()["endpoint"], "/chat/completions");
    // Azure's how-to added the expiry fields with 2025-03-01-preview; 2024-10-21 has none.
    assert!(seen.upload_fields.iter().all(|f| !f.0.starts_with("expires_after")), "{:?}", seen.upload_fields);
    assert!(seen.create_body.as_ref().unwrap().get("output_expires_after").is_none());
}

#[tokio::test]
async fn without_a_check_deployment_the_probe_only_reads() {
    let (origin, seen) = start("/openai/v1").await;
    let provider = azure_adapter("az", &options(origin, "").target(), ApiKey::new("azure-key-1".into())).unwrap();
    let schema = Registry::builtin().get(BUILTIN_CODE_REVIEW).unwrap();
    let Probe::Passed(checked) = provider.probe(&schema).await else { panic!("the read was refused") };
    assert_eq!(checked.key, Coverage::Exercised);
    let Coverage::NotChecked(why) = &checked.model else { panic!("a batch deployment was called: {checked:?}") };
    assert!(why.contains("check_deployment"), "{why}");
    assert_eq!(checked.schema, checked.model);
    let seen = seen.lock().unwrap();
    assert_eq!(seen.requests.len(), 1);
    assert_eq!(
        (seen.requests[0].0.as_str(), seen.requests[0].1.as_str(), seen.requests[0].2.as_str()),
        ("GET", "/openai/v1/batches", "limit=1")
    );
}

#[test]
fn a_key_no_header_can_carry_is_refused_at_set_up() {
    let options = options("https://res.openai.azure.com".into(), "");
    let err = azure_adapter("az", &options.target(), ApiKey::new("line\nbreak".into())).unwrap_err();
    assert_eq!(err.class, ErrorClass::InvalidRequest);
    assert!(err.message().contains("header"), "{}", err.message());
}

/// Azure's `invalidPayload` (Azure/azure-sdk-for-net#44710) and `quotaExceeded`
/// (Azure/azure-sdk-for-java#47401) are not about size; OpenAI's "File is too large."
/// (bespokelabsai/curator#111) and a 413 are.
#[test]
fn only_an_upload_refusal_about_size_reads_as_too_large() {
    assert!(says_too_large(Some(400), "400 : File is too large."));
    assert!(says_too_large(Some(413), "413 : Request Entity Too Large"));
    assert!(!says_too_large(Some(400), "400 invalidPayload: The file has no or an empty content type specified."));
    assert!(!says_too_large(Some(400), "400 invalidPayload: Invalid value for purpose."));
    assert!(!says_too_large(Some(400), "400 quotaExceeded: The quota for files without expiry is reached."));
    assert!(!says_too_large(Some(400), "400 : Unrecognized request argument supplied: expires_after.anchor"));
    assert!(!says_too_large(Some(500), "File is too large."), "a server error is not about the file");
}
