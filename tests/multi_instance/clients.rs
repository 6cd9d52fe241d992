//! Intake clients: each sends sources to the instances (one it sticks to, or any), a share
//! of them again (duplicates, often while the first delivery is in flight elsewhere), and
//! records what was acknowledged. A request no instance answered is not acknowledged; it
//! may or may not have been stored.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::json;

use crate::fleet::INSTANCES;
use crate::world::{Counters, SCHEMA, Source, World, lock};

const TENANTS: [&str; 3] = ["acme", "globex", "initech"];

/// What a client does, drawn from the seed.
#[derive(Debug, Clone, Copy)]
pub struct Mix {
    /// Share of sends that repeat an earlier source.
    pub duplicate_ratio: f64,
    /// `Some(slot)`: this client sends to one instance (waiting while it is down).
    pub sticky: Option<usize>,
    /// Pause between sends.
    pub pause_ms: (u64, u64),
}

impl Mix {
    pub fn draw(rng: &mut StdRng, duplicate_ratio: f64) -> Mix {
        let sticky = rng.random_bool(0.4).then(|| rng.random_range(0..INSTANCES));
        Mix { duplicate_ratio, sticky, pause_ms: (150, 450) }
    }
}

/// The content of a source: a function of its name, so a duplicate has the same identity.
/// Some lines trip the simulated reviewer's rules, so commits carry findings.
fn content_for(tenant: &str, source_id: &str) -> String {
    let h = blake3::hash(format!("{tenant}/{source_id}").as_bytes());
    let b = h.as_bytes();
    let mut text = format!("// {tenant} {source_id}\nfn f() -> u32 {{\n");
    if b[0].is_multiple_of(3) {
        text.push_str("    let n = s.parse().unwrap();\n");
    }
    if b[1].is_multiple_of(4) {
        text.push_str("    // TODO: handle the empty case\n");
    }
    if b[2].is_multiple_of(5) {
        text.push_str("    unsafe { *p }\n");
    }
    text.push_str(&format!("    {}\n}}\n", b[3]));
    text
}

pub async fn run(world: Arc<World>, client: usize, mix: Mix, seed: u64) {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut n = 0u64;
    while !world.stop_intake.load(Ordering::SeqCst) {
        let pause = rng.random_range(mix.pause_ms.0..=mix.pause_ms.1);
        tokio::time::sleep(Duration::from_millis(pause)).await;
        let slot = mix.sticky.unwrap_or_else(|| rng.random_range(0..INSTANCES));
        let Some(base) = world.live.get(slot) else { continue };
        let again = rng.random_bool(mix.duplicate_ratio);
        let source = {
            let pool = lock(&world.pool);
            (again && !pool.is_empty()).then(|| pool[rng.random_range(0..pool.len())].clone())
        };
        let source = source.unwrap_or_else(|| {
            n += 1;
            let tenant = TENANTS[rng.random_range(0..TENANTS.len())];
            let source_id = format!("c{client}/src-{n}.rs");
            let source = Source { tenant: tenant.into(), content: content_for(tenant, &source_id), source_id };
            lock(&world.pool).push(source.clone());
            source
        });
        if again {
            Counters::bump(&world.counters.duplicate_sends);
        }
        let id = source.id();
        lock(&world.sent).insert(id.clone(), source.clone());
        send(&world, &base, &source, &id).await;
    }
}

async fn send(world: &World, base: &str, source: &Source, id: &str) {
    Counters::bump(&world.counters.intakes);
    let body =
        json!({"tenant": source.tenant, "source_id": source.source_id, "schema": SCHEMA, "content": source.content});
    match world.call(base, "/v1/extractions", Some(&body)).await {
        Ok((status @ (200 | 201), reply)) => {
            let answered = reply["extraction_id"].as_str().unwrap_or_default();
            if answered != id {
                world.violation(format!(
                    "intake of {}/{} answered id {answered}, expected {id}",
                    source.tenant, source.source_id
                ));
            }
            if (status == 201) != (reply["created"] == json!(true)) {
                world.violation(format!("intake answered {status} with {reply}"));
            }
            if status == 201 {
                Counters::bump(&world.counters.created);
                *lock(&world.created).entry(id.to_string()).or_default() += 1;
            }
            Counters::bump(&world.counters.acks);
            *lock(&world.acks).entry(id.to_string()).or_default() += 1;
        }
        // The store unavailable (the database restarting): not acknowledged.
        Ok((500..=599, _)) => Counters::bump(&world.counters.unavailable),
        Ok((status, reply)) => world.violation(format!("intake answered {status}: {reply}")),
        Err(_) => Counters::bump(&world.counters.unanswered),
    }
}
