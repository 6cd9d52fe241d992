//! An external worker racing the built-in provider for pending work (the provider batches
//! every registered schema, so there is no schema only workers see). It answers with the
//! simulated reviewer's own output, so every committed extraction must end with the same
//! findings whichever path committed it. Some answers are schema-violating, some claims are
//! abandoned and answered long after their lease, some answers are posted twice, and failed
//! extractions are retried now and then. Every post reports its usage with its own
//! `request_id`, and the ledger entry each answer implies is recorded for the checker.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use commitpoint::simulator::{broken_review, review};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use reqwest::Method;
use serde_json::{Value, json};

use crate::api::{Reply, Unanswered};
use crate::config::WORKER_MODEL;
use crate::observed::{Kind, WorkerSend};
use crate::workload::World;

#[derive(Debug)]
struct Grant {
    id: String,
    token: String,
    attempt: u64,
    source_id: String,
    content: String,
}

/// One model answer: the usage it reports (what its ledger entries must show) and how
/// many times it has been sent.
#[derive(Debug)]
struct Call {
    id: u64,
    input_tokens: u64,
    output_tokens: u64,
    sends: u32,
}

impl Call {
    fn new(world: &World, grant: &Grant, output: &Value) -> Call {
        Call {
            id: world.observed.calls.fetch_add(1, Ordering::Relaxed),
            input_tokens: 20 + grant.content.len() as u64 / 4,
            output_tokens: (output.to_string().len() as u64 / 4).max(1),
            sends: 0,
        }
    }
}

#[derive(Debug, Clone, Copy)]
enum Answer {
    Valid,
    Invalid,
    Twice,
    Abandon,
}

pub async fn run(world: Arc<World>, seed: u64) {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut late: Vec<(Instant, Grant)> = Vec::new();
    let mut turn = 0u64;
    while !world.stop_worker.load(Ordering::SeqCst) {
        turn += 1;
        let lease_seconds: u64 = rng.random_range(1..=3);
        let claim =
            json!({"worker": "torture-worker", "limit": rng.random_range(1..=3), "lease_seconds": lease_seconds});
        if let Ok(reply) = world.endpoint.send_once(Method::POST, "/v1/claims", Some(&claim)).await {
            assert_eq!(reply.status, 200, "claim: {:#}", reply.body);
            for grant in reply.body["claims"].as_array().expect("claims array") {
                let grant = check_grant(&world, grant);
                world.worker.claims.fetch_add(1, Ordering::Relaxed);
                let answer = if world.calm.load(Ordering::SeqCst) {
                    Answer::Valid
                } else {
                    match rng.random_range(0..100) {
                        0..65 => Answer::Valid,
                        65..77 => Answer::Invalid,
                        77..87 => Answer::Twice,
                        _ => Answer::Abandon,
                    }
                };
                match answer {
                    Answer::Valid => {
                        post_valid(&world, &grant, None).await;
                    }
                    Answer::Twice => {
                        let call = post_valid(&world, &grant, None).await;
                        post_valid(&world, &grant, Some(call)).await;
                    }
                    Answer::Invalid => post_invalid(&world, &grant).await,
                    Answer::Abandon => {
                        world.worker.abandoned.fetch_add(1, Ordering::Relaxed);
                        let after = Duration::from_millis(lease_seconds * 1000 + rng.random_range(0..2000));
                        late.push((Instant::now() + after, grant));
                    }
                }
            }
        }
        let now = Instant::now();
        let (due, waiting): (Vec<_>, Vec<_>) = late.into_iter().partition(|(at, _)| *at <= now);
        late = waiting;
        for (_, grant) in due {
            post_late(&world, &grant).await;
        }
        if turn.is_multiple_of(12) {
            retry_some_failed(&world, &mut rng).await;
        }
        tokio::time::sleep(Duration::from_millis(rng.random_range(20..100))).await;
    }
}

/// A grant must be for something a client sent, with that content.
fn check_grant(world: &World, grant: &Value) -> Grant {
    let text = |k: &str| grant[k].as_str().unwrap_or_else(|| panic!("grant without {k}: {grant:#}")).to_string();
    let grant = Grant {
        id: text("extraction_id"),
        token: text("lease_token"),
        attempt: grant["attempt"].as_u64().unwrap_or_else(|| panic!("grant without attempt: {grant:#}")),
        source_id: text("source_id"),
        content: text("content"),
    };
    let source = world.source(&grant.id).unwrap_or_else(|| panic!("claimed {} which no client sent", grant.id));
    assert_eq!(
        (grant.source_id.as_str(), grant.content.as_str()),
        (source.source_id.as_str(), source.content.as_str())
    );
    grant
}

fn result_path(grant: &Grant) -> String {
    format!("/v1/extractions/{}/result", grant.id)
}

/// Posts `output` under the grant's lease until an answer arrives, each send with its own
/// `request_id`; sends whose answer a kill cut are recorded as lost. Returns the answer,
/// the request id that got it and how many sends were lost before.
async fn post(world: &World, grant: &Grant, call: &mut Call, output: &Value) -> (Reply, String, u32) {
    let mut lost = 0;
    loop {
        let request_id = format!("tw-{}-{}", call.id, call.sends + 1);
        let usage = json!({
            "model": WORKER_MODEL,
            "input_tokens": call.input_tokens,
            "output_tokens": call.output_tokens,
            "request_id": request_id,
        });
        // This worker declines re-asks: its schema-violating answers fail at once, which
        // the observer expects; re-asks have their own tests (provider_faults, results).
        let body = json!({"lease_token": grant.token, "output": output, "usage": usage, "reask": false});
        match world.endpoint.send_once(Method::POST, &result_path(grant), Some(&body)).await {
            Ok(reply) => {
                call.sends += 1;
                return (reply, request_id, lost);
            }
            Err(Unanswered::Down) => {}
            Err(Unanswered::Lost) => {
                call.sends += 1;
                lost += 1;
                record(world, grant, call, request_id, None, "lost".into());
            }
        }
        tokio::time::sleep(Duration::from_millis(15)).await;
    }
}

