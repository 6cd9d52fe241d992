//! The console at `/ui` without a browser (the browser test is `.ci/browser.sh`): its
//! headers, the session cookie, refusals (wrong token 401, post without CSRF 403, another
//! tenant's page 404) and pages whose numbers are the API's.

use reqwest::header::{CONTENT_SECURITY_POLICY, LOCATION, SET_COOKIE};
use reqwest::{Method, StatusCode};
use serde_json::json;

use crate::util::{Server, call_as, temp_dir, write_secret};

pub(crate) const ADMIN: &str = "admin-token-console-000001";
pub(crate) const ACME: &str = "acme-token-console-0000001";
const GLOBEX: &str = "globex-token-console-00001";

fn start(tokens: bool) -> (tempfile::TempDir, Server) {
    let dir = temp_dir();
    if !tokens {
        let server = Server::start(&dir.path().join("data"));
        return (dir, server);
    }
    let admin = dir.path().join("admin");
    let tenants = dir.path().join("tenants");
    write_secret(&admin, &format!("{ADMIN}\n"));
    write_secret(&tenants, &format!("acme {ACME}\nglobex {GLOBEX}\n"));
    let config = dir.path().join("config.toml");
    let text = format!(
        "[access]\nadmin_token_file = \"{}\"\ntenant_tokens_file = \"{}\"\n",
        admin.display(),
        tenants.display()
    );
    std::fs::write(&config, text).expect("write config");
    let server = Server::start_with(&dir.path().join("data"), &["--config", config.to_str().expect("utf-8 path")]);
    (dir, server)
}

/// A browser without redirects or a cookie jar: every step is asserted.
pub(crate) struct Browser {
    base: String,
    client: reqwest::Client,
    cookie: Option<String>,
}

impl Browser {
    pub(crate) fn new(base: &str) -> Self {
        let client = reqwest::Client::builder().redirect(reqwest::redirect::Policy::none()).build().expect("client");
        Self { base: base.to_string(), client, cookie: None }
    }

    /// A session on a server without tokens: the login page hands one out on loopback.
    pub(crate) async fn open_session(base: &str) -> Self {
        let mut browser = Browser::new(base);
        let response = browser.send(Method::GET, "/ui/login", None).await;
        assert_eq!(response.status(), StatusCode::SEE_OTHER);
        let cookie = response.headers()[SET_COOKIE].to_str().expect("ascii").to_string();
        browser.cookie = Some(cookie.split(';').next().expect("pair").to_string());
        browser
    }

    pub(crate) async fn send(&self, method: Method, path: &str, form: Option<&[(&str, &str)]>) -> reqwest::Response {
        let mut request = self.client.request(method, format!("{}{path}", self.base));
        if let Some(cookie) = &self.cookie {
            request = request.header("cookie", cookie);
        }
        if let Some(form) = form {
            let body: Vec<String> = form.iter().map(|(k, v)| format!("{k}={v}")).collect();
            request = request.header("content-type", "application/x-www-form-urlencoded").body(body.join("&"));
        }
        request.send().await.expect("console request")
    }

    pub(crate) async fn page(&self, path: &str) -> (StatusCode, String) {
        let response = self.send(Method::GET, path, None).await;
        let status = response.status();
        (status, response.text().await.expect("page body"))
    }

    /// Opens the login form: its nonce cookie and CSRF token.
    async fn login_form(&self) -> (String, String) {
        let response = self.send(Method::GET, "/ui/login", None).await;
        assert_eq!(response.status(), StatusCode::OK);
        let set = response.headers()[SET_COOKIE].to_str().expect("ascii cookie").to_string();
        let html = response.text().await.expect("login page");
        let marker = "name=\"csrf\" value=\"";
        let start = html.find(marker).expect("a CSRF field") + marker.len();
        (set.split(';').next().expect("a cookie pair").to_string(), html[start..start + 64].to_string())
    }

    /// Posts the login form with `token`.
    pub(crate) async fn post_login(&self, token: &str) -> reqwest::Response {
        let (nonce, csrf) = self.login_form().await;
        let mut with_nonce = Browser::new(&self.base);
        with_nonce.cookie = Some(nonce);
        with_nonce.send(Method::POST, "/ui/login", Some(&[("token", token), ("csrf", &csrf)])).await
    }

