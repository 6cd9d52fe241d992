//! Intake benchmark: durable acknowledgements per second through the real binary.
//!
//! `cargo bench --bench intake` builds the release binary, then for each concurrency level
//! (1, 32 and 128 clients by default) starts a fresh `commitpoint serve` on a fresh data
//! directory, drives `POST /v1/extractions` over keep-alive HTTP/1.1 (one connection per
//! client, about 30% exact re-sends of sources already acknowledged), stops the server with
//! SIGTERM and checks the file with `commitpoint verify`. Before that it measures the disk's
//! own 4 KiB write + fdatasync rate in the same directory. It prints one table; it never
//! asserts the targets, but exits 1 if any request failed or the file disagrees with the
//! acknowledgements.
//!
//! Environment (all optional):
//!
//! | variable | default | meaning |
//! |---|---|---|
//! | `COMMITPOINT_BENCH_QUICK=1` | off | smoke run: 1 s per level, short warm-up and fsync probe |
//! | `COMMITPOINT_BENCH_CLIENTS` | `1,32,128` | concurrency levels |
//! | `COMMITPOINT_BENCH_SECS` | 10 (quick: 1) | measured seconds per level |
//! | `COMMITPOINT_BENCH_WARMUP_SECS` | 1 (quick: 0.2) | unmeasured seconds before each level |
//! | `COMMITPOINT_BENCH_REQUESTS` | unset | measure this many requests per level instead of a duration |
//! | `COMMITPOINT_BENCH_DUP_PERCENT` | 30 | share of requests that re-send an acknowledged source |
//! | `COMMITPOINT_BENCH_CONTENT_BYTES` | 1024 | size of each source's `content` |
//! | `COMMITPOINT_BENCH_FSYNC_SECS` | 2 (quick: 0.5) | length of each fsync probe |
//! | `COMMITPOINT_BENCH_CLIENT_THREADS` | 1 | tokio worker threads driving the clients |
//! | `COMMITPOINT_BENCH_VERIFY` | 1 | set to 0 to skip `commitpoint verify` after each level |
//! | `COMMITPOINT_BENCH_DIR` | `target/tmp` | parent of the data directories (avoid tmpfs) |
//! | `COMMITPOINT_BENCH_PRELOAD` | 0 | fill both stores with this many extractions first (also `-- --preload N`) |
//! | `COMMITPOINT_BENCH_POSTGRES` | 1 | set to 0 to skip the PostgreSQL side |
//! | `COMMITPOINT_BENCH_PG_CLIENTS` | 32 | pgbench connections |
//! | `COMMITPOINT_BENCH_PRELOAD_KEEP` | unset | a directory: keep commitpoint's preloaded store there and reuse it next time |
//! | `COMMITPOINT_BENCH_CACHE_BYTES` | unset (the server's default) | redb page cache of the server (`[server] cache_bytes`) |
//! | `COMMITPOINT_BENCH_PRELOAD_COLD` | 1 | `0` leaves each level's copy of the preloaded store in the page cache |
//!
//! Side by side: after commitpoint's levels it starts a throw-away PostgreSQL (see
//! `common/postgres.rs`; "PostgreSQL: skipped (…)" when its binaries are absent) and runs
//! `pgbench` with `INSERT … ON CONFLICT (id) DO NOTHING` into a table of the same shape,
//! the same duplicate share and content size, for the same duration, and prints both and
//! their ratio. For both it prints the bytes written per acknowledged intake, from
//! /proc/PID/io: commitpoint's `write_bytes`; PostgreSQL's `wchar` summed over the
//! postmaster and its children (see `common/postgres.rs` for why), during the run and
//! with the CHECKPOINT after it that writes the data pages the run dirtied.

use std::fmt::Write as _;
use std::io::Write;
use std::net::SocketAddr;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::client::conn::http1;
use hyper::header::{CONTENT_TYPE, HOST};
use hyper_util::rt::TokioIo;

#[path = "common/mod.rs"]
mod common;
#[path = "pg_side/intake.rs"]
mod pg_side;

use common::stats::{Latencies, fmt_us, micros, rate};
use common::{
    BINARY, Filesystem, Result, ServerProcess, env_var, filesystem_of, load_average, process_cpu_secs, run_verify,
};

const SCHEMA: &str = "code-review@1";
const TENANT: &str = "bench";
/// One request that takes longer than this is counted as an error and its connection
/// replaced; the bench never waits forever.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);
const VERIFY_TIMEOUT: Duration = Duration::from_secs(600);
/// Error responses kept verbatim for the report.
const MAX_SAMPLES: usize = 5;

pub fn main() -> ExitCode {
    let config = match Config::from_env() {
        Ok(c) => c,
        Err(e) => {
            eprintln!("intake bench: {e}");
            return ExitCode::from(2);
        }
    };
    let runtime =
        match tokio::runtime::Builder::new_multi_thread().worker_threads(config.client_threads).enable_all().build() {
            Ok(rt) => rt,
            Err(e) => {
                eprintln!("intake bench: cannot start the tokio runtime: {e}");
                return ExitCode::from(2);
            }
        };
    match runtime.block_on(run(&config)) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::from(1),
        Err(e) => {
            eprintln!("intake bench: {e}");
            ExitCode::from(1)
        }
    }
}

