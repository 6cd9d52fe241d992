//! Result-ingestion benchmark: how fast a restarted `commitpoint serve` streams an
//! OpenAI-format batch result file and commits every extraction, and how much memory it
//! needs for it.
//!
//! `cargo bench --bench ingest` runs, for N = 5,000 and N = 50,000 (quick: 500 and 5,000):
//!
//! 1. a SIMULATED OpenAI Batch API in this process (`commitpoint::simulator`, no faults,
//!    `complete_after` long enough to stop the server before the batch completes);
//! 2. the release binary, `serve --provider openai` against it, `--batch-max-size N`;
//! 3. N intakes (`POST /v1/extractions`, 64 at a time, 1-3 KB of code with two reviewable
//!    lines each, an `unwrap()` and a `TODO`, so two findings per answer) — the batch forms when all N are pending and is submitted;
//! 4. once `/healthz` shows the batch submitted and the simulator has seen a poll (so the
//!    job id is persisted), SIGTERM: the process that built the upload in memory is gone;
//! 5. the bench waits for the simulated batch to complete (its listing generates the
//!    output file, so that work is not charged to the measured window);
//! 6. **measured:** a fresh server on the same data directory. Its scheduler polls the
//!    persisted job, streams the result file and commits. Ingestion time runs from the
//!    spawn until `GET /v1/stats` shows `committed == N` (polled every 100 ms). VmRSS is
//!    sampled every 50 ms and VmHWM read at the end, before SIGTERM;
//! 7. SIGTERM, then `commitpoint verify` on the file.
//!
//! It prints one table and the peak-RSS ratio between the largest and the smallest file
//! against the 1.20 target (reported, never asserted). Exit status 1 only if a run failed
//! (timeout, wrong counts, unclean exit, verify problems).
//!
//! Environment (all optional):
//!
//! | variable | default | meaning |
//! |---|---|---|
//! | `COMMITPOINT_BENCH_QUICK=1` | off | smoke run: N = 500 and 5,000 |
//! | `COMMITPOINT_BENCH_SIZES` | `5000,50000` | result-file lines, comma-separated (1..=50,000) |
//! | `COMMITPOINT_BENCH_COMPLETE_AFTER_SECS` | 5 | simulated batch duration, create to `completed` |
//! | `COMMITPOINT_BENCH_DIR` | the temp dir, or `target/tmp` if that is tmpfs | parent of the data dirs |
//! | `COMMITPOINT_BENCH_KEEP=1` | off | keep the data directories (paths are printed) |
//! | `COMMITPOINT_BENCH_CACHE_BYTES` | unset (the server's default) | redb page cache of the server (`[server] cache_bytes`) |
//! | `COMMITPOINT_BENCH_FINDINGS` | 2 | findings per answer (0..=9; the workload is 2) |

use std::io::Write as _;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use commitpoint::simulator::{Simulator, SimulatorConfig};
use serde_json::{Value, json};

#[path = "common/mod.rs"]
mod common;

use common::{
    BINARY, Filesystem, Result, ServerProcess, env_var, filesystem_of, load_average, process_cpu_secs, run_verify,
};

const SCHEMA: &str = "code-review@1";
const TENANT: &str = "bench";
const KEY_ENV: &str = "COMMITPOINT_BENCH_INGEST_KEY";
/// Concurrent intake requests while filling the batch.
const INTAKE_CONCURRENCY: usize = 64;
/// The target: peak RSS at the largest file within 20% of the smallest.
const RSS_TARGET_RATIO: f64 = 1.20;
/// The simulator (and OpenAI) accept at most this many lines per batch input.
const MAX_LINES: usize = 50_000;

const STATS_EVERY: Duration = Duration::from_millis(100);
const RSS_EVERY: Duration = Duration::from_millis(50);
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);
const INTAKE_TIMEOUT: Duration = Duration::from_secs(900);
const SUBMIT_TIMEOUT: Duration = Duration::from_secs(600);
const INGEST_TIMEOUT: Duration = Duration::from_secs(900);
const CLOSE_TIMEOUT: Duration = Duration::from_secs(60);
const VERIFY_TIMEOUT: Duration = Duration::from_secs(600);

pub fn main() -> ExitCode {
    let config = match Config::from_env() {
        Ok(c) => c,
        Err(e) => {
            eprintln!("ingest bench: {e}");
            return ExitCode::from(2);
        }
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("ingest bench: cannot start the tokio runtime: {e}");
            return ExitCode::from(2);
        }
    };
    let outcome = runtime.block_on(run(&config));
    // The simulator's connections may linger; do not wait for them.
    runtime.shutdown_timeout(Duration::from_secs(5));
    match outcome {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::from(1),
        Err(e) => {
            eprintln!("ingest bench: {e}");
            ExitCode::from(1)
        }
    }
}

// ---------------------------------------------------------------------------------------
// Configuration

