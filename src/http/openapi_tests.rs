//! The served OpenAPI document against the router it describes: the same routes, each
//! documented method answered by its handler (never the 404/405 fallbacks), other
//! methods refused with 405, and real answers matching the documented schemas.

use std::collections::BTreeSet;
use std::sync::Arc;

use reqwest::Method;
use serde_json::{Value, json};

use crate::domain::schema::Registry;
use crate::engine::supervisor::Supervisor;
use crate::http::access::{Access, AccessPolicy};
use crate::service::Service;
use crate::store::{Store, WriterGuard};

/// Every route the API has. A route added to the router without a `#[utoipa::path]`
/// cannot be registered (see `routes.rs`), and one dropped from it fails here.
const ROUTES: &[(&str, &str)] = &[
    ("GET", "/healthz"),
    ("GET", "/metrics"),
    ("GET", "/openapi.json"),
    ("POST", "/v1/extractions"),
    ("GET", "/v1/extractions"),
    ("GET", "/v1/extractions/{id}"),
    ("GET", "/v1/extractions/{id}/findings"),
    ("POST", "/v1/extractions/{id}/result"),
    ("POST", "/v1/extractions/{id}/lease"),
    ("POST", "/v1/extractions/{id}/retry"),
    ("GET", "/v1/extractions/{id}/costs"),
    ("POST", "/v1/claims"),
    ("GET", "/v1/schemas/{name}"),
    ("GET", "/v1/stats"),
    ("GET", "/v1/tenants/{tenant}/costs"),
    ("POST", "/v1/estimates"),
    ("POST", "/v1/webhooks/{name}"),
    ("GET", "/v1/outbox"),
    ("POST", "/v1/outbox/{id}/redeliver"),
    ("POST", "/v1/admin/sinks/{name}/enable"),
    ("POST", "/v1/admin/backup"),
    ("GET", "/v1/admin/providers"),
    ("POST", "/v1/admin/providers/{name}/pause"),
    ("POST", "/v1/admin/providers/{name}/resume"),
    ("GET", "/v1/admin/backups/{name}"),
    ("DELETE", "/v1/admin/backups/{name}"),
    ("POST", "/v1/extractions/{id}/cancel"),
    ("GET", "/v1/export"),
    ("POST", "/v1/admin/retry"),
    ("DELETE", "/v1/tenants/{tenant}"),
    ("GET", "/v1/sources/{tenant}/{source_id}"),
    ("GET", "/v1/extractions/{id}/diff"),
    ("POST", "/v1/evaluations"),
    ("GET", "/v1/evaluations"),
    ("GET", "/v1/evaluations/{name}"),
    ("GET", "/v1/evaluations/{name}/report"),
    ("POST", "/v1/evaluations/{name}/promote"),
    ("POST", "/v1/evaluations/{name}/cancel"),
];

const METHODS: [&str; 5] = ["GET", "POST", "PUT", "PATCH", "DELETE"];

fn served_document() -> Value {
    let (_, doc) = super::routes::documented(&Arc::new(Access::new(AccessPolicy::default())));
    super::openapi::finish(doc, &["code-review@1".to_string()])
}

/// The routes of one group (`routes.rs`), as (method, path) pairs.
fn group_operations(group: utoipa_axum::router::OpenApiRouter<Service>) -> BTreeSet<(String, String)> {
    let (_, doc) = group.split_for_parts();
    operations(&serde_json::to_value(&doc).expect("document"))
}

struct Groups {
    public: BTreeSet<(String, String)>,
    tenant: BTreeSet<(String, String)>,
    shared: BTreeSet<(String, String)>,
    worker: BTreeSet<(String, String)>,
    admin: BTreeSet<(String, String)>,
}

fn groups() -> Groups {
    use super::routes::{admin, public, shared, tenant, worker};
    Groups {
        public: group_operations(public()),
        tenant: group_operations(tenant()),
        shared: group_operations(shared()),
        worker: group_operations(worker()),
        admin: group_operations(admin()),
    }
}

