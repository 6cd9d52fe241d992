//! What the clients and workers were told, shared by every task and read by the checks.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use commitpoint::domain::identity::{ExtractionId, SourceHash};
use serde_json::Value;

use crate::fleet::Live;

pub const SCHEMA: &str = "code-review@1";

#[derive(Debug, Clone)]
pub struct Source {
    pub tenant: String,
    pub source_id: String,
    pub content: String,
}

impl Source {
    /// The identity the server must answer with (the documented rule).
    pub fn id(&self) -> String {
        let hash = SourceHash::compute(self.content.as_bytes(), SCHEMA);
        ExtractionId::compute(&self.tenant, &self.source_id, &hash, SCHEMA).to_hex()
    }
}

#[derive(Debug, Default)]
pub struct Counters {
    pub intakes: AtomicU64,
    pub acks: AtomicU64,
    pub created: AtomicU64,
    pub duplicate_sends: AtomicU64,
    pub unanswered: AtomicU64,
    pub unavailable: AtomicU64,
    pub claims: AtomicU64,
    pub fresh_commits: AtomicU64,
    pub replays: AtomicU64,
    pub stale_refused: AtomicU64,
    pub slow_posts: AtomicU64,
    pub post_retries: AtomicU64,
}

impl Counters {
    pub fn bump(counter: &AtomicU64) {
        counter.fetch_add(1, Ordering::Relaxed);
    }
}

#[derive(Debug, Default)]
pub struct World {
    pub live: Arc<Live>,
    pub http: reqwest::Client,
    pub stop_intake: AtomicBool,
    pub stop_workers: AtomicBool,
    /// Every identity a client sent, acknowledged or not.
    pub sent: Mutex<HashMap<String, Source>>,
    /// Sources already sent, which clients send again (duplicates).
    pub pool: Mutex<Vec<Source>>,
    /// Acknowledged identities and how many times each was acknowledged.
    pub acks: Mutex<HashMap<String, u64>>,
    /// Identities answered `201 created`, and how many times (at most once each).
    pub created: Mutex<HashMap<String, u64>>,
    /// Extraction → the lease token whose post was answered as a fresh commit.
    pub fresh: Mutex<HashMap<String, String>>,
    /// Request ids of every worker call posted, and of those an instance answered with a
    /// fresh commit or a stale-lease refusal (both are charged).
    pub posted_calls: Mutex<HashSet<String>>,
    pub answered_calls: Mutex<HashSet<String>>,
    pub counters: Counters,
    /// What a task saw that must not happen; the test fails with all of them.
    pub violations: Mutex<Vec<String>>,
}

pub fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl World {
    pub fn new(live: Arc<Live>) -> World {
        let http = reqwest::Client::builder()
            .no_proxy()
            .timeout(Duration::from_secs(15))
            .build()
            .expect("build the HTTP client");
        World { live, http, ..World::default() }
    }

    pub fn violation(&self, what: String) {
        eprintln!("VIOLATION: {what}");
        lock(&self.violations).push(what);
    }

    /// One request to `base`: `Ok((status, body))`, or `Err` when no answer came (refused,
    /// cut by a kill, timed out).
    pub async fn call(&self, base: &str, path: &str, body: Option<&Value>) -> Result<(u16, Value), String> {
        let url = format!("{base}{path}");
        let request = match body {
            Some(body) => self.http.post(&url).json(body),
            None => self.http.get(&url),
        };
        let response = request.send().await.map_err(|e| e.to_string())?;
        let status = response.status().as_u16();
        let bytes = response.bytes().await.map_err(|e| e.to_string())?;
        let body = serde_json::from_slice(&bytes)
            .map_err(|e| format!("{status} answer to {path} is not JSON ({e}): {}", String::from_utf8_lossy(&bytes)))?;
        Ok((status, body))
    }
}
