//! Crash-loop torture: the real `commitpoint serve` against the SIMULATED OpenAI Batch API
//! with faults on, under concurrent intake with duplicates, signed webhooks and an
//! external worker, delivering its outbox to a receiver that often refuses, is SIGKILLed
//! at a random moment every round and restarted on the same data directory. After the
//! last round everything drains and an outside checker compares what clients were told,
//! what the simulator billed, what the receiver got and what the API answers (the cost
//! ledger included): docs/RELIABILITY.md.
//!
//! `COMMITPOINT_TORTURE_SEED` (u64, random by default) and `COMMITPOINT_TORTURE_ROUNDS`
//! (default 20) parameterise it; the seed is always printed, and every failure names the
//! seed and round. A seed fixes the schedule (kill moments, fault mixes, every client's
//! and the worker's choices), not the thread interleaving.
//!
//! Run with `cargo test --release --test torture -- --nocapture`.

// clippy.toml's allow-expect-in-tests covers #[test] functions only; the helpers fail the
// test the same way, by panicking with a message.
#![allow(clippy::expect_used)]
// A test is the outside world: it reads the real clock, not the crate's `clock`.
#![allow(clippy::disallowed_methods)]

#[path = "torture/api.rs"]
mod api;
#[path = "torture/checker.rs"]
mod checker;
#[path = "torture/config.rs"]
mod config;
#[path = "torture/context.rs"]
mod context;
#[path = "torture/costs.rs"]
mod costs;
#[path = "torture/events.rs"]
mod events;
#[path = "torture/faults.rs"]
mod faults;
#[path = "torture/health.rs"]
mod health;
#[path = "torture/hooks.rs"]
mod hooks;
#[path = "torture/kills.rs"]
mod kills;
#[path = "torture/observed.rs"]
mod observed;
#[path = "torture/process.rs"]
mod process;
#[path = "torture/receiver.rs"]
mod receiver;
#[path = "torture/simfiles.rs"]
mod simfiles;
#[path = "torture/summary.rs"]
mod summary;
#[path = "support/mod.rs"]
mod support;
#[path = "torture/worker.rs"]
mod worker;
#[path = "torture/workload.rs"]
mod workload;

use std::collections::BTreeSet;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use commitpoint::simulator::{Faults, Simulator, SimulatorConfig};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use reqwest::Method;
use serde_json::json;
use tokio::runtime::Runtime;
use tokio::task::JoinHandle;

use crate::api::Api;
use crate::context::{Params, say};
use crate::kills::KillAt;
use crate::observed::Kind;
use crate::process::{assert_verifies, db_path, report_count};
use crate::receiver::Receiver;
use crate::workload::World;

const INTAKE_CLIENTS: usize = 3;
/// Bounds the final drain; a healthy run needs a few seconds.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(180);