fn operations(doc: &Value) -> BTreeSet<(String, String)> {
    let mut found = BTreeSet::new();
    for (path, item) in doc["paths"].as_object().expect("paths") {
        for method in item.as_object().expect("path item").keys() {
            found.insert((method.to_uppercase(), path.clone()));
        }
    }
    found
}

/// Every `$ref` in the document points at something in it.
fn dangling_refs(doc: &Value, node: &Value, out: &mut Vec<String>) {
    match node {
        Value::Object(map) => {
            if let Some(Value::String(target)) = map.get("$ref") {
                let pointer = target.strip_prefix('#').unwrap_or(target);
                if doc.pointer(pointer).is_none() {
                    out.push(target.clone());
                }
            }
            map.values().for_each(|v| dangling_refs(doc, v, out));
        }
        Value::Array(items) => items.iter().for_each(|v| dangling_refs(doc, v, out)),
        _ => {}
    }
}

#[test]
fn the_document_is_openapi_3_1_and_every_reference_resolves() {
    let doc = served_document();
    assert_eq!(doc["openapi"], "3.1.0");
    assert_eq!(doc["info"]["version"], env!("CARGO_PKG_VERSION"));
    let mut dangling = Vec::new();
    dangling_refs(&doc, &doc, &mut dangling);
    assert!(dangling.is_empty(), "unresolved references: {dangling:?}");
    assert_eq!(doc["components"]["securitySchemes"]["bearer"], json!({"type": "http", "scheme": "bearer"}));
    assert_eq!(doc["components"]["schemas"]["IntakeBody"]["properties"]["schema"]["enum"], json!(["code-review@1"]));
    assert!(!doc.to_string().contains("u-int"), "unsigned formats are spelled uint64");
    for (method, path) in operations(&doc) {
        let operation = &doc["paths"][&path][method.to_lowercase()];
        assert!(operation["operationId"].is_string() && operation["tags"][0].is_string(), "{method} {path}");
        let responses = operation["responses"].as_object().expect("responses");
        assert!(responses.keys().any(|s| s.starts_with('2')), "{method} {path} documents no success");
        // The path's `{params}` and the declared path parameters are the same names.
        let in_template: BTreeSet<&str> =
            path.split('/').filter_map(|s| s.strip_prefix('{')?.strip_suffix('}')).collect();
        let declared: BTreeSet<&str> = operation["parameters"]
            .as_array()
            .map(|ps| ps.iter().filter(|p| p["in"] == "path").filter_map(|p| p["name"].as_str()).collect())
            .unwrap_or_default();
        assert_eq!(in_template, declared, "{method} {path}");
    }
}

#[test]
fn the_document_lists_exactly_the_routes_of_the_router() {
    let documented = operations(&served_document());
    let expected: BTreeSet<(String, String)> =
        ROUTES.iter().map(|(method, path)| (method.to_string(), path.to_string())).collect();
    assert_eq!(documented, expected);
}

#[test]
fn every_route_is_in_exactly_one_access_group() {
    let Groups { public, tenant, shared, worker, admin } = groups();
    let all = operations(&served_document());
    let mut seen = BTreeSet::new();
    for route in public.iter().chain(&tenant).chain(&shared).chain(&worker).chain(&admin) {
        assert!(seen.insert(route.clone()), "{route:?} is in two groups");
    }
    assert_eq!(seen, all);
}

/// The description matches the layer each group has: no token for public routes; a
/// bearer token, and a documented 401, for the others; a documented 403 for admin ones.
#[test]
fn bearer_security_is_declared_exactly_where_the_layers_demand_a_token() {
    let doc = served_document();
    let Groups { public, admin, worker, .. } = groups();
    for (method, path) in operations(&doc) {
        let route = (method.clone(), path.clone());
        let operation = &doc["paths"][&path][method.to_lowercase()];
        let secured = operation["security"] == json!([{"bearer": []}]);
        assert_eq!(secured, !public.contains(&route), "{method} {path}");
        if secured {
            assert!(operation["responses"]["401"].is_object(), "{method} {path} documents no 401");
        }
        if admin.contains(&route) || worker.contains(&route) {
            assert!(operation["responses"]["403"].is_object(), "{method} {path} refuses tokens but documents no 403");
        }
    }
}

