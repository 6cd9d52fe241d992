//! `commitpoint migrate-store --from FILE.redb --to postgres://…`: copies a whole redb
//! store into an empty PostgreSQL database, offline, then compares the two through both
//! backends' read APIs (docs/SCALE-OUT.md, "Moving from redb to PostgreSQL").
//!
//! Exit codes: 0 copied and compared equal; 1 the source holds what PostgreSQL has no
//! place for yet (nothing written), or the copy differs (left marked unverified, which
//! `serve` refuses); 64 usage; 69 the database cannot be reached or is in use; 74 the
//! file is missing, unreadable or held by a running server; 78 configuration (no target,
//! a password in the URL, an unreadable password reference, a non-empty target).

use std::io::IsTerminal;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::{Arc, Mutex};

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

use super::{EXIT_CONFIG, EXIT_IO, EXIT_PROBLEMS, EXIT_SOFTWARE, EXIT_UNAVAILABLE, EXIT_USAGE};
use crate::app::config::{DEFAULT_CONFIG_PATH, Overrides, ServeOptions, StoreChoice};
use crate::store::postgres::{ImportError, PgOptions};
use crate::store::{MigrateError, MigrateProgress, MigrateReport};

#[derive(Debug, clap::Args)]
pub(super) struct Args {
    /// The redb file to copy (commitpoint.redb). No server may be running on it.
    #[arg(long)]
    from: PathBuf,
    /// The empty PostgreSQL database, `postgres://user@host:5432/db`; overrides `[store]
    /// url`. Never with a password in it: that comes from `[store] password_env`, `_file`
    /// or `_credential` in the configuration file.
    #[arg(long, env = "COMMITPOINT_STORE_URL")]
    to: Option<String>,
    /// Configuration file whose `[store]` names the password (and the URL, without --to).
    #[arg(long, env = "COMMITPOINT_CONFIG")]
    config: Option<PathBuf>,
}

pub(super) async fn run(args: Args) -> anyhow::Result<ExitCode> {
    let from_text = args.from.to_string_lossy();
    if from_text.starts_with("postgres://") || from_text.starts_with("postgresql://") {
        eprintln!("commitpoint: --from takes the redb file; the PostgreSQL database is --to");
        return Ok(ExitCode::from(EXIT_USAGE));
    }
    let shown = args.from.display().to_string();
    if !args.from.is_file() {
        let missing = std::io::Error::new(std::io::ErrorKind::NotFound, "no such file");
        return Err(anyhow::Error::new(missing).context(shown));
    }
    let target = match target(&args) {
        Ok(target) => target,
        Err(message) => {
            eprintln!("commitpoint: {message}");
            return Ok(ExitCode::from(EXIT_CONFIG));
        }
    };
    let url = target.url.clone();
    let progress = Arc::new(Bar::default());
    let outcome = crate::store::migrate_store(&args.from, &target, progress.clone()).await;
    progress.done();
    match outcome {
        Ok(report) => {
            print_report(&shown, &url, &report);
            Ok(ExitCode::SUCCESS)
        }
        Err(e) => {
            let code = exit_code(&e);
            eprintln!("commitpoint: {shown} → {url}: {:#}", anyhow::Error::new(e));
            Ok(ExitCode::from(code))
        }
    }
}

/// The database and its password, resolved as `serve` resolves `[store]`.
fn target(args: &Args) -> Result<PgOptions, String> {
    let explicit = args.config.is_some();
    let path = args.config.clone().unwrap_or_else(|| PathBuf::from(DEFAULT_CONFIG_PATH));
    let overrides = Overrides { store_url: args.to.clone(), ..Overrides::default() };
    let options = ServeOptions::load(&path, explicit, overrides).map_err(|e| format!("{e:#}"))?;
    match options.store {
        StoreChoice::Redb => Err("no PostgreSQL target: give --to postgres://user@host:5432/db (or \
             COMMITPOINT_STORE_URL), or a --config whose [store] has backend = \"postgres\""
            .into()),
        StoreChoice::Postgres { url, password, .. } => {
            let password = password.map(|p| p.load_secret()).transpose().map_err(|e| format!("store password: {e}"))?;
            Ok(PgOptions { url, password })
        }
    }
}

fn exit_code(e: &MigrateError) -> u8 {
    match e {
        MigrateError::Source { .. } => EXIT_IO,
        MigrateError::Unmappable(_) | MigrateError::Mismatch(_) | MigrateError::Target(ImportError::Counts(_)) => {
            EXIT_PROBLEMS
        }
        MigrateError::Target(ImportError::NotEmpty(_)) => EXIT_CONFIG,
        MigrateError::Target(ImportError::InUse) => EXIT_UNAVAILABLE,
        MigrateError::Target(ImportError::Store(e)) | MigrateError::Store(e) => match e {
            crate::store::Error::SchemaTooNew { .. } => EXIT_CONFIG,
            crate::store::Error::Postgres { context, .. } if context.starts_with("cannot connect") => EXIT_UNAVAILABLE,
            _ => EXIT_SOFTWARE,
        },
    }
}

fn print_report(from: &str, to: &str, report: &MigrateReport) {
    let secs = report.copy.as_secs_f64().max(1e-3);
    println!("migrated {from} → {to}");
    for (table, rows) in &report.tables {
        println!("  {table:<20} {rows:>10}");
    }
    println!("copy: {} rows in {:.1} s ({:.0} rows/s), one transaction", report.rows, secs, report.rows as f64 / secs);
    let c = &report.comparison;
    println!(
        "comparison passed in {:.1} s: {} extractions, {} findings, {} raw results, {} ledger entries, \
         {} outbox events, {} open batches read back equal from both stores",
        report.compare.as_secs_f64(),
        c.extractions,
        c.findings,
        c.results,
        c.ledger_entries,
        c.outbox_events,
        c.open_batches
    );
    println!("verify passed on the copy in {:.1} s: every invariant holds", report.verify.as_secs_f64());
    for note in &report.not_copied {
        println!("not copied: {note}");
    }
    println!("the database is marked verified; start serve with [store] backend = \"postgres\"");
}

/// A progress bar on stderr, only when stderr is a terminal.
#[derive(Default)]
struct Bar(Mutex<Option<ProgressBar>>);

impl Bar {
    fn done(&self) {
        if let Some(bar) = self.0.lock().ok().and_then(|mut b| b.take()) {
            bar.finish_and_clear();
        }
    }
}

impl MigrateProgress for Bar {
    fn phase(&self, name: &'static str, total: u64) {
        let target =
            if std::io::stderr().is_terminal() { ProgressDrawTarget::stderr() } else { ProgressDrawTarget::hidden() };
        let bar = ProgressBar::with_draw_target(Some(total), target);
        bar.set_style(
            ProgressStyle::with_template("{msg:>10} {bar:40} {pos}/{len} rows [{elapsed}, {per_sec}]")
                .unwrap_or_else(|_| ProgressStyle::default_bar()),
        );
        bar.set_message(name);
        if let Ok(mut current) = self.0.lock()
            && let Some(previous) = current.replace(bar)
        {
            previous.finish_and_clear();
        }
    }

    fn advance(&self, steps: u64) {
        if let Ok(current) = self.0.lock()
            && let Some(bar) = current.as_ref()
        {
            bar.inc(steps);
        }
    }
}

impl std::fmt::Debug for Bar {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Bar")
    }
}
