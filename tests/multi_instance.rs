//! Multi-instance torture on PostgreSQL (issue 18): three `commitpoint serve` processes
//! share one database, one of them driving the SIMULATED OpenAI Batch API. 32 clients
//! send intakes with duplicates to all three, external workers claim from and post to all
//! three (some too slowly, so their leases are claimed again and their posts must be
//! fenced out). The instances are SIGKILLed and restarted in turn, and the database server
//! itself is restarted once with `pg_ctl restart -m immediate` while traffic runs. Then
//! everything drains and an audit compares what clients and workers were told, what the
//! simulator billed, what the database holds and what the API answers (`checks.rs`).
//!
//! The test owns its PostgreSQL server (`Cluster::start`), so restarting it disturbs no
//! other test. It runs with `COMMITPOINT_TEST_STORE=postgres` and says it was skipped
//! otherwise. `COMMITPOINT_TORTURE_SEED` (u64, default [`DEFAULT_SEED`]) fixes the
//! schedule: kill moments and order, the database restart's moment, each client's mix, the
//! duplicate ratio and the workers' slowness; not the thread interleaving. The seed is
//! printed at the start and again on failure. docs/SCALE-OUT.md has the figures.
//!
//! Run with `COMMITPOINT_TEST_STORE=postgres cargo test --test multi_instance -- --nocapture`.

// clippy.toml's allow-expect-in-tests covers #[test] functions only; the helpers fail the
// test the same way, by panicking with a message.
#![allow(clippy::expect_used)]
// A test is the outside world: it reads the real clock, not the crate's `clock`.
#![allow(clippy::disallowed_methods)]

#[path = "multi_instance/checks.rs"]
mod checks;
#[path = "multi_instance/clients.rs"]
mod clients;
#[path = "multi_instance/config.rs"]
mod config;
#[path = "multi_instance/fleet.rs"]
mod fleet;
#[path = "support/mod.rs"]
mod support;
#[path = "multi_instance/workers.rs"]
mod workers;
#[path = "multi_instance/world.rs"]
mod world;

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use commitpoint::simulator::{Simulator, SimulatorConfig};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tokio::runtime::Runtime;

use crate::fleet::{DRIVERS, Fleet, INSTANCES, Started};
use crate::support::postgres::{self, Cluster};
use crate::world::{World, lock};

const DEFAULT_SEED: u64 = 18;
const CLIENTS: usize = 32;
const WORKERS: usize = 6;
/// How long intake runs (kills and the database restart happen inside it).
const TRAFFIC: Duration = Duration::from_secs(20);
/// Bounds the final drain.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(90);
/// Bounds how long the instances may take to serve again after the database restart.
const RECOVERY_TIMEOUT: Duration = Duration::from_secs(30);
const DATABASE: &str = "torture";

/// Prints the seed again when the test fails, wherever the panic came from.
struct SeedOnFailure(u64);

impl Drop for SeedOnFailure {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("multi-instance torture FAILED with COMMITPOINT_TORTURE_SEED={}", self.0);
        }
    }
}

/// The seed's schedule.
#[derive(Debug)]
struct Schedule {
    first_kill: Duration,
    kill_every: (u64, u64),
    first_slot: usize,
    pg_restart_at: Duration,
    duplicate_ratio: f64,
    slow_ratio: f64,
    /// When the driving instance is paused (SIGSTOP, its database sessions cut) and for
    /// how long: past its lease, so the standby takes the provider over.
    pause_at: Duration,
    pause_for: Duration,
}

impl Schedule {
    fn draw(rng: &mut StdRng) -> Schedule {
        Schedule {
            first_kill: Duration::from_millis(rng.random_range(1_500..3_500)),
            kill_every: (2_500, 5_000),
            first_slot: rng.random_range(0..INSTANCES),
            pg_restart_at: Duration::from_millis(rng.random_range(7_000..15_000)),
            duplicate_ratio: rng.random_range(0.2..0.5),
            slow_ratio: rng.random_range(0.15..0.3),
            pause_at: Duration::from_millis(rng.random_range(3_000..11_000)),
            pause_for: Duration::from_millis(rng.random_range(5_000..7_000)),
        }
    }
}

/// What happened to the instances, for the summary and the docs' failover figures.
#[derive(Default)]
struct Timeline {
    kills: Vec<(Duration, usize)>,
    restarts: Vec<Started>,
    pg_restart: Option<(Duration, Duration)>,
    /// After the database restart: when each instance first served a store read again.
    recovered: Vec<(usize, Duration)>,
    /// The driver paused past its lease.
    pause: Option<Pause>,
}

