//! Scale-out benchmark: intake and the worker path with 1, 2 and 3 `commitpoint serve`
//! instances on one local PostgreSQL, next to one instance on redb, in one run on the same
//! machine (docs/SCALE-OUT.md, docs/PERFORMANCE.md).
//!
//! `cargo bench --bench instances` runs, for each setup, two phases against fresh data:
//! - intake: C clients, each on one keep-alive connection to one instance (spread evenly),
//!   send new sources back to back; acknowledged intakes per second and latency;
//! - workers: W workers (`common/workers.rs`), spread the same way, claim 10 and post a
//!   result with 2 findings for each, working off what the intake phase stored.
//!
//! Then, on the same server, `pgbench` runs a single-row `INSERT … ON CONFLICT DO NOTHING`
//! of a new 1 KiB row per transaction with as many connections as intake clients: what a
//! durable insert costs PostgreSQL itself, printed with each PostgreSQL setup's intake
//! rate as a multiple of it and the server's CPU per intake and per result; then the
//! River/Oban-style worker script of `benches/worker.rs` (`FOR UPDATE SKIP LOCKED` claim
//! of 10, each completed with 2 findings) over the rows that run left, beside the
//! workers' results per second.
//!
//! Beside each figure it prints the CPU seconds the commitpoint processes and the
//! PostgreSQL processes used, against the machine's cores: that says what limits the
//! setup. PostgreSQL's binaries must be installed (Debian: `postgresql`); without them
//! only the redb line is printed. It exits 1 if a step fails.
//!
//! | variable | default | meaning |
//! |---|---|---|
//! | `COMMITPOINT_BENCH_QUICK=1` | off | smoke run: 2 s phases, 8 clients, 4 workers |
//! | `COMMITPOINT_BENCH_SECS` | 10 (quick: 2) | seconds per phase |
//! | `COMMITPOINT_BENCH_CLIENTS` | 64 (quick: 8) | intake clients |
//! | `COMMITPOINT_BENCH_WORKERS` | 32 (quick: 4) | workers |
//! | `COMMITPOINT_BENCH_INSTANCES` | `1,2,3` | PostgreSQL setups to run |
//! | `COMMITPOINT_BENCH_DIR` | `target/tmp` | parent of the data directories (avoid tmpfs) |

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;

#[path = "common/mod.rs"]
mod common;

use common::http::Connection;
use common::postgres::{self, Cluster};
use common::stats::{Latencies, fmt_us, micros, rate};
use common::workers::{CLAIM_LIMIT, output_body, worker};
use common::{BINARY, Result, ServerProcess, env_var, load_average, process_cpu_secs};

const SCHEMA: &str = "code-review@1";
const TENANT: &str = "bench";
const CONTENT_BYTES: usize = 1024;

fn main() -> ExitCode {
    common::bench_main("instances", 1, || {
        let config = Config::from_env()?;
        Ok(async move { run(&config).await })
    })
}

#[derive(Debug)]
struct Config {
    secs: u64,
    clients: usize,
    workers: usize,
    instances: Vec<usize>,
    base: PathBuf,
}

impl Config {
    fn from_env() -> Result<Self> {
        let quick = env_var("COMMITPOINT_BENCH_QUICK").is_some_and(|v| v != "0");
        let number = |name: &str, default: usize| -> Result<usize> {
            match env_var(name) {
                Some(v) => v.trim().parse().map_err(|e| format!("{name}={v:?}: {e}").into()),
                None => Ok(default),
            }
        };
        let instances = match env_var("COMMITPOINT_BENCH_INSTANCES") {
            Some(list) => list
                .split(',')
                .map(|n| n.trim().parse::<usize>().map_err(|e| format!("COMMITPOINT_BENCH_INSTANCES={list:?}: {e}")))
                .collect::<Result<Vec<_>, _>>()?,
            None => vec![1, 2, 3],
        };
        if instances.iter().any(|n| *n == 0 || *n > 8) {
            return Err("COMMITPOINT_BENCH_INSTANCES: each count must be 1..=8".into());
        }
        let base = env_var("COMMITPOINT_BENCH_DIR")
            .map(PathBuf::from)
            .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("target").join("tmp"));
        Ok(Self {
            secs: number("COMMITPOINT_BENCH_SECS", if quick { 2 } else { 10 })? as u64,
            clients: number("COMMITPOINT_BENCH_CLIENTS", if quick { 8 } else { 64 })?.max(1),
            workers: number("COMMITPOINT_BENCH_WORKERS", if quick { 4 } else { 32 })?.max(1),
            instances,
            base,
        })
    }
}

