//! External workers: they claim from any instance and post to any instance (often not the
//! one that granted the lease). Some are slow: they answer after their lease expired, by
//! which time another worker has usually claimed the extraction again, and the fencing
//! token must refuse them (409 `stale_lease`, or a replay once the new holder committed).
//! Every post carries the simulated reviewer's own answer, so an extraction's findings are
//! the same whichever path committed it.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use commitpoint::simulator::review;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::{Value, json};

use crate::config::WORKER_MODEL;
use crate::fleet::INSTANCES;
use crate::world::{Counters, World, lock};

/// A post no instance answered is sent again (same token) until this long has passed.
const POST_DEADLINE: Duration = Duration::from_secs(60);

#[derive(Debug, Clone)]
struct Grant {
    id: String,
    token: String,
    source_id: String,
    content: String,
}

pub async fn run(world: Arc<World>, worker: usize, slow_ratio: f64, seed: u64) {
    let mut rng = StdRng::seed_from_u64(seed);
    let name = format!("worker-{worker}");
    let mut late = tokio::task::JoinSet::new();
    while !world.stop_workers.load(Ordering::SeqCst) {
        tokio::time::sleep(Duration::from_millis(rng.random_range(20..120))).await;
        let Some(base) = world.live.get(rng.random_range(0..INSTANCES)) else { continue };
        let lease_seconds: u64 = rng.random_range(1..=2);
        // Larger claims once intake stopped, so the run drains quickly.
        let most = if world.stop_intake.load(Ordering::SeqCst) { 10 } else { 3 };
        let claim = json!({"worker": name, "limit": rng.random_range(1..=most), "lease_seconds": lease_seconds});
        let grants = match world.call(&base, "/v1/claims", Some(&claim)).await {
            Ok((200, reply)) => reply["claims"].as_array().cloned().unwrap_or_default(),
            Ok((500..=599, _)) | Err(_) => continue,
            Ok((status, reply)) => {
                world.violation(format!("claim answered {status}: {reply}"));
                continue;
            }
        };
        for grant in grants {
            let Some(grant) = parse(&world, &grant) else { continue };
            Counters::bump(&world.counters.claims);
            // Slow workers are not slow once intake stopped, so the run drains.
            if rng.random_bool(slow_ratio) && !world.stop_intake.load(Ordering::SeqCst) {
                Counters::bump(&world.counters.slow_posts);
                let after = Duration::from_millis(lease_seconds * 1000 + rng.random_range(100..1500));
                let (world, seed) = (Arc::clone(&world), rng.random());
                late.spawn(async move {
                    tokio::time::sleep(after).await;
                    post(&world, &grant, seed).await;
                });
            } else {
                post(&world, &grant, rng.random()).await;
            }
        }
        while late.try_join_next().is_some() {}
    }
    while late.join_next().await.is_some() {}
}

fn parse(world: &World, grant: &Value) -> Option<Grant> {
    let text = |k: &str| grant[k].as_str().map(str::to_string);
    let parsed = Grant {
        id: text("extraction_id")?,
        token: text("lease_token")?,
        source_id: text("source_id")?,
        content: text("content")?,
    };
    match lock(&world.sent).get(&parsed.id) {
        Some(source) if source.source_id == parsed.source_id && source.content == parsed.content => Some(parsed),
        _ => {
            world.violation(format!("a grant for something no client sent, or with other content: {grant}"));
            None
        }
    }
}

/// Posts the grant's answer to random instances until one answers.
async fn post(world: &World, grant: &Grant, seed: u64) {
    let mut rng = StdRng::seed_from_u64(seed);
    let output = review(&grant.source_id, &grant.content);
    let request_id = format!("{}-{}", grant.id, grant.token);
    let usage = json!({
        "model": WORKER_MODEL,
        "input_tokens": 20 + grant.content.len() / 4,
        "output_tokens": (output.to_string().len() / 4).max(1),
        "request_id": request_id,
    });
    lock(&world.posted_calls).insert(request_id.clone());
    let body = json!({"lease_token": grant.token, "output": output, "usage": usage});
    let path = format!("/v1/extractions/{}/result", grant.id);
    let began = Instant::now();
    loop {
        if let Some(base) = world.live.get(rng.random_range(0..INSTANCES)) {
            match world.call(&base, &path, Some(&body)).await {
                Ok((200, reply)) => {
                    // A replay may be a late post after another lease committed: charged
                    // at nothing, so only fresh commits are known to be charged.
                    if reply["replay"] != json!(true) {
                        lock(&world.answered_calls).insert(request_id);
                    }
                    return answered(world, grant, &reply);
                }
                Ok((409, reply)) if reply["error"]["code"] == json!("stale_lease") => {
                    lock(&world.answered_calls).insert(request_id);
                    Counters::bump(&world.counters.stale_refused);
                    return;
                }
                Ok((status, reply)) if status < 500 => {
                    return world.violation(format!("post for {} answered {status}: {reply}", grant.id));
                }
                Ok(_) | Err(_) => Counters::bump(&world.counters.post_retries),
            }
        }
        if began.elapsed() > POST_DEADLINE {
            return world.violation(format!("no instance answered the post for {} in {POST_DEADLINE:?}", grant.id));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn answered(world: &World, grant: &Grant, reply: &Value) {
    if reply["state"] != json!("committed") {
        return world.violation(format!("post for {} answered 200 without a commit: {reply}", grant.id));
    }
    if reply["replay"] == json!(true) {
        Counters::bump(&world.counters.replays);
        return;
    }
    Counters::bump(&world.counters.fresh_commits);
    let mut fresh = lock(&world.fresh);
    if let Some(first) = fresh.insert(grant.id.clone(), grant.token.clone()) {
        world.violation(format!(
            "{} committed twice: fresh commits under lease {first} and lease {}",
            grant.id, grant.token
        ));
    }
}
