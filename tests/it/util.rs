//! The harness: the real `commitpoint` binary on `127.0.0.1:0` over a temp data
//! directory (guarded by `support::process`, shared with the torture test), a small JSON
//! client for its API, and a runner for CLI subcommands. Every wait has a timeout.

use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use reqwest::Method;
use serde_json::{Value, json};

use crate::support::process::run_bounded;
pub use crate::support::process::{BIN, Server, wait_timeout};

pub const SCHEMA: &str = "code-review@1";
const CLI_TIMEOUT: Duration = Duration::from_secs(60);

/// The constructors the tests use; the process guard itself is `support::process::Server`.
impl Server {
    /// Starts a server on a free loopback port and waits for its "listening" line.
    pub fn start(data_dir: &Path) -> Server {
        Self::start_with(data_dir, &[])
    }

    pub fn start_with(data_dir: &Path, extra: &[&str]) -> Server {
        Self::spawn(serve_command(data_dir, extra), data_dir)
    }

    /// Like [`Server::start_with`], with extra environment variables. Crash points
    /// (`COMMITPOINT_FAILPOINTS`) are armed only when `env` names them.
    pub fn start_with_env(data_dir: &Path, extra: &[&str], env: &[(&str, &str)]) -> Server {
        let mut cmd = serve_command(data_dir, extra);
        cmd.env_remove("COMMITPOINT_FAILPOINTS");
        for (name, value) in env {
            cmd.env(name, value);
        }
        Self::spawn(cmd, data_dir)
    }

    pub fn api(&self) -> Api {
        Api::new(&self.url)
    }
}

pub fn serve_command(data_dir: &Path, extra: &[&str]) -> Command {
    let mut cmd = Command::new(BIN);
    cmd.arg("serve")
        .arg("--data-dir")
        .arg(data_dir)
        .args(["--listen", "127.0.0.1:0"])
        .args(extra)
        .env("COMMITPOINT_LOG", "info")
        .stdin(Stdio::null());
    cmd
}

/// Runs a command to completion (killing it after a timeout) and captures its output.
pub fn run_to_end(cmd: Command) -> Output {
    run_bounded(cmd, CLI_TIMEOUT).unwrap_or_else(|failure| panic!("{failure}"))
}

/// `commitpoint ARGS…` with captured output.
pub fn cli(args: &[&str]) -> Output {
    cli_with_env(args, &[])
}

/// A CLI run with extra environment (`COMMITPOINT_ADMIN`, `COMMITPOINT_CONFIG`, …).
pub fn cli_with_env(args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut cmd = Command::new(BIN);
    cmd.args(args).env_remove("COMMITPOINT_ADMIN").env("COMMITPOINT_CONFIG", "/nonexistent/commitpoint.toml");
    for (name, value) in env {
        cmd.env(name, value);
    }
    run_to_end(cmd)
}

/// `commitpoint verify FILE`.
pub fn verify(db: &Path) -> Output {
    let mut cmd = Command::new(BIN);
    cmd.arg("verify").arg(db);
    run_to_end(cmd)
}

pub fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

pub fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// Asserts `verify` exits 0 and reports every invariant as holding; returns stdout. On
/// PostgreSQL (`COMMITPOINT_TEST_STORE=postgres`) it is `verify --store-url` on the data
/// directory's database.
pub fn assert_verifies(db: &Path) -> String {
    if crate::support::postgres::enabled() {
        let data_dir = db.parent().expect("the database file's directory");
        let postgres = crate::support::postgres::cluster();
        return postgres.assert_verifies(&crate::support::postgres::database_for(data_dir));
    }
    let out = verify(db);
    let text = stdout(&out);
    assert_eq!(out.status.code(), Some(0), "verify failed\nstdout:\n{text}\nstderr:\n{}", stderr(&out));
    assert!(text.contains("ok: every invariant holds"), "{text}");
    text
}

/// SIGTERMs the server, asserts a clean exit, then asserts the file verifies.
pub fn stop_and_verify(server: Server) -> String {
    let db = server.db_path();
    let (status, log) = server.terminate();
    assert_eq!(status.code(), Some(0), "SIGTERM should stop the server cleanly; stderr:\n{log}");
    assert_verifies(&db)
}

/// One HTTP answer: status and the JSON body (every answer of this API is JSON).
#[derive(Debug, Clone)]
pub struct Reply {
    pub status: u16,
    pub body: Value,
}

impl Reply {
    pub fn error_code(&self) -> &str {
        self.body["error"]["code"].as_str().unwrap_or("<no error code>")
    }