#[derive(Debug, Clone)]
struct Config {
    quick: bool,
    levels: Vec<usize>,
    measure: Duration,
    warmup: Duration,
    requests: Option<u64>,
    dup_percent: u64,
    content_bytes: usize,
    fsync: Duration,
    client_threads: usize,
    verify: bool,
    base_dir: PathBuf,
    preload: u64,
    postgres: bool,
    pg_clients: usize,
    cache_bytes: Option<u64>,
}

/// `--preload N` or `--preload=N` among the arguments (cargo bench adds `--bench`).
fn preload_arg() -> Result<Option<u64>> {
    let args: Vec<String> = std::env::args().collect();
    for (i, arg) in args.iter().enumerate() {
        let value = if arg == "--preload" {
            args.get(i + 1).cloned()
        } else if let Some(v) = arg.strip_prefix("--preload=") {
            Some(v.to_string())
        } else {
            continue;
        };
        let value = value.unwrap_or_default();
        return value.trim().parse().map(Some).map_err(|_| format!("--preload {value:?}: want a count").into());
    }
    Ok(None)
}

fn env_parse<T: std::str::FromStr>(name: &str, default: T) -> Result<T> {
    match env_var(name) {
        None => Ok(default),
        Some(raw) => raw.trim().parse().map_err(|_| format!("{name}={raw:?} is not a valid value").into()),
    }
}

fn env_secs(name: &str, default: f64) -> Result<Duration> {
    let secs: f64 = env_parse(name, default)?;
    Duration::try_from_secs_f64(secs).map_err(|_| format!("{name}: {secs} is not a duration").into())
}

impl Config {
    fn from_env() -> Result<Self> {
        let quick = env_var("COMMITPOINT_BENCH_QUICK").is_some_and(|v| v != "0");
        let levels = match env_var("COMMITPOINT_BENCH_CLIENTS") {
            None => vec![1, 32, 128],
            Some(raw) => raw
                .split(',')
                .map(|s| s.trim().parse::<usize>().ok().filter(|&n| n > 0))
                .collect::<Option<Vec<_>>>()
                .ok_or_else(|| format!("COMMITPOINT_BENCH_CLIENTS={raw:?}: want e.g. 1,32,128"))?,
        };
        let dup_percent = env_parse("COMMITPOINT_BENCH_DUP_PERCENT", 30u64)?;
        if dup_percent > 100 {
            return Err("COMMITPOINT_BENCH_DUP_PERCENT must be 0-100".into());
        }
        let requests = match env_var("COMMITPOINT_BENCH_REQUESTS") {
            None => None,
            Some(_) => Some(env_parse("COMMITPOINT_BENCH_REQUESTS", 0u64)?).filter(|&n| n > 0),
        };
        let client_threads = env_parse("COMMITPOINT_BENCH_CLIENT_THREADS", 1usize)?.max(1);
        let base_dir = match env_var("COMMITPOINT_BENCH_DIR") {
            Some(dir) => PathBuf::from(dir),
            None => PathBuf::from(env!("CARGO_TARGET_TMPDIR")),
        };
        Ok(Self {
            quick,
            levels,
            measure: env_secs("COMMITPOINT_BENCH_SECS", if quick { 1.0 } else { 10.0 })?,
            warmup: env_secs("COMMITPOINT_BENCH_WARMUP_SECS", if quick { 0.2 } else { 1.0 })?,
            requests,
            dup_percent,
            content_bytes: env_parse("COMMITPOINT_BENCH_CONTENT_BYTES", 1024usize)?.max(16),
            fsync: env_secs("COMMITPOINT_BENCH_FSYNC_SECS", if quick { 0.5 } else { 2.0 })?,
            client_threads,
            verify: env_var("COMMITPOINT_BENCH_VERIFY").is_none_or(|v| v != "0"),
            base_dir,
            preload: match preload_arg()? {
                Some(n) => n,
                None => env_parse("COMMITPOINT_BENCH_PRELOAD", 0u64)?,
            },
            postgres: env_var("COMMITPOINT_BENCH_POSTGRES").is_none_or(|v| v != "0"),
            pg_clients: env_parse("COMMITPOINT_BENCH_PG_CLIENTS", 32usize)?.max(1),
            cache_bytes: match env_var("COMMITPOINT_BENCH_CACHE_BYTES") {
                None => None,
                Some(_) => Some(env_parse("COMMITPOINT_BENCH_CACHE_BYTES", 0u64)?),
            },
        })
    }
}