#[derive(Debug, Clone)]
struct Config {
    quick: bool,
    sizes: Vec<usize>,
    complete_after: Duration,
    base_dir: PathBuf,
    keep: bool,
    /// Reviewable lines per source, so findings per answer.
    findings: usize,
    /// `[server] cache_bytes` for the server, when set.
    cache_bytes: Option<usize>,
}

impl Config {
    fn from_env() -> Result<Self> {
        let quick = env_var("COMMITPOINT_BENCH_QUICK").is_some_and(|v| v != "0");
        let sizes = match env_var("COMMITPOINT_BENCH_SIZES") {
            None if quick => vec![500, 5_000],
            None => vec![5_000, 50_000],
            Some(raw) => raw
                .split(',')
                .map(|s| s.trim().replace('_', "").parse::<usize>().ok().filter(|n| (1..=MAX_LINES).contains(n)))
                .collect::<Option<Vec<_>>>()
                .ok_or_else(|| format!("COMMITPOINT_BENCH_SIZES={raw:?}: want e.g. 5000,50000 (each 1..=50000)"))?,
        };
        let complete_after = match env_var("COMMITPOINT_BENCH_COMPLETE_AFTER_SECS") {
            None => Duration::from_secs(5),
            Some(raw) => raw
                .trim()
                .parse::<f64>()
                .ok()
                .and_then(|s| Duration::try_from_secs_f64(s).ok())
                .filter(|d| *d >= Duration::from_secs(1))
                .ok_or_else(|| format!("COMMITPOINT_BENCH_COMPLETE_AFTER_SECS={raw:?}: want seconds >= 1"))?,
        };
        let base_dir = match env_var("COMMITPOINT_BENCH_DIR") {
            Some(dir) => PathBuf::from(dir),
            None => {
                let tmp = std::env::temp_dir();
                if filesystem_of(&tmp).is_some_and(|fs| fs.is_ram()) {
                    PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
                } else {
                    tmp
                }
            }
        };
        let keep = env_var("COMMITPOINT_BENCH_KEEP").is_some_and(|v| v != "0");
        let findings = match env_var("COMMITPOINT_BENCH_FINDINGS") {
            None => 2,
            Some(raw) => raw
                .trim()
                .parse::<usize>()
                .ok()
                .filter(|n| *n <= 9)
                .ok_or_else(|| format!("COMMITPOINT_BENCH_FINDINGS={raw:?}: want 0..=9"))?,
        };
        let cache_bytes = match env_var("COMMITPOINT_BENCH_CACHE_BYTES") {
            None => None,
            Some(raw) => Some(
                raw.trim()
                    .parse::<usize>()
                    .map_err(|_| format!("COMMITPOINT_BENCH_CACHE_BYTES={raw:?}: want a number of bytes"))?,
            ),
        };
        Ok(Self { quick, sizes, complete_after, base_dir, keep, findings, cache_bytes })
    }
}

// ---------------------------------------------------------------------------------------
// The whole run

async fn run(config: &Config) -> Result<bool> {
    std::fs::create_dir_all(&config.base_dir)
        .map_err(|e| format!("cannot create {}: {e}", config.base_dir.display()))?;
    let base = std::fs::canonicalize(&config.base_dir)?;
    print_header(config, &base);

    let mut results = Vec::new();
    for &lines in &config.sizes {
        println!("--- {lines} lines ---");
        let outcome = run_size(config, &base, lines).await;
        match outcome {
            Ok(result) => {
                print_details(&result);
                results.push(Ok(result));
            }
            Err(e) => {
                println!("  FAILED: {e}");
                results.push(Err((lines, e.to_string())));
            }
        }
        println!();
    }
    print_table(&results);
    let clean = results.iter().all(|r| r.as_ref().is_ok_and(SizeResult::is_clean));
    let machine_load = load_average();
    println!("load average at the end: {machine_load}");
    if !clean {
        println!("NOT CLEAN: a run failed or its file did not verify (see above); exit status 1");
    }
    let _ = std::io::stdout().flush();
    Ok(clean)
}

fn print_header(config: &Config, base: &Path) {
    println!("commitpoint result-ingestion benchmark");
    println!("  binary        {BINARY}");
    let fs = filesystem_of(base);
    println!("  data dirs in  {} ({})", base.display(), Filesystem::describe(fs.as_ref()));
    if fs.is_some_and(|fs| fs.is_ram()) {
        println!("  WARNING       this is a RAM filesystem: fsync costs nothing, and the file itself counts as memory");
    }
    let cores = std::thread::available_parallelism().map_or(0, usize::from);
    println!("  machine       {cores} cores, load average {} (1/5/15 min) at start", load_average());
    println!(
        "  per size      simulator complete_after {:.1} s, {INTAKE_CONCURRENCY} concurrent intakes, {} findings per answer, poll interval 200 ms{}",
        config.complete_after.as_secs_f64(),
        config.findings,
        if config.quick { " (QUICK mode)" } else { "" },
    );
    println!("  measured      restart of `serve` on the filled data dir -> GET /v1/stats committed == N");
    println!();
}

// ---------------------------------------------------------------------------------------
// One file size