/// Asks the layers themselves, over HTTP, about every route of every group: a tenant
/// token gets 403 on each admin and worker route, a worker token on each admin and
/// tenant route, and no token gets 401 everywhere but public routes.
#[tokio::test]
async fn each_token_reaches_its_own_groups_and_no_token_only_public_ones() {
    let access = AccessPolicy::with_tokens("admin-secret", &[("acme", "acme-secret")]).with_worker(
        "triage",
        "worker-secret",
        crate::store::WorkScope::default(),
    );
    let live = live_as(|service| service, access).await;
    let Groups { public, tenant, shared, worker, admin } = groups();
    assert!(!admin.is_empty() && !tenant.is_empty() && !public.is_empty() && !worker.is_empty());
    let refusals = [
        ("acme-secret", &admin, "this call needs the admin token"),
        ("acme-secret", &worker, "this call needs the admin token or a worker token"),
        ("worker-secret", &admin, "this call needs the admin token"),
        (
            "worker-secret",
            &tenant,
            "a worker token may only claim work, extend its leases, post results and read schemas",
        ),
    ];
    for (token, routes, message) in refusals {
        for (method, path) in routes {
            let (status, answer) = live.send_as(method, &concrete(path), Some(token)).await;
            assert_eq!(status, 403, "{method} {path} answered {token}: {answer}");
            assert_eq!(answer["error"]["message"], message, "{method} {path}");
        }
    }
    let reached = [
        ("acme-secret", tenant.iter().chain(&shared).collect::<Vec<_>>()),
        ("worker-secret", worker.iter().chain(&shared).collect()),
    ];
    for (token, routes) in reached {
        for (method, path) in routes {
            let (status, answer) = live.send_as(method, &concrete(path), Some(token)).await;
            let by_layer = refusals.iter().any(|(_, _, message)| answer["error"]["message"] == *message);
            assert!(status != 401 && !by_layer, "{method} {path} refused {token}: {status} {answer}");
        }
    }
    for (method, path) in tenant.iter().chain(&shared).chain(&worker).chain(&admin) {
        let (status, answer) = live.send_as(method, &concrete(path), None).await;
        assert_eq!(status, 401, "{method} {path} answered without a token: {answer}");
    }
    for (method, path) in &public {
        let (status, answer) = live.send_as(method, &concrete(path), None).await;
        assert_ne!(status, 401, "{method} {path} wants a token: {answer}");
    }
    let (status, _) = live.send_as("GET", "/v1/no-such-route", None).await;
    assert_eq!(status, 401, "unknown paths need a token too, as before");
    let (status, _) = live.send_as("GET", "/v1/no-such-route", Some("acme-secret")).await;
    assert_eq!(status, 404);
}

struct Live {
    base: String,
    client: reqwest::Client,
    doc: Value,
    _dir: tempfile::TempDir,
    _writer: WriterGuard,
}

async fn live() -> Live {
    live_with(|service| service).await
}

async fn live_with(configure: impl FnOnce(Service) -> Service) -> Live {
    live_as(configure, AccessPolicy::default()).await
}

async fn live_as(configure: impl FnOnce(Service) -> Service, access: AccessPolicy) -> Live {
    let dir = tempfile::tempdir().expect("temp dir");
    let (store, writer) = Store::open(dir.path(), 16 << 20).expect("open store");
    let service = configure(Service::new(store, Registry::builtin()).with_backup_dir(dir.path().join("backups")));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let hosts = super::HostNames::new(listener.local_addr().expect("address"), &[]);
    let limits = super::BodyLimits { max_bytes: 1 << 20, ..Default::default() };
    let router = super::router(service, limits, Arc::new(Access::new(access)), hosts);
    let base = format!("http://{}", listener.local_addr().expect("address"));
    let limits = super::limits::ServerLimits::default();
    tokio::spawn(super::serve(listener, router, limits, std::future::pending()));
    let client = reqwest::Client::new();
    let doc: Value =
        client.get(format!("{base}/openapi.json")).send().await.expect("get doc").json().await.expect("doc");
    Live { base, client, doc, _dir: dir, _writer: writer }
}

