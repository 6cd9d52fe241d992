//! The torture's `serve` command line and its offline `verify`, which keeps a failing file
//! and the logs. The process guard (SIGKILL on drop, bounded waits) is
//! `support::process`, shared with the integration tests.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use crate::support::process::{BIN, run_bounded};
pub use crate::support::process::{Server, db_path};

/// The key the simulator is given and the server sends (any key would do; one is set so
/// the server's provider configuration is the production one).
pub const SIM_KEY: &str = "sk-torture";
const VERIFY_TIMEOUT: Duration = Duration::from_secs(120);

/// `serve --provider openai` against the simulator at `sim_base_url`, batches of at most
/// 8 members formed within 200 ms and jobs polled every 100 ms, so that a round of about
/// a second sees batches formed, submitted, polled and ingested; `config` adds prices,
/// the outbox sink and the webhook endpoint.
pub fn start(data_dir: &Path, sim_base_url: &str, config: &Path) -> Server {
    let mut cmd = Command::new(BIN);
    cmd.arg("serve")
        .arg("--data-dir")
        .arg(data_dir)
        .arg("--config")
        .arg(config)
        .args(["--listen", "127.0.0.1:0", "--provider", "openai", "--provider-base-url", sim_base_url])
        .args(["--provider-key-env", "TORTURE_SIM_KEY", "--batch-max-size", "8", "--batch-max-wait", "200ms"])
        .args(["--poll-interval", "100ms"])
        .env("TORTURE_SIM_KEY", SIM_KEY)
        .env(crate::config::SINK_SECRET_ENV, crate::config::SINK_SECRET)
        .env("COMMITPOINT_LOG", "info")
        .env_remove("COMMITPOINT_FAILPOINTS")
        .env_remove("COMMITPOINT_CONFIG")
        .stdin(Stdio::null());
    Server::spawn(cmd, data_dir)
}

/// `commitpoint verify FILE` must exit 0 and say every invariant holds; returns its report.
pub fn assert_verifies(db: &Path, when: &str, log: &str) -> String {
    verify(db, when, log).unwrap_or_else(|failure| panic!("{failure}"))
}

/// Runs `commitpoint verify FILE`: `Ok(report)` when it exits 0 and says every invariant
/// holds. Otherwise the file and `log` (every server's stderr so far) are kept under the
/// target directory and `Err` describes the failure, with the log's tail.
pub fn verify(db: &Path, when: &str, log: &str) -> Result<String, String> {
    let mut cmd = Command::new(BIN);
    cmd.arg("verify").arg(db);
    let output = run_bounded(cmd, VERIFY_TIMEOUT).unwrap_or_else(|failure| panic!("verify {when}: {failure}"));
    let (out, err) = (String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr));
    if output.status.code() != Some(0) || !out.contains("ok: every invariant holds") {
        let kept = keep(db, log);
        return Err(format!(
            "verify {when} failed ({:?}); kept {kept}\nstdout:\n{out}\nstderr:\n{err}\n\
             server log (tail):\n{}",
            output.status,
            tail(log, 60)
        ));
    }
    Ok(out.into_owned())
}

/// Copies a database that failed verification, and the logs, to where they outlive the
/// temp directory; returns where.
fn keep(db: &Path, log: &str) -> String {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("torture-failures");
    let stem = dir.join(format!("{}-round{}", std::process::id(), crate::context::round()));
    let (file, logs) = (stem.with_extension("redb"), stem.with_extension("log"));
    let kept =
        std::fs::create_dir_all(&dir).and_then(|()| std::fs::copy(db, &file)).and_then(|_| std::fs::write(&logs, log));
    match kept {
        Ok(()) => format!("{} and {}", file.display(), logs.display()),
        Err(e) => format!("nothing (cannot copy: {e})"),
    }
}

fn tail(text: &str, lines: usize) -> String {
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

/// The number on the report line `name: N` (e.g. `extractions: 12`, `  committed: 3`).
pub fn report_count(report: &str, name: &str) -> u64 {
    report.lines().find_map(|l| l.trim().strip_prefix(name)?.strip_prefix(": ")?.trim().parse().ok()).unwrap_or(0)
}
