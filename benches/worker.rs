//! Worker-path benchmark: external workers claiming and completing work, commitpoint next
//! to PostgreSQL.
//!
//! `cargo bench --bench worker` fills a fresh store with N pending extractions (through
//! `Store::intake`, see `common/preload.rs`), starts the release binary on it, and runs 32
//! workers, each on one keep-alive connection: `POST /v1/claims` with limit 10, then for
//! each grant `POST /v1/extractions/{id}/result` with an output holding 2 findings, one
//! after another, until the time is up. Every result is acknowledged after its group
//! commit's fsync.
//!
//! Then, when PostgreSQL's binaries are installed (otherwise "PostgreSQL: skipped"), the
//! same on a table of the same shape preloaded with N pending rows: pgbench with 32
//! connections runs the pattern River and Oban use, a claim
//! `UPDATE … WHERE id IN (SELECT … FOR UPDATE SKIP LOCKED LIMIT 10) RETURNING …`, then per
//! item one transaction with the completing `UPDATE` (checked against the lease) and 2
//! `INSERT`s into `findings`. It prints completed items per second for both, the ratio,
//! latencies and bytes written per item. It exits 1 only if a step fails.
//!
//! | variable | default | meaning |
//! |---|---|---|
//! | `COMMITPOINT_BENCH_QUICK=1` | off | smoke run: 2 s, N = 5,000 |
//! | `COMMITPOINT_BENCH_SECS` | 20 (quick: 2) | measured seconds per side |
//! | `COMMITPOINT_BENCH_PENDING` | 300000 (quick: 5000) | pending extractions to start from (N) |
//! | `COMMITPOINT_BENCH_WORKERS` | 32 | workers (and pgbench connections) |
//! | `COMMITPOINT_BENCH_CONTENT_BYTES` | 1024 | size of each extraction's content |
//! | `COMMITPOINT_BENCH_POSTGRES` | 1 | set to 0 to skip the PostgreSQL side |
//! | `COMMITPOINT_BENCH_DIR` | `target/tmp` | parent of the data directories (avoid tmpfs) |

use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};
use std::sync::Arc;
use std::time::{Duration, Instant};

#[path = "common/mod.rs"]
mod common;

use common::postgres::{self, Cluster};
use common::stats::{Latencies, fmt_us};
use common::workers::{CLAIM_LIMIT, output_body, worker};
use common::{BINARY, Filesystem, Result, ServerProcess, env_var, filesystem_of, load_average};

const SCHEMA: &str = "code-review@1";

pub fn main() -> ExitCode {
    common::bench_main("worker", 1, || {
        let config = Config::from_env()?;
        Ok(async move { run(&config).await })
    })
}

#[derive(Debug, Clone)]
struct Config {
    quick: bool,
    secs: u64,
    pending: u64,
    workers: usize,
    content_bytes: usize,
    postgres: bool,
    base_dir: PathBuf,
}

fn env_parse<T: std::str::FromStr>(name: &str, default: T) -> Result<T> {
    match env_var(name) {
        None => Ok(default),
        Some(raw) => raw.trim().parse().map_err(|_| format!("{name}={raw:?} is not a valid value").into()),
    }
}

impl Config {
    fn from_env() -> Result<Self> {
        let quick = env_var("COMMITPOINT_BENCH_QUICK").is_some_and(|v| v != "0");
        Ok(Self {
            quick,
            secs: env_parse("COMMITPOINT_BENCH_SECS", if quick { 2 } else { 20 })?.max(1),
            pending: env_parse("COMMITPOINT_BENCH_PENDING", if quick { 5_000 } else { 300_000 })?.max(1),
            workers: env_parse("COMMITPOINT_BENCH_WORKERS", 32usize)?.max(1),
            content_bytes: env_parse("COMMITPOINT_BENCH_CONTENT_BYTES", 1024usize)?.max(16),
            postgres: env_var("COMMITPOINT_BENCH_POSTGRES").is_none_or(|v| v != "0"),
            base_dir: env_var("COMMITPOINT_BENCH_DIR")
                .map_or_else(|| PathBuf::from(env!("CARGO_TARGET_TMPDIR")), PathBuf::from),
        })
    }
}

