//! Scale benchmark: what the operator's request paths cost once the store is large.
//!
//! `cargo bench --bench scale` fills a fresh store through the library with N extractions
//! (default 1,000,000): half of them are claimed and committed, half stay pending, spread
//! over T tenants (default 1,000, as many as the claim target names: the fair pick's cost
//! grows with the (schema, tenant) flows holding pending work, not only with N); 10 more
//! pending extractions of a second schema arrive last, behind all the others. It reopens
//! the store (the open recounts the per-state counters), then times, at that size:
//!
//! * status (`counts_by_state`, what `GET /v1/stats` and `ctl status` read);
//! * a list page of 100 (pending, by tenant, and unfiltered), from the middle of the store;
//! * a claim of 100 (any schema), and a claim that asks for the rare schema;
//! * a batch intent of 1,000 members, for the common schema and for the rare one.
//!
//! Writes include their group commit's fsync. It prints each figure; it exits 1 only if
//! a step fails, and never asserts a target (status, list < 5 ms; claim of 100 < 10 ms).
//!
//! Then the idle footprint (issue 14, item 5): the release binary serves the same file
//! with a simulated OpenAI provider configured (and paused, as `ctl pause` would, so the
//! half-million pending extractions are not submitted while the server is watched). After
//! a settling time it reads the process's CPU time (utime + stime), its threads' context
//! switches, VmRSS and VmHWM from `/proc`, over an idle window (targets: no CPU between
//! polls, RSS under 64 MiB).
//!
//! | variable | default | meaning |
//! |---|---|---|
//! | `COMMITPOINT_BENCH_QUICK=1` | off | smoke run: N = 20,000 |
//! | `COMMITPOINT_BENCH_EXTRACTIONS` | 1000000 (quick: 20000) | N |
//! | `COMMITPOINT_BENCH_TENANTS` | 1000 | T (100 compares with the figures before the fair pick) |
//! | `COMMITPOINT_BENCH_DIR` | `target/tmp` | parent of the data directory (avoid tmpfs) |
//! | `COMMITPOINT_BENCH_CLAIMS` | 20 | claims of 100 timed (more, to profile them) |
//! | `COMMITPOINT_BENCH_IDLE_SECS` | 10 (quick: 3) | idle window; `0` skips the idle footprint |

use commitpoint::store::seam::{Batches, Extractions};
use std::future::Future;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use commitpoint::domain::identity::{ExtractionId, SourceHash};
use commitpoint::domain::lifecycle::StateName;
use commitpoint::store::{
    Authority, ClaimRequest, IntentOutcome, IntentRequest, ListFilter, NewExtraction, PostResult, Store, Submission,
    WorkFilter,
};
use futures_util::StreamExt;
use serde_json::json;

#[path = "common/mod.rs"]
mod common;

use commitpoint::simulator::{Simulator, SimulatorConfig};
use common::{BINARY, Result, ServerProcess, env_var, filesystem_of, process_cpu_secs};

const SCHEMA: &str = "code-review@1";
const RARE_SCHEMA: &str = "rare@1";
const RARE: u64 = 10;
const TENANTS: u64 = 1000;
const CONCURRENCY: usize = 256;

pub fn main() -> ExitCode {
    let runtime = match tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("scale bench: cannot start the tokio runtime: {e}");
            return ExitCode::from(2);
        }
    };
    match runtime.block_on(run()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("scale bench: {e}");
            ExitCode::from(1)
        }
    }
}

