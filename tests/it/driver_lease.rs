//! The fenced provider lease on PostgreSQL (docs/SCALE-OUT.md): one instance drives a
//! provider's batches per term; a driver whose term ended, because it was paused past its
//! lease or another instance took over, calls the provider no more and stores nothing,
//! and the batches it left are finished by the next driver, once each.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

use crate::provider::{Rig, SIM_KEY, settle_within};
use crate::support::postgres::{self, cluster, database_for};
use crate::util::{Server, id_of, serve_command, temp_dir};

/// Short, so a takeover happens within the test's patience.
const LEASE: &str = "2s";

fn lease_config(dir: &Path) -> PathBuf {
    let path = dir.join("lease.toml");
    std::fs::write(&path, format!("[store]\ndriver_lease = \"{LEASE}\"\n")).expect("write the lease config");
    path
}

/// A driving instance of the simulated OpenAI provider on the database of `database_dir`.
fn driver(rig: &Rig, data_dir: &Path, database_dir: &Path, config: &Path) -> Server {
    let base = rig.sim.base_url();
    let args = [
        "--provider",
        "openai",
        "--provider-base-url",
        &base,
        "--provider-key-env",
        "SIM_KEY",
        "--batch-max-wait",
        "200ms",
        "--poll-interval",
        "100ms",
    ];
    let mut cmd = serve_command(data_dir, &args);
    cmd.env("SIM_KEY", SIM_KEY).env("COMMITPOINT_CONFIG", config).env_remove("COMMITPOINT_FAILPOINTS");
    postgres::apply(&mut cmd, database_dir);
    Server::spawn(cmd, data_dir)
}

fn count(database: &str, sql: &str) -> u64 {
    cluster().psql(database, sql).parse().expect("a count")
}

async fn driver_of(server: &Server) -> Option<String> {
    let stats = server.api().get("/v1/stats").await.body;
    stats["store"]["drivers"]["openai"].as_str().map(str::to_string)
}

