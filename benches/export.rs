//! Export benchmark: how fast `GET /v1/export` streams a large tenant, and whether the
//! server's memory stays flat while it does.
//!
//! `cargo bench --bench export` fills a fresh store through the library (intake, claims,
//! validated results: N extractions × 2 findings, default N = 500,000, so 1,000,000
//! findings), then starts the release binary on it, exports the tenant over HTTP while
//! sampling the server's resident memory from /proc, runs `commitpoint export` (JSON
//! lines) against it, stops it with SIGTERM and runs `commitpoint verify`. It prints one
//! report; it exits 1 if a count disagrees or a step fails, and never asserts the target
//! (1,000,000 findings in 30 s or less).
//!
//! | variable | default | meaning |
//! |---|---|---|
//! | `COMMITPOINT_BENCH_QUICK=1` | off | smoke run: N = 5,000 |
//! | `COMMITPOINT_BENCH_EXTRACTIONS` | 500000 (quick: 5000) | N |
//! | `COMMITPOINT_BENCH_VERIFY` | 1 | set to 0 to skip `commitpoint verify` |
//! | `COMMITPOINT_BENCH_DIR` | `target/tmp` | parent of the data directory (avoid tmpfs) |

use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use commitpoint::domain::schema::Registry;
use commitpoint::service::{IntakeRequest, ResultRequest, Service};
use commitpoint::store::{ClaimRequest, Store};
use futures_util::StreamExt;
use serde_json::json;

#[path = "common/mod.rs"]
mod common;

use common::{BINARY, Result, ServerProcess, env_var, filesystem_of, run_verify};

const TENANT: &str = "bench";
const SCHEMA: &str = "code-review@1";
const CONCURRENCY: usize = 256;
const FINDINGS_PER_EXTRACTION: u64 = 2;

fn main() -> ExitCode {
    let runtime = match tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("export bench: cannot start the tokio runtime: {e}");
            return ExitCode::from(2);
        }
    };
    match runtime.block_on(run()) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::from(1),
        Err(e) => {
            eprintln!("export bench: {e}");
            ExitCode::from(1)
        }
    }
}

async fn run() -> Result<bool> {
    let quick = env_var("COMMITPOINT_BENCH_QUICK").is_some_and(|v| v != "0");
    let n: u64 = match env_var("COMMITPOINT_BENCH_EXTRACTIONS") {
        Some(v) => v.parse().map_err(|e| format!("COMMITPOINT_BENCH_EXTRACTIONS={v:?}: {e}"))?,
        None if quick => 5_000,
        None => 500_000,
    };
    let verify = env_var("COMMITPOINT_BENCH_VERIFY").is_none_or(|v| v != "0");
    let parent = env_var("COMMITPOINT_BENCH_DIR").map_or_else(|| PathBuf::from("target/tmp"), PathBuf::from);
    std::fs::create_dir_all(&parent)?;
    let work = tempfile::Builder::new().prefix("export-bench-").tempdir_in(&parent)?;
    let data = work.path().join("data");
    println!(
        "export bench{}: {n} extractions × {FINDINGS_PER_EXTRACTION} findings",
        if quick { " (QUICK)" } else { "" }
    );
    println!("data directory: {} ({})", data.display(), common::Filesystem::describe(filesystem_of(&parent).as_ref()));

    let started = Instant::now();
    fill(&data, n).await?;
    println!("fill (library: intake, claim, validated result): {:.1} s", started.elapsed().as_secs_f64());

    let mut cmd = Command::new(BINARY);
    cmd.arg("serve").arg("--data-dir").arg(&data).args(["--listen", "127.0.0.1:0"]).env("COMMITPOINT_LOG", "warn");
    let mut server = ServerProcess::start(cmd, &work.path().join("server.log"))?;
    let base = format!("http://{}", server.addr);
    let pid = server.pid().to_string();
    let idle_kib = rss_kib(&pid, "VmRSS").unwrap_or(0);

    let sampler = Sampler::start(pid.clone());
    let started = Instant::now();
    let (lines, findings, bytes) = export_over_http(&base).await?;
    let secs = started.elapsed().as_secs_f64();
    let peak_kib = sampler.stop();
    let after_kib = rss_kib(&pid, "VmRSS").unwrap_or(0);

    let out = work.path().join("bench.jsonl");
    let started = Instant::now();
    let mut cli = Command::new(BINARY);
    cli.args(["export", "--tenant", TENANT, "--format", "jsonl", "--admin", &base, "--out"]).arg(&out);
    let child = cli.stdout(std::process::Stdio::null()).stderr(std::process::Stdio::piped()).spawn()?;
    let cli_sampler = Sampler::start(child.id().to_string());
    let output = child.wait_with_output()?;
    let cli_secs = started.elapsed().as_secs_f64();
    let cli_peak_kib = cli_sampler.stop();
    let cli_lines = std::fs::read(&out).map(|b| b.iter().filter(|c| **c == b'\n').count() as u64).unwrap_or(0);
    server.check_alive()?;
    let (status, _) = server.stop()?;

    let mib = |kib: u64| kib as f64 / 1024.0;
    println!("GET /v1/export: {lines} lines, {findings} findings, {:.1} MiB in {secs:.2} s", bytes as f64 / 1048576.0);
    println!("  {:.0} findings/s, {:.1} MiB/s", findings as f64 / secs, bytes as f64 / 1048576.0 / secs);
    println!(
        "  server RSS: {:.1} MiB idle, {:.1} MiB peak while exporting, {:.1} MiB after (page cache cap 16 MiB)",
        mib(idle_kib),
        mib(peak_kib),
        mib(after_kib)
    );
    println!(
        "commitpoint export --format jsonl: {cli_lines} lines in {cli_secs:.2} s, client peak RSS {:.1} MiB",
        mib(cli_peak_kib)
    );
    let mut ok = true;
    if lines != n || findings != n * FINDINGS_PER_EXTRACTION || cli_lines != n {
        println!("MISMATCH: expected {n} lines and {} findings", n * FINDINGS_PER_EXTRACTION);
        ok = false;
    }
    if !output.status.success() {
        println!("commitpoint export failed: {}", String::from_utf8_lossy(&output.stderr));
        ok = false;
    }
    if !status.success() {
        println!("the server did not stop cleanly: {status}");
        ok = false;
    }
    if verify {
        match run_verify(&data.join("commitpoint.redb"), Duration::from_secs(1800)) {
            Ok(_) => println!("verify: ok"),
            Err(e) => {
                println!("verify: {e}");
                ok = false;
            }
        }
    }
    Ok(ok)
}

