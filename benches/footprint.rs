//! Footprint benchmark: how large the redb file is per extraction, before and after
//! retention and compaction (issue 15, item 4).
//!
//! `cargo bench --bench footprint` drives the store directly (no HTTP: the size of the file
//! does not depend on how the writes arrived) through the real write paths: N intakes of
//! distinct sources, every one claimed and committed with two findings, a raw result and a
//! paid ledger entry, as an external worker would. Then it measures the file, runs
//! retention with both durations at zero until nothing is left to drop, measures again,
//! closes the store, runs `compact` (which also verifies), and prints one table scaled to
//! 1,000,000 extractions. The file size is the same in any build profile, so
//! `cargo bench --profile dev --bench footprint` gives the same figures without a release
//! build.
//!
//! | variable | default | meaning |
//! |---|---|---|
//! | `COMMITPOINT_BENCH_EXTRACTIONS` | 100000 | extractions to write |
//! | `COMMITPOINT_BENCH_CONTENT_BYTES` | 1024 | size of each source's content |
//! | `COMMITPOINT_BENCH_DIR` | `target/tmp` | parent of the data directory (avoid tmpfs) |

#[path = "common/mod.rs"]
mod common;

use commitpoint::store::seam::{Extractions, Upkeep};
use std::path::Path;
use std::process::ExitCode;
use std::time::Instant;

use commitpoint::domain::batch::Usage;
use commitpoint::domain::identity::{ExtractionId, SourceHash};
use commitpoint::domain::schema::ValidatedFinding;
use commitpoint::store::{
    Authority, Charge, ClaimRequest, NewExtraction, PostResult, RetentionPolicy, Store, Submission, compact_file,
};
use common::{BoxError, Result, env_var};
use serde_json::json;

const SCHEMA: &str = "code-review@1";
/// Jobs in flight at once: enough to fill the writer's group commits.
const CONCURRENCY: usize = 1024;

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("footprint: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run() -> Result<()> {
    let n: usize = env_var("COMMITPOINT_BENCH_EXTRACTIONS").map_or(Ok(100_000), |v| v.parse())?;
    let content_bytes: usize = env_var("COMMITPOINT_BENCH_CONTENT_BYTES").map_or(Ok(1024), |v| v.parse())?;
    let parent = env_var("COMMITPOINT_BENCH_DIR").unwrap_or_else(|| "target/tmp".to_string());
    std::fs::create_dir_all(&parent)?;
    let dir = tempfile::Builder::new().prefix("footprint-").tempdir_in(&parent)?;
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    let started = Instant::now();
    let db = dir.path().join(commitpoint::store::FILE_NAME);
    let kept_copy = dir.path().join("everything-kept.redb");
    let (written, retained) = runtime.block_on(async {
        let (store, guard) = Store::open(dir.path(), 64 << 20)?;
        fill(&store, n, content_bytes).await?;
        drop(store);
        tokio::task::spawn_blocking(move || guard.join()).await?;
        let written = size(&db)?;
        // A closed file copies consistently: the baseline for compaction without retention.
        std::fs::copy(&db, &kept_copy)?;
        let (store, guard) = Store::open(dir.path(), 64 << 20)?;
        let dropped = retain(&store).await?;
        if dropped != (n as u64, n as u64) {
            return Err(format!("retention dropped {dropped:?}, expected {n} of each").into());
        }
        let retained = size(&db)?;
        drop(store);
        tokio::task::spawn_blocking(move || guard.join()).await?;
        Ok::<_, BoxError>((written, retained))
    })?;
    let kept = compact_file(&kept_copy)?;
    let compacted = compact_file(&db)?;
    for report in [&kept, &compacted] {
        if !report.verify.is_ok() {
            return Err(format!("verify after compaction:\n{}", report.verify).into());
        }
    }
    let per_million = |bytes: u64| bytes as f64 * 1_000_000.0 / n as f64 / (1u64 << 30) as f64;
    println!("extractions: {n}, content: {content_bytes} bytes each, {:.0} s", started.elapsed().as_secs_f64());
    println!("| file | bytes | bytes per extraction | GiB per 1,000,000 |");
    println!("|---|---:|---:|---:|");
    for (label, bytes) in [
        ("written (everything kept)", written),
        ("after retention, before compaction", retained),
        ("everything kept, compacted", kept.bytes_after),
        ("after retention and compaction", compacted.bytes_after),
    ] {
        println!("| {label} | {bytes} | {} | {:.2} |", bytes / n as u64, per_million(bytes));
    }
    Ok(())
}