/// One setup's figures.
#[derive(Debug, Default)]
struct Outcome {
    label: String,
    intake: Phase,
    work: Phase,
    problems: Vec<String>,
}

#[derive(Debug, Default)]
struct Phase {
    done: u64,
    elapsed: Duration,
    latencies_us: Vec<u32>,
    commitpoint_cpu: f64,
    postgres_cpu: f64,
    errors: u64,
}

async fn run(config: &Config) -> Result<bool> {
    std::fs::create_dir_all(&config.base)?;
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    println!(
        "instances bench: {} s per phase, {} intake clients, {} workers, {cores} cores, load {}",
        config.secs,
        config.clients,
        config.workers,
        load_average()
    );
    let mut outcomes = vec![setup(config, Backend::Redb, 1).await?];
    let mut reference = None;
    match postgres::find_bin() {
        Ok(_) => {
            let cluster = Cluster::start(&config.base, "256MB")?;
            for (n, instances) in config.instances.iter().enumerate() {
                cluster.psql(&format!("CREATE DATABASE scale_{n}"))?;
                let url = format!("postgres://postgres@127.0.0.1:{}/scale_{n}", cluster.port);
                let postmaster = cluster.postmaster_pid()?;
                outcomes.push(setup(config, Backend::Postgres { url: &url, postmaster }, *instances).await?);
            }
            let insert = pgbench_insert(config, &cluster)?;
            reference = Some((insert, pgbench_claims(config, &cluster)?));
        }
        Err(e) => println!("PostgreSQL: skipped ({e})"),
    }
    print_table(&outcomes, cores);
    if let Some((insert, claims)) = reference {
        print_reference(&insert, &claims, &outcomes, cores);
    }
    Ok(outcomes.iter().all(|o| o.problems.is_empty()))
}

#[derive(Debug, Clone, Copy)]
enum Backend<'a> {
    Redb,
    Postgres { url: &'a str, postmaster: u32 },
}

async fn setup(config: &Config, backend: Backend<'_>, instances: usize) -> Result<Outcome> {
    let label = match backend {
        Backend::Redb => "redb, 1 instance".to_string(),
        Backend::Postgres { .. } => format!("postgres, {instances} instance{}", if instances == 1 { "" } else { "s" }),
    };
    let dir = tempfile::Builder::new().prefix("instances-").tempdir_in(&config.base)?;
    let mut servers = Vec::with_capacity(instances);
    for i in 0..instances {
        let mut serve = Command::new(BINARY);
        serve
            .arg("serve")
            .arg("--data-dir")
            .arg(dir.path().join(format!("data-{i}")))
            .args(["--listen", "127.0.0.1:0"]);
        if let Backend::Postgres { url, .. } = backend {
            serve.args(["--store-url", url]);
        }
        servers.push(ServerProcess::start(serve, &dir.path().join(format!("server-{i}.log")))?);
    }
    let addrs: Vec<SocketAddr> = servers.iter().map(|s| s.addr).collect();
    let pids: Vec<u32> = servers.iter().map(ServerProcess::pid).collect();
    let postmaster = match backend {
        Backend::Redb => None,
        Backend::Postgres { postmaster, .. } => Some(postmaster),
    };
    let mut outcome = Outcome { label, ..Outcome::default() };

    let cpu = CpuMeter::start(&pids, postmaster);
    outcome.intake = intake_phase(config, &addrs).await;
    cpu.finish(&mut outcome.intake);
    let cpu = CpuMeter::start(&pids, postmaster);
    outcome.work = work_phase(config, &addrs).await;
    cpu.finish(&mut outcome.work);

    if outcome.intake.done == 0 || outcome.work.done == 0 {
        outcome.problems.push("a phase completed nothing".to_string());
    }
    for phase in [&outcome.intake, &outcome.work] {
        if phase.errors > 0 {
            outcome.problems.push(format!("{} requests failed", phase.errors));
        }
    }
    for server in &mut servers {
        if let Err(e) = server.check_alive().and_then(|()| tokio::task::block_in_place(|| server.stop()).map(drop)) {
            outcome.problems.push(e.to_string());
        }
    }
    Ok(outcome)
}