/// N intakes, then claims of 1000 and one validated two-finding result each, all through
/// the service so the store holds exactly what the API would have written.
async fn fill(data: &Path, n: u64) -> Result<()> {
    let (store, guard) = Store::open(data, 16 << 20)?;
    let service = Service::new(store, Registry::builtin());
    let intakes = futures_util::stream::iter(0..n).map(|i| {
        let service = service.clone();
        async move {
            let request = IntakeRequest {
                tenant: TENANT.into(),
                source_id: format!("src/{i}.rs"),
                schema: SCHEMA.into(),
                content: format!("fn f{i}() {{ let x = run().unwrap(); }}"),
                metadata: None,
            };
            service.intake(request).await.map(|_| ())
        }
    });
    let failed = intakes.buffer_unordered(CONCURRENCY).filter(|r| std::future::ready(r.is_err())).count().await;
    if failed > 0 {
        return Err(format!("{failed} intakes failed").into());
    }
    let mut committed = 0u64;
    while committed < n {
        let request = ClaimRequest {
            worker: "bench".into(),
            limit: 1000,
            lease_ms: 3_600_000,
            schema: None,
            estimate: None,
            scope: Default::default(),
        };
        let grants = service.claim(request, None).await?;
        if grants.is_empty() {
            return Err(format!("only {committed} of {n} could be claimed").into());
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
                let request = ResultRequest { lease_token: grant.lease_token.into_string(), output, usage: None, reask: true };
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

/// Streams the export, counting lines, findings (by their key field) and bytes.
async fn export_over_http(base: &str) -> Result<(u64, u64, u64)> {
    let response = reqwest::Client::new().get(format!("{base}/v1/export?tenant={TENANT}")).send().await?;
    if !response.status().is_success() {
        return Err(format!("export answered {}", response.status()).into());
    }
    let mut body = response.bytes_stream();
    let (mut lines, mut findings, mut bytes) = (0u64, 0u64, 0u64);
    let key = b"\"finding_key\"";
    // A key split across two chunks is found by keeping the tail of the previous one.
    let mut carry: Vec<u8> = Vec::new();
    while let Some(chunk) = body.next().await {
        let chunk = chunk?;
        bytes += chunk.len() as u64;
        lines += chunk.iter().filter(|b| **b == b'\n').count() as u64;
        carry.extend_from_slice(&chunk);
        findings += carry.windows(key.len()).filter(|w| *w == key).count() as u64;
        let keep = carry.len().min(key.len() - 1);
        carry.drain(..carry.len() - keep);
    }
    Ok((lines, findings, bytes))
}

/// A process's memory line from /proc (`VmRSS`, `VmHWM`), in KiB.
fn rss_kib(pid: &str, field: &str) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with(field))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

/// Samples a process's resident memory every 20 ms and keeps the highest.
struct Sampler {
    done: Arc<AtomicBool>,
    peak: Arc<AtomicU64>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Sampler {
    fn start(pid: String) -> Sampler {
        let done = Arc::new(AtomicBool::new(false));
        let peak = Arc::new(AtomicU64::new(0));
        let (stop, high) = (Arc::clone(&done), Arc::clone(&peak));
        let thread = std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                if let Some(kib) = rss_kib(&pid, "VmRSS") {
                    high.fetch_max(kib, Ordering::Relaxed);
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        });
        Sampler { done, peak, thread: Some(thread) }
    }

    fn stop(mut self) -> u64 {
        self.done.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
        self.peak.load(Ordering::Relaxed)
    }
}