async fn run(config: &Config) -> Result<bool> {
    std::fs::create_dir_all(&config.base_dir)
        .map_err(|e| format!("cannot create {}: {e}", config.base_dir.display()))?;
    let base = std::fs::canonicalize(&config.base_dir)?;
    let fs = filesystem_of(&base);
    print_header(config, &base, fs.as_ref());

    let probes = tokio::task::spawn_blocking({
        let base = base.clone();
        let duration = config.fsync;
        move || fsync_probes(&base, duration)
    })
    .await??;
    print_probes(config, &probes, "disk baseline");

    let template = preload(config, &base).await?;
    let mut levels = Vec::new();
    for &clients in &config.levels {
        let result = run_level(config, &base, clients, template.as_ref().map(Template::path)).await;
        match result {
            Ok(level) => levels.push(level),
            Err(e) => {
                println!("  {clients:>7}  level failed: {e}");
                levels.push(LevelResult::failed(clients, e.to_string()));
            }
        }
    }
    // The disk is shared with whatever else runs on the machine: probe it again.
    let after = tokio::task::spawn_blocking({
        let base = base.clone();
        let duration = config.fsync;
        move || overwrite_probe(&base, duration, "overwrite, after")
    })
    .await??;
    drop(template);
    print_levels(&levels, config.preload > 0);
    let postgres = if config.postgres {
        let config = config.clone();
        let base = base.clone();
        tokio::task::spawn_blocking(move || pg_side::run(&config, &base)).await?
    } else {
        pg_side::Outcome::Skipped("COMMITPOINT_BENCH_POSTGRES=0".to_string())
    };
    print_probes(config, std::slice::from_ref(&after), "disk again after the levels");
    print_summary(&probes, &levels);
    pg_side::print(config, &postgres, &levels);
    let _ = std::io::stdout().flush();
    // PostgreSQL is a reference, not the thing under test: a failure on its side is
    // printed but does not fail the run (CI machines may lack it or run it badly).
    Ok(levels.iter().all(LevelResult::is_clean))
}

/// Where commitpoint's preloaded store lives: a temp dir, or one kept between runs.
#[derive(Debug)]
enum Template {
    Temporary(tempfile::TempDir),
    Kept(PathBuf),
}

impl Template {
    fn path(&self) -> &Path {
        match self {
            Template::Temporary(dir) => dir.path(),
            Template::Kept(dir) => dir,
        }
    }
}

/// Fills a store with `config.preload` extractions once; each level copies it. With
/// `COMMITPOINT_BENCH_PRELOAD_KEEP`, a store already there (from a run with the same N and
/// content size) is reused.
async fn preload(config: &Config, base: &Path) -> Result<Option<Template>> {
    let n = config.preload;
    if n == 0 {
        return Ok(None);
    }
    let template = match env_var("COMMITPOINT_BENCH_PRELOAD_KEEP") {
        Some(dir) => {
            let dir = PathBuf::from(dir);
            if dir.join("data").join("commitpoint.redb").is_file() {
                println!("commitpoint preload: reusing {} (must hold {n} extractions)", dir.display());
                return Ok(Some(Template::Kept(dir)));
            }
            Template::Kept(dir)
        }
        None => Template::Temporary(tempfile::Builder::new().prefix("intake-preload-").tempdir_in(base)?),
    };
    let took = common::preload::fill(&template.path().join("data"), n, SCHEMA, "preload", config.content_bytes).await?;
    println!("commitpoint preload: {n} extractions through Store::intake in {:.1} s", took.as_secs_f64());
    Ok(Some(template))
}

// ---------------------------------------------------------------------------------------
// Environment description

fn print_header(config: &Config, base: &Path, fs: Option<&Filesystem>) {
    println!("commitpoint intake benchmark");
    println!("  binary        {BINARY}");
    println!("  data dirs in  {} ({})", base.display(), Filesystem::describe(fs));
    if fs.is_some_and(Filesystem::is_ram) {
        println!("  WARNING       this is a RAM filesystem: fsync costs nothing, figures overstate a disk");
    }
    let cores = std::thread::available_parallelism().map_or(0, usize::from);
    println!("  machine       {cores} cores, load average {} (1/5/15 min) at start", load_average());
    let amount = match config.requests {
        Some(n) => format!("{n} measured requests"),
        None => format!("{:.1} s measured", config.measure.as_secs_f64()),
    };
    println!(
        "  per level     fresh server + data dir, {:.1} s warm-up, {amount}, {}% duplicates, {}-byte content{}",
        config.warmup.as_secs_f64(),
        config.dup_percent,
        config.content_bytes,
        if config.quick { " (QUICK mode)" } else { "" },
    );
    if let Some(cache_bytes) = config.cache_bytes {
        println!("  server        [server] cache_bytes = {cache_bytes}");
    }
    println!(
        "  bench client  hyper http1, one keep-alive connection per client, {} tokio thread(s), same machine",
        config.client_threads
    );
    println!();
}

// ---------------------------------------------------------------------------------------
// The disk's own fsync rate

#[derive(Debug)]
struct Probe {
    name: &'static str,
    ops: u64,
    elapsed: Duration,
    latencies: Latencies,
}

impl Probe {
    fn rate(&self) -> f64 {
        rate(self.ops, self.elapsed)
    }
}

const BLOCK: usize = 4096;
/// Overwrite probe cycles over this many preallocated blocks (1 MiB).
const PROBE_BLOCKS: u64 = 256;

/// 4 KiB write + `File::sync_data` (fdatasync) in a loop, in the benchmark's directory:
/// once overwriting preallocated blocks (pure data flush) and once appending (every
/// flush also commits the file's new size to the journal).
fn fsync_probes(base: &Path, duration: Duration) -> Result<Vec<Probe>> {
    let overwrite = overwrite_probe(base, duration, "overwrite")?;
    let dir = tempfile::Builder::new().prefix("fsync-probe-").tempdir_in(base)?;
    let block = [0x5au8; BLOCK];
    let mut file = std::fs::File::create(dir.path().join("append"))?;
    file.sync_all()?;
    let append = probe_loop("append", duration, |_| {
        file.write_all(&block)?;
        file.sync_data()
    })?;
    Ok(vec![overwrite, append])
}

