//! `commitpoint verify`: a redb file, offline; or a PostgreSQL store, live and read-only.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;

use super::{EXIT_CONFIG, EXIT_PROBLEMS, EXIT_UNAVAILABLE, EXIT_USAGE};
use crate::app::config::{DEFAULT_CONFIG_PATH, StoreChoice, store_in_file};
use crate::store::postgres::PgOptions;
use crate::store::{Error, Report, error_chain};

/// The store URL flag's environment variable, as for `serve`. Read by hand (not by clap)
/// so that a URL in the environment never turns `verify FILE` into a usage error.
const STORE_URL_ENV: &str = "COMMITPOINT_STORE_URL";
const CONFIG_ENV: &str = "COMMITPOINT_CONFIG";

#[derive(Debug, clap::Args)]
pub(super) struct Args {
    /// The redb file (commitpoint.redb) to check, with its server stopped.
    path: Option<PathBuf>,
    /// Check this PostgreSQL store instead (safe while servers run: one read-only
    /// snapshot), e.g. `postgres://commitpoint@db:5432/commitpoint` [env:
    /// COMMITPOINT_STORE_URL]. The password comes from the config file's `[store]
    /// password_env`/`_file`/`_credential`, never from the URL.
    #[arg(long, conflicts_with = "path")]
    store_url: Option<String>,
    /// Configuration file whose `[store]` names the PostgreSQL store and its password, read
    /// as `serve` reads it [env: COMMITPOINT_CONFIG; default: /etc/commitpoint/config.toml].
    #[arg(long, conflicts_with = "path")]
    config: Option<PathBuf>,
}

pub(super) async fn run(args: Args) -> anyhow::Result<ExitCode> {
    match args.path {
        Some(path) => redb(path).await,
        None => postgres(args.store_url, args.config).await,
    }
}

fn finish(shown: &str, report: &Report) -> ExitCode {
    print!("{shown}\n{report}");
    if report.is_ok() { ExitCode::SUCCESS } else { ExitCode::from(EXIT_PROBLEMS) }
}

async fn redb(path: PathBuf) -> anyhow::Result<ExitCode> {
    let text = path.to_string_lossy();
    if text.starts_with("postgres://") || text.starts_with("postgresql://") {
        eprintln!("commitpoint: verify takes a PostgreSQL store as --store-url URL (its password through --config)");
        return Ok(ExitCode::from(EXIT_USAGE));
    }
    let shown = path.display().to_string();
    if !path.exists() {
        let missing = std::io::Error::new(std::io::ErrorKind::NotFound, "no such file");
        return Err(anyhow::Error::new(missing).context(shown));
    }
    let report = tokio::task::spawn_blocking(move || crate::store::verify_file(&path))
        .await?
        .with_context(|| format!("{shown}: cannot verify (is a server still running on it?)"))?;
    Ok(finish(&shown, &report))
}

async fn postgres(url: Option<String>, config: Option<PathBuf>) -> anyhow::Result<ExitCode> {
    let url = url.or_else(|| std::env::var(STORE_URL_ENV).ok().filter(|u| !u.is_empty()));
    let (path, explicit) = match config.or_else(|| std::env::var_os(CONFIG_ENV).map(PathBuf::from)) {
        Some(path) => (path, true),
        None => (PathBuf::from(DEFAULT_CONFIG_PATH), false),
    };
    // Config errors (a password in the URL, an unreadable secret) exit 78 through `main`.
    let (url, password) = match store_in_file(&path, explicit, url)? {
        StoreChoice::Postgres { url, password, .. } => (url, password),
        StoreChoice::Redb => {
            eprintln!(
                "commitpoint: verify needs a redb FILE, --store-url postgres://… or a config file whose [store] has \
                 backend = \"postgres\" ({} has none)",
                path.display()
            );
            return Ok(ExitCode::from(EXIT_USAGE));
        }
    };
    let password = password.map(|p| p.load_secret()).transpose().map_err(crate::app::config::Error::from)?;
    match crate::store::postgres::verify(&PgOptions { url: url.clone(), password }).await {
        Ok(report) => Ok(finish(&url, &report)),
        Err(e) => {
            eprintln!("commitpoint: {url}: cannot verify: {}", error_chain(&e));
            let code = match e {
                Error::SchemaTooNew { .. } | Error::SchemaTooOld { .. } | Error::NoSchema => EXIT_CONFIG,
                _ => EXIT_UNAVAILABLE,
            };
            Ok(ExitCode::from(code))
        }
    }
}
