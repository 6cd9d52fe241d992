//! No existence oracles across tenants: another tenant's extraction answers exactly as a
//! missing one, and list cursors reveal nothing about how much anyone else ingests.

use reqwest::Method;
use serde_json::{Value, json};

use crate::util::{Server, call_as, finding, id_of, output, temp_dir, write_secret};

const ADMIN: &str = "admin-token-tenancy-000001";
const ACME: &str = "acme-token-tenancy-000001";
const GLOBEX: &str = "globex-token-tenancy-00001";

fn start() -> (tempfile::TempDir, Server) {
    let dir = temp_dir();
    let admin = dir.path().join("admin");
    let tenants = dir.path().join("tenants");
    write_secret(&admin, &format!("{ADMIN}\n"));
    write_secret(&tenants, &format!("acme {ACME}\nglobex {GLOBEX}\n"));
    let config = dir.path().join("config.toml");
    std::fs::write(
        &config,
        format!(
            "[access]\nadmin_token_file = \"{}\"\ntenant_tokens_file = \"{}\"\n",
            admin.display(),
            tenants.display()
        ),
    )
    .expect("write config");
    let server = Server::start_with(&dir.path().join("data"), &["--config", config.to_str().expect("utf-8 path")]);
    (dir, server)
}

async fn intake(base: &str, token: &str, tenant: &str, source: &str) -> String {
    let body = json!({"tenant": tenant, "source_id": source, "schema": "code-review@1", "content": source});
    let (status, reply) = call_as(&format!("{base}/v1/extractions"), Some(token), Method::POST, Some(body)).await;
    assert_eq!(status, 201, "{reply}");
    id_of(&reply)
}