/// The driver's pause: which slot and process, when, and when another process was seen
/// driving.
#[derive(Debug, Clone, Copy)]
struct Pause {
    slot: usize,
    /// The paused process: a kill of its slot meanwhile starts another, which may take over.
    pid: u32,
    at: Duration,
    until: Duration,
    taken_over_after: Option<Duration>,
    resumed: bool,
}

fn seed() -> u64 {
    match std::env::var("COMMITPOINT_TORTURE_SEED") {
        Ok(text) => text.trim().parse().unwrap_or_else(|_| panic!("COMMITPOINT_TORTURE_SEED={text:?} is not a u64")),
        Err(_) => DEFAULT_SEED,
    }
}

#[ignore = "PostgreSQL only: COMMITPOINT_TEST_STORE=postgres, --include-ignored (.ci/run does both)"]
#[test]
fn three_instances_on_one_database_survive_kills_and_a_database_restart() {
    postgres::require();
    let seed = seed();
    let _guard = SeedOnFailure(seed);
    eprintln!(
        "multi-instance torture: seed {seed} (reproduce: COMMITPOINT_TORTURE_SEED={seed} \
         COMMITPOINT_TEST_STORE=postgres cargo test --test multi_instance -- --nocapture)"
    );
    let began = Instant::now();
    let mut rng = StdRng::seed_from_u64(seed);
    let schedule = Schedule::draw(&mut rng);
    eprintln!("schedule: {schedule:?}");
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("runtime");

    let cluster = Cluster::start();
    cluster.create_database(DATABASE);
    let sim_config = SimulatorConfig {
        api_key: Some(fleet::SIM_KEY.into()),
        complete_after: Duration::from_millis(300),
        seed,
        ..SimulatorConfig::default()
    };
    let sim = rt
        .block_on(Simulator::start("127.0.0.1:0".parse().expect("loopback address"), sim_config))
        .expect("start the simulator");
    let dir = tempfile::Builder::new().prefix("commitpoint-multi-").tempdir().expect("temp dir");
    let config = config::write(dir.path(), &refusing_url());
    let mut fleet = Fleet::new(cluster.url(DATABASE), config, sim.base_url(), seed);
    let mut timeline = Timeline::default();
    for slot in 0..INSTANCES {
        fleet.start(slot);
    }

    let world = Arc::new(World::new(Arc::clone(&fleet.live)));
    let clients: Vec<_> = (0..CLIENTS)
        .map(|c| {
            let mix = clients::Mix::draw(&mut rng, schedule.duplicate_ratio);
            rt.spawn(clients::run(Arc::clone(&world), c, mix, rng.random()))
        })
        .collect();
    let workers: Vec<_> = (0..WORKERS)
        .map(|w| rt.spawn(workers::run(Arc::clone(&world), w, schedule.slow_ratio, rng.random())))
        .collect();

    let traffic = Instant::now();
    let mut next_kill = schedule.first_kill;
    let mut next_slot = schedule.first_slot;
    while traffic.elapsed() < TRAFFIC {
        supervise(&mut fleet);
        pause_the_driver(&rt, &world, &cluster, &mut fleet, &mut timeline, &schedule, traffic);
        let paused_now = timeline.pause.is_some_and(|p| !p.resumed);
        if timeline.pg_restart.is_none() && !paused_now && traffic.elapsed() >= schedule.pg_restart_at {
            let at = traffic.elapsed();
            cluster.restart_immediate();
            timeline.pg_restart = Some((at, traffic.elapsed() - at));
            eprintln!("{at:>6.1?}: PostgreSQL restarted (-m immediate), up again in {:?}", traffic.elapsed() - at);
            wait_recovered(&rt, &world, &mut fleet, &mut timeline, traffic);
        }
        if traffic.elapsed() >= next_kill {
            let slot = next_slot;
            next_slot = (next_slot + 1) % INSTANCES;
            timeline.kills.push((traffic.elapsed(), slot));
            fleet.kill(slot, "schedule");
            std::thread::sleep(Duration::from_millis(rng.random_range(0..600)));
            let started = fleet.start(slot);
            eprintln!(
                "{:>6.1?}: slot {slot} SIGKILLed and started again in {:?} ({} refused starts)",
                timeline.kills.last().map(|k| k.0).unwrap_or_default(),
                started.took,
                started.refusals.len()
            );
            timeline.restarts.push(started);
            next_kill = traffic.elapsed()
                + Duration::from_millis(rng.random_range(schedule.kill_every.0..schedule.kill_every.1));
        }
        std::thread::sleep(Duration::from_millis(50));
    }

    while timeline.pause.is_some_and(|p| !p.resumed) {
        pause_the_driver(&rt, &world, &cluster, &mut fleet, &mut timeline, &schedule, traffic);
        std::thread::sleep(Duration::from_millis(50));
    }
    world.stop_intake.store(true, Ordering::SeqCst);
    for client in clients {
        surface(&rt, client);
    }
    let drained_in = drain(&rt, &world, &mut fleet);
    world.stop_workers.store(true, Ordering::SeqCst);
    for worker in workers {
        surface(&rt, worker);
    }
    let violations = lock(&world.violations).clone();
    assert!(
        violations.is_empty(),
        "{} violations, the first: {:#?}",
        violations.len(),
        &violations[..violations.len().min(20)]
    );

    let stats = sim.stats();
    let audit = rt.block_on(checks::run(&world, &cluster, DATABASE, &stats));
    fleet.stop_all();
    // The product's `verify` on the database the three instances shared.
    let report = cluster.assert_verifies(DATABASE);

    let c = &world.counters;
    let n = |a: &std::sync::atomic::AtomicU64| a.load(Ordering::Relaxed);
    let restarts: Vec<String> = timeline
        .restarts
        .iter()
        .map(|s| {
            format!("slot {} in {:.1?} after {} refused starts {:?}", s.slot, s.took, s.refusals.len(), s.refusals)
        })
        .collect();
    eprintln!(
        "multi-instance torture: seed {seed} passed in {:.1?} (drained in {drained_in:.1?})\n\
         intake: {} sent ({} duplicates), {} acknowledged ({} created), {} unanswered, {} refused while unavailable\n\
         workers: {} claims, {} fresh commits, {} replays, {} stale posts refused, {} slow, {} post retries\n\
         database: {} extractions ({} acknowledged), {} committed by batch, {} by workers, {} findings, \
         {} worker calls charged, {} replay entries, {} outbox events\n\
         simulator: {} batches, {} lines billed\n\
         kills: {:?}\nstarts: {restarts:#?}\ndatabase restart (at, took): {:?}; served again: {:?}; driver pause: {:?}\n{report}",
        began.elapsed(),
        n(&c.intakes),
        n(&c.duplicate_sends),
        n(&c.acks),
        n(&c.created),
        n(&c.unanswered),
        n(&c.unavailable),
        n(&c.claims),
        n(&c.fresh_commits),
        n(&c.replays),
        n(&c.stale_refused),
        n(&c.slow_posts),
        n(&c.post_retries),
        audit.extractions,
        audit.acked,
        audit.by_batch,
        audit.by_workers,
        audit.findings,
        audit.worker_charges,
        audit.replay_entries,
        audit.outbox_events,
        stats.batches_created,
        stats.lines_completed,
        timeline.kills,
        timeline.pg_restart,
        timeline.recovered,
        timeline.pause,
    );
    // A run that exercised nothing proves nothing.
    assert!(
        audit.by_batch > 0 && audit.by_workers > 0,
        "both paths must commit: {} by batch, {} by workers",
        audit.by_batch,
        audit.by_workers
    );
    assert!(n(&c.duplicate_sends) > 0 && n(&c.stale_refused) > 0, "duplicates and stale posts must occur");
    assert!(
        timeline.kills.iter().any(|(_, slot)| DRIVERS.contains(slot)),
        "an instance with the provider must be killed at least once"
    );
    let pause = timeline.pause.expect("the driver must have been paused");
    assert!(pause.taken_over_after.is_some(), "the standby never took over from the paused driver: {pause:?}");
    rt.block_on(sim.stop());
}