#[derive(Debug, Default)]
struct SizeResult {
    lines: usize,
    data_dir: Option<PathBuf>,
    /// Sum of the intakes' `content` lengths.
    content_bytes: u64,
    /// The simulator's input and output files.
    input_bytes: Option<u64>,
    output_bytes: Option<u64>,
    intake: Duration,
    submitted_after: Duration,
    // Measured window, all from the spawn of the second server.
    ready: Duration,
    first_staged: Option<Duration>,
    all_staged: Option<Duration>,
    ingest: Duration,
    closed: Option<Duration>,
    committed: u64,
    failed: u64,
    /// KiB.
    startup_rss: u64,
    peak_rss_sampled: u64,
    vm_hwm: u64,
    rss_at_all_staged: Option<u64>,
    rss_at_end: u64,
    /// RssAnon and RssFile at the end: heap (redb's cache lives here) vs mapped files.
    rss_anon_end: u64,
    rss_file_end: u64,
    /// About ten (seconds, MiB) points of the sampled VmRSS.
    timeline: Vec<(f64, f64)>,
    /// User + system CPU seconds of the server over the measured window (all threads).
    server_cpu: Option<f64>,
    /// (count, total latency, max latency) of the `/v1/stats` polls in the window.
    stats_polls: (u32, Duration, Duration),
    lines_ingested: u64,
    malformed_lines: u64,
    batches_recovered: u64,
    db_bytes: Option<u64>,
    shutdown: Option<Duration>,
    verify: Option<Verdict>,
    problems: Vec<String>,
}

#[derive(Debug, Clone)]
enum Verdict {
    Ok { extractions: u64, committed: u64, findings: u64 },
    Problem(String),
}

impl SizeResult {
    fn peak_rss(&self) -> u64 {
        self.vm_hwm.max(self.peak_rss_sampled)
    }

    fn rate(&self) -> f64 {
        self.committed as f64 / self.ingest.as_secs_f64().max(1e-9)
    }

    fn is_clean(&self) -> bool {
        self.problems.is_empty() && matches!(self.verify, Some(Verdict::Ok { .. }))
    }
}

async fn run_size(config: &Config, base: &Path, lines: usize) -> Result<SizeResult> {
    let dir = tempfile::Builder::new().prefix(&format!("ingest-{lines}-")).tempdir_in(base)?;
    let data_dir = dir.path().join("data");
    let mut result = SizeResult { lines, ..SizeResult::default() };
    if config.keep {
        result.data_dir = Some(data_dir.clone());
    }

    let sim_config = SimulatorConfig {
        faults: Default::default(),
        api_key: None,
        complete_after: config.complete_after,
        seed: 0x1_9e57,
        ..SimulatorConfig::default()
    };
    let sim = Simulator::start(SocketAddr::from(([127, 0, 0, 1], 0)), sim_config).await?;
    let http =
        reqwest::Client::builder().timeout(REQUEST_TIMEOUT).pool_max_idle_per_host(INTAKE_CONCURRENCY).build()?;
    let outcome = measure(config, &sim, &http, dir.path(), &data_dir, &mut result).await;
    sim.stop().await;
    outcome?;

    if let Ok(meta) = std::fs::metadata(data_dir.join("commitpoint.redb")) {
        result.db_bytes = Some(meta.len());
    }
    if config.keep {
        let _ = dir.keep();
    }
    Ok(result)
}

