//! A small JSON client for commitpoint's API, and the endpoint the clients share: the
//! address changes with every restart (port 0), and is absent while the server is down.

use std::sync::Mutex;
use std::time::Duration;

use reqwest::Method;
use serde_json::Value;

/// Time between looks for a server that is down or restarting.
const DOWN_POLL: Duration = Duration::from_millis(15);

#[derive(Debug, Clone)]
pub struct Reply {
    pub status: u16,
    pub body: Value,
}

impl Reply {
    pub fn code(&self) -> &str {
        self.body["error"]["code"].as_str().unwrap_or("")
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
            .timeout(Duration::from_secs(30))
            .build()
            .expect("build reqwest client");
        Api { base: base.trim_end_matches('/').to_string(), http }
    }

    pub fn base(&self) -> &str {
        &self.base
    }

    /// `Err` only when no complete answer arrived (connection refused or cut by a kill).
    pub async fn try_send(&self, method: Method, path: &str, body: Option<&Value>) -> Result<Reply, reqwest::Error> {
        let mut request = self.http.request(method, format!("{}{path}", self.base));
        if let Some(body) = body {
            request = request.header("content-type", "application/json").body(body.to_string());
        }
        Self::reply(path, request).await
    }

    /// A POST of exact bytes with extra headers (a signed webhook delivery).
    pub async fn try_post_raw(
        &self,
        path: &str,
        headers: &[(&str, String)],
        body: Vec<u8>,
    ) -> Result<Reply, reqwest::Error> {
        let mut request = self.http.post(format!("{}{path}", self.base)).header("content-type", "application/json");
        for (name, value) in headers {
            request = request.header(*name, value);
        }
        Self::reply(path, request.body(body)).await
    }

    async fn reply(path: &str, request: reqwest::RequestBuilder) -> Result<Reply, reqwest::Error> {
        let response = request.send().await?;
        let status = response.status().as_u16();
        let bytes = response.bytes().await?;
        let body = serde_json::from_slice(&bytes).unwrap_or_else(|e| {
            panic!("{status} answer to {path} is not JSON ({e}): {:?}", String::from_utf8_lossy(&bytes))
        });
        Ok(Reply { status, body })
    }
}

/// Why a single send got no answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unanswered {
    /// No server was up: nothing was sent.
    Down,
    /// Sent, but the connection failed before a whole answer arrived: the request may or
    /// may not have taken effect.
    Lost,
}

/// Where the server is now. Clients never hold an `Api` across a restart: they ask here.
#[derive(Debug, Default)]
pub struct Endpoint {
    current: Mutex<Option<Api>>,
}

impl Endpoint {
    pub fn set(&self, api: Option<Api>) {
        *self.current.lock().unwrap_or_else(|e| e.into_inner()) = api;
    }

    pub fn current(&self) -> Option<Api> {
        self.current.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Sends until an answer arrives, across kills and restarts: the at-least-once delivery
    /// of a client that retries. Returns the answer and how many sends failed before it.
    pub async fn send(&self, method: Method, path: &str, body: Option<&Value>) -> (Reply, u32) {
        let mut failures = 0;
        loop {
            let Some(api) = self.current() else {
                tokio::time::sleep(DOWN_POLL).await;
                continue;
            };
            match api.try_send(method.clone(), path, body).await {
                Ok(reply) => return (reply, failures),
                Err(_) => {
                    failures += 1;
                    tokio::time::sleep(DOWN_POLL).await;
                }
            }
        }
    }

    /// One send to the current server.
    pub async fn send_once(&self, method: Method, path: &str, body: Option<&Value>) -> Result<Reply, Unanswered> {
        let api = self.current().ok_or(Unanswered::Down)?;
        api.try_send(method, path, body).await.map_err(|_| Unanswered::Lost)
    }

    pub async fn get(&self, path: &str) -> Reply {
        let reply = self.send(Method::GET, path, None).await.0;
        assert_eq!(reply.status, 200, "GET {path}: {:#}", reply.body);
        reply
    }

    /// Every extraction matching `query` (e.g. `state=failed&`), following `next` cursors.
    pub async fn list_all(&self, query: &str) -> Vec<Value> {
        let mut out = Vec::new();
        let mut after = String::new();
        loop {
            let reply = self.get(&format!("/v1/extractions?{query}limit=1000&after={after}")).await;
            out.extend(reply.body["extractions"].as_array().expect("extractions array").iter().cloned());
            match &reply.body["next"] {
                Value::String(next) => after.clone_from(next),
                Value::Null => return out,
                other => panic!("next must be a string or null, got {other}"),
            }
        }
    }
}