/// What one side did in its measured window.
#[derive(Debug, Default)]
struct Side {
    items: u64,
    claims: u64,
    empty_claims: u64,
    elapsed: Duration,
    /// Per claim and per result (commitpoint), or per claim + 10 completions (pgbench).
    claim_us: Vec<u32>,
    result_us: Vec<u32>,
    write_bytes: Option<u64>,
    extra_bytes: Option<u64>,
    errors: u64,
    samples: Vec<String>,
    load: String,
    fill: Duration,
}

impl Side {
    fn rate(&self) -> f64 {
        self.items as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }
}

async fn run(config: &Config) -> Result<bool> {
    std::fs::create_dir_all(&config.base_dir)?;
    let base = std::fs::canonicalize(&config.base_dir)?;
    println!("commitpoint worker-path benchmark{}", if config.quick { " (QUICK mode)" } else { "" });
    println!("  binary        {BINARY}");
    println!("  data dirs in  {} ({})", base.display(), Filesystem::describe(filesystem_of(&base).as_ref()));
    let cores = std::thread::available_parallelism().map_or(0, usize::from);
    println!("  machine       {cores} cores, load average {} at start", load_average());
    println!(
        "  workload      {} workers, claim {CLAIM_LIMIT} → post {CLAIM_LIMIT} results with 2 findings each, {} s per side, \
         {} pending {}-byte extractions to start",
        config.workers, config.secs, config.pending, config.content_bytes
    );
    println!();

    let ours = match commitpoint_side(config, &base).await {
        Ok(side) => Some(side),
        Err(e) => {
            println!("commitpoint: FAILED: {e}");
            None
        }
    };
    if let Some(side) = &ours {
        print_side("commitpoint (HTTP, release binary)", side, "per claim", "per result");
        common::figures::record("worker.cp.items_per_s", side.rate());
        let p99_ms = |us: &[u32]| common::stats::Latencies::from(us.to_vec()).p99 / 1000.0;
        common::figures::record("worker.cp.claim_p99_ms", p99_ms(&side.claim_us));
        common::figures::record("worker.cp.result_p99_ms", p99_ms(&side.result_us));
    }
    let theirs = if config.postgres {
        let config = config.clone();
        let base = base.clone();
        tokio::task::spawn_blocking(move || postgres_side(&config, &base)).await?
    } else {
        Err("COMMITPOINT_BENCH_POSTGRES=0".into())
    };
    let clean = ours.as_ref().is_some_and(|s| s.errors == 0);
    match (&theirs, postgres::find_bin()) {
        (_, Err(reason)) => println!("PostgreSQL: skipped ({reason})"),
        (Err(e), Ok(_)) if !config.postgres => println!("PostgreSQL: skipped ({e})"),
        // A reference, not the thing under test: printed, but it does not fail the run.
        (Err(e), Ok(_)) => println!("PostgreSQL: FAILED: {e}"),
        (Ok(side), Ok(_)) => {
            print_side(
                "PostgreSQL (pgbench -M prepared, SKIP LOCKED claim + completing UPDATE + 2 INSERTs)",
                side,
                "per pgbench transaction (claim + 10 completions)",
                "",
            );
            common::figures::record("worker.pg.items_per_s", side.rate());
            if let Some(ours) = &ours {
                let ratio = ours.rate() / side.rate().max(1e-9);
                common::figures::record("worker.ratio", ratio);
                println!(
                    "commitpoint {:.0} items/s / PostgreSQL {:.0} items/s = {ratio:.2}× (target >= 1.5×: {})",
                    ours.rate(),
                    side.rate(),
                    if ratio >= 1.5 { "met" } else { "MISSED" }
                );
            }
        }
    }
    Ok(clean)
}