/// A loopback URL nothing listens on: every delivery is refused at once.
fn refusing_url() -> String {
    let port = std::net::TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).expect("a free port").port();
    format!("http://127.0.0.1:{port}/events")
}

/// An instance that exits by itself fails the test: not even the driver exits when the
/// database restarts or its sessions are cut, since its term lives in the lease row, not
/// in a session.
fn supervise(fleet: &mut Fleet) {
    if let Some((slot, status, stderr)) = fleet.exited().into_iter().next() {
        panic!("slot {slot} exited by itself ({status}); its stderr (tail):\n{}", tail(&stderr, 40));
    }
}

/// The instance driving the provider now, as `host:pid`, asked of any live instance.
fn driver_now(rt: &Runtime, world: &World, fleet: &Fleet) -> Option<String> {
    let base = fleet.live.any().first().cloned()?;
    let (status, stats) = rt.block_on(world.call(&base, "/v1/stats", None)).ok()?;
    (status == 200).then(|| stats["store"]["drivers"]["openai"].as_str().map(str::to_string)).flatten()
}

/// At the schedule's moment, stops the driving instance (SIGSTOP) and cuts its database
/// sessions, as a partition would; notes when the standby is seen driving; resumes it
/// (SIGCONT) after the pause. A kill of the paused slot meanwhile is allowed.
fn pause_the_driver(
    rt: &Runtime,
    world: &World,
    cluster: &Cluster,
    fleet: &mut Fleet,
    timeline: &mut Timeline,
    schedule: &Schedule,
    traffic: Instant,
) {
    let now = traffic.elapsed();
    match timeline.pause {
        None if now >= schedule.pause_at => {
            let Some(driver) = driver_now(rt, world, fleet) else { return };
            let Some(pid) = driver.rsplit(':').next().and_then(|p| p.parse::<u32>().ok()) else { return };
            let Some(slot) = fleet.slot_of(pid) else { return };
            let Some(pid) = fleet.pause(slot) else { return };
            let cut = cluster.psql(
                DATABASE,
                &format!(
                    "SELECT count(*) FILTER (WHERE pg_terminate_backend(pid)) FROM pg_stat_activity \
                     WHERE application_name = 'commitpoint {driver}'"
                ),
            );
            eprintln!("{now:>6.1?}: slot {slot} (the driver, {driver}) SIGSTOPped; {cut} of its database sessions cut");
            timeline.pause = Some(Pause {
                slot,
                pid,
                at: now,
                until: now + schedule.pause_for,
                taken_over_after: None,
                resumed: false,
            });
        }
        Some(mut pause) if !pause.resumed => {
            if pause.taken_over_after.is_none()
                && let Some(driver) = driver_now(rt, world, fleet)
                && driver.rsplit(':').next().and_then(|p| p.parse::<u32>().ok()) != Some(pause.pid)
            {
                pause.taken_over_after = Some(now - pause.at);
                eprintln!("{now:>6.1?}: {driver} drives the provider now");
            }
            if now >= pause.until {
                fleet.resume(pause.slot);
                pause.resumed = true;
                eprintln!("{now:>6.1?}: slot {} SIGCONTed", pause.slot);
            }
            timeline.pause = Some(pause);
        }
        _ => {}
    }
}

