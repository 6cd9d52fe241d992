//! `commitpoint demo`: the whole exactly-once story on a temporary directory, with no
//! provider key. It starts a real server on a loopback port and talks to it over HTTP
//! like any client would: duplicate and redelivered intakes, a worker that dies holding
//! a lease, a stale worker posting late, a model answer that fails the schema and is
//! retried. It ends by checking the invariants and verifying the database file.

mod corpus;
mod scenario;

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;

use super::EXIT_PROBLEMS;
use crate::config::{DEFAULT_MAX_BODY_BYTES, ProviderOptions, ServeOptions};
use crate::server::Server;

#[derive(Debug, clap::Args)]
pub struct Args {
    /// Keep the database in this directory instead of a temporary one.
    #[arg(long)]
    data_dir: Option<PathBuf>,
}

pub async fn run(args: Args) -> anyhow::Result<ExitCode> {
    let temp = tempfile::tempdir().context("cannot create a temporary directory")?;
    let data_dir = args.data_dir.unwrap_or_else(|| temp.path().to_path_buf());
    let options = ServeOptions {
        data_dir,
        listen: ([127, 0, 0, 1], 0).into(),
        schema_dir: None,
        max_body_bytes: DEFAULT_MAX_BODY_BYTES,
        provider: ProviderOptions::default(),
    };
    let server = Server::start(&options).await?;
    let database = server.database_path();
    println!("commitpoint demo: server on http://{}, database {}\n", server.addr(), database.display());
    let outcome = scenario::run(&format!("http://{}", server.addr())).await;
    server.stop().await?;
    let summary = outcome?;

    let path = database.clone();
    let report = tokio::task::spawn_blocking(move || crate::store::verify_file(&path)).await??;
    println!("\n== commitpoint verify {} ==\n{report}", database.display());
    let ok = summary.all_checks_passed() && report.is_ok();
    println!("{}", if ok { "demo: every check passed" } else { "demo: SOME CHECKS FAILED" });
    Ok(if ok { ExitCode::SUCCESS } else { ExitCode::from(EXIT_PROBLEMS) })
}
