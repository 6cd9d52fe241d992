//! A sender of signed webhooks (Standard Webhooks) to the server's endpoint, across kills:
//! new deliveries, redeliveries of earlier delivery ids (same id, same body, signed again
//! with a fresh timestamp, as senders do), new delivery ids for content sent before, and
//! bursts of one new delivery sent several times at once. A delivery whose answer a kill
//! cut is sent again, or (15 %) given up on: it may or may not exist, until a redelivery
//! of its id settles it.
//!
//! Checked on every answer: the extraction id is the identity hash of the payload's
//! content under the endpoint's tenant; `created` matches 201/200; once any answer for a
//! delivery id has arrived, every later send of it answers 200 `redelivery: true` with
//! the same extraction. At the end: at most one answer per delivery id was not a
//! redelivery (exactly one when no send of it was lost).

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use commitpoint::engine::webhook::{WebhookSecret, sign_standard};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::json;

use crate::api::Reply;
use crate::config::{SINK_SECRET, WEBHOOK, WEBHOOK_TENANT};
use crate::context;
use crate::observed::{HookAnswer, HookDelivery};
use crate::workload::{Ack, LINES, Source, World};

#[derive(Debug, Default)]
pub struct HookSeen {
    pub deliveries: usize,
    pub sends: u64,
    pub answers: usize,
    pub redeliveries: usize,
    pub lost: u64,
    pub never_answered: usize,
}

pub async fn run(world: Arc<World>, seed: u64) {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut ids: Vec<String> = Vec::new();
    let mut made = 0usize;
    while !world.stop_intake.load(Ordering::SeqCst) {
        let pick = rng.random_range(0..100);
        match pick {
            // A new delivery of new content.
            0..45 => {
                made += 1;
                let id = register(&world, format!("dlv_{made}"), new_source(&mut rng, made));
                let give_up = rng.random_bool(0.15);
                deliver(&world, &id, give_up).await;
                ids.push(id);
            }
            // The sender redelivers an earlier delivery id.
            45..80 if !ids.is_empty() => {
                let id = ids[rng.random_range(0..ids.len())].clone();
                deliver(&world, &id, false).await;
            }
            // Another event about content sent before: a new delivery id, a known identity.
            80..90 if !ids.is_empty() => {
                let old = &ids[rng.random_range(0..ids.len())];
                let source = Arc::clone(&world.observed.hooks()[old].source);
                made += 1;
                let id = register(&world, format!("dlv_{made}"), source);
                deliver(&world, &id, false).await;
                ids.push(id);
            }
            // One new delivery sent several times at once.
            90.. => {
                made += 1;
                let id = register(&world, format!("dlv_{made}"), new_source(&mut rng, made));
                let mut burst = tokio::task::JoinSet::new();
                for _ in 0..rng.random_range(2..=4) {
                    let (world, id) = (Arc::clone(&world), id.clone());
                    burst.spawn(async move { deliver(&world, &id, false).await });
                }
                while let Some(done) = burst.join_next().await {
                    if let Err(e) = done {
                        std::panic::resume_unwind(e.into_panic());
                    }
                }
                ids.push(id);
            }
            _ => continue,
        }
        tokio::time::sleep(Duration::from_millis(rng.random_range(10..60))).await;
    }
}

fn new_source(rng: &mut StdRng, n: usize) -> Arc<Source> {
    let mut content: Vec<&str> =
        (0..rng.random_range(1..=6)).map(|_| LINES[rng.random_range(0..LINES.len())]).collect();
    let nonce = format!("// webhook revision {n}");
    content.push(&nonce);
    Arc::new(Source::new(WEBHOOK_TENANT, format!("hooks/pr-{n}.rs"), content.join("\n") + "\n"))
}