async fn wait_until_driven_by(server: &Server, pid: u32, within: Duration) {
    let deadline = Instant::now() + within;
    loop {
        if driver_of(server).await.is_some_and(|d| d.ends_with(&format!(":{pid}"))) {
            return;
        }
        assert!(Instant::now() < deadline, "pid {pid} did not take the provider over within {within:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn intake(server: &Server, prefix: &str, n: usize) -> BTreeSet<String> {
    let mut ids = BTreeSet::new();
    for i in 0..n {
        let source = format!("{prefix}-{i}");
        let reply = server.api().intake("acme", &source, &format!("fn f{i}() {{ {prefix}.unwrap() }}")).await;
        assert_eq!(reply.status, 201, "{:#}", reply.body);
        ids.insert(id_of(&reply.body));
    }
    ids
}

/// Every batch the provider created is one the store knows and has closed: none was
/// orphaned, and none was created twice for the same members.
fn assert_every_batch_adopted(rig: &Rig, database: &str) {
    let stats = rig.stats();
    assert_eq!(stats.max_live_batches_per_custom_id, 1, "{stats:#?}");
    assert!(stats.submissions_per_custom_id.values().all(|n| *n == 1), "a member was sent twice: {stats:#?}");
    let known = count(database, "SELECT count(DISTINCT job_id) FROM batches WHERE job_id IS NOT NULL");
    assert_eq!(stats.batches_created, known, "a batch created at the provider is unknown to the store: {stats:#?}");
    let open = count(database, "SELECT count(*) FROM batches WHERE job_id IS NOT NULL AND state_code <> 2");
    assert_eq!(open, 0, "a batch the provider created was never finished");
}

/// The driver is stopped (SIGSTOP) with batches in flight and stays stopped past its
/// lease. The standby takes the provider over, polls the batches the driver left and
/// commits them. Resumed (SIGCONT), the old driver finds its term over before it calls the
/// provider again, stands by, and later work is still driven by the standby alone.
#[ignore = "PostgreSQL only: COMMITPOINT_TEST_STORE=postgres, --include-ignored (.ci/run does both)"]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_driver_is_fenced_out_and_the_standby_finishes_its_batches() {
    postgres::require();
    let rig = Rig::start(Duration::from_millis(1_500), commitpoint::simulator::Faults::default()).await;
    let config = lease_config(rig.dir.path());
    let first = driver(&rig, rig.dir.path(), rig.dir.path(), &config);
    let other_dir = temp_dir();
    let second = driver(&rig, other_dir.path(), rig.dir.path(), &config);
    wait_until_driven_by(&second, first.pid(), Duration::from_secs(10)).await;
    let database = database_for(rig.dir.path());

    let mut ids = intake(&first, "early", 12).await;
    rig.wait_stats("a batch in flight", |s| s.batches_created >= 1).await;
    let first_pid = Pid::from_raw(i32::try_from(first.pid()).expect("a pid"));
    kill(first_pid, Signal::SIGSTOP).expect("SIGSTOP the driver");
    let paused = Instant::now();
    ids.extend(intake(&second, "while-paused", 8).await);

    // Two seconds of lease and a standby that asks every 400 ms.
    wait_until_driven_by(&second, second.pid(), Duration::from_secs(10)).await;
    let took_over = paused.elapsed();
    let records = settle_within(&second.api(), &ids, Duration::from_secs(30)).await;
    assert!(records.values().all(|r| r["state"] == "committed"), "{records:#?}");
    let settled = paused.elapsed();

    kill(first_pid, Signal::SIGCONT).expect("SIGCONT the driver");
    // Its term is over by its own clock: it stops before calling the provider, then stands by.
    let later = intake(&first, "after-resume", 6).await;
    let records = settle_within(&second.api(), &later, Duration::from_secs(30)).await;
    assert!(records.values().all(|r| r["state"] == "committed"), "{records:#?}");
    assert!(
        driver_of(&second).await.is_some_and(|d| d.ends_with(&format!(":{}", second.pid()))),
        "the standby still drives"
    );
    assert_every_batch_adopted(&rig, &database);
    let (exit, log) = first.terminate();
    assert_eq!(exit.code(), Some(0), "{log}");
    assert!(log.contains("term driving the provider ended"), "{log}");
    assert!(log.contains("standing by"), "the resumed driver stands by: {log}");
    let (exit, log) = second.terminate();
    assert_eq!(exit.code(), Some(0), "{log}");
    assert!(log.contains("took over driving"), "{log}");
    eprintln!("takeover {took_over:?} after the pause; all committed {settled:?} after it");
    cluster().assert_verifies(&database);
}

/// Another instance's takeover while the driver waits on a slow upload: the driver's next
/// renewal finds the new term, the step in flight is dropped before the batch is created,
/// and nothing of it is stored. When the lease is free again the same instance starts a
/// new term, looks the intent up by its key (it may have been sent meanwhile) and submits
/// it once.
#[ignore = "PostgreSQL only: COMMITPOINT_TEST_STORE=postgres, --include-ignored (.ci/run does both)"]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_driver_whose_term_is_taken_abandons_its_step_in_flight() {
    postgres::require();
    let slow = commitpoint::simulator::Faults { slow_ms: 3_000, ..Default::default() };
    let rig = Rig::start(Duration::from_millis(50), slow).await;
    let config = lease_config(rig.dir.path());
    let driver = driver(&rig, rig.dir.path(), rig.dir.path(), &config);
    let database = database_for(rig.dir.path());
    let ids = intake(&driver, "PR", 1).await;
    let deadline = Instant::now() + Duration::from_secs(20);
    while count(&database, "SELECT count(*) FROM batches") == 0 {
        assert!(Instant::now() < deadline, "no submit intent was formed");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // The scheduler is now in the provider's upload, which takes 3 s: another holder
    // takes the lease for a minute.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let taken = count(
        &database,
        "WITH t AS (UPDATE provider_leases SET holder = 'elsewhere:1', epoch = epoch + 1, \
         expires_at_ms = (extract(epoch FROM clock_timestamp()) * 1000)::bigint + 60000 \
         WHERE provider = 'openai' RETURNING 1) SELECT count(*) FROM t",
    );
    assert_eq!(taken, 1);
    tokio::time::sleep(Duration::from_secs(4)).await;
    let stats = rig.stats();
    assert_eq!(stats.batches_created, 0, "the step went on after the term ended: {stats:#?}");
    assert_eq!(count(&database, "SELECT count(*) FROM batches WHERE job_id IS NOT NULL"), 0);

    // The other holder lets go; this instance drives again and sends the intent once.
    rig.sim.set_faults(commitpoint::simulator::Faults::default());
    cluster().psql(&database, "UPDATE provider_leases SET expires_at_ms = 0 WHERE holder = 'elsewhere:1'");
    let records = settle_within(&driver.api(), &ids, Duration::from_secs(30)).await;
    assert!(records.values().all(|r| r["state"] == "committed"), "{records:#?}");
    assert_every_batch_adopted(&rig, &database);
    let (exit, log) = driver.terminate();
    assert_eq!(exit.code(), Some(0), "{log}");
    assert!(log.contains("term driving the provider ended"), "{log}");
    assert!(log.contains("took over driving"), "{log}");
}
