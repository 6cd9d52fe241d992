//! Worker tokens: a worker claims and answers only the work its token's scope covers,
//! and reaches nothing else (no tenant's listings, no admin actions, no console).

use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

use crate::console::Browser;
use crate::util::{Server, call_as, finding, id_of, output, temp_dir, write_secret};

const ADMIN: &str = "admin-token-workers-000001";
const ACME: &str = "acme-token-workers-0000001";
const ACME_WORKER: &str = "worker-token-acme-00000001";
const ANY_WORKER: &str = "worker-token-any-000000001";
const INVOICE_WORKER: &str = "worker-token-invoices-00001";

fn start() -> (tempfile::TempDir, Server) {
    let dir = temp_dir();
    let (admin, tenants, workers) = (dir.path().join("admin"), dir.path().join("tenants"), dir.path().join("workers"));
    write_secret(&admin, &format!("{ADMIN}\n"));
    write_secret(&tenants, &format!("acme {ACME}\n"));
    write_secret(
        &workers,
        &format!(
            "acme-triage {ACME_WORKER} tenants=acme\nanyone {ANY_WORKER}\ninvoices {INVOICE_WORKER} schemas=invoice@1\n"
        ),
    );
    let config = dir.path().join("config.toml");
    let text = format!(
        "[access]\nadmin_token_file = \"{}\"\ntenant_tokens_file = \"{}\"\nworker_tokens_file = \"{}\"\n",
        admin.display(),
        tenants.display(),
        workers.display()
    );
    std::fs::write(&config, text).expect("write config");
    let server = Server::start_with(&dir.path().join("data"), &["--config", config.to_str().expect("utf-8 path")]);
    (dir, server)
}

async fn intake(base: &str, tenant: &str, source: &str) -> String {
    let body = json!({"tenant": tenant, "source_id": source, "schema": "code-review@1", "content": source});
    let (status, reply) = call_as(&format!("{base}/v1/extractions"), Some(ADMIN), Method::POST, Some(body)).await;
    assert_eq!(status, 201, "{reply}");
    id_of(&reply)
}

async fn claim(base: &str, token: &str, limit: u32) -> (u16, Value) {
    let body = json!({"worker": "w", "limit": limit, "lease_seconds": 60});
    call_as(&format!("{base}/v1/claims"), Some(token), Method::POST, Some(body)).await
}