async fn run() -> Result<()> {
    let quick = env_var("COMMITPOINT_BENCH_QUICK").is_some_and(|v| v != "0");
    let n: u64 = match env_var("COMMITPOINT_BENCH_EXTRACTIONS") {
        Some(v) => v.parse().map_err(|e| format!("COMMITPOINT_BENCH_EXTRACTIONS={v:?}: {e}"))?,
        None if quick => 20_000,
        None => 1_000_000,
    };
    let tenants: u64 = match env_var("COMMITPOINT_BENCH_TENANTS") {
        Some(v) => v.parse().map_err(|e| format!("COMMITPOINT_BENCH_TENANTS={v:?}: {e}"))?,
        None => TENANTS,
    };
    if tenants == 0 {
        return Err("COMMITPOINT_BENCH_TENANTS=0: the extractions need a tenant".into());
    }
    let parent = env_var("COMMITPOINT_BENCH_DIR").map_or_else(|| PathBuf::from("target/tmp"), PathBuf::from);
    std::fs::create_dir_all(&parent)?;
    let work = tempfile::Builder::new().prefix("scale-bench-").tempdir_in(&parent)?;
    let data = work.path().join("data");
    println!(
        "scale bench{}: {n} extractions ({} committed, {} pending) over {tenants} tenants, + {RARE} pending of {RARE_SCHEMA}",
        if quick { " (QUICK)" } else { "" },
        n / 2,
        n - n / 2
    );
    println!("data directory: {} ({})", data.display(), common::Filesystem::describe(filesystem_of(&parent).as_ref()));

    let started = Instant::now();
    fill(&data, n, tenants).await?;
    common::figures::record("scale.extractions", n as f64);
    println!("fill (library: intake, claim, commit): {:.1} s", started.elapsed().as_secs_f64());

    let started = Instant::now();
    let (store, guard) = Store::open(&data, 16 << 20)?;
    println!("open (recounts the per-state counters): {:.1} ms", ms(started.elapsed()));
    let result = measure(&store, n).await;
    // The idle server's provider stays paused: see the module comment.
    let paused = store.set_provider_paused(IDLE_PROVIDER.into(), true).await;
    drop(store);
    tokio::task::spawn_blocking(move || guard.join()).await?;
    result?;
    paused?;
    let idle_secs: u64 = match env_var("COMMITPOINT_BENCH_IDLE_SECS") {
        Some(v) => v.parse().map_err(|e| format!("COMMITPOINT_BENCH_IDLE_SECS={v:?}: {e}"))?,
        None if quick => 3,
        None => 10,
    };
    if idle_secs > 0 {
        idle(work.path(), &data, Duration::from_secs(idle_secs)).await?;
    }
    Ok(())
}

const IDLE_PROVIDER: &str = "sim";
const IDLE_KEY_ENV: &str = "COMMITPOINT_BENCH_SCALE_KEY";
/// Startup (the open recounts nothing, but the runtime and caches warm up) before watching.
const IDLE_SETTLE: Duration = Duration::from_secs(2);

/// Serves the large file with a provider configured and watches the process do nothing.
async fn idle(work: &Path, data: &Path, window: Duration) -> Result<()> {
    let sim = Simulator::start(std::net::SocketAddr::from(([127, 0, 0, 1], 0)), SimulatorConfig::default()).await?;
    let config = work.join("idle.toml");
    std::fs::write(
        &config,
        format!(
            "[providers.{IDLE_PROVIDER}]\nkind = \"openai\"\nbase_url = \"{}\"\napi_key_env = \"{IDLE_KEY_ENV}\"\n",
            sim.base_url()
        ),
    )?;
    let mut cmd = std::process::Command::new(BINARY);
    cmd.arg("serve").arg("--config").arg(&config).arg("--data-dir").arg(data);
    cmd.args(["--listen", "127.0.0.1:0"]).env(IDLE_KEY_ENV, "x");
    let started = Instant::now();
    let mut server = ServerProcess::start(cmd, &work.join("idle-server.log"))?;
    println!("idle server: ready {:.0} ms after spawn (pid {})", ms(started.elapsed()), server.pid());
    tokio::time::sleep(IDLE_SETTLE).await;
    let pid = server.pid().to_string();
    let (cpu_before, switches_before) = (process_cpu_secs(&pid), context_switches(&pid));
    let watched = Instant::now();
    tokio::time::sleep(window).await;
    let (cpu_after, switches_after) = (process_cpu_secs(&pid), context_switches(&pid));
    let secs = watched.elapsed().as_secs_f64();
    let status = |field: &str| status_mib(&pid, field).map_or_else(|| "?".to_string(), |m| format!("{m:.1} MiB"));
    let cpu = match (cpu_before, cpu_after) {
        (Some(a), Some(b)) => format!("{:.0} ms ({:.2}% of one core)", (b - a) * 1000.0, (b - a) / secs * 100.0),
        _ => "?".to_string(),
    };
    let switches = match (switches_before, switches_after) {
        (Some(a), Some(b)) => format!("{} ({:.1}/s)", b.saturating_sub(a), b.saturating_sub(a) as f64 / secs),
        _ => "?".to_string(),
    };
    println!(
        "idle {secs:.1} s (provider configured, paused; {n} threads): CPU {cpu}, context switches {switches}",
        n = thread_count(&pid).unwrap_or(0)
    );
    println!("idle RSS: VmRSS {}, VmHWM {} (target: under 64 MiB)", status("VmRSS:"), status("VmHWM:"));
    if let (Some(a), Some(b)) = (cpu_before, cpu_after) {
        common::figures::record("idle.cpu_ms", (b - a) * 1000.0);
    }
    if let (Some(a), Some(b)) = (switches_before, switches_after) {
        common::figures::record("idle.context_switches", b.saturating_sub(a) as f64);
    }
    if let Some(mib) = status_mib(&pid, "VmHWM:") {
        common::figures::record("idle.vmhwm_mib", mib);
    }
    common::figures::record("idle.window_s", secs);
    let stopped = tokio::task::block_in_place(|| server.stop());
    sim.stop().await;
    let (exit, _) = stopped?;
    if !exit.success() {
        return Err(format!("the idle server exited with {exit}: {}", server.log_tail()).into());
    }
    Ok(())
}