/// CPU seconds of the commitpoint processes and of every PostgreSQL process (the
/// postmaster's children) over one phase.
struct CpuMeter<'a> {
    pids: &'a [u32],
    postmaster: Option<u32>,
    commitpoint: f64,
    postgres: f64,
}

impl<'a> CpuMeter<'a> {
    fn start(pids: &'a [u32], postmaster: Option<u32>) -> Self {
        let mut meter = Self { pids, postmaster, commitpoint: 0.0, postgres: 0.0 };
        (meter.commitpoint, meter.postgres) = meter.read();
        meter
    }

    fn read(&self) -> (f64, f64) {
        let commitpoint = self.pids.iter().filter_map(|p| process_cpu_secs(&p.to_string())).sum();
        let postgres = self.postmaster.map_or(0.0, postgres_cpu_secs);
        (commitpoint, postgres)
    }

    fn finish(self, phase: &mut Phase) {
        let (commitpoint, postgres) = self.read();
        phase.commitpoint_cpu = commitpoint - self.commitpoint;
        phase.postgres_cpu = postgres - self.postgres;
    }
}

/// The postmaster's CPU and its live children's (found by their parent pid in /proc). A
/// backend that ended during the phase takes its time with it, so this is a lower bound
/// when connections come and go; the servers keep pooled connections, so few do.
fn postgres_cpu_secs(postmaster: u32) -> f64 {
    let mut total = process_cpu_secs(&postmaster.to_string()).unwrap_or(0.0);
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return total;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(pid) = name.to_str().filter(|n| n.bytes().all(|b| b.is_ascii_digit())) else {
            continue;
        };
        let stat = std::fs::read_to_string(entry.path().join("stat")).unwrap_or_default();
        // The parent pid is the second field after the parenthesised command name.
        let parent = stat.rfind(')').and_then(|at| stat[at + 1..].split_whitespace().nth(1));
        if parent == Some(postmaster.to_string().as_str()) {
            total += process_cpu_secs(pid).unwrap_or(0.0);
        }
    }
    total
}

/// Each client sends new sources to one instance, back to back, for the phase.
async fn intake_phase(config: &Config, addrs: &[SocketAddr]) -> Phase {
    let started = Instant::now();
    let stop_at = started + Duration::from_secs(config.secs);
    let tasks: Vec<_> =
        (0..config.clients).map(|id| tokio::spawn(intake_client(id, addrs[id % addrs.len()], stop_at))).collect();
    let mut phase = Phase::default();
    for task in tasks {
        match task.await {
            Ok((done, latencies, errors)) => {
                phase.done += done;
                phase.latencies_us.extend(latencies);
                phase.errors += errors;
            }
            Err(_) => phase.errors += 1,
        }
    }
    phase.elapsed = started.elapsed();
    phase
}

async fn intake_client(id: usize, addr: SocketAddr, stop_at: Instant) -> (u64, Vec<u32>, u64) {
    let (mut done, mut latencies, mut errors) = (0, Vec::new(), 0);
    let Ok(mut connection) = Connection::open(addr).await else {
        return (0, latencies, 1);
    };
    let filler = "x".repeat(CONTENT_BYTES);
    let mut n = 0u64;
    while Instant::now() < stop_at {
        n += 1;
        let body = serde_json::json!({
            "tenant": TENANT,
            "source_id": format!("scale/{id}-{n}"),
            "schema": SCHEMA,
            "content": format!("PR {id}-{n}. {filler}"),
        });
        let sent = Instant::now();
        match connection.post("/v1/extractions", Bytes::from(body.to_string())).await {
            Ok((201, _)) => {
                latencies.push(micros(sent.elapsed()));
                done += 1;
            }
            Ok(_) => errors += 1,
            Err(_) => {
                errors += 1;
                match Connection::open(addr).await {
                    Ok(c) => connection = c,
                    Err(_) => return (done, latencies, errors),
                }
            }
        }
    }
    connection.close().await;
    (done, latencies, errors)
}