    /// Logs in; returns the `Set-Cookie` header.
    pub(crate) async fn login(&mut self, token: &str) -> String {
        let response = self.post_login(token).await;
        assert_eq!(response.status(), StatusCode::SEE_OTHER);
        let set = response.headers()[SET_COOKIE].to_str().expect("ascii cookie").to_string();
        self.cookie = Some(set.split(';').next().expect("a cookie pair").to_string());
        set
    }

    /// The CSRF token the forms of a page carry.
    pub(crate) async fn csrf(&self, path: &str) -> String {
        let (status, html) = self.page(path).await;
        assert_eq!(status, StatusCode::OK, "{html}");
        let marker = "name=\"csrf\" value=\"";
        let start = html.find(marker).expect("a form with a CSRF field") + marker.len();
        html[start..start + 64].to_string()
    }
}

async fn failed_extraction(base: &str, tenant: &str, token: &str) -> String {
    let body = json!({"tenant": tenant, "source_id": format!("{tenant}-1"), "schema": "code-review@1", "content": "x"});
    let (status, reply) = call_as(&format!("{base}/v1/extractions"), Some(token), Method::POST, Some(body)).await;
    assert_eq!(status, 201, "{reply}");
    let id = reply["extraction_id"].as_str().expect("id").to_string();
    let claim = json!({"worker": "w", "limit": 1, "lease_seconds": 60});
    let (_, claims) = call_as(&format!("{base}/v1/claims"), Some(ADMIN), Method::POST, Some(claim)).await;
    let lease = claims["claims"][0]["lease_token"].as_str().expect("lease").to_string();
    let bad = json!({"lease_token": lease, "output": {"not": "a review"}, "reask": false});
    let (status, _) =
        call_as(&format!("{base}/v1/extractions/{id}/result"), Some(ADMIN), Method::POST, Some(bad)).await;
    assert_eq!(status, 422);
    id
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_console_logs_in_once_and_shows_the_apis_numbers() {
    let (_dir, server) = start(true);
    let base = server.url.clone();
    let id = failed_extraction(&base, "acme", ACME).await;
    let mut browser = Browser::new(&base);

    let response = browser.send(Method::GET, "/ui", None).await;
    assert_eq!(response.status(), StatusCode::SEE_OTHER);
    assert_eq!(response.headers()[LOCATION], "/ui/login");
    let csp = response.headers()[CONTENT_SECURITY_POLICY].to_str().expect("ascii");
    for part in ["default-src 'none'", "script-src 'self'", "form-action 'self'", "frame-ancestors 'none'"] {
        assert!(csp.contains(part), "{csp}");
    }
    assert!(!csp.contains("unsafe-inline"), "{csp}");

    let wrong = browser.post_login("not-a-token-of-this-server").await;
    assert_eq!(wrong.status(), StatusCode::UNAUTHORIZED);
    let set = wrong.headers().get(SET_COOKIE).map(|v| v.to_str().expect("ascii").to_string()).unwrap_or_default();
    assert!(!set.contains("cp_console"), "a refused login gets no session: {set}");
    // The login form's post needs its CSRF token and nonce cookie like any other.
    let bare = browser.send(Method::POST, "/ui/login", Some(&[("token", ADMIN)])).await;
    assert_eq!(bare.status(), StatusCode::FORBIDDEN);
    let (nonce, _) = browser.login_form().await;
    let mut other_form = Browser::new(&base);
    other_form.cookie = Some(nonce);
    let (_, foreign_csrf) = browser.login_form().await;
    let crossed = other_form.send(Method::POST, "/ui/login", Some(&[("token", ADMIN), ("csrf", &foreign_csrf)])).await;
    assert_eq!(crossed.status(), StatusCode::FORBIDDEN, "a token from another form does not fit");

    let cookie = browser.login(ADMIN).await;
    for flag in ["HttpOnly", "SameSite=Strict", "Max-Age=", "Path=/ui"] {
        assert!(cookie.contains(flag), "{cookie}");
    }
    let (status, html) = browser.page("/ui").await;
    assert_eq!(status, StatusCode::OK);
    assert!(!html.contains("<script>"), "no inline script");
    let (_, stats) = call_as(&format!("{base}/v1/stats"), Some(ADMIN), Method::GET, None).await;
    for (state, count) in stats["extractions"].as_object().expect("counts") {
        let shown = format!("id=\"count-{state}\">{count}<");
        assert!(html.contains(&shown), "{shown} not in the overview");
    }
    assert!(html.contains(&format!("id=\"count-total\">{}<", stats["total"])));
    assert_eq!(stats["extractions"]["failed"], 1, "the failed extraction is counted");
    let store = format!(
        "Store: <strong>{}</strong> · this instance: <code>{}</code>",
        stats["store"]["backend"].as_str().expect("backend"),
        stats["store"]["instance"].as_str().expect("instance")
    );
    assert!(html.contains(&store), "{store} not in the overview");
    // The tenants table: acme's one failed extraction, in StateName order, no pending work.
    let acme = "<td>code-review@1</td><td>0</td><td>0</td><td>0</td><td>1</td><td>0</td><td>0</td><td>0</td><td>—</td>";
    assert!(html.contains("data-tenant=\"acme\"") && html.contains(acme), "acme's row not in the overview");

    let (status, html) = browser.page(&format!("/ui/extractions/{id}")).await;
    assert_eq!(status, StatusCode::OK);
    assert!(html.contains("id=\"state\">failed<") && html.contains("validation"), "{html}");

    // The stylesheet is embedded and cached for long.
    let start = html.find("/ui/assets/console-").expect("stylesheet link");
    let end = start + html[start..].find('"').expect("end of href");
    let css = browser.send(Method::GET, &html[start..end], None).await;
    assert_eq!(css.status(), StatusCode::OK);
    assert!(css.headers()["cache-control"].to_str().expect("ascii").contains("immutable"));

    // A forged or expired cookie is no session.
    browser.cookie = Some("cp_console=e30.AAAA".to_string());
    let (status, _) = browser.page("/ui").await;
    assert_eq!(status, StatusCode::SEE_OTHER);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn console_posts_need_the_sessions_csrf_token() {
    let (_dir, server) = start(true);
    let base = server.url.clone();
    let id = failed_extraction(&base, "acme", ACME).await;
    let mut browser = Browser::new(&base);
    browser.login(ADMIN).await;
    let path = format!("/ui/extractions/{id}/retry");
    let csrf = browser.csrf(&format!("/ui/extractions/{id}")).await;

    let missing = browser.send(Method::POST, &path, Some(&[])).await;
    assert_eq!(missing.status(), StatusCode::FORBIDDEN);
    let wrong = "0".repeat(64);
    let forged = browser.send(Method::POST, &path, Some(&[("csrf", wrong.as_str())])).await;
    assert_eq!(forged.status(), StatusCode::FORBIDDEN);
    // Another session's token does not fit this one.
    let mut other = Browser::new(&base);
    other.login(ADMIN).await;
    let stolen = other.send(Method::POST, &path, Some(&[("csrf", csrf.as_str())])).await;
    assert_eq!(stolen.status(), StatusCode::FORBIDDEN);
    // Without any session a post is refused outright, not redirected.
    let anonymous = Browser::new(&base).send(Method::POST, &path, Some(&[("csrf", csrf.as_str())])).await;
    assert_eq!(anonymous.status(), StatusCode::FORBIDDEN);
    let (_, record) = call_as(&format!("{base}/v1/extractions/{id}"), Some(ADMIN), Method::GET, None).await;
    assert_eq!(record["state"], "failed", "no refused post changed anything");

    let done = browser.send(Method::POST, &path, Some(&[("csrf", csrf.as_str())])).await;
    assert_eq!(done.status(), StatusCode::SEE_OTHER);
    let (_, record) = call_as(&format!("{base}/v1/extractions/{id}"), Some(ADMIN), Method::GET, None).await;
    assert_eq!(record["state"], "pending");
    assert_eq!(record["attempts"], 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_session_sees_only_its_own_tenant() {
    let (_dir, server) = start(true);
    let base = server.url.clone();
    let theirs = failed_extraction(&base, "globex", GLOBEX).await;
    let mut acme = Browser::new(&base);
    acme.login(ACME).await;

    let (status, _) = acme.page(&format!("/ui/extractions/{theirs}")).await;
    assert_eq!(status, StatusCode::NOT_FOUND, "another tenant's extraction is as missing");
    let (status, html) = acme.page("/ui/extractions").await;
    assert_eq!(status, StatusCode::OK);
    assert!(!html.contains(&theirs[..12]), "the listing holds no other tenant's work");
    let (status, _) = acme.page("/ui/extractions?tenant=globex").await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    for admin_page in ["/ui/batches", "/ui/dead-letters"] {
        let (status, _) = acme.page(admin_page).await;
        assert_eq!(status, StatusCode::FORBIDDEN, "{admin_page}");
    }
    let home = acme.send(Method::GET, "/ui", None).await;
    assert_eq!(home.headers()[LOCATION], "/ui/extractions", "the overview is the whole store: admin only");

    let csrf = acme.csrf("/ui/extractions").await;
    let cancel = acme.send(Method::POST, &format!("/ui/extractions/{theirs}/cancel"), Some(&[("csrf", &csrf)])).await;
    assert_eq!(cancel.status(), StatusCode::NOT_FOUND);
    let retry = acme.send(Method::POST, &format!("/ui/extractions/{theirs}/retry"), Some(&[("csrf", &csrf)])).await;
    assert_eq!(retry.status(), StatusCode::FORBIDDEN, "retry is an admin action");
    let (_, record) = call_as(&format!("{base}/v1/extractions/{theirs}"), Some(ADMIN), Method::GET, None).await;
    assert_eq!(record["state"], "failed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_tokens_the_console_is_open_on_loopback() {
    let (_dir, server) = start(false);
    let browser = Browser::open_session(&server.url).await;
    let (status, html) = browser.page("/ui").await;
    assert_eq!(status, StatusCode::OK);
    assert!(html.contains("id=\"count-total\">0<") && html.contains("open (loopback)"), "{html}");
}

async fn pending_extraction(base: &str) -> String {
    let body = json!({"tenant": "acme", "source_id": "acme-pending", "schema": "code-review@1", "content": "x"});
    let (status, reply) = call_as(&format!("{base}/v1/extractions"), Some(ACME), Method::POST, Some(body)).await;
    assert_eq!(status, 201, "{reply}");
    reply["extraction_id"].as_str().expect("id").to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_post_with_a_logged_out_sessions_cookie_is_refused() {
    let (_dir, server) = start(true);
    let base = server.url.clone();
    let id = pending_extraction(&base).await;
    let mut browser = Browser::new(&base);
    browser.login(ADMIN).await;
    let csrf = browser.csrf(&format!("/ui/extractions/{id}")).await;
    // A copy of the cookie, as a stolen one or another tab would hold it.
    let mut copy = Browser::new(&base);
    copy.cookie = browser.cookie.clone();

    let out = browser.send(Method::POST, "/ui/logout", Some(&[("csrf", &csrf)])).await;
    assert_eq!(out.status(), StatusCode::SEE_OTHER);
    let cancel = copy.send(Method::POST, &format!("/ui/extractions/{id}/cancel"), Some(&[("csrf", &csrf)])).await;
    assert_eq!(cancel.status(), StatusCode::FORBIDDEN, "the session ended at logout");
    let (status, _) = copy.page("/ui").await;
    assert_eq!(status, StatusCode::SEE_OTHER, "its pages send it to the login form");
    let (_, record) = call_as(&format!("{base}/v1/extractions/{id}"), Some(ADMIN), Method::GET, None).await;
    assert_eq!(record["state"], "pending", "nothing was cancelled");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_with_a_new_admin_token_ends_the_old_tokens_sessions() {
    let (dir, server) = start(true);
    let base = server.url.clone();
    let mut browser = Browser::new(&base);
    browser.login(ADMIN).await;
    let (status, _) = browser.page("/ui").await;
    assert_eq!(status, StatusCode::OK);

    let rotated = "admin-token-console-rotated1";
    write_secret(&dir.path().join("admin"), &format!("{rotated}\n"));
    let config = dir.path().join("config.toml");
    let pid = server.pid().to_string();
    let data = dir.path().join("data");
    let args = ["ctl", "reload", "--pid", &pid, "--config", config.to_str().expect("utf-8"), "--data-dir"];
    let out = crate::util::cli(&[&args[..], &[data.to_str().expect("utf-8")]].concat());
    assert!(out.status.success(), "{}", crate::util::stderr(&out));

    let stats = format!("{base}/v1/stats");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while call_as(&stats, Some(ADMIN), Method::GET, None).await.0 != 401 {
        assert!(std::time::Instant::now() < deadline, "the old admin token still works after the reload");
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    assert_eq!(call_as(&stats, Some(rotated), Method::GET, None).await.0, 200);
    let (status, _) = browser.page("/ui").await;
    assert_eq!(status, StatusCode::SEE_OTHER, "the session opened with the old token ended");
    browser.login(rotated).await;
    assert_eq!(browser.page("/ui").await.0, StatusCode::OK);
}
