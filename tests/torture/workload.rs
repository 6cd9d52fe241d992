//! The intake side: sources built from lines the simulated reviewer flags (so findings
//! vary), a few clients that send new sources, new versions of old ones, old ones again and
//! bursts of one source sent concurrently, and the ledger of everything sent and every
//! acknowledgement received.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use commitpoint::domain::identity::{ExtractionId, SourceHash};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use reqwest::Method;
use serde_json::{Value, json};

use crate::api::{Endpoint, Reply, Unanswered};
use crate::context;

pub const SCHEMA: &str = "code-review@1";
pub const TENANTS: &[&str] = &["acme", "globex", "initech"];

/// Lines for generated sources: one per reviewer rule, one with two rules, and clean ones.
pub const LINES: &[&str] = &[
    "let v = input.parse::<u32>().unwrap();",
    "// TODO: handle the error path",
    "unsafe { ptr.read() }",
    "let password = \"hunter2\";",
    "let secret = load_key();",
    "panic!(\"unreachable state\");",
    "let n = run().unwrap(); // TODO: retry",
    "let total = a + b;",
    "fn helper() -> u8 { 0 }",
    "}",
    "if done { return; }",
];

/// One identity as sent: tenant, source id, content (schema is always [`SCHEMA`]).
#[derive(Debug)]
pub struct Source {
    pub tenant: String,
    pub source_id: String,
    pub content: String,
    /// The documented identity, computed here independently of the server.
    pub id: String,
    pub source_hash: String,
}

impl Source {
    pub fn new(tenant: &str, source_id: String, content: String) -> Source {
        let hash = SourceHash::compute(content.as_bytes(), SCHEMA);
        let id = ExtractionId::compute(tenant, &source_id, &hash, SCHEMA).to_hex();
        Source { tenant: tenant.to_string(), source_id, content, id, source_hash: hash.to_hex() }
    }

    pub fn body(&self) -> Value {
        json!({"tenant": self.tenant, "source_id": self.source_id, "schema": SCHEMA, "content": self.content})
    }
}

/// An intake answered 200 or 201.
#[derive(Debug, Clone)]
pub struct Ack {
    pub id: String,
    pub created: bool,
    /// The round whose server answered (−1 never happens: clients start with round 0).
    pub round: i64,
}

#[derive(Debug, Default)]
pub struct Ledger {
    /// Every identity ever sent, acknowledged or not, by extraction id.
    pub sent: HashMap<String, Arc<Source>>,
    pub acks: Vec<Ack>,
    /// Sends whose answer was lost to a kill.
    pub lost: u64,
    /// Intakes the client gave up on after a lost answer (they may or may not exist).
    pub abandoned: u64,
}

/// What the worker did, for the summary and the sanity checks.
#[derive(Debug, Default)]
pub struct WorkerCounts {
    pub claims: AtomicU64,
    pub commits: AtomicU64,
    pub replays: AtomicU64,
    pub invalid: AtomicU64,
    pub abandoned: AtomicU64,
    pub late_accepted: AtomicU64,
    /// Late posts answered as replays: someone else committed first (no charge).
    pub late_replayed: AtomicU64,
    pub late_refused: AtomicU64,
    pub retries: AtomicU64,
}

/// Everything the clients, the worker and the controller share.
#[derive(Debug, Default)]
pub struct World {
    pub endpoint: Endpoint,
    ledger: Mutex<Ledger>,
    /// Sources sent so far, for duplicates (shared, so clients collide on each other's).
    pool: Mutex<Vec<Arc<Source>>>,
    pub stop_intake: AtomicBool,
    pub stop_worker: AtomicBool,
    /// The final phase: no more invalid or abandoned results from the worker.
    pub calm: AtomicBool,
    pub worker: WorkerCounts,
    pub observed: crate::observed::Observed,
}

impl World {
    pub fn ledger(&self) -> MutexGuard<'_, Ledger> {
        self.ledger.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn pool(&self) -> MutexGuard<'_, Vec<Arc<Source>>> {
        self.pool.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn source(&self, id: &str) -> Option<Arc<Source>> {
        self.ledger().sent.get(id).cloned()
    }
}

