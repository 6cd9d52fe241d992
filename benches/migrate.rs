//! `migrate-store` benchmark: how long moving a redb store of N extractions into an empty
//! PostgreSQL database takes, copy and comparison, and that the comparison passes.
//!
//! `cargo bench --bench migrate` fills a fresh redb store through the library (N pending
//! intakes, then half of them claimed and committed with two findings and a priced ledger
//! entry each, through the service), starts a throw-away local PostgreSQL (fsync on), and
//! runs the release binary's `commitpoint migrate-store` on it, timed. It prints the
//! command's own report (rows per table, copy time and rows/s, the comparison) and the
//! wall time; it exits 1 if the command fails or its report does not say the comparison
//! passed. Without PostgreSQL's server binaries it prints "skipped" and exits 0.
//!
//! | variable | default | meaning |
//! |---|---|---|
//! | `COMMITPOINT_BENCH_PRELOAD` | 100000 | N (also `-- --preload N`) |
//! | `COMMITPOINT_BENCH_QUICK=1` | off | smoke run: N = 2,000 |
//! | `COMMITPOINT_BENCH_DIR` | `target/tmp` | parent of the data directories (avoid tmpfs) |

use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};
use std::time::Instant;

use commitpoint::domain::batch::Usage;
use commitpoint::domain::schema::Registry;
use commitpoint::service::{ResultRequest, Service, WorkerUsage};
use commitpoint::store::{ClaimRequest, Store};
use futures_util::StreamExt;
use serde_json::json;

#[path = "common/mod.rs"]
mod common;

use common::postgres::{Cluster, find_bin};
use common::{BINARY, Result, env_var, filesystem_of, preload};

const SCHEMA: &str = "code-review@1";
const CONTENT_BYTES: usize = 1024;
const CONCURRENCY: usize = 256;

fn main() -> ExitCode {
    common::bench_main("migrate", 2, || Ok(run()))
}

/// `--preload N` or `--preload=N` among the arguments (cargo bench adds `--bench`).
fn preload_arg() -> Result<Option<u64>> {
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        let value = if arg == "--preload" {
            args.next().unwrap_or_default()
        } else if let Some(v) = arg.strip_prefix("--preload=") {
            v.to_string()
        } else {
            continue;
        };
        return value.trim().parse().map(Some).map_err(|_| format!("--preload {value:?}: want a count").into());
    }
    Ok(None)
}

async fn run() -> Result<bool> {
    let quick = env_var("COMMITPOINT_BENCH_QUICK").is_some_and(|v| v != "0");
    let n: u64 = match (preload_arg()?, env_var("COMMITPOINT_BENCH_PRELOAD")) {
        (Some(n), _) => n,
        (None, Some(v)) => v.parse().map_err(|e| format!("COMMITPOINT_BENCH_PRELOAD={v:?}: {e}"))?,
        (None, None) if quick => 2_000,
        (None, None) => 100_000,
    };
    if let Err(reason) = find_bin() {
        println!("migrate bench: skipped: {reason}");
        return Ok(true);
    }
    let parent = env_var("COMMITPOINT_BENCH_DIR").map_or_else(|| PathBuf::from("target/tmp"), PathBuf::from);
    std::fs::create_dir_all(&parent)?;
    let work = tempfile::Builder::new().prefix("migrate-bench-").tempdir_in(&parent)?;
    let data = work.path().join("data");
    println!(
        "migrate bench{}: {n} extractions ({CONTENT_BYTES} B content), half committed",
        if quick { " (QUICK)" } else { "" }
    );
    println!("data directory: {} ({})", data.display(), common::Filesystem::describe(filesystem_of(&parent).as_ref()));
    println!("load average before: {}", common::load_average());

    let started = Instant::now();
    preload::fill(&data, n, SCHEMA, "src", CONTENT_BYTES).await?;
    commit_half(&data, n / 2).await?;
    println!("fill (library: intake, then claims and validated results): {:.1} s", started.elapsed().as_secs_f64());
    let file = data.join("commitpoint.redb");
    let bytes = std::fs::metadata(&file)?.len();
    println!("redb file: {:.1} MiB", bytes as f64 / 1048576.0);

    let cluster = Cluster::start(&parent, "256MB")?;
    cluster.psql("CREATE DATABASE migrated")?;
    let url = format!("postgres://postgres@127.0.0.1:{}/migrated", cluster.port);
    let started = Instant::now();
    let output = Command::new(BINARY)
        .args(["migrate-store", "--from"])
        .arg(&file)
        .args(["--to", &url])
        .env_remove("COMMITPOINT_CONFIG")
        .env_remove("COMMITPOINT_STORE_URL")
        .env("COMMITPOINT_LOG", "warn")
        .output()?;
    let wall = started.elapsed().as_secs_f64();
    let report = String::from_utf8_lossy(&output.stdout);
    print!("{report}");
    eprint!("{}", String::from_utf8_lossy(&output.stderr));
    println!("migrate-store wall time: {wall:.1} s for {n} extractions ({:.0} extractions/s)", n as f64 / wall);
    let size = cluster.psql("SELECT pg_size_pretty(pg_database_size('migrated'))")?;
    println!("database size after: {size}");
    let passed =
        output.status.success() && report.contains("comparison passed") && report.contains("verify passed on the copy");
    println!("comparison: {}", if passed { "passed" } else { "FAILED" });
    Ok(passed)
}

/// Claims `count` of the pending extractions and commits each with two findings and a
/// priced usage, through the service, so the store holds findings, raw results and ledger
/// entries as the API would have written them.
async fn commit_half(data: &Path, count: u64) -> Result<()> {
    let (store, guard) = Store::open(data, 64 << 20)?;
    let service = Service::new(store, Registry::builtin());
    let mut committed = 0u64;
    while committed < count {
        let limit = (count - committed).min(1000) as usize;
        let request = ClaimRequest {
            worker: "bench".into(),
            limit,
            lease_ms: 3_600_000,
            schema: None,
            estimate: None,
            scope: Default::default(),
        };
        let grants = service.claim(request, None).await?;
        if grants.is_empty() {
            return Err(format!("only {committed} of {count} could be claimed").into());
        }
        committed += grants.len() as u64;
        let posts = futures_util::stream::iter(grants).map(|grant| {
            let service = service.clone();
            async move {
                let source = grant.record.source_id.clone();
                let finding = |rule: &str, line: u64| {
                    json!({"rule": rule, "severity": "medium", "file": source, "line": line, "summary": "bench"})
                };
                let output = json!({"findings": [finding("no-unwrap", 1), finding("todo-left", 1)]});
                let usage = Usage {
                    model: "bench-model".into(),
                    input_tokens: 400,
                    output_tokens: 60,
                    provider_cost_micros: Some(90),
                    ..Usage::default()
                };
                let usage = Some(WorkerUsage { provider: "external".into(), usage, latency_ms: Some(1200) });
                let request = ResultRequest { lease_token: grant.lease_token.into_string(), output, usage, reask: true };
                service.post_result(grant.record.id, request).await.map(|_| ())
            }
        });
        let failed = posts.buffer_unordered(CONCURRENCY).filter(|r| std::future::ready(r.is_err())).count().await;
        if failed > 0 {
            return Err(format!("{failed} results failed").into());
        }
    }
    drop(service);
    tokio::task::spawn_blocking(move || guard.join()).await?;
    Ok(())
}