async fn measure(
    config: &Config,
    sim: &Simulator,
    http: &reqwest::Client,
    dir: &Path,
    data_dir: &Path,
    result: &mut SizeResult,
) -> Result<()> {
    let lines = result.lines;
    // An empty configuration file, so a host's /etc/commitpoint/config.toml (tokens, limits)
    // does not leak into the measurement.
    let config_file = dir.join("bench.toml");
    let server = config.cache_bytes.map(|bytes| format!("[server]\ncache_bytes = {bytes}\n")).unwrap_or_default();
    // Priced as a deployment would be: an unpriced model is a warning in the log, and a
    // warning fails the run.
    let provider = format!(
        "# commitpoint ingest bench: built-in defaults, the simulator as provider, plus flags\n\
         {server}[providers.openai]\nkind = \"openai\"\nbase_url = \"{}\"\napi_key_env = \"{KEY_ENV}\"\n\n\
         [[prices]]\nprovider = \"openai\"\nmodel = \"gpt-4o-mini\"\ninput_per_mtok = 0.15\noutput_per_mtok = 0.60\n",
        sim.base_url()
    );
    std::fs::write(&config_file, provider)?;
    let args = serve_args(data_dir, &config_file, lines);

    // Phase 1: fill and submit the batch, then stop the process that built the upload.
    let mut first = ServerProcess::start(serve_command(&args), &dir.join("server-1.log"))?;
    let started = Instant::now();
    let (created, content_bytes) = post_intakes(http, first.addr, lines, config.findings).await?;
    result.intake = started.elapsed();
    result.content_bytes = content_bytes;
    if created != lines as u64 {
        return Err(format!("{created} of {lines} intakes were created").into());
    }
    wait_submitted(http, &mut first, sim).await?;
    result.submitted_after = started.elapsed();
    let (status, _) = tokio::task::block_in_place(|| first.stop())?;
    if !status.success() {
        result.problems.push(format!("the first server exited with {status}"));
    }
    if sim.stats().content_downloads > 0 {
        return Err(format!(
            "the first server downloaded results before it stopped: raise COMMITPOINT_BENCH_COMPLETE_AFTER_SECS \
             (now {:.1} s)",
            config.complete_after.as_secs_f64()
        )
        .into());
    }

    // Phase 2: the batch completes at the provider; its listing generates the output file.
    let batch = wait_completed(http, sim, config.complete_after).await?;
    let total = batch.pointer("/request_counts/total").and_then(Value::as_u64).unwrap_or(0);
    if total != lines as u64 {
        return Err(format!("the simulated batch holds {total} requests, expected {lines}").into());
    }
    result.input_bytes = file_bytes(http, sim, batch.get("input_file_id")).await;
    result.output_bytes = file_bytes(http, sim, batch.get("output_file_id")).await;
    // The simulator always writes an error file; without faults it is empty.
    if let Some(bytes) = file_bytes(http, sim, batch.get("error_file_id")).await.filter(|b| *b > 0) {
        result.problems.push(format!("the simulated batch has a {bytes}-byte error file"));
    }

    // Phase 3, measured: a fresh process ingests the result file.
    let spawned = Instant::now();
    let mut server = ServerProcess::start(serve_command(&args), &dir.join("server-2.log"))?;
    result.ready = spawned.elapsed();
    let pid = server.pid();
    result.startup_rss = status_kib(pid, "VmRSS:").unwrap_or(0);
    let sampler = RssSampler::start(pid, spawned.elapsed());
    let cpu_before = process_cpu_secs(&pid.to_string());
    let watched = watch_ingest(http, &mut server, lines as u64, spawned).await;
    let cpu_after = process_cpu_secs(&pid.to_string());
    // Stop sampling first: VmHWM, read after, covers every sample.
    let trace = sampler.stop();
    result.vm_hwm = status_kib(pid, "VmHWM:").unwrap_or(0);
    result.rss_at_end = status_kib(pid, "VmRSS:").unwrap_or(0);
    result.rss_anon_end = status_kib(pid, "RssAnon:").unwrap_or(0);
    result.rss_file_end = status_kib(pid, "RssFile:").unwrap_or(0);
    result.peak_rss_sampled = trace.peak;
    result.timeline = trace.timeline(10);
    let progress = watched?;
    result.first_staged = progress.first_staged;
    result.all_staged = progress.all_staged;
    result.ingest = progress.done;
    result.committed = progress.counts.committed;
    result.failed = progress.counts.failed;
    result.stats_polls = (progress.polls, progress.poll_total, progress.poll_max);
    result.rss_at_all_staged = progress.all_staged.and_then(|at| trace.at(at));
    result.server_cpu = match (cpu_before, cpu_after) {
        (Some(a), Some(b)) => Some(b - a),
        _ => None,
    };
    if result.committed != lines as u64 {
        result.problems.push(format!(
            "{} of {lines} extractions committed ({} failed, {} still pending/submitted/ready)",
            result.committed,
            result.failed,
            progress.counts.unfinished()
        ));
    }

    // Let the batch close (it is part of the work, but not of the committed==N clock).
    match wait_closed(http, &mut server, spawned).await {
        Ok((closed, health)) => {
            result.closed = Some(closed);
            result.lines_ingested = health.get("lines_ingested").and_then(Value::as_u64).unwrap_or(0);
            result.malformed_lines = health.get("malformed_lines").and_then(Value::as_u64).unwrap_or(0);
            result.batches_recovered = health.get("batches_recovered").and_then(Value::as_u64).unwrap_or(0);
        }
        Err(e) => result.problems.push(format!("the batch did not close: {e}")),
    }

    match tokio::task::block_in_place(|| server.stop()) {
        Ok((status, took)) => {
            result.shutdown = Some(took);
            if !status.success() {
                result.problems.push(format!("the ingesting server exited with {status}"));
            }
        }
        Err(e) => result.problems.push(e.to_string()),
    }
    for line in server.log_problems().into_iter().take(5) {
        result.problems.push(format!("server log: {line}"));
    }
    let db = data_dir.join("commitpoint.redb");
    let verdict = tokio::task::spawn_blocking(move || verify(&db)).await?;
    if let Verdict::Ok { committed, .. } = &verdict
        && *committed != result.committed
    {
        result.problems.push(format!("verify counts {committed} committed, /v1/stats said {}", result.committed));
    }
    result.verify = Some(verdict);
    Ok(())
}

fn serve_command(args: &[String]) -> Command {
    let mut cmd = Command::new(BINARY);
    cmd.args(args).env(KEY_ENV, "x");
    cmd
}