fn size(path: &Path) -> Result<u64> {
    Ok(std::fs::metadata(path)?.len())
}

/// N distinct sources, each committed with two findings, a raw result and a paid entry.
async fn fill(store: &Store, n: usize, content_bytes: usize) -> Result<()> {
    let padding = "x".repeat(content_bytes.saturating_sub(24));
    for start in (0..n).step_by(CONCURRENCY) {
        let mut tasks = tokio::task::JoinSet::new();
        for i in start..(start + CONCURRENCY).min(n) {
            let (store, content) = (store.clone(), format!("// source {i:>12}\n{padding}"));
            tasks.spawn(async move {
                let hash = SourceHash::compute(content.as_bytes(), SCHEMA);
                let source_id = format!("repo/src/file_{i}.rs");
                let id = ExtractionId::compute("acme", &source_id, &hash, SCHEMA);
                let new = NewExtraction {
                    id,
                    tenant: "acme".into(),
                    source_id,
                    source_hash: hash,
                    schema: SCHEMA.into(),
                    metadata_json: Some(r#"{"repo":"acme/app","pr":1234}"#.into()),
                    content,
                };
                store.intake(new).await.map(|_| ())
            });
        }
        while let Some(done) = tasks.join_next().await {
            done??;
        }
        let request = ClaimRequest {
            worker: "w".into(),
            limit: CONCURRENCY,
            lease_ms: 600_000,
            schema: None,
            estimate: None,
            scope: Default::default(),
        };
        let grants = store.claim(request).await?;
        let mut tasks = tokio::task::JoinSet::new();
        for grant in grants {
            let store = store.clone();
            tasks.spawn(async move {
                store.post_result(answer(grant.record.id, grant.lease_token.into_string())).await.map(|_| ())
            });
        }
        while let Some(done) = tasks.join_next().await {
            done??;
        }
    }
    Ok(())
}

fn answer(id: ExtractionId, lease_token: String) -> PostResult {
    let finding = |line: u32| {
        json!({"rule": "no-unwrap", "severity": "medium", "file": "src/lib.rs", "line": line,
        "summary": "unwrap() on a value that can be None panics at runtime"})
    };
    let findings: Vec<_> = [12, 48].into_iter().map(finding).collect();
    let output = json!({ "findings": findings });
    let findings = findings
        .into_iter()
        .map(|body| ValidatedFinding {
            canonical_identity: format!("[\"no-unwrap\",\"src/lib.rs\",{}]", body["line"]),
            body,
        })
        .collect();
    let usage = Usage {
        model: "gpt-4o-mini".into(),
        input_tokens: 900,
        output_tokens: 120,
        provider_cost_micros: Some(210),
        request_id: Some(format!("req_{}", &id.to_hex()[..24])),
        ..Usage::default()
    };
    PostResult {
        id,
        authority: Authority::Lease(lease_token.into()),
        submission: Submission::Valid { findings, output },
        charge: Some(Charge { provider: "external".into(), job_id: None, usage, latency_ms: Some(1500), batch: false }),
    }
}

/// Retention with both durations at zero, until a whole pass drops nothing.
async fn retain(store: &Store) -> Result<(u64, u64)> {
    let policy = RetentionPolicy { content_after_ms: Some(0), raw_results_after_ms: Some(0) };
    let (mut contents, mut results, mut after) = (0, 0, 0);
    loop {
        let step = store.retention_step(policy, after, 512).await?;
        contents += step.contents_dropped;
        results += step.raw_results_dropped;
        match step.next_after {
            Some(next) => after = next,
            None => return Ok((contents, results)),
        }
    }
}
