//! The `commitpoint` command line. The only module besides `main` that uses `anyhow`.
//!
//! Exit codes (sysexits where one fits): 0 success; 1 the command ran and found a
//! problem (failed submits, `verify` found violations); 64 usage error; 69 the server
//! could not be reached; 70 an internal failure; 74 a file could not be opened or read
//! (missing, or locked by a running server); 78 a configuration error that a restart
//! will not fix.

mod backup;
mod costs;
mod ctl;
mod demo;
mod erase;
mod estimate;
mod eval;
mod export;
mod files;
mod get;
mod logging;
mod maintenance;
mod migrate;
mod provider;
mod retry;
mod serve;
mod signals;
mod simulator;
mod simulator_platform;
mod submit;
mod target;
mod verify;
mod wait;

pub use target::AdminUrl;

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use clap::{Parser, Subcommand};

pub const EXIT_PROBLEMS: u8 = 1;
pub const EXIT_USAGE: u8 = 64;
pub const EXIT_UNAVAILABLE: u8 = 69;
pub const EXIT_SOFTWARE: u8 = 70;
pub const EXIT_IO: u8 = 74;
/// A file the command would create exists already.
pub const EXIT_CANTCREAT: u8 = 73;
/// Try again: the store refused for now (a conflict, a halted writer, a shutdown).
pub const EXIT_TEMPFAIL: u8 = 75;
pub const EXIT_CONFIG: u8 = 78;

#[derive(Debug, Parser)]
#[command(name = "commitpoint", version, about = "Exactly-once LLM structured extraction at the commit point")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run the service: HTTP API on a loopback port, one redb file in the data directory.
    Serve(serve::Args),
    /// Configuration tools.
    #[command(subcommand)]
    Config(ConfigCommand),
    /// Submit files (or every file under a directory) as sources, concurrently.
    Submit(submit::Args),
    /// Operate a running server: status.
    #[command(subcommand)]
    Ctl(ctl::Command),
    /// Take a consistent backup of a running server's database into one file.
    Backup(backup::Args),
    /// A tenant's spend: fresh work, replays, validation failures and unusable answers,
    /// optionally grouped.
    Costs(costs::Args),
    /// What files would cost at each configured provider, before they are submitted.
    Estimate(estimate::Args),
    /// Provider bake-offs: send a frozen set of extractions to candidate providers, compare
    /// their answers, promote the winner's (docs/EVALUATIONS.md).
    #[command(subcommand)]
    Eval(eval::Command),
    /// Write a tenant's committed extractions and findings to a file (JSON lines or CSV).
    Export(export::Args),
    /// Print one extraction as JSON (by id, id prefix or --source), its findings
    /// (--findings), or its findings diff against the previous committed revision of its
    /// source (--diff).
    Get(get::Args),
    /// Check every commitpoint invariant: a redb file offline (with redb's own integrity
    /// check), or a PostgreSQL store with --store-url (read-only, safe while serving).
    Verify(verify::Args),
    /// Compact a database file offline (the server stopped), print its size before and
    /// after, then verify it.
    Compact { path: PathBuf },
    /// Erase a tenant on a running server: its extractions, contents, findings, results,
    /// staged answers, outbox events and webhook delivery ids.
    EraseTenant(erase::Args),
    /// Copy a redb store (the server stopped) into an empty PostgreSQL database, then
    /// compare the two record by record (docs/SCALE-OUT.md).
    MigrateStore(migrate::Args),
    /// Print every row of every table of a database file (offline), decoded.
    #[command(hide = true)]
    DebugDump { path: PathBuf },
    /// Provider tools: `provider check` asks each configured provider, with one tiny billed
    /// request per schema, whether it accepts the key, the model and the schema.
    #[command(subcommand)]
    Provider(provider::Command),
    /// Run the built-in SIMULATED OpenAI Batch API on its own (for tests and experiments).
    Simulator(simulator::Args),
    /// Self-contained demonstration: server, duplicates, dying and late workers, summary.
    Demo(demo::Args),
}

#[derive(Debug, Subcommand)]
enum ConfigCommand {
    /// Validate the configuration (file, environment, flags, schemas, key) and print the
    /// effective settings with secrets redacted. Exits 78 when something is wrong.
    Check(serve::Args),
}

pub fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            // --help and --version are not errors.
            let code = if e.use_stderr() { EXIT_USAGE } else { 0 };
            let _ = e.print();
            return ExitCode::from(code);
        }
    };
    let format = match logging::choose(&logging::Environment::of_process()) {
        Ok(format) => format,
        Err(e) => {
            // Before any log line: a typo must not silently change what operators parse.
            eprintln!("commitpoint: {e}");
            return ExitCode::from(EXIT_CONFIG);
        }
    };
    // `serve` installs the subscriber itself once its configuration says whether traces
    // are exported; nothing logs before that.
    let serving = matches!(cli.command, Command::Serve(_));
    if !serving {
        init_tracing(format, None);
    }
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("commitpoint: cannot start the async runtime: {e}");
            return ExitCode::from(EXIT_SOFTWARE);
        }
    };
    match runtime.block_on(run(cli, format)) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("commitpoint: {e:#}");
            ExitCode::from(exit_code_for(&e))
        }
    }
}