fn serve_args(data_dir: &Path, config_file: &Path, lines: usize) -> Vec<String> {
    let mut args: Vec<String> = vec![
        "serve".into(),
        "--config".into(),
        config_file.display().to_string(),
        "--data-dir".into(),
        data_dir.display().to_string(),
    ];
    for (flag, value) in [
        ("--listen", "127.0.0.1:0".to_string()),
        ("--batch-max-size", lines.to_string()),
        ("--batch-max-wait", "1h".to_string()),
        ("--poll-interval", "200ms".to_string()),
    ] {
        args.push(flag.to_string());
        args.push(value);
    }
    args
}

// ---------------------------------------------------------------------------------------
// Phase 1: intake and submit

/// splitmix64, so every source is the same on every run.
fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// About 1-2.5 KB of Rust-looking code (28 to 70 lines, 1.7 KB on average) with `findings`
/// reviewable lines: an `unwrap()` on line 5 and a `TODO` on line 12 of every 16, up to that
/// many (the workload is two findings per answer; each line needs 16 lines more
/// than the one before, so a short source can hold fewer than a large count asks).
/// 50,000 of them stay under the scheduler's 100 MiB content cap per batch, so they form
/// one batch.
fn source_content(i: usize, findings: usize) -> String {
    let lines = 28 + (mix(i as u64) % 43) as usize;
    let mut out = format!("pub fn item_{i:05}(x: &[u64], w: &[u64]) -> u64 {{\n");
    let mut placed = 0;
    for j in 1..lines - 1 {
        let line = match j % 16 {
            5 if placed < findings => format!("    let v{j} = x.get({j}).unwrap(); // {i}\n"),
            12 if placed < findings => format!("    // TODO: empty case, item {i}\n"),
            _ => format!("    acc += w[{j}] * x[{j}]; // {i}\n"),
        };
        if matches!(j % 16, 5 | 12) && placed < findings {
            placed += 1;
        }
        out.push_str(&line);
    }
    out.push_str("}\n");
    out
}

fn intake_body(i: usize, findings: usize) -> (Value, usize) {
    let content = source_content(i, findings);
    let len = content.len();
    (
        json!({"tenant": TENANT, "source_id": format!("bench/src/item_{i:05}.rs"), "schema": SCHEMA, "content": content}),
        len,
    )
}

/// Posts sources 0..n with `INTAKE_CONCURRENCY` requests in flight. Returns (created, content bytes).
async fn post_intakes(http: &reqwest::Client, addr: SocketAddr, n: usize, findings: usize) -> Result<(u64, u64)> {
    let next = Arc::new(AtomicUsize::new(0));
    let created = Arc::new(AtomicU64::new(0));
    let bytes = Arc::new(AtomicU64::new(0));
    let url = format!("http://{addr}/v1/extractions");
    let deadline = Instant::now() + INTAKE_TIMEOUT;
    let workers: Vec<_> = (0..INTAKE_CONCURRENCY)
        .map(|_| {
            let (http, next, created, bytes, url) =
                (http.clone(), Arc::clone(&next), Arc::clone(&created), Arc::clone(&bytes), url.clone());
            tokio::spawn(async move {
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    if i >= n {
                        return Ok::<(), String>(());
                    }
                    let (body, len) = intake_body(i, findings);
                    let mut attempt = 0;
                    loop {
                        if Instant::now() > deadline {
                            return Err(format!("intake did not finish within {INTAKE_TIMEOUT:?}"));
                        }
                        attempt += 1;
                        match http.post(&url).json(&body).send().await {
                            Ok(response) if response.status().as_u16() == 201 => break,
                            Ok(response) => {
                                let status = response.status();
                                let text = response.text().await.unwrap_or_default();
                                return Err(format!("intake {i}: HTTP {status}: {}", truncate(&text, 300)));
                            }
                            // A transport error is retried: intake is idempotent by identity,
                            // and a re-send of an acknowledged source would answer 200, not 201.
                            Err(e) if attempt < 3 => {
                                eprintln!("intake {i}: {e}; retrying");
                                tokio::time::sleep(Duration::from_millis(200)).await;
                            }
                            Err(e) => return Err(format!("intake {i}: {e}")),
                        }
                    }
                    created.fetch_add(1, Ordering::Relaxed);
                    bytes.fetch_add(len as u64, Ordering::Relaxed);
                }
            })
        })
        .collect();
    for worker in workers {
        worker.await??;
    }
    Ok((created.load(Ordering::Relaxed), bytes.load(Ordering::Relaxed)))
}

fn truncate(text: &str, max: usize) -> String {
    text.chars().take(max).collect()
}

async fn get_json(http: &reqwest::Client, url: &str) -> Result<Value> {
    let response = http.get(url).send().await?;
    let status = response.status();
    let body: Value = response.json().await?;
    if !status.is_success() {
        return Err(format!("GET {url}: HTTP {status}: {}", truncate(&body.to_string(), 300)).into());
    }
    Ok(body)
}

fn provider_health(body: &Value) -> Option<&Value> {
    body.get("providers").and_then(|p| p.get(0).or(Some(p)))
}

fn counter(health: Option<&Value>, name: &str) -> u64 {
    health.and_then(|h| h.get(name)).and_then(Value::as_u64).unwrap_or(0)
}

