//! The harness: the real `commitpoint` binary on `127.0.0.1:0` over a temp data
//! directory, a small JSON client for its API, and a runner for CLI subcommands.
//!
//! Every child process is owned by a guard that SIGKILLs it on drop, so a failing
//! assertion never leaves a server behind. Every wait has a timeout.

use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::sync::mpsc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use reqwest::Method;
use serde_json::{Value, json};

pub const BIN: &str = env!("CARGO_BIN_EXE_commitpoint");
pub const SCHEMA: &str = "code-review@1";
const STARTUP_TIMEOUT: Duration = Duration::from_secs(30);
const EXIT_TIMEOUT: Duration = Duration::from_secs(20);
const CLI_TIMEOUT: Duration = Duration::from_secs(60);

/// A running `commitpoint serve`. Dropping it SIGKILLs the process.
pub struct Server {
    child: Option<Child>,
    stderr: Option<JoinHandle<String>>,
    pub url: String,
    pub data_dir: PathBuf,
}

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

    fn spawn(mut cmd: Command, data_dir: &Path) -> Server {
        let mut child = cmd.stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().expect("spawn commitpoint serve");
        let stdout = child.stdout.take().expect("piped stdout");
        let stderr = drain(child.stderr.take().expect("piped stderr"));
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            let mut reader = BufReader::new(stdout);
            let mut line = String::new();
            let _ = reader.read_line(&mut line);
            let _ = tx.send(line);
            // Keep the pipe open and drained for the life of the process.
            let _ = std::io::copy(&mut reader, &mut std::io::sink());
        });
        let mut server =
            Server { child: Some(child), stderr: Some(stderr), url: String::new(), data_dir: data_dir.to_path_buf() };
        let line = rx.recv_timeout(STARTUP_TIMEOUT).unwrap_or_default();
        match line.trim_end().strip_prefix("commitpoint listening on ") {
            Some(url) if url.starts_with("http://127.0.0.1:") => {
                server.url = url.to_string();
                server
            }
            _ => {
                let stderr = server.kill9();
                panic!("serve did not report its address (stdout line {line:?}); stderr:\n{stderr}");
            }
        }
    }

    pub fn api(&self) -> Api {
        Api::new(&self.url)
    }

    pub fn db_path(&self) -> PathBuf {
        self.data_dir.join("commitpoint.redb")
    }

    /// The server's process id (signals sent by tests and by the CLI under test).
    pub fn pid(&self) -> u32 {
        self.child.as_ref().map(Child::id).expect("server still owned")
    }

    /// SIGTERM, then waits for the exit. Returns the status and everything on stderr.
    pub fn terminate(mut self) -> (ExitStatus, String) {
        let sent = Command::new("kill").args(["-TERM", &self.pid().to_string()]).status().expect("run kill -TERM");
        assert!(sent.success(), "kill -TERM failed");
        let mut child = self.child.take().expect("server still owned");
        let status = wait_timeout(&mut child, EXIT_TIMEOUT).unwrap_or_else(|| {
            let _ = child.kill();
            let _ = child.wait();
            panic!("the server did not stop within {EXIT_TIMEOUT:?} of SIGTERM")
        });
        (status, self.collect_stderr())
    }

    /// SIGKILL (no chance to clean up) and reap. Returns stderr.
    pub fn kill9(&mut self) -> String {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        self.collect_stderr()
    }

    /// Waits for the process to exit by itself (a crash point killed it), reaps it and
    /// returns its status and stderr; `None` if it is still running after `timeout`.
    pub fn wait_exit(&mut self, timeout: Duration) -> Option<(ExitStatus, String)> {
        let status = wait_timeout(self.child.as_mut()?, timeout)?;
        self.child = None;
        Some((status, self.collect_stderr()))
    }

    fn collect_stderr(&mut self) -> String {
        self.stderr.take().map(|h| h.join().unwrap_or_default()).unwrap_or_default()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
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

/// Reads a pipe to the end on a thread, so the child never blocks on a full pipe.
fn drain<R: Read + Send + 'static>(mut pipe: R) -> JoinHandle<String> {
    std::thread::spawn(move || {
        let mut bytes = Vec::new();
        let _ = pipe.read_to_end(&mut bytes);
        String::from_utf8_lossy(&bytes).into_owned()
    })
}

pub fn wait_timeout(child: &mut Child, timeout: Duration) -> Option<ExitStatus> {
    let deadline = Instant::now() + timeout;
    loop {
        if let Ok(Some(status)) = child.try_wait() {
            return Some(status);
        }
        if Instant::now() >= deadline {
            return None;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Runs a command to completion (killing it after a timeout) and captures its output.
pub fn run_to_end(mut cmd: Command) -> Output {
    let mut child =
        cmd.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().expect("spawn command");
    let stdout = drain(child.stdout.take().expect("piped stdout"));
    let stderr = drain(child.stderr.take().expect("piped stderr"));
    let status = wait_timeout(&mut child, CLI_TIMEOUT);
    if status.is_none() {
        let _ = child.kill();
        let _ = child.wait();
    }
    let stdout = stdout.join().unwrap_or_default();
    let stderr = stderr.join().unwrap_or_default();
    let status = status.unwrap_or_else(|| {
        panic!("{cmd:?} did not finish within {CLI_TIMEOUT:?}\nstdout:\n{stdout}\nstderr:\n{stderr}")
    });
    Output { status, stdout: stdout.into_bytes(), stderr: stderr.into_bytes() }
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

/// Asserts `verify` exits 0 and reports every invariant as holding; returns stdout.
pub fn assert_verifies(db: &Path) -> String {
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

    pub async fn post_result(&self, id: &str, token: &str, output: &Value) -> Reply {
        self.post(&format!("/v1/extractions/{id}/result"), &json!({"lease_token": token, "output": output})).await
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