fn overwrite_probe(base: &Path, duration: Duration, name: &'static str) -> Result<Probe> {
    let dir = tempfile::Builder::new().prefix("fsync-probe-").tempdir_in(base)?;
    let block = [0x5au8; BLOCK];
    let file = std::fs::File::create(dir.path().join("overwrite"))?;
    for i in 0..PROBE_BLOCKS {
        file.write_all_at(&block, i * BLOCK as u64)?;
    }
    file.sync_all()?;
    probe_loop(name, duration, |i| {
        file.write_all_at(&block, (i % PROBE_BLOCKS) * BLOCK as u64)?;
        file.sync_data()
    })
}

fn probe_loop(name: &'static str, duration: Duration, mut op: impl FnMut(u64) -> std::io::Result<()>) -> Result<Probe> {
    let mut latencies = Vec::new();
    let start = Instant::now();
    let mut i = 0u64;
    while start.elapsed() < duration {
        let t = Instant::now();
        op(i).map_err(|e| format!("fsync probe ({name}): {e}"))?;
        latencies.push(micros(t.elapsed()));
        i += 1;
    }
    Ok(Probe { name, ops: i, elapsed: start.elapsed(), latencies: Latencies::from(latencies) })
}

fn print_probes(config: &Config, probes: &[Probe], title: &str) {
    println!(
        "{title}: 4 KiB write + fdatasync (File::sync_data), one stream, {:.1} s each",
        config.fsync.as_secs_f64()
    );
    println!("  {:<17} {:>9} {:>9} {:>9} {:>9} {:>9}", "mode", "ops/s", "mean", "p50", "p99", "max");
    for p in probes {
        println!(
            "  {:<17} {:>9.0} {:>9} {:>9} {:>9} {:>9}",
            p.name,
            p.rate(),
            fmt_us(p.latencies.mean),
            fmt_us(p.latencies.p50),
            fmt_us(p.latencies.p99),
            fmt_us(p.latencies.max),
        );
    }
    println!();
}

// ---------------------------------------------------------------------------------------
// CPU use

/// (busy, total) jiffies of the whole machine, from the first line of /proc/stat.
fn machine_jiffies() -> Option<(u64, u64)> {
    let stat = std::fs::read_to_string("/proc/stat").ok()?;
    let line = stat.lines().next()?;
    let values: Vec<u64> = line.split_whitespace().skip(1).filter_map(|v| v.parse().ok()).collect();
    let total: u64 = values.iter().take(8).sum();
    let idle = values.get(3)? + values.get(4)?;
    Some((total - idle, total))
}

#[derive(Debug, Clone, Copy)]
struct CpuSnapshot {
    server: Option<f64>,
    bench: Option<f64>,
    machine: Option<(u64, u64)>,
}

impl CpuSnapshot {
    fn take(server_pid: u32) -> Self {
        Self {
            server: process_cpu_secs(&server_pid.to_string()),
            bench: process_cpu_secs("self"),
            machine: machine_jiffies(),
        }
    }
}

/// CPU use over a window, each as a share of one core (100% = one core busy).
#[derive(Debug, Clone, Copy, Default)]
struct CpuUse {
    server: Option<f64>,
    bench: Option<f64>,
    /// Busy share of the whole machine (100% = every core busy).
    machine: Option<f64>,
}

fn cpu_use(before: CpuSnapshot, after: CpuSnapshot, wall: Duration) -> CpuUse {
    let wall = wall.as_secs_f64().max(1e-9);
    let share = |a: Option<f64>, b: Option<f64>| Some((b? - a?) / wall * 100.0);
    let machine = match (before.machine, after.machine) {
        (Some((b0, t0)), Some((b1, t1))) if t1 > t0 => Some((b1 - b0) as f64 / (t1 - t0) as f64 * 100.0),
        _ => None,
    };
    CpuUse { server: share(before.server, after.server), bench: share(before.bench, after.bench), machine }
}

// ---------------------------------------------------------------------------------------
// One concurrency level

#[derive(Debug, Default)]
struct LevelResult {
    clients: usize,
    /// Measured window: requests started after the warm-up.
    requests: u64,
    created: u64,
    duplicates: u64,
    elapsed: Duration,
    latencies: Latencies,
    errors: ErrorCounts,
    cpu: CpuUse,
    /// 201s over the whole level, warm-up included (what the file must hold).
    created_total: u64,
    verify: Option<VerifyOutcome>,
    /// Bytes the server caused to be written over the measured window.
    write_bytes: Option<u64>,
    /// Bytes the server handed to write calls over the window (pwrite + responses).
    wchar: Option<u64>,
    shutdown: Option<Duration>,
    server_exit: Option<String>,
    server_log_problems: Vec<String>,
    failure: Option<String>,
}

#[derive(Debug, Clone)]
enum VerifyOutcome {
    Ok { extractions: u64 },
    Problem(String),
}