/// Waits until the batch is submitted and the simulator has been polled once: the
/// scheduler polls only after it committed the job id, so a restart finds the job.
async fn wait_submitted(http: &reqwest::Client, server: &mut ServerProcess, sim: &Simulator) -> Result<()> {
    let url = format!("http://{}/healthz", server.addr);
    let deadline = Instant::now() + SUBMIT_TIMEOUT;
    loop {
        server.check_alive()?;
        let body = get_json(http, &url).await?;
        let health = provider_health(&body);
        if let Some(error) = health.and_then(|h| h.get("last_error")).and_then(Value::as_str) {
            return Err(format!("the provider reported an error while submitting: {error}").into());
        }
        let formed = counter(health, "batches_formed");
        if formed > 1 {
            return Err(format!("{formed} batches formed instead of one (content over the batch byte cap?)").into());
        }
        if counter(health, "batches_submitted") >= 1 && sim.stats().polls >= 1 {
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err(format!("the batch was not submitted within {SUBMIT_TIMEOUT:?}: {body}").into());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

// ---------------------------------------------------------------------------------------
// Phase 2: the provider finishes

async fn wait_completed(http: &reqwest::Client, sim: &Simulator, complete_after: Duration) -> Result<Value> {
    let url = format!("{}/batches?limit=1", sim.base_url());
    let deadline = Instant::now() + complete_after + Duration::from_secs(120);
    loop {
        let list = get_json(http, &url).await?;
        let batch = list.pointer("/data/0").cloned().ok_or("the simulator lists no batch")?;
        match batch.get("status").and_then(Value::as_str) {
            Some("completed") => return Ok(batch),
            Some("failed" | "expired" | "cancelled") => {
                return Err(format!("the simulated batch ended badly: {}", truncate(&batch.to_string(), 500)).into());
            }
            _ => {}
        }
        if Instant::now() > deadline {
            return Err("the simulated batch did not complete in time".into());
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

async fn file_bytes(http: &reqwest::Client, sim: &Simulator, id: Option<&Value>) -> Option<u64> {
    let id = id?.as_str()?;
    let meta = get_json(http, &format!("{}/files/{id}", sim.base_url())).await.ok()?;
    meta.get("bytes").and_then(Value::as_u64)
}

// ---------------------------------------------------------------------------------------
// Phase 3: the measured ingestion

#[derive(Debug, Default, Clone, Copy)]
struct Counts {
    pending: u64,
    claimed: u64,
    submitted: u64,
    ready: u64,
    committed: u64,
    failed: u64,
}

impl Counts {
    fn from_stats(body: &Value) -> Self {
        let n = |state: &str| body.pointer(&format!("/extractions/{state}")).and_then(Value::as_u64).unwrap_or(0);
        Self {
            pending: n("pending"),
            claimed: n("claimed"),
            submitted: n("submitted"),
            ready: n("ready"),
            committed: n("committed"),
            failed: n("failed"),
        }
    }

    fn unfinished(&self) -> u64 {
        self.pending + self.claimed + self.submitted + self.ready
    }
}

#[derive(Debug)]
struct Progress {
    first_staged: Option<Duration>,
    all_staged: Option<Duration>,
    done: Duration,
    counts: Counts,
    /// The observer's own cost: `/v1/stats` counts every extraction by state.
    polls: u32,
    poll_total: Duration,
    poll_max: Duration,
}

/// Polls `/v1/stats` until every extraction is committed (or all are final otherwise).
async fn watch_ingest(
    http: &reqwest::Client,
    server: &mut ServerProcess,
    n: u64,
    spawned: Instant,
) -> Result<Progress> {
    let url = format!("http://{}/v1/stats", server.addr);
    let mut progress = Progress {
        first_staged: None,
        all_staged: None,
        done: Duration::ZERO,
        counts: Counts::default(),
        polls: 0,
        poll_total: Duration::ZERO,
        poll_max: Duration::ZERO,
    };
    let mut tick = tokio::time::interval(STATS_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        server.check_alive()?;
        let asked = Instant::now();
        let counts = Counts::from_stats(&get_json(http, &url).await?);
        let took = asked.elapsed();
        progress.polls += 1;
        progress.poll_total += took;
        progress.poll_max = progress.poll_max.max(took);
        let at = spawned.elapsed();
        if progress.first_staged.is_none() && counts.ready + counts.committed + counts.failed > 0 {
            progress.first_staged = Some(at);
        }
        if progress.all_staged.is_none() && counts.submitted == 0 && counts.pending == 0 {
            progress.all_staged = Some(at);
        }
        progress.counts = counts;
        if counts.committed >= n || (counts.unfinished() == 0 && counts.committed + counts.failed >= n) {
            progress.done = at;
            return Ok(progress);
        }
        if at > INGEST_TIMEOUT {
            return Err(format!("ingestion did not finish within {INGEST_TIMEOUT:?}: {counts:?}").into());
        }
    }
}

/// Waits for the scheduler to close the batch; returns when, and the provider health.
async fn wait_closed(
    http: &reqwest::Client,
    server: &mut ServerProcess,
    spawned: Instant,
) -> Result<(Duration, Value)> {
    let url = format!("http://{}/healthz", server.addr);
    let deadline = Instant::now() + CLOSE_TIMEOUT;
    loop {
        server.check_alive()?;
        let body = get_json(http, &url).await?;
        let health = provider_health(&body).cloned().unwrap_or(Value::Null);
        if counter(Some(&health), "batches_closed") >= 1 {
            return Ok((spawned.elapsed(), health));
        }
        if Instant::now() > deadline {
            return Err(format!("not closed within {CLOSE_TIMEOUT:?}").into());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A field of /proc/PID/status in KiB (`VmRSS:`, `VmHWM:`).
fn status_kib(pid: u32, field: &str) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with(field))?;
    line[field.len()..].split_whitespace().next()?.parse().ok()
}

#[derive(Debug, Default)]
struct RssTrace {
    peak: u64,
    /// (time since sampling began, VmRSS KiB).
    samples: Vec<(Duration, u64)>,
    /// Offset between the sampler's clock and the measured window's.
    offset: Duration,
}

impl RssTrace {
    /// About `points` evenly spaced samples, in (measured-window seconds, MiB).
    fn timeline(&self, points: usize) -> Vec<(f64, f64)> {
        let step = self.samples.len().div_ceil(points.max(1)).max(1);
        let mut out: Vec<(f64, f64)> =
            self.samples.iter().step_by(step).map(|(t, kib)| ((*t + self.offset).as_secs_f64(), mib(*kib))).collect();
        if let Some((t, kib)) = self.samples.last()
            && self.samples.len() % step != 1
        {
            out.push(((*t + self.offset).as_secs_f64(), mib(*kib)));
        }
        out
    }

    /// The last sample at or before `at` (measured-window time).
    fn at(&self, at: Duration) -> Option<u64> {
        let at = at.checked_sub(self.offset)?;
        self.samples.iter().take_while(|(t, _)| *t <= at).last().map(|(_, kib)| *kib)
    }
}

#[derive(Debug)]
struct RssSampler {
    stop: Arc<AtomicBool>,
    thread: std::thread::JoinHandle<RssTrace>,
}

impl RssSampler {
    /// `offset`: how far into the measured window sampling begins.
    fn start(pid: u32, offset: Duration) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = Arc::clone(&stop);
        let thread = std::thread::spawn(move || {
            let start = Instant::now();
            let mut trace = RssTrace { offset, ..RssTrace::default() };
            while !flag.load(Ordering::Relaxed) {
                let Some(kib) = status_kib(pid, "VmRSS:") else { break };
                trace.peak = trace.peak.max(kib);
                trace.samples.push((start.elapsed(), kib));
                std::thread::sleep(RSS_EVERY);
            }
            trace
        });
        Self { stop, thread }
    }

    fn stop(self) -> RssTrace {
        self.stop.store(true, Ordering::Relaxed);
        self.thread.join().unwrap_or_default()
    }
}

/// Runs `commitpoint verify` on the stopped server's file, killed after `VERIFY_TIMEOUT`.
fn verify(db: &Path) -> Verdict {
    let stdout = match run_verify(db, VERIFY_TIMEOUT) {
        Ok(stdout) => stdout,
        Err(problem) => return Verdict::Problem(problem),
    };
    let field = |name: &str| -> Option<u64> {
        stdout.lines().find_map(|l| l.trim().strip_prefix(name)).and_then(|n| n.trim().parse().ok())
    };
    match (field("extractions:"), stdout.contains("ok: every invariant holds")) {
        (Some(extractions), true) => Verdict::Ok {
            extractions,
            committed: field("committed:").unwrap_or(0),
            findings: field("findings:").unwrap_or(0),
        },
        _ => Verdict::Problem(format!("cannot read verify's report: {}", stdout.trim())),
    }
}

// ---------------------------------------------------------------------------------------
// Printing

fn mib(kib: u64) -> f64 {
    kib as f64 / 1024.0
}

fn mb(bytes: u64) -> String {
    format!("{:.1} MB", bytes as f64 / 1e6)
}

fn secs(d: Option<Duration>) -> String {
    d.map_or_else(|| "?".to_string(), |d| format!("{:.2} s", d.as_secs_f64()))
}

fn print_details(r: &SizeResult) {
    let opt_mb = |b: Option<u64>| b.map_or_else(|| "?".to_string(), mb);
    println!(
        "  phase 1 (not measured): {} intakes in {:.1} s ({:.0}/s), content {}, batch submitted after {:.1} s; \
         input file {}",
        r.lines,
        r.intake.as_secs_f64(),
        r.lines as f64 / r.intake.as_secs_f64().max(1e-9),
        mb(r.content_bytes),
        r.submitted_after.as_secs_f64(),
        opt_mb(r.input_bytes),
    );
    println!(
        "  measured: ready line {}, first staged answer seen {}, all staged {}, committed == N {}, batch closed {}",
        secs(Some(r.ready)),
        secs(r.first_staged),
        secs(r.all_staged),
        secs(Some(r.ingest)),
        secs(r.closed),
    );
    let rss_staged = r.rss_at_all_staged.map_or_else(|| "?".to_string(), |k| format!("{:.1}", mib(k)));
    println!(
        "  RSS (MiB): at ready {:.1}, when all staged {rss_staged}, at the end {:.1}, peak sampled {:.1}, VmHWM {:.1}",
        mib(r.startup_rss),
        mib(r.rss_at_end),
        mib(r.peak_rss_sampled),
        mib(r.vm_hwm),
    );
    println!(
        "  RSS at the end: anon {:.1} MiB, file-backed {:.1} MiB; VmRSS over time (s: MiB): {}",
        mib(r.rss_anon_end),
        mib(r.rss_file_end),
        r.timeline.iter().map(|(t, m)| format!("{t:.1}: {m:.0}")).collect::<Vec<_>>().join(", "),
    );
    let cpu = r.server_cpu.map_or_else(
        || "?".to_string(),
        |c| format!("{c:.1} s ({:.0}% of one core)", c / r.ingest.as_secs_f64().max(1e-9) * 100.0),
    );
    println!(
        "  server CPU in the window {cpu}; lines ingested {}, malformed {}, jobs recovered by batch key {}; \
         file {} after; SIGTERM->exit {}",
        r.lines_ingested,
        r.malformed_lines,
        r.batches_recovered,
        opt_mb(r.db_bytes),
        secs(r.shutdown),
    );
    let (polls, total, max) = r.stats_polls;
    println!(
        "  observer: {polls} GET /v1/stats (each counts every extraction by state), mean {:.1} ms, max {:.1} ms",
        total.as_secs_f64() * 1000.0 / f64::from(polls.max(1)),
        max.as_secs_f64() * 1000.0,
    );
    let verdict = match &r.verify {
        None => "not run".to_string(),
        Some(Verdict::Ok { extractions, committed, findings }) => {
            format!("ok ({extractions} extractions, {committed} committed, {findings} findings; every invariant holds)")
        }
        Some(Verdict::Problem(p)) => format!("PROBLEM: {p}"),
    };
    println!("  verify: {verdict}");
    for p in &r.problems {
        println!("  problem: {p}");
    }
    if let Some(dir) = &r.data_dir {
        println!("  kept: {}", dir.display());
    }
}

fn print_table(results: &[Result<SizeResult, (usize, String)>]) {
    println!(
        "result ingestion: restarted `serve`, poll -> stream -> judge -> commit (one transaction per chunk of lines)"
    );
    println!(
        "  {:>7} {:>12} {:>9} {:>14} {:>12} {:>10} {:>9} {:>7}",
        "lines", "result file", "ingest", "extractions/s", "startup RSS", "peak RSS", "CPU", "verify"
    );
    for r in results {
        match r {
            Err((lines, e)) => println!("  {lines:>7} FAILED: {}", truncate(e, 200)),
            Ok(r) => println!(
                "  {:>7} {:>12} {:>7.2} s {:>14.0} {:>8.1} MiB {:>6.1} MiB {:>7.1} s {:>7}",
                r.lines,
                r.output_bytes.map_or_else(|| "?".to_string(), mb),
                r.ingest.as_secs_f64(),
                r.rate(),
                mib(r.startup_rss),
                mib(r.peak_rss()),
                r.server_cpu.unwrap_or(f64::NAN),
                if r.is_clean() { "ok" } else { "PROBLEM" },
            ),
        }
        if let Ok(r) = r.as_ref()
            && r.is_clean()
        {
            common::figures::record(&format!("ingest.{}.secs", r.lines), r.ingest.as_secs_f64());
            common::figures::record(&format!("ingest.{}.peak_rss_mib", r.lines), mib(r.peak_rss()));
        }
    }
    println!("  (ingest: spawn of the restarted server -> /v1/stats committed == N; peak RSS: VmHWM of that process)");
    let ok: Vec<&SizeResult> = results.iter().filter_map(|r| r.as_ref().ok()).collect();
    let smallest = ok.iter().min_by_key(|r| r.lines);
    let largest = ok.iter().max_by_key(|r| r.lines);
    if let (Some(small), Some(large)) = (smallest, largest)
        && small.lines != large.lines
        && small.peak_rss() > 0
    {
        let ratio = large.peak_rss() as f64 / small.peak_rss() as f64;
        common::figures::record("ingest.rss_ratio", ratio);
        println!(
            "peak RSS {} lines / {} lines = {:.1} / {:.1} MiB = {ratio:.2} (target <= {RSS_TARGET_RATIO:.2}): {}",
            large.lines,
            small.lines,
            mib(large.peak_rss()),
            mib(small.peak_rss()),
            if ratio <= RSS_TARGET_RATIO { "PASS" } else { "FAIL" },
        );
    } else {
        println!("peak RSS ratio: needs two successful sizes");
    }
}