fn record(world: &World, grant: &Grant, call: &Call, request_id: String, expect: Option<Kind>, answer: String) {
    world.observed.sends().push(WorkerSend {
        request_id,
        call: call.id,
        extraction_id: grant.id.clone(),
        input_tokens: call.input_tokens,
        output_tokens: call.output_tokens,
        expect,
        answer,
    });
}

fn describe(reply: &Reply) -> String {
    format!("{} {}", reply.status, reply.body)
}

/// Posts the reviewer's answer; `again` is the call of a first post of the same answer.
async fn post_valid(world: &World, grant: &Grant, again: Option<Call>) -> Call {
    let output = review(&grant.source_id, &grant.content);
    let expected = output["findings"].as_array().map_or(0, Vec::len);
    let is_again = again.is_some();
    let mut call = again.unwrap_or_else(|| Call::new(world, grant, &output));
    let (reply, request_id, lost) = post(world, grant, &mut call, &output).await;
    assert_eq!(
        reply.status, 200,
        "valid result for {} under its lease (lost sends {lost}): {:#}",
        grant.id, reply.body
    );
    assert_eq!(reply.body["state"], json!("committed"), "{:#}", reply.body);
    let replay = reply.body["replay"] == json!(true);
    if is_again {
        assert!(replay, "a second post of a committed result is a replay: {:#}", reply.body);
    }
    if !replay {
        assert_eq!(reply.body["findings"], json!(expected), "{:#}", reply.body);
        world.worker.commits.fetch_add(1, Ordering::Relaxed);
    } else {
        world.worker.replays.fetch_add(1, Ordering::Relaxed);
    }
    let kind = if replay { Kind::Replay } else { Kind::Fresh };
    record(world, grant, &call, request_id, Some(kind), describe(&reply));
    call
}

async fn post_invalid(world: &World, grant: &Grant) {
    let output = broken_review(&grant.source_id, &grant.content);
    let mut call = Call::new(world, grant, &output);
    let (reply, request_id, lost) = post(world, grant, &mut call, &output).await;
    let kind = match (reply.status, reply.code()) {
        (422, "validation_failed") => {
            world.observed.failed(&grant.id, grant.attempt, "validation");
            Some(Kind::FailedValidation)
        }
        // The first send failed the extraction before the kill cut its answer; this one
        // is a reporter without authority now, whose call was still paid for.
        (409, "illegal_transition") if lost > 0 => Some(Kind::Fresh),
        _ => None,
    };
    let kind = kind.unwrap_or_else(|| {
        panic!("schema-violating result for {} (lost sends {lost}): {} {:#}", grant.id, reply.status, reply.body)
    });
    record(world, grant, &call, request_id, Some(kind), describe(&reply));
    world.worker.invalid.fetch_add(1, Ordering::Relaxed);
}

/// A worker whose lease ran out answers anyway: the fencing token decides.
async fn post_late(world: &World, grant: &Grant) {
    let output = review(&grant.source_id, &grant.content);
    let mut call = Call::new(world, grant, &output);
    let (reply, request_id, _) = post(world, grant, &mut call, &output).await;
    let kind = match (reply.status, reply.code()) {
        (200, _) => {
            assert_eq!(reply.body["state"], json!("committed"), "{:#}", reply.body);
            world.worker.late_accepted.fetch_add(1, Ordering::Relaxed);
            // Already committed (by a later claim, or by this call's own lost send): a
            // replay, never charged.
            if reply.body["replay"] == json!(true) {
                world.worker.late_replayed.fetch_add(1, Ordering::Relaxed);
                Kind::Replay
            } else {
                Kind::Fresh
            }
        }
        // Refused, but the call was made and paid for.
        (409, "stale_lease" | "illegal_transition") => {
            world.worker.late_refused.fetch_add(1, Ordering::Relaxed);
            Kind::Fresh
        }
        (status, _) => panic!("late result for {} answered {status}: {:#}", grant.id, reply.body),
    };
    record(world, grant, &call, request_id, Some(kind), describe(&reply));
}

/// Retries about half of the failed extractions, as an operator would.
async fn retry_some_failed(world: &World, rng: &mut StdRng) {
    let path = "/v1/extractions?state=failed&limit=50";
    let Ok(reply) = world.endpoint.send_once(Method::GET, path, None).await else { return };
    assert_eq!(reply.status, 200, "{path}: {:#}", reply.body);
    retry_listed(world, rng, &reply.body).await;
}

async fn retry_listed(world: &World, rng: &mut StdRng, listing: &Value) {
    world.observed.failed_listing(listing["extractions"].as_array().map(Vec::as_slice).unwrap_or_default());
    for record in listing["extractions"].as_array().into_iter().flatten() {
        if !rng.random_bool(0.5) {
            continue;
        }
        let id = record["extraction_id"].as_str().unwrap_or_default();
        let Ok(reply) =
            world.endpoint.send_once(Method::POST, &format!("/v1/extractions/{id}/retry"), Some(&json!({}))).await
        else {
            continue;
        };
        match (reply.status, reply.code()) {
            (200, _) => {
                world.worker.retries.fetch_add(1, Ordering::Relaxed);
            }
            // Retried by the drain loop meanwhile.
            (409, "illegal_transition") => {}
            (status, _) => panic!("retry of failed {id} answered {status}: {:#}", reply.body),
        }
    }
}
