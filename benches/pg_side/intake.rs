//! The intake bench's PostgreSQL side: the same workload as `pgbench` clients running
//! `INSERT … ON CONFLICT (id) DO NOTHING`, printed next to commitpoint's figures.

use std::path::Path;
use std::time::{Duration, Instant};

use super::common::figures::record;
use super::common::postgres::{self, Cluster};
use super::common::stats::{Latencies, fmt_us};
use super::common::{Result, load_average};
use super::{Config, LevelResult};

/// Each transaction: a new source, or (`dup` % of the time, once this client has one) an
/// exact re-send of one of this client's earlier sources. Client variables persist across
/// transactions, so `:n` counts this client's new sources. The identity is sha256 of
/// run/client/number: 32 bytes, as commitpoint's blake3 identity.
const SCRIPT: &str = r"\set r random(0, 99)
\if :r < :dup and :n > 0
\set k random(1, :n)
\else
\set n :n + 1
\set k :n
\endif
INSERT INTO extractions (id, tenant, source_id, schema, content)
VALUES (sha256(convert_to(:run::text || '/' || :client_id::text || '/' || :k::text, 'UTF8')), 'bench',
        'bench/pr-' || :client_id::text || '-' || :k::text, 'code-review@1',
        'PR ' || :client_id::text || '-' || :k::text || ' ' || :fill::text)
ON CONFLICT (id) DO NOTHING;
";

#[derive(Debug)]
pub(super) enum Outcome {
    Skipped(String),
    Failed(String),
    Done(Figures),
}

#[derive(Debug)]
pub(super) struct Figures {
    clients: usize,
    tps: f64,
    transactions: u64,
    failed: u64,
    latencies: Latencies,
    write_bytes: u64,
    checkpoint_bytes: u64,
    rows: u64,
    preload_took: Option<Duration>,
    load: String,
}

pub(super) fn run(config: &Config, base: &Path) -> Outcome {
    if let Err(reason) = postgres::find_bin() {
        return Outcome::Skipped(reason);
    }
    match measure(config, base) {
        Ok(figures) => Outcome::Done(figures),
        Err(e) => Outcome::Failed(e.to_string()),
    }
}

fn whole_secs(d: Duration) -> u64 {
    d.as_secs_f64().ceil().max(1.0) as u64
}

fn measure(config: &Config, base: &Path) -> Result<Figures> {
    let cluster = Cluster::start(base, "256MB")?;
    cluster.create_extractions(false)?;
    let preload_took = match config.preload {
        0 => None,
        n => {
            let started = Instant::now();
            cluster.preload(n, "preload", config.content_bytes)?;
            Some(started.elapsed())
        }
    };
    let fill = "x".repeat(config.content_bytes.saturating_sub(16));
    let vars = |run: &str| {
        vec![
            ("run", run.to_string()),
            ("dup", config.dup_percent.to_string()),
            ("n", "0".to_string()),
            ("fill", fill.clone()),
        ]
    };
    if !config.warmup.is_zero() {
        cluster.pgbench(SCRIPT, config.pg_clients, whole_secs(config.warmup), &vars("warmup"))?;
    }
    let load = load_average();
    let run = cluster.pgbench(SCRIPT, config.pg_clients, whole_secs(config.measure), &vars("measured"))?;
    let checkpoint_bytes = cluster.checkpoint_bytes()?;
    let rows = cluster.psql("SELECT count(*) FROM extractions")?.parse().unwrap_or(0);
    Ok(Figures {
        clients: config.pg_clients,
        tps: run.tps,
        transactions: run.transactions,
        failed: run.failed,
        latencies: Latencies::from(run.latencies_us),
        write_bytes: run.write_bytes,
        checkpoint_bytes,
        rows,
        preload_took,
        load,
    })
}

pub(super) fn print(config: &Config, outcome: &Outcome, levels: &[LevelResult]) {
    println!();
    let figures = match outcome {
        Outcome::Skipped(reason) => {
            println!("PostgreSQL: skipped ({reason})");
            return;
        }
        Outcome::Failed(reason) => {
            println!("PostgreSQL: FAILED: {reason}");
            return;
        }
        Outcome::Done(figures) => figures,
    };
    println!(
        "PostgreSQL side by side: pgbench -M prepared, {} connections, INSERT … ON CONFLICT (id) DO NOTHING, \
         {}% re-sends, {}-byte content, fsync + synchronous_commit on, {} rows preloaded",
        figures.clients, config.dup_percent, config.content_bytes, config.preload
    );
    if let Some(took) = figures.preload_took {
        println!(
            "  preload (INSERT … SELECT generate_series, CHECKPOINT, VACUUM ANALYZE): {:.1} s",
            took.as_secs_f64()
        );
    }
    let per_ack = |bytes: u64| bytes as f64 / 1024.0 / figures.transactions.max(1) as f64;
    println!(
        "  {:.0} tps, {} transactions ({} failed), mean {}, p50 {}, p99 {}, max {}; {} rows after; load {} at start",
        figures.tps,
        figures.transactions,
        figures.failed,
        fmt_us(figures.latencies.mean),
        fmt_us(figures.latencies.p50),
        fmt_us(figures.latencies.p99),
        fmt_us(figures.latencies.max),
        figures.rows,
        figures.load,
    );
    println!(
        "  written: {:.1} KiB per transaction during the run (wchar of the postmaster and its children: WAL, data pages, WAL segment zero-fill), \
         {:.1} KiB per transaction with the CHECKPOINT after it",
        per_ack(figures.write_bytes),
        per_ack(figures.write_bytes + figures.checkpoint_bytes),
    );
    let store = if config.preload > 0 { "preloaded" } else { "empty" };
    record(&format!("intake.{store}.pg.tps"), figures.tps);
    record(&format!("intake.{store}.pg.p99_ms"), figures.latencies.p99 / 1000.0);
    record(&format!("intake.{store}.pg.kib_per_txn"), per_ack(figures.write_bytes));
    record(
        &format!("intake.{store}.pg.kib_per_txn_with_checkpoint"),
        per_ack(figures.write_bytes + figures.checkpoint_bytes),
    );
    record(&format!("intake.{store}.pg.clients"), figures.clients as f64);
    let target = if config.preload >= 1_000_000 { 1.5 } else { 2.0 };
    record(&format!("intake.{store}.target"), target);
    for level in levels.iter().filter(|l| l.failure.is_none() && l.clients >= figures.clients) {
        let ratio = level.rate() / figures.tps.max(1e-9);
        record(&format!("intake.{store}.ratio.c{}", level.clients), ratio);
        println!(
            "  commitpoint {} clients {:.0} acks/s (p99 {}) / PostgreSQL {} clients {:.0} tps = {:.2}× \
             (target >= {target}×: {})",
            level.clients,
            level.rate(),
            fmt_us(level.latencies.p99),
            figures.clients,
            figures.tps,
            ratio,
            if ratio >= target { "met" } else { "MISSED" },
        );
    }
}
