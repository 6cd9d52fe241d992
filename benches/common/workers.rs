//! An external worker on one keep-alive connection: claim up to 10, then post a result
//! with 2 findings for each grant, in order, until the time is up. Used by the worker and
//! instances benches.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use serde_json::{Value, json};

use super::Result;
use super::http::Connection;
use super::stats::micros;

pub const CLAIM_LIMIT: usize = 10;
const LEASE_SECONDS: u64 = 300;

fn finding(rule: &str, line: u32, summary: &str) -> Value {
    json!({"rule": rule, "severity": "high", "file": "", "line": line, "summary": summary})
}

/// A result's `output`: two findings that differ in identity, on line 1 of the grant's
/// source (each post names its grant's `source_id` as the file, so code-review@1's
/// grounding rules hold).
pub fn output_body() -> Value {
    json!({"findings": [
        finding("lease-renewal", 1, "the lease is not renewed when a batch is split"),
        finding("unchecked-index", 1, "an index into the parsed lines is not checked"),
    ]})
}

/// `output` with its findings on `source_id`'s file.
fn grounded(output: &Value, source_id: &str) -> Value {
    let mut output = output.clone();
    for finding in output["findings"].as_array_mut().into_iter().flatten() {
        finding["file"] = json!(source_id);
    }
    output
}

#[derive(Debug, Default)]
pub struct WorkerStats {
    pub items: u64,
    pub claims: u64,
    pub empty_claims: u64,
    pub claim_us: Vec<u32>,
    pub result_us: Vec<u32>,
    pub errors: u64,
    pub samples: Vec<String>,
    pub finished: Option<Instant>,
}

impl WorkerStats {
    fn error(&mut self, text: String) {
        self.errors += 1;
        if self.samples.len() < 5 {
            self.samples.push(text);
        }
    }
}

pub async fn worker(id: usize, addr: SocketAddr, stop_at: Instant, output: Arc<Value>) -> WorkerStats {
    let mut stats = WorkerStats::default();
    let claim = Bytes::from(
        json!({"worker": format!("w-{id}"), "limit": CLAIM_LIMIT, "lease_seconds": LEASE_SECONDS}).to_string(),
    );
    let mut connection = None;
    while Instant::now() < stop_at {
        let conn = match &mut connection {
            Some(c) => c,
            None => match Connection::open(addr).await {
                Ok(c) => connection.insert(c),
                Err(e) => {
                    stats.error(format!("connect: {e}"));
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        if let Err(e) = one_round(conn, &claim, &output, &mut stats).await {
            stats.error(e.to_string());
            connection = None;
        }
    }
    if let Some(c) = connection {
        c.close().await;
    }
    stats
}

/// One claim of 10, then a result for each grant, in order.
async fn one_round(conn: &mut Connection, claim: &Bytes, output: &Value, stats: &mut WorkerStats) -> Result<()> {
    let started = Instant::now();
    let (status, body) = conn.post("/v1/claims", claim.clone()).await?;
    if status != 200 {
        return Err(format!("claim: HTTP {status} {}", String::from_utf8_lossy(&body)).into());
    }
    stats.claim_us.push(micros(started.elapsed()));
    stats.claims += 1;
    let page: Value = serde_json::from_slice(&body)?;
    let grants = page["claims"].as_array().cloned().unwrap_or_default();
    if grants.is_empty() {
        stats.empty_claims += 1;
        tokio::time::sleep(Duration::from_millis(10)).await;
        return Ok(());
    }
    for grant in grants {
        let (Some(id), Some(token)) = (grant["extraction_id"].as_str(), grant["lease_token"].as_str()) else {
            return Err(format!("a grant without id or lease token: {grant}").into());
        };
        let output = grounded(output, grant["source_id"].as_str().unwrap_or_default());
        let body = Bytes::from(json!({"lease_token": token, "output": output}).to_string());
        let started = Instant::now();
        let (status, answer) = conn.post(&format!("/v1/extractions/{id}/result"), body).await?;
        let needle = b"\"findings\":2,";
        if status != 200 || !answer.windows(needle.len()).any(|w| w == needle) {
            stats.error(format!("result: HTTP {status} {}", String::from_utf8_lossy(&answer)));
            continue;
        }
        stats.result_us.push(micros(started.elapsed()));
        stats.items += 1;
        stats.finished = Some(Instant::now());
    }
    Ok(())
}