/// Workers spread over the instances complete what the intake phase stored.
async fn work_phase(config: &Config, addrs: &[SocketAddr]) -> Phase {
    let started = Instant::now();
    let stop_at = started + Duration::from_secs(config.secs);
    let output = Arc::new(output_body());
    let tasks: Vec<_> = (0..config.workers)
        .map(|id| tokio::spawn(worker(id, addrs[id % addrs.len()], stop_at, Arc::clone(&output))))
        .collect();
    let mut phase = Phase::default();
    for task in tasks {
        match task.await {
            Ok(w) => {
                phase.done += w.items;
                phase.latencies_us.extend(w.result_us);
                phase.errors += w.errors;
            }
            Err(_) => phase.errors += 1,
        }
    }
    phase.elapsed = started.elapsed();
    phase
}

fn print_table(outcomes: &[Outcome], cores: usize) {
    println!();
    println!(
        "{:<22} {:>10} {:>9} {:>9} {:>12} | {:>10} {:>9} {:>9} {:>12}",
        "setup", "intake/s", "p50", "p99", "cpu cp+pg", "results/s", "p50", "p99", "cpu cp+pg"
    );
    for o in outcomes {
        let cells = |p: &Phase| {
            let l = Latencies::from(p.latencies_us.clone());
            let wall = p.elapsed.as_secs_f64().max(1e-9);
            (
                format!("{:.0}", rate(p.done, p.elapsed)),
                fmt_us(l.p50),
                fmt_us(l.p99),
                format!("{:.2}+{:.2}", p.commitpoint_cpu / wall, p.postgres_cpu / wall),
            )
        };
        let (ir, i50, i99, icpu) = cells(&o.intake);
        let (wr, w50, w99, wcpu) = cells(&o.work);
        println!("{:<22} {ir:>10} {i50:>9} {i99:>9} {icpu:>12} | {wr:>10} {w50:>9} {w99:>9} {wcpu:>12}", o.label);
        for problem in &o.problems {
            println!("  PROBLEM: {problem}");
        }
    }
    println!();
    println!(
        "cpu cp+pg: cores used by the commitpoint processes + by PostgreSQL during the phase, of {cores}; \
         their sum near {cores} means the setup is CPU-bound on this machine"
    );
}

/// pgbench's single-row insert of a new identity with 1 KiB of content, committed on its
/// own, by as many connections as there are intake clients, on the same server: what one
/// durable insert costs PostgreSQL itself. Client variables persist across transactions,
/// so `:n` numbers each client's rows.
const PGBENCH_INSERT: &str = r"\set n :n + 1
INSERT INTO extractions (id, tenant, source_id, schema, content)
VALUES (sha256(convert_to('ref/' || :client_id::text || '/' || :n::text, 'UTF8')), 'bench',
        'ref/' || :client_id::text || '-' || :n::text, 'code-review@1', :fill::text)
ON CONFLICT (id) DO NOTHING;
";

/// The reference figure: pgbench's transactions per second, its latencies and the
/// server's CPU over the run.
struct Reference {
    /// Operations per second: transactions (the insert), completed rows (the worker).
    tps: f64,
    done: u64,
    latencies: Latencies,
    postgres_cpu: f64,
    clients: usize,
}

fn pgbench_insert(config: &Config, cluster: &Cluster) -> Result<Reference> {
    cluster.create_extractions(false)?;
    let vars = [("n", "0".to_string()), ("fill", "x".repeat(CONTENT_BYTES))];
    let (run, postgres_cpu) = pgbench_sampled(cluster, PGBENCH_INSERT, config.clients, config.secs, &vars)?;
    Ok(Reference {
        tps: run.tps,
        done: run.transactions,
        latencies: Latencies::from(run.latencies_us),
        postgres_cpu,
        clients: config.clients,
    })
}