impl Live {
    async fn send(&self, method: &str, path: &str, body: Option<Value>) -> (u16, Option<String>, Value) {
        let method = Method::from_bytes(method.as_bytes()).expect("method");
        let mut request = self.client.request(method, format!("{}{path}", self.base));
        if let Some(body) = body {
            request = request.json(&body);
        }
        let response = request.send().await.expect("send");
        let status = response.status().as_u16();
        let allow = response.headers().get("allow").and_then(|v| v.to_str().ok()).map(str::to_string);
        let text = response.text().await.expect("body");
        (status, allow, serde_json::from_str(&text).unwrap_or(Value::String(text)))
    }

    /// Sends a request with a bearer token, or none; a POST carries `{}`.
    async fn send_as(&self, method: &str, path: &str, token: Option<&str>) -> (u16, Value) {
        let method = Method::from_bytes(method.as_bytes()).expect("method");
        let mut request = self.client.request(method.clone(), format!("{}{path}", self.base));
        if method == Method::POST {
            request = request.json(&json!({}));
        }
        if let Some(token) = token {
            request = request.bearer_auth(token);
        }
        let response = request.send().await.expect("send");
        let status = response.status().as_u16();
        let text = response.text().await.expect("body");
        (status, serde_json::from_str(&text).unwrap_or(Value::String(text)))
    }

    /// Sends a request and checks the answer against the document.
    async fn call(&self, method: &str, template: &str, path: &str, body: Option<Value>) -> (u16, Value) {
        let (status, _, answer) = self.send(method, path, body).await;
        self.check(method, template, status, &answer);
        (status, answer)
    }

    /// A documented status, and a body valid under that status's schema.
    fn check(&self, method: &str, template: &str, status: u16, answer: &Value) {
        let operation = &self.doc["paths"][template][method.to_lowercase()];
        let mut response = &operation["responses"][status.to_string()];
        assert!(response.is_object(), "{method} {template}: {status} is not documented: {answer}");
        if let Some(target) = response["$ref"].as_str() {
            response = self.doc.pointer(target.trim_start_matches('#')).expect("response reference");
        }
        if let Some(schema) = response.pointer("/content/application~1json/schema") {
            let mut rooted = schema.clone();
            rooted["components"] = self.doc["components"].clone();
            if let Err(e) = jsonschema::validate(&rooted, answer) {
                panic!("{method} {template} → {status}: the body breaks its schema: {e}\n{answer:#}");
            }
        }
    }
}

fn concrete(template: &str) -> String {
    let id = if template.starts_with("/v1/outbox") { "7".to_string() } else { "0".repeat(64) };
    template
        .replace("{id}", &id)
        .replace("{tenant}", "acme")
        .replace("/backups/{name}", "/backups/commitpoint-none.redb")
        .replace("{name}", "nobody")
}

#[tokio::test]
async fn documented_methods_reach_their_handlers_and_the_others_get_405_with_allow() {
    let live = live().await;
    for (path, item) in live.doc["paths"].as_object().expect("paths") {
        let url = concrete(path);
        let documented: Vec<String> = item.as_object().expect("item").keys().map(|m| m.to_uppercase()).collect();
        for method in METHODS {
            let body = (method == "POST").then(|| json!({}));
            let (status, allow, answer) = live.send(method, &url, body).await;
            if documented.iter().any(|m| m == method) {
                let fallback = status == 405
                    || answer["error"]["message"].as_str().is_some_and(|m| m.contains("no such endpoint"));
                assert!(!fallback, "{method} {url} is documented but the router does not serve it: {status} {answer}");
                live.check(method, path, status, &answer);
            } else {
                assert_eq!(status, 405, "{method} {url} is not documented but got {status}: {answer}");
                let allow = allow.unwrap_or_default();
                for m in &documented {
                    assert!(allow.contains(m.as_str()), "{method} {url}: Allow {allow:?} lacks {m}");
                }
                assert_eq!(answer["error"]["code"], "method_not_allowed");
            }
        }
    }
}