impl LevelResult {
    fn failed(clients: usize, reason: String) -> Self {
        Self { clients, failure: Some(reason), ..Self::default() }
    }

    fn acked(&self) -> u64 {
        self.created + self.duplicates
    }

    fn rate(&self) -> f64 {
        rate(self.acked(), self.elapsed)
    }

    fn is_clean(&self) -> bool {
        self.failure.is_none()
            && self.errors.total() == 0
            && self.server_exit.is_none()
            && !matches!(self.verify, Some(VerifyOutcome::Problem(_)))
    }
}

#[derive(Debug, Default, Clone)]
struct ErrorCounts {
    /// Non-2xx answers, by status.
    status: Vec<(u16, u64)>,
    /// 2xx whose `created` disagrees with what was sent (new source not created, or a
    /// re-send created a second extraction).
    mismatched: u64,
    connection: u64,
    timeouts: u64,
    samples: Vec<String>,
}

impl ErrorCounts {
    fn total(&self) -> u64 {
        self.status.iter().map(|(_, n)| n).sum::<u64>() + self.mismatched + self.connection + self.timeouts
    }

    fn status(&mut self, code: u16) {
        match self.status.iter_mut().find(|(c, _)| *c == code) {
            Some((_, n)) => *n += 1,
            None => self.status.push((code, 1)),
        }
    }

    fn sample(&mut self, text: String) {
        if self.samples.len() < MAX_SAMPLES {
            self.samples.push(text);
        }
    }

    fn merge(&mut self, other: ErrorCounts) {
        for (code, n) in other.status {
            match self.status.iter_mut().find(|(c, _)| *c == code) {
                Some((_, m)) => *m += n,
                None => self.status.push((code, n)),
            }
        }
        self.mismatched += other.mismatched;
        self.connection += other.connection;
        self.timeouts += other.timeouts;
        for s in other.samples {
            self.sample(s);
        }
    }

    fn describe(&self) -> String {
        let mut parts: Vec<String> = self.status.iter().map(|(code, n)| format!("{n}× HTTP {code}")).collect();
        if self.mismatched > 0 {
            parts.push(format!("{} wrong `created`", self.mismatched));
        }
        if self.connection > 0 {
            parts.push(format!("{} connection errors", self.connection));
        }
        if self.timeouts > 0 {
            parts.push(format!("{} timeouts", self.timeouts));
        }
        parts.join(", ")
    }
}

/// Shared schedule of one level.
#[derive(Debug)]
struct Plan {
    addr: SocketAddr,
    /// Requests started at or after this instant are measured.
    measure_from: Instant,
    /// No request starts after this instant.
    stop_at: Instant,
    /// With `COMMITPOINT_BENCH_REQUESTS`: measured requests still to start.
    budget: Option<AtomicU64>,
    dup_percent: u64,
    content_bytes: usize,
}

impl Plan {
    /// Whether a client may start another request, and whether it will be measured.
    fn next(&self) -> Option<bool> {
        let now = Instant::now();
        if now >= self.stop_at {
            return None;
        }
        let measured = now >= self.measure_from;
        if measured && let Some(budget) = &self.budget {
            budget.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1)).ok()?;
        }
        Some(measured)
    }
}

/// Writes the file out and drops it from the page cache, as a host restart would. Left
/// cached, the copy sits in the large folios its sequential write made, and every 4 KiB
/// page the server writes dirties a whole folio: the kernel then charged ~99 KiB of
/// `write_bytes` per acknowledged intake at 1,000,000 stored, against 8.4 KiB after
/// eviction (the server handed 8.6 KiB to `pwrite` either way, and the rate was the same
/// within noise). `COMMITPOINT_BENCH_PRELOAD_COLD=0` keeps the copy cached.
fn evict_from_page_cache(path: &Path) -> Result<()> {
    use nix::fcntl::{PosixFadviseAdvice, posix_fadvise};
    let file = std::fs::File::open(path)?;
    file.sync_all()?;
    posix_fadvise(&file, 0, 0, PosixFadviseAdvice::POSIX_FADV_DONTNEED)?;
    Ok(())
}