fn print_side(title: &str, side: &Side, claim_what: &str, result_what: &str) {
    println!("{title}");
    println!(
        "  {:.0} items completed/s ({} items, {} claims, {} empty, in {:.2} s; fill {:.1} s; load {} at start)",
        side.rate(),
        side.items,
        side.claims,
        side.empty_claims,
        side.elapsed.as_secs_f64(),
        side.fill.as_secs_f64(),
        side.load
    );
    let show = |what: &str, v: &[u32]| {
        if !what.is_empty() && !v.is_empty() {
            let l = Latencies::from(v.to_vec());
            println!(
                "  latency {what}: mean {}, p50 {}, p99 {}, max {}",
                fmt_us(l.mean),
                fmt_us(l.p50),
                fmt_us(l.p99),
                fmt_us(l.max)
            );
        }
    };
    show(claim_what, &side.claim_us);
    show(result_what, &side.result_us);
    let per_item = |b: u64| b as f64 / 1024.0 / side.items.max(1) as f64;
    match (side.write_bytes, side.extra_bytes) {
        (Some(w), Some(c)) => println!(
            "  written: {:.1} KiB per item during the run, {:.1} KiB per item with the CHECKPOINT after it",
            per_item(w),
            per_item(w + c)
        ),
        (Some(w), None) => println!("  written: {:.1} KiB per item (server's /proc/PID/io write_bytes)", per_item(w)),
        _ => {}
    }
    if side.errors > 0 {
        println!("  ERRORS: {}", side.errors);
        for s in &side.samples {
            println!("    e.g. {s}");
        }
    }
    println!();
}

// ---------------------------------------------------------------------------------------
// commitpoint

async fn commitpoint_side(config: &Config, base: &Path) -> Result<Side> {
    let dir = tempfile::Builder::new().prefix("worker-").tempdir_in(base)?;
    let data = dir.path().join("data");
    let fill = common::preload::fill(&data, config.pending, SCHEMA, "work", config.content_bytes).await?;
    let mut serve = Command::new(BINARY);
    serve.arg("serve").arg("--data-dir").arg(&data).args(["--listen", "127.0.0.1:0"]);
    let mut server = ServerProcess::start(serve, &dir.path().join("server.log"))?;
    let load = load_average();
    let io_before = postgres::write_bytes(server.pid());
    let started = Instant::now();
    let stop_at = started + Duration::from_secs(config.secs);
    let output = Arc::new(output_body());
    let tasks: Vec<_> =
        (0..config.workers).map(|id| tokio::spawn(worker(id, server.addr, stop_at, Arc::clone(&output)))).collect();
    let mut side = Side { load, fill, ..Side::default() };
    let mut last = started;
    for task in tasks {
        let w = task.await?;
        side.items += w.items;
        side.claims += w.claims;
        side.empty_claims += w.empty_claims;
        side.claim_us.extend(w.claim_us);
        side.result_us.extend(w.result_us);
        side.errors += w.errors;
        for s in w.samples {
            if side.samples.len() < 5 {
                side.samples.push(s);
            }
        }
        last = last.max(w.finished.unwrap_or(started));
    }
    side.elapsed = last - started;
    side.write_bytes = postgres::write_bytes(server.pid()).zip(io_before).map(|(a, b)| a.saturating_sub(b));
    server.check_alive()?;
    tokio::task::block_in_place(|| server.stop())?;
    Ok(side)
}

// ---------------------------------------------------------------------------------------
// PostgreSQL

fn postgres_side(config: &Config, base: &Path) -> Result<Side> {
    postgres::find_bin()?;
    let cluster = Cluster::start(base, "256MB")?;
    cluster.create_extractions(true)?;
    let started = Instant::now();
    cluster.preload(config.pending, "work", config.content_bytes)?;
    let fill = started.elapsed();
    let (script, vars) = postgres::claim_and_complete(CLAIM_LIMIT, &output_body());
    let load = load_average();
    let run = cluster.pgbench(&script, config.workers, config.secs, &vars)?;
    let checkpoint = cluster.checkpoint_bytes()?;
    let items: u64 = cluster.psql("SELECT count(*) FROM extractions WHERE state = 2")?.parse()?;
    let findings: u64 = cluster.psql("SELECT count(*) FROM findings")?.parse()?;
    let mut side = Side {
        items,
        claims: run.transactions,
        elapsed: Duration::from_secs(config.secs),
        claim_us: run.latencies_us,
        write_bytes: Some(run.write_bytes),
        extra_bytes: Some(checkpoint),
        errors: run.failed,
        load,
        fill,
        ..Side::default()
    };
    if findings != items * 2 {
        side.errors += 1;
        side.samples.push(format!("{items} items completed but {findings} findings (want 2 each)"));
    }
    if items < run.transactions * CLAIM_LIMIT as u64 {
        side.samples
            .push(format!("{} claims completed only {items} items: the pending rows ran out", run.transactions));
    }
    Ok(side)
}