#[test]
fn crash_loop_torture() {
    let params = Params::from_env();
    context::install(params);
    say(&format!("torture: seed {} rounds {} (reproduce: {})", params.seed, params.rounds, params.reproduce()));
    let started = Instant::now();
    let mut rng = StdRng::seed_from_u64(params.seed);
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("runtime");

    let config = SimulatorConfig {
        api_key: Some(process::SIM_KEY.into()),
        complete_after: Duration::from_millis(400),
        seed: params.seed,
        ..SimulatorConfig::default()
    };
    let sim = rt
        .block_on(Simulator::start("127.0.0.1:0".parse().expect("loopback address"), config))
        .expect("start the simulator");
    let dir = tempfile::Builder::new().prefix("commitpoint-torture-").tempdir().expect("temp dir");
    let db = db_path(dir.path());
    let world = Arc::new(World::default());
    let receiver = rt.block_on(Receiver::start(rng.random()));
    let config = config::write(dir.path(), &receiver.url);

    let mut clients: Vec<JoinHandle<()>> =
        (0..INTAKE_CLIENTS).map(|c| rt.spawn(workload::run_client(Arc::clone(&world), c, rng.random()))).collect();
    clients.push(rt.spawn(hooks::run(Arc::clone(&world), rng.random())));
    let sampler = Arc::new(health::Sampler::default());
    let mut background = vec![
        rt.spawn(worker::run(Arc::clone(&world), rng.random())),
        rt.spawn(Arc::clone(&sampler).run(Arc::clone(&world))),
    ];

    let mut checked_acks = 0;
    // Every server's stderr, kept for the failure report.
    let mut logs = String::new();
    let mut failed_verifies: Vec<String> = Vec::new();
    for round in 0..params.rounds {
        context::set_round(round);
        let faults = faults::for_round(&mut rng);
        let kill_at = KillAt::draw(&mut rng);
        sim.set_faults(faults.clone());
        let mut server = process::start(dir.path(), &sim.base_url(), &config);
        world.endpoint.set(Some(Api::new(&server.url)));
        // Every intake acknowledged before this restart must be there (DESIGN §6.5).
        checked_acks = rt.block_on(acks_survived(&world, checked_acks, round));
        let moment = kill_at.wait(&sim);
        server.assert_alive(&format!("before its SIGKILL in round {round}"));
        world.endpoint.set(None);
        logs.push_str(&format!("===== round {round}: {} killed =====\n", server.url));
        logs.push_str(&server.kill9());
        sampler.process_ended(&server.url);
        surface_early_exit(&rt, &mut clients);
        surface_early_exit(&rt, &mut background);
        let report = match process::verify(&db, &format!("after the SIGKILL of round {round}"), &logs) {
            Ok(report) => report,
            Err(failure) if params.keep_going => {
                say(&format!("round {round}: {}", failure.lines().take(20).collect::<Vec<_>>().join("\n")));
                failed_verifies.push(failure);
                String::new()
            }
            Err(failure) => panic!("{failure}"),
        };
        let stats = sim.stats();
        // DESIGN §6.4 at the provider, checked every round so a failure names its round.
        assert!(stats.max_live_batches_per_custom_id <= 1, "a member was in two live batches at once: {stats:#?}");
        say(&format!(
            "round {round:>3}: killed {moment}, faults [{}], extractions {}, batches created {}, acks {}",
            faults::describe(&faults),
            report_count(&report, "extractions"),
            stats.batches_created,
            world.ledger().acks.len(),
        ));
    }

    // The final phase: no faults, no new intake, nothing invalid; let it all drain.
    context::set_round(params.rounds);
    world.calm.store(true, Ordering::SeqCst);
    world.stop_intake.store(true, Ordering::SeqCst);
    sim.set_faults(Faults::default());
    receiver.calm();
    let server = process::start(dir.path(), &sim.base_url(), &config);
    world.endpoint.set(Some(Api::new(&server.url)));
    for client in clients {
        rt.block_on(client).expect("intake client");
    }
    rt.block_on(acks_survived(&world, checked_acks, params.rounds));
    let drained_in = rt.block_on(drain(&world));
    world.stop_worker.store(true, Ordering::SeqCst);
    for task in background {
        rt.block_on(task).expect("worker or sampler");
    }
    rt.block_on(drain_outbox(&world));

    let stats = sim.stats();
    let files = rt.block_on(simfiles::read(&sim.base_url()));
    let seen = rt.block_on(checker::check(&world, &stats, &files, &receiver));
    world.endpoint.set(None);
    sampler.process_ended(&server.url);
    let (status, stderr) = server.terminate();
    logs.push_str(&format!("===== final: SIGTERM =====\n{stderr}"));
    assert_eq!(status.code(), Some(0), "SIGTERM after the drain must exit 0; stderr:\n{stderr}");
    let report = assert_verifies(&db, "after the final SIGTERM", &logs);
    assert_eq!(report_count(&report, "extractions"), seen.extractions as u64, "verify vs API:\n{report}");
    assert_eq!(report_count(&report, "committed"), seen.extractions as u64, "verify vs API:\n{report}");
    assert_eq!(report_count(&report, "findings"), seen.findings as u64, "verify vs API:\n{report}");

    summary::print(
        &summary::Run { params, took: started.elapsed(), drained_in, stats: &stats, seen: &seen },
        &world,
        &sampler,
    );

    // A run that exercised nothing proves nothing.
    assert!(stats.batches_created > 0 && stats.lines_completed > 0, "the provider did no work: {stats:#?}");
    assert!(world.worker.commits.load(Ordering::Relaxed) > 0, "the worker committed nothing");
    assert!(seen.duplicate_acks > 0, "no duplicate intake was answered");
    let entries = |provider: &str, kind| seen.costs.by_kind.get(&(provider.to_string(), kind)).copied().unwrap_or(0);
    assert!(
        entries("openai", Kind::Fresh) > 0 && entries(config::WORKER_PROVIDER, Kind::Fresh) > 0,
        "{:?}",
        seen.costs
    );
    assert!(seen.events.committed > 0 && seen.hooks.redeliveries > 0, "{:?} {:?}", seen.events, seen.hooks);
    assert!(params.rounds < 20 || seen.events.refused > 0, "the receiver never refused: {:?}", seen.events);
    let lost = world.ledger().lost;
    assert!(params.rounds < 20 || lost > 0, "no request was cut by a kill in {} rounds", params.rounds);
    rt.block_on(sim.stop());
    assert!(
        failed_verifies.is_empty(),
        "verify failed after {} of {} kills; the first:\n{}",
        failed_verifies.len(),
        params.rounds,
        failed_verifies[0]
    );
}