async fn run_level(config: &Config, base: &Path, clients: usize, template: Option<&Path>) -> Result<LevelResult> {
    let dir = tempfile::Builder::new().prefix(&format!("intake-{clients}c-")).tempdir_in(base)?;
    if let Some(template) = template {
        std::fs::create_dir_all(dir.path().join("data"))?;
        let copy = dir.path().join("data").join("commitpoint.redb");
        std::fs::copy(template.join("data").join("commitpoint.redb"), &copy)?;
        if env_var("COMMITPOINT_BENCH_PRELOAD_COLD").is_none_or(|v| v != "0") {
            evict_from_page_cache(&copy)?;
        }
    }
    let mut serve = Command::new(BINARY);
    serve.arg("serve").arg("--data-dir").arg(dir.path().join("data")).args(["--listen", "127.0.0.1:0"]);
    if let Some(cache_bytes) = config.cache_bytes {
        let path = dir.path().join("commitpoint.toml");
        std::fs::write(&path, format!("[server]\ncache_bytes = {cache_bytes}\n"))?;
        serve.arg("--config").arg(path);
    }
    let mut server = ServerProcess::start(serve, &dir.path().join("server.log"))?;

    let start = Instant::now();
    let measure_from = start + config.warmup;
    let stop_at = match config.requests {
        // A count-bounded level still ends by itself: at most ten minutes.
        Some(_) => measure_from + Duration::from_secs(600),
        None => measure_from + config.measure,
    };
    let plan = Arc::new(Plan {
        addr: server.addr,
        measure_from,
        stop_at,
        budget: config.requests.map(AtomicU64::new),
        dup_percent: config.dup_percent,
        content_bytes: config.content_bytes,
    });

    let tasks: Vec<_> = (0..clients).map(|id| tokio::spawn(client(id, Arc::clone(&plan)))).collect();

    tokio::time::sleep_until(measure_from.into()).await;
    let cpu_before = CpuSnapshot::take(server.pid());
    let io_before = common::postgres::write_bytes(server.pid());
    let wchar_before = common::postgres::wchar(server.pid());

    let mut result = LevelResult { clients, ..LevelResult::default() };
    let mut latencies = Vec::new();
    let mut last_finish = measure_from;
    for task in tasks {
        match task.await {
            Ok(stats) => {
                result.requests += stats.requests;
                result.created += stats.created;
                result.duplicates += stats.duplicates;
                result.created_total += stats.created_total;
                result.errors.merge(stats.errors);
                latencies.extend(stats.latencies);
                last_finish = last_finish.max(stats.finished);
            }
            Err(e) => {
                result.errors.connection += 1;
                result.errors.sample(format!("client task failed: {e}"));
            }
        }
    }
    let cpu_after = CpuSnapshot::take(server.pid());
    result.write_bytes = common::postgres::write_bytes(server.pid()).zip(io_before).map(|(a, b)| a.saturating_sub(b));
    result.wchar = common::postgres::wchar(server.pid()).zip(wchar_before).map(|(a, b)| a.saturating_sub(b));
    result.elapsed = last_finish.saturating_duration_since(measure_from);
    result.latencies = Latencies::from(latencies);
    result.cpu = cpu_use(cpu_before, cpu_after, Instant::now() - measure_from);

    match tokio::task::block_in_place(|| server.stop()) {
        Ok((status, took)) => {
            result.shutdown = Some(took);
            if !status.success() {
                result.server_exit = Some(format!("server exited with {status}"));
            }
        }
        Err(e) => result.server_exit = Some(e.to_string()),
    }
    result.server_log_problems = server.log_problems();
    if config.verify && result.server_exit.is_none() {
        let db = dir.path().join("data").join("commitpoint.redb");
        let verified = tokio::task::spawn_blocking(move || verify(&db)).await?;
        result.verify = Some(match verified {
            VerifyOutcome::Ok { extractions } if extractions != result.created_total + config.preload => {
                VerifyOutcome::Problem(format!(
                    "the file holds {extractions} extractions but {} were preloaded and {} intakes acknowledged as created",
                    config.preload, result.created_total
                ))
            }
            other => other,
        });
    }
    Ok(result)
}

/// Runs `commitpoint verify` on the stopped server's file.
fn verify(db: &Path) -> VerifyOutcome {
    let stdout = match run_verify(db, VERIFY_TIMEOUT) {
        Ok(stdout) => stdout,
        Err(problem) => return VerifyOutcome::Problem(problem),
    };
    let extractions =
        stdout.lines().find_map(|l| l.trim().strip_prefix("extractions:")).and_then(|n| n.trim().parse().ok());
    match extractions {
        Some(extractions) => VerifyOutcome::Ok { extractions },
        None => VerifyOutcome::Problem(format!("cannot read verify's report: {stdout}")),
    }
}

// ---------------------------------------------------------------------------------------
// One client: one keep-alive connection, requests back to back

#[derive(Debug)]
struct ClientStats {
    requests: u64,
    created: u64,
    duplicates: u64,
    created_total: u64,
    latencies: Vec<u32>,
    errors: ErrorCounts,
    finished: Instant,
}

type Sender = http1::SendRequest<Full<Bytes>>;

async fn connect(addr: SocketAddr) -> Result<(Sender, tokio::task::JoinHandle<()>)> {
    let stream = tokio::net::TcpStream::connect(addr).await?;
    stream.set_nodelay(true)?;
    let (sender, connection) = http1::handshake(TokioIo::new(stream)).await?;
    let driver = tokio::spawn(async move {
        let _ = connection.await;
    });
    Ok((sender, driver))
}

/// splitmix64: a deterministic per-client choice of new vs duplicate.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

const FILLER: &str = "The change moves the retry loop out of the handler and into the queue consumer; \
the reviewer asks whether the lease is still renewed when a batch is split, notes a missing test \
for the empty-batch path, and flags an unchecked index in the parser. ";

/// The request body for source `n` of client `client`; identical bytes every time.
fn body(client: usize, n: u64, content_bytes: usize) -> Bytes {
    let mut content = format!("PR c{client}-{n} revision 1. ");
    while content.len() < content_bytes {
        let take = (content_bytes - content.len()).min(FILLER.len());
        content.push_str(&FILLER[..take]);
    }
    let body = serde_json::json!({
        "tenant": TENANT,
        "source_id": format!("bench/pr-{client}-{n}"),
        "schema": SCHEMA,
        "content": content,
    });
    Bytes::from(body.to_string())
}