#[tokio::test]
async fn real_answers_match_their_documented_schemas() {
    let live = live().await;
    let intake = json!({"tenant": "acme", "source_id": "PR-1", "schema": "code-review@1", "content": "fn a() {}",
        "metadata": {"repo": "x"}});
    let (status, created) = live.call("POST", "/v1/extractions", "/v1/extractions", Some(intake.clone())).await;
    assert_eq!(status, 201);
    assert_eq!(live.call("POST", "/v1/extractions", "/v1/extractions", Some(intake)).await.0, 200);
    let id = created["extraction_id"].as_str().expect("id").to_string();
    let result_path = format!("/v1/extractions/{id}/result");
    let claim = json!({"worker": "w", "limit": 5.0, "lease_seconds": 60});
    let expensive = json!({"model": "m", "input_tokens": 10, "output_tokens": 2, "cost_micros": u64::MAX});

    // A first answer that fails the schema: 422 reasked, charged, back to the queue as a new
    // attempt; its claim carries the refused answer and its issues.
    let (_, claims) = live.call("POST", "/v1/claims", "/v1/claims", Some(claim.clone())).await;
    let token = claims["claims"][0]["lease_token"].clone();
    assert!(claims["claims"][0]["previous_attempt"].is_null(), "{claims:#}");
    assert_eq!(claims["claims"][0]["schema_url"], "/v1/schemas/code-review@1");
    let (_, claimed) = live.call("GET", "/v1/extractions/{id}", &format!("/v1/extractions/{id}"), None).await;
    assert_eq!(claimed["state"], "claimed");
    let bad = json!({"lease_token": token, "output": {"findings": "none"}, "usage": expensive});
    let (status, refused) = live.call("POST", "/v1/extractions/{id}/result", &result_path, Some(bad.clone())).await;
    assert_eq!(
        (status, &refused["error"]["code"], &refused["error"]["details"]["reask"]),
        (422, &json!("reasked"), &json!(1))
    );
    let (_, claims) = live.call("POST", "/v1/claims", "/v1/claims", Some(claim.clone())).await;
    let previous = &claims["claims"][0]["previous_attempt"];
    assert_eq!(previous["output"], r#"{"findings":"none"}"#, "{claims:#}");
    assert_eq!(previous["issues"][0]["path"], "/findings", "{claims:#}");
    assert_eq!(claims["claims"][0]["attempt"], 2);
    // The same mistake again: no re-ask is left, so the extraction fails.
    let again =
        json!({"lease_token": claims["claims"][0]["lease_token"], "output": {"findings": "none"}, "usage": expensive});
    let (status, refused) = live.call("POST", "/v1/extractions/{id}/result", &result_path, Some(again)).await;
    assert_eq!((status, &refused["error"]["code"]), (422, &json!("validation_failed")));
    let (status, retried) =
        live.call("POST", "/v1/extractions/{id}/retry", &format!("/v1/extractions/{id}/retry"), None).await;
    assert_eq!((status, &retried["attempts"]), (200, &json!(3)));
    let (status, schema) = live.call("GET", "/v1/schemas/{name}", "/v1/schemas/code-review@1", None).await;
    assert_eq!((status, &schema["reask"]), (200, &json!(1)));
    assert_eq!(schema["json_schema"]["type"], "object");
    assert_eq!(live.call("GET", "/v1/schemas/{name}", "/v1/schemas/nope@1", None).await.0, 404);

    // The second attempt commits, and a repeat of it is a replay.
    let (_, claims) = live.call("POST", "/v1/claims", "/v1/claims", Some(claim)).await;
    let finding = json!({"rule": "r1", "severity": "high", "file": "PR-1", "line": 1, "summary": "s"});
    let good = json!({"lease_token": claims["claims"][0]["lease_token"], "output": {"findings": [finding]}, "usage": expensive});
    let lease_path = format!("/v1/extractions/{id}/lease");
    let extend = json!({"lease_token": claims["claims"][0]["lease_token"], "lease_seconds": 600});
    let (status, lease) = live.call("POST", "/v1/extractions/{id}/lease", &lease_path, Some(extend.clone())).await;
    assert_eq!((status, &lease["lease_token"]), (200, &claims["claims"][0]["lease_token"]), "{lease:#}");
    assert!(lease["lease_expires_at"].as_str() > claims["claims"][0]["lease_expires_at"].as_str(), "{lease:#}");
    let stale = json!({"lease_token": "lt-none", "lease_seconds": 600});
    let (status, refused) = live.call("POST", "/v1/extractions/{id}/lease", &lease_path, Some(stale)).await;
    assert_eq!((status, &refused["error"]["code"]), (409, &json!("stale_lease")));
    let (status, posted) = live.call("POST", "/v1/extractions/{id}/result", &result_path, Some(good.clone())).await;
    assert_eq!((status, &posted["replay"]), (200, &json!(false)));
    let (status, refused) = live.call("POST", "/v1/extractions/{id}/lease", &lease_path, Some(extend)).await;
    assert_eq!((status, &refused["error"]["code"]), (409, &json!("illegal_transition")), "extended after its result");
    assert_eq!(live.call("POST", "/v1/extractions/{id}/result", &result_path, Some(good)).await.1["replay"], true);
    let (_, findings) =
        live.call("GET", "/v1/extractions/{id}/findings", &format!("/v1/extractions/{id}/findings"), None).await;
    assert_eq!(findings["findings"][0]["rule"], "r1");
    // Two charges of u64::MAX: the total saturates instead of overflowing (which panicked).
    let (_, costs) = live.call("GET", "/v1/extractions/{id}/costs", &format!("/v1/extractions/{id}/costs"), None).await;
    assert_eq!(costs["attempts"].as_array().map(Vec::len), Some(4));
    assert_eq!(costs["charged_micros"], json!(u64::MAX));
    let (status, _) =
        live.call("POST", "/v1/extractions/{id}/retry", &format!("/v1/extractions/{id}/retry"), None).await;
    assert_eq!(status, 409, "a committed extraction cannot be retried");
    let (_, source) =
        live.call("GET", "/v1/sources/{tenant}/{source_id}", "/v1/sources/acme/PR-1?schema=code-review", None).await;
    assert_eq!(source["current"]["extraction_id"], json!(id));
    let diff = format!("/v1/extractions/{id}/diff?against={id}");
    let (status, diff) = live.call("GET", "/v1/extractions/{id}/diff", &diff, None).await;
    assert_eq!((status, &diff["counts"]["unchanged"]), (200, &json!(1)), "{diff:#}");
    let previous = format!("/v1/extractions/{id}/diff");
    assert_eq!(live.call("GET", "/v1/extractions/{id}/diff", &previous, None).await.0, 409);
    let (_, page) = live.call("GET", "/v1/extractions", "/v1/extractions?state=committed&limit=1&after=", None).await;
    assert!(page["extractions"][0]["committed_at"].is_string(), "{page:#}");
    let costs = "/v1/tenants/acme/costs?from=1970-01-01&to=2999-01-01T00:00:00%2B02:00&group_by=model";
    let (_, report) = live.call("GET", "/v1/tenants/{tenant}/costs", costs, None).await;
    assert_eq!(report["groups"]["m"]["fresh"]["attempts"], 1);
    let items = json!({"tenant": "acme", "schema": "code-review@1", "items": [{"source_id": "a.rs", "bytes": 400}]});
    let (status, estimate) = live.call("POST", "/v1/estimates", "/v1/estimates", Some(items)).await;
    assert_eq!((status, &estimate["requests"]), (200, &json!(1)), "{estimate:#}");
    live.call("GET", "/v1/stats", "/v1/stats", None).await;
    live.call("GET", "/healthz", "/healthz", None).await;
    live.call("GET", "/v1/admin/providers", "/v1/admin/providers", None).await;
    live.call("GET", "/v1/outbox", "/v1/outbox?state=dead&limit=0", None).await;
    let (status, backup) = live.call("POST", "/v1/admin/backup", "/v1/admin/backup", None).await;
    assert_eq!(status, 201);
    let download = backup["download"].as_str().expect("download").to_string();
    assert_eq!(live.call("DELETE", "/v1/admin/backups/{name}", &download, None).await.0, 204);
    let (status, _) = live.call("POST", "/v1/outbox/{id}/redeliver", "/v1/outbox/+7/redeliver", None).await;
    assert_eq!(status, 400, "event ids are plain decimal numbers");

    let cancel = |id: &str| format!("/v1/extractions/{id}/cancel");
    let (status, _) = live.call("POST", "/v1/extractions/{id}/cancel", &cancel(&id), None).await;
    assert_eq!(status, 409, "a committed extraction cannot be cancelled");
    let other = json!({"tenant": "acme", "source_id": "PR-2", "schema": "code-review@1", "content": "fn b() {}"});
    let (_, created) = live.call("POST", "/v1/extractions", "/v1/extractions", Some(other)).await;
    let other = created["extraction_id"].as_str().expect("id").to_string();
    for _ in 0..2 {
        let (status, cancelled) = live.call("POST", "/v1/extractions/{id}/cancel", &cancel(&other), None).await;
        assert_eq!((status, &cancelled["state"]), (200, &json!("cancelled")), "cancelling is idempotent");
    }
    let body = json!({"tenant": "acme", "failure_class": "validation", "limit": 10});
    let (status, retried) = live.call("POST", "/v1/admin/retry", "/v1/admin/retry", Some(body)).await;
    assert_eq!((status, &retried["retried"]), (200, &json!(0)));
    let (status, line) = live.call("GET", "/v1/export", "/v1/export?tenant=acme&since=1970-01-01", None).await;
    assert_eq!((status, &line["extraction_id"], &line["findings"][0]["rule"]), (200, &json!(id), &json!("r1")));
}

#[tokio::test]
async fn healthz_answers_503_naming_a_failed_task_but_not_its_cause() {
    let supervisor = Supervisor::new();
    let live = live_with(|service| service.with_task_failures(supervisor.failures())).await;
    assert_eq!(live.call("GET", "/healthz", "/healthz", None).await.0, 200);
    supervisor.spawn("scheduler simulator", async { Err(std::io::Error::other("cause-with-a-secret-path")) });
    tokio::time::timeout(std::time::Duration::from_secs(5), supervisor.failed()).await.expect("the failure is seen");
    let (status, health) = live.call("GET", "/healthz", "/healthz", None).await;
    assert_eq!(status, 503, "{health}");
    assert_eq!(health["status"], "failed");
    assert_eq!(health["failed_tasks"], json!(["scheduler simulator"]));
    assert!(!health.to_string().contains("secret-path"), "the cause is for the log, not for anyone: {health}");
}

/// Client generators key methods by operation id and types by component name: a repeated
/// id is refused by the reference validator (openapi-spec-validator), and a generator
/// silently drops one of the operations.
#[test]
fn operation_ids_are_unique() {
    let doc = served_document();
    let mut seen: std::collections::BTreeMap<String, Vec<String>> = std::collections::BTreeMap::new();
    for (method, path) in operations(&doc) {
        let id = doc["paths"][&path][method.to_lowercase()]["operationId"].as_str().unwrap_or_default().to_string();
        seen.entry(id).or_default().push(format!("{method} {path}"));
    }
    let repeated: Vec<_> = seen.into_iter().filter(|(_, ops)| ops.len() > 1).collect();
    assert!(repeated.is_empty(), "operation ids used more than once: {repeated:?}");
}