    /// Asserts an error answer of the documented shape with this status and code.
    pub fn assert_error(&self, status: u16, code: &str) {
        assert_eq!(self.status, status, "{:#}", self.body);
        assert_eq!(self.error_code(), code, "{:#}", self.body);
        assert!(
            self.body["error"]["message"].as_str().is_some_and(|m| !m.is_empty()),
            "an error carries a message: {:#}",
            self.body
        );
    }
}

#[derive(Debug, Clone)]
pub struct Api {
    base: String,
    http: reqwest::Client,
}

impl Api {
    pub fn new(base: &str) -> Api {
        let http = reqwest::Client::builder()
            .no_proxy()
            .timeout(Duration::from_secs(20))
            .build()
            .expect("build reqwest client");
        Api { base: base.trim_end_matches('/').to_string(), http }
    }

    /// Sends raw bytes; `Err` only for transport failures.
    pub async fn try_send(&self, method: Method, path: &str, body: Option<Vec<u8>>) -> Result<Reply, reqwest::Error> {
        let mut request = self.http.request(method, format!("{}{path}", self.base));
        if let Some(body) = body {
            request = request.header("content-type", "application/json").body(body);
        }
        let response = request.send().await?;
        let status = response.status().as_u16();
        let content_type =
            response.headers().get("content-type").and_then(|v| v.to_str().ok()).unwrap_or_default().to_string();
        let bytes = response.bytes().await?;
        let body = serde_json::from_slice(&bytes).unwrap_or_else(|e| {
            panic!("{status} answer to {path} is not JSON ({e}): {:?}", String::from_utf8_lossy(&bytes))
        });
        assert!(
            content_type.starts_with("application/json"),
            "{status} answer to {path} has content-type {content_type:?}"
        );
        Ok(Reply { status, body })
    }

    pub async fn send(&self, method: Method, path: &str, body: Option<Vec<u8>>) -> Reply {
        let shown = format!("{method} {path}");
        self.try_send(method, path, body).await.unwrap_or_else(|e| panic!("{shown}: {e}"))
    }

    pub async fn get(&self, path: &str) -> Reply {
        self.send(Method::GET, path, None).await
    }

    /// A GET whose answer is text (CSV, a table): asserts 200 and returns the body.
    pub async fn get_text(&self, path: &str) -> String {
        let response = self.http.get(format!("{}{path}", self.base)).send().await.expect("GET");
        let status = response.status().as_u16();
        let text = response.text().await.expect("read the body");
        assert_eq!(status, 200, "GET {path}: {text}");
        text
    }

    pub async fn post(&self, path: &str, body: &Value) -> Reply {
        self.send(Method::POST, path, Some(body.to_string().into_bytes())).await
    }

    pub async fn try_intake(&self, tenant: &str, source_id: &str, content: &str) -> Result<Reply, reqwest::Error> {
        let body = intake_body(tenant, source_id, content);
        self.try_send(Method::POST, "/v1/extractions", Some(body.to_string().into_bytes())).await
    }

    pub async fn intake(&self, tenant: &str, source_id: &str, content: &str) -> Reply {
        self.post("/v1/extractions", &intake_body(tenant, source_id, content)).await
    }

    /// Intake that must create a new extraction; returns its id.
    pub async fn create(&self, tenant: &str, source_id: &str, content: &str) -> String {
        let reply = self.intake(tenant, source_id, content).await;
        assert_eq!(reply.status, 201, "{:#}", reply.body);
        assert_eq!(reply.body["created"], json!(true));
        assert_eq!(reply.body["state"], json!("pending"));
        id_of(&reply.body)
    }

    /// The extraction record; it must exist.
    pub async fn record(&self, id: &str) -> Value {
        let reply = self.get(&format!("/v1/extractions/{id}")).await;
        assert_eq!(reply.status, 200, "GET {id}: {:#}", reply.body);
        reply.body
    }

    pub async fn findings(&self, id: &str) -> Value {
        let reply = self.get(&format!("/v1/extractions/{id}/findings")).await;
        assert_eq!(reply.status, 200, "findings of {id}: {:#}", reply.body);
        reply.body
    }

    /// Claims work; the call itself must succeed. Returns the grants.
    pub async fn claim(&self, worker: &str, limit: u32, lease_seconds: u64) -> Vec<Value> {
        let reply =
            self.post("/v1/claims", &json!({"worker": worker, "limit": limit, "lease_seconds": lease_seconds})).await;
        assert_eq!(reply.status, 200, "claim: {:#}", reply.body);
        reply.body["claims"].as_array().cloned().expect("claims array")
    }