enum Outcome {
    Acked { created: bool },
    Rejected { status: u16, text: String },
    Mismatch { text: String },
}

async fn send(sender: &mut Sender, host: &str, body: Bytes, expect_created: bool) -> Result<Outcome> {
    sender.ready().await?;
    let request = hyper::Request::post("/v1/extractions")
        .header(HOST, host)
        .header(CONTENT_TYPE, "application/json")
        .body(Full::new(body))?;
    let response = sender.send_request(request).await?;
    let status = response.status();
    let bytes = response.into_body().collect().await?.to_bytes();
    let text = || String::from_utf8_lossy(&bytes[..bytes.len().min(300)]).into_owned();
    if !status.is_success() {
        return Ok(Outcome::Rejected { status: status.as_u16(), text: text() });
    }
    let created = if status.as_u16() == 201 && contains(&bytes, b"\"created\":true") {
        true
    } else if status.as_u16() == 200 && contains(&bytes, b"\"created\":false") {
        false
    } else {
        return Ok(Outcome::Mismatch { text: format!("HTTP {status} {}", text()) });
    };
    if created != expect_created {
        return Ok(Outcome::Mismatch {
            text: format!(
                "sent a {} source, got HTTP {status} {}",
                if expect_created { "new" } else { "re-sent" },
                text()
            ),
        });
    }
    Ok(Outcome::Acked { created })
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}