/// Maps a failure to its sysexits code by what actually went wrong.
fn exit_code_for(e: &anyhow::Error) -> u8 {
    for cause in e.chain() {
        if let Some(server) = cause.downcast_ref::<crate::app::server::Error>()
            && server.is_config()
        {
            return EXIT_CONFIG;
        }
        if cause.downcast_ref::<crate::app::config::Error>().is_some() {
            return EXIT_CONFIG;
        }
        if let Some(http) = cause.downcast_ref::<reqwest::Error>()
            && (http.is_connect() || http.is_timeout())
        {
            return EXIT_UNAVAILABLE;
        }
        // A transparent wrapper hides the store's error from the chain: ask it.
        let store = cause
            .downcast_ref::<crate::store::Error>()
            .or_else(|| cause.downcast_ref::<crate::app::server::Error>().and_then(|s| s.store()));
        if let Some(code) = store.and_then(store_exit_code) {
            return code;
        }
        if cause.downcast_ref::<std::io::Error>().is_some() {
            return EXIT_IO;
        }
    }
    EXIT_SOFTWARE
}

/// The store's failures that say more than "internal": each has its one exit code.
fn store_exit_code(e: &crate::store::Error) -> Option<u8> {
    use crate::store::Error as E;
    match e {
        E::Open { .. } | E::CreateDir { .. } | E::Io { .. } => Some(EXIT_IO),
        E::TargetExists { .. } => Some(EXIT_CANTCREAT),
        E::Conflict { .. } | E::Halted { .. } | E::Closing | E::NotDriving { .. } => Some(EXIT_TEMPFAIL),
        E::SchemaTooNew { .. } | E::SchemaTooOld { .. } | E::NoSchema | E::UnverifiedCopy => Some(EXIT_CONFIG),
        _ => None,
    }
}

/// Installs the log subscriber; `traces`, the OTLP export's layer when `serve` runs with one.
pub(crate) fn init_tracing(format: logging::Format, traces: Option<crate::app::telemetry::TraceLayer>) {
    use tracing_subscriber::util::SubscriberInitExt;
    let filter = tracing_subscriber::EnvFilter::try_from_env("COMMITPOINT_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let _ = logging::subscriber(format, filter, traces).try_init();
}

async fn run(cli: Cli, format: logging::Format) -> anyhow::Result<ExitCode> {
    match cli.command {
        Command::Serve(args) => serve::run(args, format).await,
        Command::Config(ConfigCommand::Check(args)) => Ok(serve::check(args)),
        Command::Submit(args) => submit::run(args).await,
        Command::Backup(args) => backup::run(args).await,
        Command::Costs(args) => costs::run(args).await,
        Command::Estimate(args) => estimate::run(args).await,
        Command::Eval(command) => eval::run(command).await,
        Command::Export(args) => export::run(args).await,
        Command::Ctl(command) => ctl::run(command).await,
        Command::Get(args) => get::run(args).await,
        Command::Verify(args) => verify::run(args).await,
        Command::Compact { path } => maintenance::compact(path).await,
        Command::EraseTenant(args) => erase::run(args).await,
        Command::MigrateStore(args) => migrate::run(args).await,
        Command::DebugDump { path } => maintenance::dump(path).await,
        Command::Demo(args) => demo::run(args).await,
        Command::Simulator(args) => simulator::run(args).await,
        Command::Provider(command) => Ok(provider::run(command).await),
    }
}

/// An HTTP client for the server's API that sends the bearer token, if any, on every
/// request (marked sensitive so it never shows in debug output).
pub(crate) fn http_client(token: Option<&str>) -> anyhow::Result<reqwest::Client> {
    let mut headers = reqwest::header::HeaderMap::new();
    if let Some(token) = token {
        let mut value = reqwest::header::HeaderValue::from_str(&format!("Bearer {token}"))
            .context("the token contains characters an HTTP header cannot carry")?;
        value.set_sensitive(true);
        headers.insert(reqwest::header::AUTHORIZATION, value);
    }
    reqwest::Client::builder().default_headers(headers).build().context("cannot build the HTTP client")
}

#[cfg(test)]
mod exit_code_tests {
    use super::*;

    #[test]
    fn store_failures_map_to_their_sysexits_code() {
        use crate::store::Error as E;
        let wrapped = |e: E| exit_code_for(&anyhow::Error::new(e).context("the command"));
        assert_eq!(wrapped(E::TargetExists { path: "/tmp/b".into() }), EXIT_CANTCREAT);
        assert_eq!(wrapped(E::Conflict { reason: "raced".into(), cause: None }), EXIT_TEMPFAIL);
        assert_eq!(wrapped(E::Closing), EXIT_TEMPFAIL);
        assert_eq!(wrapped(E::UnverifiedCopy), EXIT_CONFIG);
        assert_eq!(wrapped(E::Io { path: "/b".into(), what: "write", source: std::io::Error::other("x") }), EXIT_IO);
        assert_eq!(wrapped(E::Task { what: "read", reason: "panicked".into() }), EXIT_SOFTWARE);
    }
}