    /// Claims exactly one extraction and returns (id, lease_token).
    pub async fn claim_one(&self, worker: &str, lease_seconds: u64) -> (String, String) {
        let grants = self.claim(worker, 1, lease_seconds).await;
        assert_eq!(grants.len(), 1, "expected one grant: {grants:#?}");
        let token = grants[0]["lease_token"].as_str().expect("lease_token");
        (id_of(&grants[0]), token.to_string())
    }

    /// Posts under a lease, declining the re-ask (`"reask": false`): an invalid output fails
    /// its extraction at once, as the tests of the failure path expect. The re-ask tests
    /// post their own bodies.
    pub async fn post_result(&self, id: &str, token: &str, output: &Value) -> Reply {
        let body = json!({"lease_token": token, "output": output, "reask": false});
        self.post(&format!("/v1/extractions/{id}/result"), &body).await
    }

    /// `POST /v1/extractions/{id}/lease`: more time on the lease `token` holds.
    pub async fn extend_lease(&self, id: &str, token: &str, lease_seconds: u64) -> Reply {
        let body = json!({"lease_token": token, "lease_seconds": lease_seconds});
        self.post(&format!("/v1/extractions/{id}/lease"), &body).await
    }

    pub async fn retry(&self, id: &str) -> Reply {
        self.post(&format!("/v1/extractions/{id}/retry"), &json!({})).await
    }

    /// Every extraction matching `query` (e.g. `tenant=a&`), following `next` cursors.
    pub async fn list_all(&self, query: &str) -> Vec<Value> {
        let mut out = Vec::new();
        let mut after = String::new();
        loop {
            let reply = self.get(&format!("/v1/extractions?{query}limit=100&after={after}")).await;
            assert_eq!(reply.status, 200, "list: {:#}", reply.body);
            out.extend(reply.body["extractions"].as_array().expect("extractions array").iter().cloned());
            match &reply.body["next"] {
                Value::String(next) => after.clone_from(next),
                Value::Null => return out,
                other => panic!("next must be a string or null, got {other}"),
            }
        }
    }
}

pub fn intake_body(tenant: &str, source_id: &str, content: &str) -> Value {
    json!({"tenant": tenant, "source_id": source_id, "schema": SCHEMA, "content": content})
}

pub fn id_of(body: &Value) -> String {
    let id = body["extraction_id"].as_str().unwrap_or_else(|| panic!("no extraction_id in {body:#}"));
    assert_eq!(id.len(), 64, "ids are 64 hex characters: {id}");
    id.to_string()
}

/// A git diff adding each of `files` with `lines` lines: code-review@1 findings naming
/// these files and lines 1..=lines are grounded in it (the built-in schema checks `path`
/// and `line`).
pub fn diff_adding(files: &[&str], lines: u32) -> String {
    let mut diff = String::new();
    for file in files {
        diff.push_str(&format!("diff --git a/{file} b/{file}\nnew file mode 100644\n--- /dev/null\n+++ b/{file}\n"));
        diff.push_str(&format!("@@ -0,0 +1,{lines} @@\n"));
        for line in 1..=lines {
            diff.push_str(&format!("+line {line}\n"));
        }
    }
    diff
}

/// A review's source that grounds the files the tests' findings name, lines 1-12.
pub fn reviewed() -> String {
    diff_adding(&["src/a.rs", "src/db.rs", "src/z.rs", "a.rs", "b.rs", "x.rs", "f.rs"], 12)
}

/// One code-review@1 finding.
pub fn finding(rule: &str, file: &str, line: u32, summary: &str) -> Value {
    json!({"rule": rule, "severity": "high", "file": file, "line": line, "summary": summary})
}

pub fn output(findings: &[Value]) -> Value {
    json!({ "findings": findings })
}

pub fn temp_dir() -> tempfile::TempDir {
    tempfile::Builder::new().prefix("commitpoint-it-").tempdir().expect("create temp dir")
}

/// Writes a secret file (token files must be mode 0600 or stricter).
pub fn write_secret(path: &Path, text: &str) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::write(path, text).expect("write a secret file");
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)).expect("chmod a secret file");
}

/// One call with an optional bearer token: status and the JSON body (`Null` if none).
pub async fn call_as(url: &str, token: Option<&str>, method: Method, body: Option<Value>) -> (u16, Value) {
    let mut request = reqwest::Client::builder().no_proxy().build().expect("client").request(method, url);
    if let Some(token) = token {
        request = request.bearer_auth(token);
    }
    if let Some(body) = body {
        request = request.json(&body);
    }
    let response = request.send().await.expect("reach the server");
    let status = response.status().as_u16();
    (status, response.json().await.unwrap_or(Value::Null))
}