/// After the database restart every instance must serve store reads again, without a
/// restart.
fn wait_recovered(rt: &Runtime, world: &World, fleet: &mut Fleet, timeline: &mut Timeline, traffic: Instant) {
    let (restarted_at, _) = timeline.pg_restart.expect("the database was restarted");
    let mut pending: Vec<usize> = (0..INSTANCES).collect();
    while !pending.is_empty() {
        supervise(fleet);
        pending.retain(|&slot| {
            let Some(base) = fleet.live.get(slot) else { return true };
            let answer = rt.block_on(world.call(&base, "/v1/stats", None));
            if matches!(answer, Ok((200, _))) {
                timeline.recovered.push((slot, traffic.elapsed() - restarted_at));
                return false;
            }
            true
        });
        assert!(
            traffic.elapsed() - restarted_at < RECOVERY_TIMEOUT,
            "instances {pending:?} did not serve again within {RECOVERY_TIMEOUT:?} of the database restart"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Waits until nothing is pending, claimed, submitted or ready. Returns how long it took.
fn drain(rt: &Runtime, world: &World, fleet: &mut Fleet) -> Duration {
    let started = Instant::now();
    loop {
        supervise(fleet);
        let base = fleet.live.any().first().cloned().expect("an instance is up");
        if let Ok((200, stats)) = rt.block_on(world.call(&base, "/v1/stats", None)) {
            let count = |state: &str| stats["extractions"][state].as_u64().unwrap_or(0);
            let busy: u64 = ["pending", "claimed", "submitted", "ready"].iter().map(|s| count(s)).sum();
            if busy == 0 {
                assert_eq!(count("failed"), 0, "nothing may fail without faults: {stats:#}");
                return started.elapsed();
            }
            assert!(started.elapsed() < DRAIN_TIMEOUT, "not drained within {DRAIN_TIMEOUT:?}: {stats:#}");
        }
        // Also when /v1/stats keeps failing: the test fails instead of hanging.
        assert!(started.elapsed() < DRAIN_TIMEOUT, "not drained within {DRAIN_TIMEOUT:?}: /v1/stats does not answer");
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// Re-raises a task's panic on the controlling thread.
fn surface(rt: &Runtime, task: tokio::task::JoinHandle<()>) {
    if let Err(e) = rt.block_on(task) {
        if e.is_panic() {
            std::panic::resume_unwind(e.into_panic());
        }
        panic!("a client or worker task ended: {e}");
    }
}

fn tail(text: &str, lines: usize) -> String {
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}