/// The River/Oban-style worker of `benches/worker.rs` (claim 10 with `FOR UPDATE SKIP
/// LOCKED`, then complete each with 2 findings in its own transaction), by as many
/// connections as workers, over the rows the insert run left; `done` counts completed rows.
fn pgbench_claims(config: &Config, cluster: &Cluster) -> Result<Reference> {
    cluster.add_claim_tables()?;
    cluster.psql("VACUUM ANALYZE extractions")?;
    let (script, vars) = postgres::claim_and_complete(CLAIM_LIMIT, &output_body());
    let (run, postgres_cpu) = pgbench_sampled(cluster, &script, config.workers, config.secs, &vars)?;
    let done: u64 = cluster.psql("SELECT count(*) FROM extractions WHERE state = 2")?.parse()?;
    Ok(Reference {
        tps: done as f64 / config.secs.max(1) as f64,
        done,
        latencies: Latencies::from(run.latencies_us),
        postgres_cpu,
        clients: config.workers,
    })
}

/// Runs pgbench and returns its run with the server's CPU seconds over it. pgbench's
/// backends end with its run and take their CPU time with them, so the CPU is sampled
/// while they live; the last sample covers the run to within the sampling period.
fn pgbench_sampled(
    cluster: &Cluster,
    script: &str,
    clients: usize,
    secs: u64,
    vars: &[(&str, String)],
) -> Result<(postgres::PgbenchRun, f64)> {
    let postmaster = cluster.postmaster_pid()?;
    let before = postgres_cpu_secs(postmaster);
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let sampler = {
        let stop = Arc::clone(&stop);
        std::thread::spawn(move || {
            let mut most = 0.0f64;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                most = most.max(postgres_cpu_secs(postmaster) - before);
                std::thread::sleep(Duration::from_millis(100));
            }
            most
        })
    };
    let run = cluster.pgbench(script, clients, secs, vars);
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let postgres_cpu = sampler.join().map_err(|_| "the CPU sampler panicked")?;
    let run = run?;
    if run.failed > 0 || run.transactions == 0 {
        return Err(format!("pgbench: {} of {} transactions failed", run.failed, run.transactions).into());
    }
    Ok((run, postgres_cpu))
}

fn print_reference(insert: &Reference, claims: &Reference, outcomes: &[Outcome], cores: usize) {
    let per_op = |r: &Reference| r.postgres_cpu * 1000.0 / r.done.max(1) as f64;
    println!(
        "pgbench, same server, {} connections, single-row INSERT … ON CONFLICT DO NOTHING: {:.0} tps, \
         p50 {}, p99 {}, {:.2} ms of PostgreSQL CPU per insert ({cores} cores)",
        insert.clients,
        insert.tps,
        fmt_us(insert.latencies.p50),
        fmt_us(insert.latencies.p99),
        per_op(insert),
    );
    println!(
        "pgbench, same server, {} connections, SKIP LOCKED claim {CLAIM_LIMIT} + complete each with 2 findings: \
         {:.0} rows/s, {:.2} ms of PostgreSQL CPU per row",
        claims.clients,
        claims.tps,
        per_op(claims),
    );
    for o in outcomes.iter().filter(|o| o.label.starts_with("postgres")) {
        let intake = rate(o.intake.done, o.intake.elapsed);
        let results = rate(o.work.done, o.work.elapsed);
        let per_intake = o.intake.postgres_cpu * 1000.0 / o.intake.done.max(1) as f64;
        let per_result = o.work.postgres_cpu * 1000.0 / o.work.done.max(1) as f64;
        println!(
            "  {}: intake {:.2}x pgbench's insert, results {:.2}x its claim + complete; \
             PostgreSQL CPU {per_intake:.2} ms per intake, {per_result:.2} ms per result",
            o.label,
            intake / insert.tps.max(1e-9),
            results / claims.tps.max(1e-9),
        );
    }
}