/// A field of /proc/PID/status, in MiB.
fn status_mib(pid: &str, field: &str) -> Option<f64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with(field))?;
    let kib: f64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib / 1024.0)
}

/// Voluntary + involuntary context switches of every thread: how often the process woke.
fn context_switches(pid: &str) -> Option<u64> {
    let mut total = 0;
    for task in std::fs::read_dir(format!("/proc/{pid}/task")).ok()? {
        let status = std::fs::read_to_string(task.ok()?.path().join("status")).ok()?;
        for line in status.lines() {
            if line.starts_with("voluntary_ctxt_switches:") || line.starts_with("nonvoluntary_ctxt_switches:") {
                total += line.split_whitespace().nth(1)?.parse::<u64>().ok()?;
            }
        }
    }
    Some(total)
}

fn thread_count(pid: &str) -> Option<usize> {
    Some(std::fs::read_dir(format!("/proc/{pid}/task")).ok()?.count())
}

async fn measure(store: &Store, n: u64) -> Result<()> {
    let counts = store.counts_by_state().await?;
    let pending = counts.iter().find(|c| c.state == StateName::Pending).map_or(0, |c| c.count);
    println!(
        "counts: {}",
        counts.iter().map(|c| format!("{} {}", c.state.as_str(), c.count)).collect::<Vec<_>>().join(", ")
    );
    report("status (counts_by_state)", &time(200, || store.counts_by_state()).await?);

    let middle = n / 2;
    let page = |tenant: Option<String>, state: Option<StateName>| ListFilter {
        tenant,
        state,
        limit: 100,
        after: middle,
        latest: false,
        newest_first: false,
    };
    report("list page of 100, pending", &time(100, || store.list(page(None, Some(StateName::Pending)))).await?);
    report("list page of 100, one tenant", &time(100, || store.list(page(Some("t7".into()), None))).await?);
    report("list page of 100, unfiltered", &time(100, || store.list(page(None, None))).await?);
    let newest = || ListFilter { newest_first: true, ..page(None, None) };
    report("list page of 100, unfiltered, newest first", &time(100, || store.list(newest())).await?);
    report(
        "list page of 100, one tenant, pending",
        &time(20, || store.list(page(Some("t7".into()), Some(StateName::Pending)))).await?,
    );

    let claim = |schema: Option<&str>| ClaimRequest {
        worker: "bench".into(),
        limit: 100,
        lease_ms: 3_600_000,
        schema: schema.map(str::to_string),
        estimate: None,
        scope: Default::default(),
    };
    let claims = match env_var("COMMITPOINT_BENCH_CLAIMS") {
        Some(v) => v.parse().map_err(|e| format!("COMMITPOINT_BENCH_CLAIMS={v:?}: {e}"))?,
        None => 20,
    };
    report("claim of 100, any schema", &time(claims, || store.claim(claim(None))).await?);
    report(
        &format!("claim of 100, schema {RARE_SCHEMA} ({RARE} of them behind {pending} others)"),
        &time(1, || store.claim(claim(Some(RARE_SCHEMA)))).await?,
    );

    let intent = |schema: &str| IntentRequest {
        provider: "bench".into(),
        schema: schema.into(),
        accept: WorkFilter(Arc::new(|_: &str, _: &str| true)),
        max_size: 1000,
        max_content_bytes: u64::MAX,
        max_wait_ms: 0,
        minimum: None,
        estimate: None,
    };
    let samples = time(5, || async {
        match store.create_intent(intent(SCHEMA)).await? {
            IntentOutcome::Created(_) => Ok(()),
            other => Err(commitpoint::store::Error::Corrupt { kind: "bench", reason: format!("{other:?}") }),
        }
    })
    .await?;
    report(&format!("batch intent of 1000, schema {SCHEMA}"), &samples);
    // The rare schema's work was claimed above; a fresh one asks for something absent.
    report(
        &format!("batch intent, schema absent@1 (none pending among {pending})"),
        &time(1, || store.create_intent(intent("absent@1"))).await?,
    );
    Ok(())
}