fn register(world: &World, id: String, source: Arc<Source>) -> String {
    world.ledger().sent.entry(source.id.clone()).or_insert_with(|| Arc::clone(&source));
    let body = json!({"id": source.source_id, "text": source.content}).to_string().into_bytes();
    let delivery = HookDelivery { source, body, sends: 0, lost: 0, answers: Vec::new() };
    world.observed.hooks().insert(id.clone(), delivery);
    id
}

/// Sends delivery `id` until answered, unless `give_up` and an answer was lost.
async fn deliver(world: &World, id: &str, give_up: bool) {
    let secret = WebhookSecret::standard(SINK_SECRET).expect("the secret parses");
    let path = format!("/v1/webhooks/{WEBHOOK}");
    loop {
        if let Some(api) = world.endpoint.current() {
            let (body, answered_before) = {
                let mut hooks = world.observed.hooks();
                let delivery = hooks.get_mut(id).expect("a registered delivery");
                delivery.sends += 1;
                (delivery.body.clone(), !delivery.answers.is_empty())
            };
            let now = SystemTime::now().duration_since(UNIX_EPOCH).expect("clock").as_secs();
            let headers = [
                ("webhook-id", id.to_string()),
                ("webhook-timestamp", now.to_string()),
                ("webhook-signature", sign_standard(&secret, id, now, &body)),
            ];
            match api.try_post_raw(&path, &headers, body).await {
                Ok(reply) => return record(world, id, &reply, answered_before),
                Err(_) => {
                    let mut hooks = world.observed.hooks();
                    hooks.get_mut(id).expect("a registered delivery").lost += 1;
                    if give_up {
                        return;
                    }
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(15)).await;
    }
}

fn record(world: &World, id: &str, reply: &Reply, answered_before: bool) {
    let mut hooks = world.observed.hooks();
    let delivery = hooks.get_mut(id).expect("a registered delivery");
    let source = &delivery.source;
    let what = format!("delivery {id} ({}): {} {:#}", source.source_id, reply.status, reply.body);
    assert!(matches!(reply.status, 200 | 201), "{what}");
    let answer = HookAnswer {
        status: reply.status,
        created: reply.body["created"] == json!(true),
        redelivery: reply.body["redelivery"] == json!(true),
        extraction_id: reply.body["extraction_id"].as_str().unwrap_or_default().to_string(),
    };
    assert_eq!(answer.created, reply.status == 201, "{what}");
    assert_eq!(answer.extraction_id, source.id, "the extraction of the payload's identity: {what}");
    assert_eq!(reply.body["delivery_id"], json!(id), "{what}");
    if answered_before {
        assert!(answer.redelivery, "a delivery id answered before must be a redelivery: {what}");
    }
    if answer.redelivery {
        assert!(!answer.created, "{what}");
    }
    world.ledger().acks.push(Ack { id: source.id.clone(), created: answer.created, round: context::round() });
    delivery.answers.push(answer);
}

/// Every delivery id was taken in at most once (exactly once when no send was lost).
pub fn check(world: &World) -> HookSeen {
    let hooks = world.observed.hooks();
    let mut seen = HookSeen { deliveries: hooks.len(), ..HookSeen::default() };
    for (id, delivery) in hooks.iter() {
        seen.sends += u64::from(delivery.sends);
        seen.lost += u64::from(delivery.lost);
        seen.answers += delivery.answers.len();
        for answer in &delivery.answers {
            assert_eq!(answer.status, if answer.created { 201 } else { 200 }, "delivery {id}: {answer:?}");
        }
        let firsts = delivery.answers.iter().filter(|a| !a.redelivery).count();
        seen.redeliveries += delivery.answers.len() - firsts;
        if delivery.answers.is_empty() {
            seen.never_answered += 1;
            continue;
        }
        assert!(firsts <= 1, "delivery {id} was taken in {firsts} times: {:?}", delivery.answers);
        if delivery.lost == 0 {
            assert_eq!(firsts, 1, "delivery {id}: no send lost, yet no answer was the first: {:?}", delivery.answers);
        }
    }
    seen
}