async fn client(id: usize, plan: Arc<Plan>) -> ClientStats {
    let mut stats = ClientStats {
        requests: 0,
        created: 0,
        duplicates: 0,
        created_total: 0,
        latencies: Vec::new(),
        errors: ErrorCounts::default(),
        finished: Instant::now(),
    };
    let host = plan.addr.to_string();
    let mut rng = Rng(0x00c0_ffee ^ (id as u64).wrapping_mul(0x1000_0000_01b3));
    // Sources this client has had acknowledged as created; duplicates re-send one of them.
    let mut acknowledged: Vec<u64> = Vec::new();
    let mut next_new = 0u64;
    let mut connection: Option<(Sender, tokio::task::JoinHandle<()>)> = None;

    while let Some(measured) = plan.next() {
        let (sender, _) = match &mut connection {
            Some(c) => c,
            None => match connect(plan.addr).await {
                Ok(c) => connection.insert(c),
                Err(e) => {
                    stats.errors.connection += 1;
                    stats.errors.sample(format!("connect: {e}"));
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        let duplicate = !acknowledged.is_empty() && rng.below(100) < plan.dup_percent;
        let n = if duplicate {
            acknowledged[rng.below(acknowledged.len() as u64) as usize]
        } else {
            next_new += 1;
            next_new
        };
        let body = body(id, n, plan.content_bytes);
        let started = Instant::now();
        let outcome = tokio::time::timeout(REQUEST_TIMEOUT, send(sender, &host, body, !duplicate)).await;
        let latency = started.elapsed();
        if measured {
            stats.requests += 1;
        }
        match outcome {
            Ok(Ok(Outcome::Acked { created })) => {
                if created {
                    stats.created_total += 1;
                    acknowledged.push(n);
                }
                if measured {
                    stats.latencies.push(micros(latency));
                    if created {
                        stats.created += 1;
                    } else {
                        stats.duplicates += 1;
                    }
                }
            }
            Ok(Ok(Outcome::Rejected { status, text })) => {
                stats.errors.status(status);
                stats.errors.sample(format!("HTTP {status}: {text}"));
            }
            Ok(Ok(Outcome::Mismatch { text })) => {
                stats.errors.mismatched += 1;
                stats.errors.sample(text);
            }
            Ok(Err(e)) => {
                stats.errors.connection += 1;
                stats.errors.sample(format!("request: {e}"));
                connection = None;
            }
            Err(_) => {
                stats.errors.timeouts += 1;
                stats.errors.sample(format!("no answer within {REQUEST_TIMEOUT:?}"));
                connection = None;
            }
        }
    }
    stats.finished = Instant::now();
    // Close the connection so the server's graceful shutdown has nothing to wait for.
    if let Some((sender, driver)) = connection {
        drop(sender);
        let _ = tokio::time::timeout(Duration::from_secs(5), driver).await;
    }
    stats
}

// ---------------------------------------------------------------------------------------
// Statistics and printing

fn fmt_pct(v: Option<f64>) -> String {
    v.map_or_else(|| "?".to_string(), |v| format!("{v:.0}%"))
}

fn print_levels(levels: &[LevelResult], preloaded: bool) {
    println!("intake: POST /v1/extractions, each 2xx acknowledged after a Durability::Immediate commit");
    println!(
        "  {:>7} {:>9} {:>8} {:>7} {:>7} {:>9} {:>9} {:>9} {:>9} {:>6} {:>7} {:>6} {:>7} {:>8} {:>8}",
        "clients",
        "acked/s",
        "requests",
        "201 new",
        "200 dup",
        "mean",
        "p50",
        "p99",
        "max",
        "errors",
        "server",
        "bench",
        "machine",
        "KiB/ack",
        "wchar"
    );
    for l in levels {
        if let Some(reason) = &l.failure {
            println!("  {:>7} FAILED: {reason}", l.clients);
            continue;
        }
        println!(
            "  {:>7} {:>9.0} {:>8} {:>7} {:>7} {:>9} {:>9} {:>9} {:>9} {:>6} {:>7} {:>6} {:>7} {:>8} {:>8}",
            l.clients,
            l.rate(),
            l.requests,
            l.created,
            l.duplicates,
            fmt_us(l.latencies.mean),
            fmt_us(l.latencies.p50),
            fmt_us(l.latencies.p99),
            fmt_us(l.latencies.max),
            l.errors.total(),
            fmt_pct(l.cpu.server),
            fmt_pct(l.cpu.bench),
            fmt_pct(l.cpu.machine),
            l.write_bytes
                .map_or_else(|| "?".to_string(), |b| format!("{:.1}", b as f64 / 1024.0 / l.acked().max(1) as f64)),
            l.wchar.map_or_else(|| "?".to_string(), |b| format!("{:.1}", b as f64 / 1024.0 / l.acked().max(1) as f64)),
        );
        if l.failure.is_none() {
            let store = if preloaded { "preloaded" } else { "empty" };
            common::figures::record(&format!("intake.{store}.cp.rate.c{}", l.clients), l.rate());
            common::figures::record(&format!("intake.{store}.cp.p99_ms.c{}", l.clients), l.latencies.p99 / 1000.0);
            if let Some(bytes) = l.wchar {
                let per_ack = bytes as f64 / 1024.0 / l.acked().max(1) as f64;
                common::figures::record(&format!("intake.{store}.cp.wchar_kib_per_ack.c{}", l.clients), per_ack);
            }
            if let Some(bytes) = l.write_bytes {
                let per_ack = bytes as f64 / 1024.0 / l.acked().max(1) as f64;
                common::figures::record(&format!("intake.{store}.cp.write_kib_per_ack.c{}", l.clients), per_ack);
            }
        }
    }
    println!(
        "  (requests and latencies: measured window; errors: whole level, warm-up included;\n   \
         server/bench: CPU as % of one core; machine: busy share of all cores, including other load;\n   \
         KiB/ack: write_bytes of the server's /proc/PID/io over the window per acknowledged intake;\n   \
         wchar: the same for wchar, bytes the server handed to pwrite and to its sockets)"
    );
    println!();
    for l in levels.iter().filter(|l| l.failure.is_none()) {
        let mut notes = String::new();
        if l.errors.total() > 0 {
            let _ = write!(notes, "\n    errors: {}", l.errors.describe());
            for s in &l.errors.samples {
                let _ = write!(notes, "\n      e.g. {s}");
            }
        }
        if let Some(exit) = &l.server_exit {
            let _ = write!(notes, "\n    server: {exit}");
        }
        for p in l.server_log_problems.iter().take(MAX_SAMPLES) {
            let _ = write!(notes, "\n    server log: {p}");
        }
        let verify = match &l.verify {
            None => "not run".to_string(),
            Some(VerifyOutcome::Ok { extractions }) => {
                format!("ok, {extractions} extractions = 201s acknowledged")
            }
            Some(VerifyOutcome::Problem(p)) => format!("PROBLEM: {p}"),
        };
        let shutdown = l.shutdown.map_or_else(|| "?".to_string(), |d| fmt_us(d.as_secs_f64() * 1e6));
        println!(
            "  {:>3} clients: {:.2} s measured, SIGTERM→exit {shutdown}, verify {verify}{notes}",
            l.clients,
            l.elapsed.as_secs_f64(),
        );
    }
    println!();
}

fn print_summary(probes: &[Probe], levels: &[LevelResult]) {
    let ok = |l: &&LevelResult| l.failure.is_none();
    if let (Some(single), Some(disk)) = (levels.iter().filter(ok).find(|l| l.clients == 1), probes.first()) {
        println!(
            "single client {:.0} acks/s (mean {}) vs the disk's {:.0} fdatasync/s (mean {}): {:.2} acks per raw fsync",
            single.rate(),
            fmt_us(single.latencies.mean),
            disk.rate(),
            fmt_us(disk.latencies.mean),
            single.rate() / disk.rate().max(1e-9),
        );
    }
    if let Some(top) = levels.iter().filter(ok).find(|l| l.clients == 128) {
        let rate_ok = top.rate() >= 12_000.0;
        let p99_ok = top.latencies.p99 < 25_000.0;
        println!(
            "target (report only): >= 12,000 acks/s at 128 clients with p99 < 25 ms -> {:.0} acks/s ({}), p99 {} ({})",
            top.rate(),
            if rate_ok { "met" } else { "MISSED" },
            fmt_us(top.latencies.p99),
            if p99_ok { "met" } else { "MISSED" },
        );
    }
    let errors: u64 = levels.iter().map(|l| l.errors.total()).sum();
    let clean = levels.iter().all(LevelResult::is_clean);
    println!("errors: {errors}{}", if clean { "" } else { " — NOT CLEAN (see above); exit status 1" });
    let _ = std::io::stdout().flush();
}