/// Runs `op` `reps` times, one after another, and returns each duration, sorted.
async fn time<T, E, F, Fut>(reps: usize, mut op: F) -> Result<Vec<Duration>>
where
    E: std::error::Error + Send + Sync + 'static,
    F: FnMut() -> Fut,
    Fut: Future<Output = std::result::Result<T, E>>,
{
    let mut samples = Vec::with_capacity(reps);
    for _ in 0..reps {
        let started = Instant::now();
        op().await?;
        samples.push(started.elapsed());
    }
    samples.sort();
    Ok(samples)
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

fn report(what: &str, sorted: &[Duration]) {
    let at = |q: f64| sorted.get(((sorted.len() as f64 - 1.0) * q).round() as usize).copied().unwrap_or_default();
    common::figures::record(&format!("scale.{what}.median_ms"), ms(at(0.5)));
    common::figures::record(&format!("scale.{what}.p99_ms"), ms(at(0.99)));
    println!(
        "{what}: median {:.2} ms, p99 {:.2} ms, max {:.2} ms ({} runs)",
        ms(at(0.5)),
        ms(at(0.99)),
        ms(at(1.0)),
        sorted.len()
    );
}

fn new_extraction(i: u64, tenants: u64, schema: &str) -> NewExtraction {
    let tenant = format!("t{}", i % tenants);
    let source = format!("src/{i}.rs");
    let content = format!("fn f{i}() {{ let x = run().unwrap(); }}");
    let hash = SourceHash::compute(content.as_bytes(), schema);
    let id = ExtractionId::compute(&tenant, &source, &hash, schema);
    NewExtraction {
        id,
        tenant,
        source_id: source,
        source_hash: hash,
        schema: schema.into(),
        metadata_json: None,
        content,
    }
}

/// N intakes, claims of 1000 and a committed result for the first half, then the rare
/// schema's few, straight through the store (the service's checks are not what is measured).
async fn fill(data: &Path, n: u64, tenants: u64) -> Result<()> {
    let (store, guard) = Store::open(data, 16 << 20)?;
    let intakes = futures_util::stream::iter(0..n).map(|i| {
        let store = store.clone();
        async move { store.intake(new_extraction(i, tenants, SCHEMA)).await.map(|_| ()) }
    });
    let failed = intakes.buffer_unordered(CONCURRENCY).filter(|r| std::future::ready(r.is_err())).count().await;
    if failed > 0 {
        return Err(format!("{failed} intakes failed").into());
    }
    let mut committed = 0u64;
    while committed < n / 2 {
        let limit = 1000.min((n / 2 - committed) as usize);
        let request = ClaimRequest {
            worker: "bench".into(),
            limit,
            lease_ms: 3_600_000,
            schema: None,
            estimate: None,
            scope: Default::default(),
        };
        let grants = store.claim(request).await?;
        if grants.is_empty() {
            return Err(format!("only {committed} of {} could be claimed", n / 2).into());
        }
        committed += grants.len() as u64;
        let posts = futures_util::stream::iter(grants).map(|grant| {
            let store = store.clone();
            async move {
                let post = PostResult {
                    id: grant.record.id,
                    authority: Authority::Lease(grant.lease_token),
                    submission: Submission::Valid { findings: Vec::new(), output: json!({"findings": []}) },
                    charge: None,
                };
                store.post_result(post).await.map(|_| ())
            }
        });
        let failed = posts.buffer_unordered(CONCURRENCY).filter(|r| std::future::ready(r.is_err())).count().await;
        if failed > 0 {
            return Err(format!("{failed} results failed").into());
        }
    }
    for i in 0..RARE {
        store.intake(new_extraction(n + i, tenants, RARE_SCHEMA)).await?;
    }
    drop(store);
    tokio::task::spawn_blocking(move || guard.join()).await?;
    Ok(())
}