fn tenants_of(claims: &Value) -> Vec<String> {
    let mut tenants: Vec<String> = claims["claims"]
        .as_array()
        .expect("claims")
        .iter()
        .map(|c| c["tenant"].as_str().expect("tenant").to_string())
        .collect();
    tenants.sort();
    tenants
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_scoped_worker_claims_and_answers_only_its_tenants_work() {
    let (_dir, server) = start();
    let base = server.url.clone();
    let globex = intake(&base, "globex", "g1").await;
    let acme = intake(&base, "acme", "a1").await;
    intake(&base, "globex", "g2").await;

    let (status, claims) = claim(&base, ACME_WORKER, 10).await;
    assert_eq!(status, 200, "{claims}");
    assert_eq!(tenants_of(&claims), ["acme"], "globex's older work stays for others: {claims}");
    let lease = claims["claims"][0]["lease_token"].as_str().expect("lease").to_string();
    let result = json!({"lease_token": lease, "output": output(&[finding("r1", "a1", 1, "x")])});
    let (status, reply) =
        call_as(&format!("{base}/v1/extractions/{acme}/result"), Some(ACME_WORKER), Method::POST, Some(result)).await;
    assert_eq!(status, 200, "{reply}");

    // A worker asking for a schema its token does not cover is told so; without asking,
    // it is handed none of that schema's work.
    let body = json!({"worker": "w", "limit": 1, "lease_seconds": 60, "schema": "code-review@1"});
    let (status, refused) = call_as(&format!("{base}/v1/claims"), Some(INVOICE_WORKER), Method::POST, Some(body)).await;
    assert_eq!(status, 403, "{refused}");
    assert!(refused["error"]["message"].as_str().expect("message").contains("schema \"code-review@1\""));
    let (status, none) = claim(&base, INVOICE_WORKER, 10).await;
    assert_eq!((status, none["claims"].as_array().map(Vec::len)), (200, Some(0)), "{none}");

    // Another worker's lease on globex's work is no use to the acme worker.
    let (_, theirs) = claim(&base, ANY_WORKER, 1).await;
    assert_eq!(tenants_of(&theirs), ["globex"], "{theirs}");
    let (id, lease) = (
        theirs["claims"][0]["extraction_id"].as_str().expect("id").to_string(),
        theirs["claims"][0]["lease_token"].as_str().expect("lease").to_string(),
    );
    assert_eq!(id, globex, "the oldest pending work goes first");
    // Nor may it extend that lease; its holder may. Work outside its scope answers as a
    // missing extraction does (issue 43, item 5): a 403 naming the extraction's tenant and
    // schema told the worker what it is and that it exists.
    let missing = "0".repeat(64);
    let as_missing = async |refused: &Value, what: &str, body: &Value| {
        let url = format!("{base}/v1/extractions/{missing}/{what}");
        let (status, absent) = call_as(&url, Some(ACME_WORKER), Method::POST, Some(body.clone())).await;
        assert_eq!(status, 404, "{absent}");
        assert_eq!(refused.to_string().replace(&id, "<id>"), absent.to_string().replace(&missing, "<id>"), "{what}");
    };
    let extend = json!({"lease_token": lease, "lease_seconds": 120});
    let lease_url = format!("{base}/v1/extractions/{id}/lease");
    let (status, refused) = call_as(&lease_url, Some(ACME_WORKER), Method::POST, Some(extend.clone())).await;
    assert_eq!(status, 404, "{refused}");
    as_missing(&refused, "lease", &extend).await;
    let (status, extended) = call_as(&lease_url, Some(ANY_WORKER), Method::POST, Some(extend)).await;
    assert_eq!((status, &extended["lease_token"]), (200, &json!(lease)), "{extended}");
    let result = json!({"lease_token": lease, "output": output(&[finding("r1", "g1", 1, "x")])});
    let (status, refused) =
        call_as(&format!("{base}/v1/extractions/{id}/result"), Some(ACME_WORKER), Method::POST, Some(result.clone()))
            .await;
    assert_eq!(status, 404, "{refused}");
    assert!(!refused.to_string().contains("globex"), "{refused}");
    as_missing(&refused, "result", &result).await;
    let (status, reply) =
        call_as(&format!("{base}/v1/extractions/{id}/result"), Some(ANY_WORKER), Method::POST, Some(result)).await;
    assert_eq!(status, 200, "the unscoped worker's own answer commits: {reply}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_token_reaches_neither_tenant_data_nor_admin_actions_nor_the_console() {
    let (_dir, server) = start();
    let base = server.url.clone();
    let id = intake(&base, "acme", "a1").await;
    let refused_calls = [
        (Method::GET, format!("/v1/extractions/{id}"), "a worker token may only claim work"),
        (Method::GET, "/v1/extractions?tenant=acme".to_string(), "a worker token may only claim work"),
        (Method::GET, "/v1/tenants/acme/costs".to_string(), "a worker token may only claim work"),
        (Method::POST, "/v1/admin/backup".to_string(), "this call needs the admin token"),
        (Method::DELETE, "/v1/tenants/acme".to_string(), "this call needs the admin token"),
    ];
    for (method, path, message) in refused_calls {
        let (status, body) = call_as(&format!("{base}{path}"), Some(ACME_WORKER), method.clone(), None).await;
        assert_eq!(status, 403, "{method} {path}: {body}");
        assert!(body["error"]["message"].as_str().expect("message").starts_with(message), "{path}: {body}");
    }
    // The schema a worker answers is readable with its token.
    let (status, schema) =
        call_as(&format!("{base}/v1/schemas/code-review@1"), Some(ACME_WORKER), Method::GET, None).await;
    assert_eq!(status, 200, "{schema}");
    // A tenant's token claims no work.
    let (status, body) = claim(&base, ACME, 1).await;
    assert_eq!(
        (status, body["error"]["message"].as_str()),
        (403, Some("this call needs the admin token or a worker token"))
    );

    let browser = Browser::new(&base);
    let response = browser.post_login(ACME_WORKER).await;
    assert_eq!(response.status(), StatusCode::FORBIDDEN);
    assert!(response.headers().get("set-cookie").is_none_or(|c| !c.to_str().unwrap_or("").contains("session")));
    assert!(response.text().await.expect("page").contains("cannot open the console"));
}