/// Checks the acknowledgements recorded since the last check (all of them answered before
/// the latest kill) against the restarted server; returns the new check position.
async fn acks_survived(world: &World, from: usize, round: u32) -> usize {
    let (fresh, upto): (Vec<(String, i64)>, usize) = {
        let ledger = world.ledger();
        (ledger.acks[from..].iter().map(|a| (a.id.clone(), a.round)).collect(), ledger.acks.len())
    };
    let mut checked = BTreeSet::new();
    for (id, acked_in) in fresh {
        if !checked.insert(id.clone()) {
            continue;
        }
        let source = world.source(&id).expect("an acknowledged id was sent");
        let (reply, _) = world.endpoint.send(Method::GET, &format!("/v1/extractions/{id}"), None).await;
        assert_eq!(
            reply.status, 200,
            "intake acknowledged in round {acked_in} is missing after the restart of round {round}: {id} ({} / {}): {:#}",
            source.tenant, source.source_id, reply.body
        );
        assert_eq!(
            (reply.body["tenant"].as_str(), reply.body["source_id"].as_str()),
            (Some(source.tenant.as_str()), Some(source.source_id.as_str()))
        );
    }
    upto
}

/// Waits until nothing is pending, claimed, submitted or ready; retries what failed (the
/// faults are off now, so a retry commits). Returns how long it took.
async fn drain(world: &World) -> Duration {
    let started = Instant::now();
    loop {
        let stats = world.endpoint.get("/v1/stats").await.body;
        let count = |state: &str| stats["extractions"][state].as_u64().unwrap_or(0);
        let busy: u64 = ["pending", "claimed", "submitted", "ready"].iter().map(|s| count(s)).sum();
        if busy == 0 && count("failed") == 0 {
            return started.elapsed();
        }
        if busy == 0 {
            let failed = world.endpoint.list_all("state=failed&").await;
            world.observed.failed_listing(&failed);
            for record in failed {
                let id = record["extraction_id"].as_str().unwrap_or_default();
                let (reply, _) =
                    world.endpoint.send(Method::POST, &format!("/v1/extractions/{id}/retry"), Some(&json!({}))).await;
                let ok = reply.status == 200 || (reply.status == 409 && reply.code() == "illegal_transition");
                assert!(ok, "retry of {id} answered {}: {:#}", reply.status, reply.body);
            }
        }
        assert!(started.elapsed() < DRAIN_TIMEOUT, "not drained within {DRAIN_TIMEOUT:?}: {stats:#}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Waits until the outbox has nothing pending (the receiver takes everything now).
async fn drain_outbox(world: &World) {
    let started = Instant::now();
    loop {
        let pending = world.endpoint.get("/v1/outbox?state=pending").await.body;
        if pending["events"].as_array().is_some_and(Vec::is_empty) {
            return;
        }
        assert!(started.elapsed() < DRAIN_TIMEOUT, "outbox not drained within {DRAIN_TIMEOUT:?}: {pending:#}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// A client or the worker that ended before being told to stop panicked: re-raise its
/// panic here, on the controlling thread, so the test fails at once.
fn surface_early_exit(rt: &Runtime, tasks: &mut Vec<JoinHandle<()>>) {
    let Some(index) = tasks.iter().position(JoinHandle::is_finished) else { return };
    match rt.block_on(tasks.swap_remove(index)) {
        Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
        other => panic!("an intake client or the worker stopped early: {other:?}"),
    }
}