/// One intake client until `stop_intake`; every choice comes from its own seeded RNG.
pub async fn run_client(world: Arc<World>, client: usize, seed: u64) {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut made = 0usize;
    let mut fresh = |rng: &mut StdRng, source_id: Option<(String, String)>| {
        made += 1;
        let (tenant, source_id) = source_id.unwrap_or_else(|| {
            let tenant = TENANTS[rng.random_range(0..TENANTS.len())].to_string();
            (tenant, format!("repo/c{client}/file{made}.rs"))
        });
        let lines = rng.random_range(1..=8);
        let mut content: Vec<&str> = (0..lines).map(|_| LINES[rng.random_range(0..LINES.len())]).collect();
        let nonce = format!("// revision c{client}-{made}");
        content.push(&nonce);
        Arc::new(Source::new(&tenant, source_id, content.join("\n") + "\n"))
    };
    while !world.stop_intake.load(Ordering::SeqCst) {
        let pick: u32 = rng.random_range(0..100);
        let give_up = rng.random_bool(0.15);
        match pick {
            // A source never sent before.
            0..35 => {
                let source = fresh(&mut rng, None);
                world.pool().push(Arc::clone(&source));
                deliver(&world, source, give_up).await;
            }
            // A new version of a known source id: a new identity.
            35..45 => {
                let known = pick_known(&world, &mut rng);
                let source = fresh(&mut rng, known.map(|s| (s.tenant.clone(), s.source_id.clone())));
                world.pool().push(Arc::clone(&source));
                deliver(&world, source, give_up).await;
            }
            // A redelivery of something sent before (by any client).
            45..85 => match pick_known(&world, &mut rng) {
                Some(source) => deliver(&world, source, give_up).await,
                None => continue,
            },
            // The same new source several times at once.
            _ => {
                let source = fresh(&mut rng, None);
                world.pool().push(Arc::clone(&source));
                let mut burst = tokio::task::JoinSet::new();
                for _ in 0..rng.random_range(2..=5) {
                    let (world, source) = (Arc::clone(&world), Arc::clone(&source));
                    burst.spawn(async move { deliver(&world, source, false).await });
                }
                while let Some(done) = burst.join_next().await {
                    if let Err(e) = done {
                        std::panic::resume_unwind(e.into_panic());
                    }
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(rng.random_range(5..40))).await;
    }
}

/// Mostly recent sources (likely still in flight), sometimes any.
fn pick_known(world: &World, rng: &mut StdRng) -> Option<Arc<Source>> {
    let pool = world.pool();
    if pool.is_empty() {
        return None;
    }
    let from = if rng.random_bool(0.7) { pool.len().saturating_sub(40) } else { 0 };
    Some(Arc::clone(&pool[rng.random_range(from..pool.len())]))
}

/// Sends one intake until it is answered, unless `give_up` and the first answer was lost.
async fn deliver(world: &World, source: Arc<Source>, give_up: bool) {
    world.ledger().sent.entry(source.id.clone()).or_insert_with(|| Arc::clone(&source));
    let body = source.body();
    loop {
        match world.endpoint.send_once(Method::POST, "/v1/extractions", Some(&body)).await {
            Ok(reply) => return record(world, &source, &reply),
            Err(Unanswered::Down) => {}
            Err(Unanswered::Lost) => {
                let mut ledger = world.ledger();
                ledger.lost += 1;
                if give_up {
                    ledger.abandoned += 1;
                    return;
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(15)).await;
    }
}

fn record(world: &World, source: &Source, reply: &Reply) {
    let created = match reply.status {
        201 => {
            assert_eq!(reply.body["created"], json!(true), "{:#}", reply.body);
            assert_eq!(reply.body["state"], json!("pending"), "a new intake is pending: {:#}", reply.body);
            true
        }
        200 => {
            assert_eq!(reply.body["created"], json!(false), "{:#}", reply.body);
            false
        }
        other => panic!("intake of {} / {} answered {other}: {:#}", source.tenant, source.source_id, reply.body),
    };
    let id = reply.body["extraction_id"].as_str().unwrap_or_default();
    assert_eq!(id, source.id, "the id answered for {} / {} is not its identity hash", source.tenant, source.source_id);
    world.ledger().acks.push(Ack { id: source.id.clone(), created, round: context::round() });
}