/// The error body with the id itself masked, so two answers about different ids compare.
fn masked(body: &Value, id: &str) -> String {
    body.to_string().replace(id, "<id>")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_tenants_extraction_is_indistinguishable_from_a_missing_one() {
    let (_dir, server) = start();
    let base = server.url.clone();
    let id = intake(&base, ACME, "acme", "s1").await;
    // Commit it, so it has findings and a ledger entry too.
    let claim = json!({"worker": "w", "limit": 1, "lease_seconds": 60});
    let (_, claims) = call_as(&format!("{base}/v1/claims"), Some(ADMIN), Method::POST, Some(claim)).await;
    let token = claims["claims"][0]["lease_token"].as_str().expect("lease token").to_string();
    let result = json!({"lease_token": token, "output": output(&[finding("r1", "s1", 1, "x")])});
    let (status, _) =
        call_as(&format!("{base}/v1/extractions/{id}/result"), Some(ADMIN), Method::POST, Some(result)).await;
    assert_eq!(status, 200);

    // Nor does a lookup by id prefix tell another tenant the id exists.
    let by_prefix = |token: &'static str| {
        let url = format!("{base}/v1/extractions?id_prefix={}", &id[..12]);
        async move { call_as(&url, Some(token), Method::GET, None).await }
    };
    let (status, own) = by_prefix(ACME).await;
    assert_eq!((status, own["extractions"][0]["extraction_id"].as_str()), (200, Some(id.as_str())), "{own}");
    let (status, theirs) = by_prefix(GLOBEX).await;
    assert_eq!((status, theirs["extractions"].as_array().map(Vec::len)), (200, Some(0)), "{theirs}");

    let missing = "0".repeat(64);
    for suffix in ["", "/findings", "/costs"] {
        let (own, _) = call_as(&format!("{base}/v1/extractions/{id}{suffix}"), Some(ACME), Method::GET, None).await;
        assert_eq!(own, 200, "the owner reads {suffix}");
        let (theirs, theirs_body) =
            call_as(&format!("{base}/v1/extractions/{id}{suffix}"), Some(GLOBEX), Method::GET, None).await;
        let (absent, absent_body) =
            call_as(&format!("{base}/v1/extractions/{missing}{suffix}"), Some(GLOBEX), Method::GET, None).await;
        assert_eq!((theirs, absent), (404, 404), "{suffix}: {theirs_body} / {absent_body}");
        assert_eq!(masked(&theirs_body, &id), masked(&absent_body, &missing), "{suffix}: the same answer");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_cursors_are_opaque_and_bound_to_their_listing() {
    let (_dir, server) = start();
    let base = server.url.clone();
    let list = async |token: &str, query: &str| {
        call_as(&format!("{base}/v1/extractions?{query}"), Some(token), Method::GET, None).await
    };

    // Two pages of acme, with globex's intake in between: the cursor must not move with it.
    for i in 0..3 {
        intake(&base, ACME, "acme", &format!("a{i}")).await;
    }
    let (_, first) = list(ACME, "limit=2").await;
    let before = first["next"].as_str().expect("a next cursor").to_string();
    for i in 0..5 {
        intake(&base, GLOBEX, "globex", &format!("g{i}")).await;
    }
    intake(&base, ACME, "acme", "a3").await;
    let (_, again) = list(ACME, "limit=2").await;
    assert_eq!(again["next"].as_str(), Some(before.as_str()), "the same page has the same cursor");
    assert!(before.parse::<u64>().is_err(), "not a sequence number: {before}");

    let (status, second) = list(ACME, &format!("limit=2&after={before}")).await;
    assert_eq!(status, 200, "{second}");
    let sources: Vec<&str> =
        second["extractions"].as_array().expect("array").iter().filter_map(|e| e["source_id"].as_str()).collect();
    assert_eq!(sources, ["a2", "a3"]);

    // A cursor is refused outside its listing, or when altered, with a clear code.
    let mut altered = before.clone().into_bytes();
    altered[0] = if altered[0] == b'0' { b'1' } else { b'0' };
    let altered = String::from_utf8(altered).expect("hex");
    for (token, query) in [
        (GLOBEX, format!("limit=2&after={before}")),
        (ADMIN, format!("limit=2&after={before}")),
        (ACME, format!("limit=2&state=pending&after={before}")),
        (ACME, format!("limit=2&after={altered}")),
        (ACME, "limit=2&after=2".to_string()),
    ] {
        let (status, body) = list(token, &query).await;
        assert_eq!((status, body["error"]["code"].as_str()), (400, Some("invalid_cursor")), "{query}: {body}");
    }
}

/// Issue 43, item 5: a diff against another tenant's extraction answered 409
/// `not_comparable` where an unknown id answered 404, telling the caller the id exists.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_diff_against_another_tenants_extraction_answers_as_a_missing_one() {
    let (_dir, server) = start();
    let base = server.url.clone();
    let own = intake(&base, ACME, "acme", "s1").await;
    let theirs = intake(&base, GLOBEX, "globex", "s1").await;
    let claim = json!({"worker": "w", "limit": 2, "lease_seconds": 60});
    let (_, claims) = call_as(&format!("{base}/v1/claims"), Some(ADMIN), Method::POST, Some(claim)).await;
    for grant in claims["claims"].as_array().expect("claims") {
        let id = grant["extraction_id"].as_str().expect("id");
        let token = grant["lease_token"].as_str().expect("lease token");
        let result = json!({"lease_token": token, "output": output(&[finding("r1", "s1", 1, "x")])});
        let (status, reply) =
            call_as(&format!("{base}/v1/extractions/{id}/result"), Some(ADMIN), Method::POST, Some(result)).await;
        assert_eq!(status, 200, "{reply}");
    }
    let missing = "0".repeat(64);
    let diff = |against: &str| {
        let url = format!("{base}/v1/extractions/{own}/diff?against={against}");
        async move { call_as(&url, Some(ACME), Method::GET, None).await }
    };
    let (absent, absent_body) = diff(&missing).await;
    let (other, other_body) = diff(&theirs).await;
    assert_eq!((other, absent), (404, 404), "{other_body} / {absent_body}");
    assert_eq!(masked(&other_body, &theirs), masked(&absent_body, &missing), "the same answer");
    // The admin sees every tenant: to it the two are simply not comparable.
    let url = format!("{base}/v1/extractions/{own}/diff?against={theirs}");
    let (status, body) = call_as(&url, Some(ADMIN), Method::GET, None).await;
    assert_eq!((status, body["error"]["code"].as_str()), (409, Some("not_comparable")), "{body}");
}
