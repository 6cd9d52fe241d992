//! `commitpoint demo`: the whole exactly-once story on a temporary directory, with no
//! provider key. It starts a real server on a loopback port and talks to it over HTTP
//! like any client would: duplicate and redelivered intakes, a worker that dies holding
//! a lease, a stale worker posting late, a model answer that fails the schema and is
//! retried. Its third act tries two more simulated models on the committed work, side by
//! side (an evaluation). It ends by checking the invariants and verifying the database file.

mod api;
mod bakeoff;
mod corpus;
mod provider;
mod scenario;

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;

use super::EXIT_PROBLEMS;
use std::time::Duration;

use crate::app::config::{
    AccessOptions, DEFAULT_CACHE_BYTES, DEFAULT_MAX_BODY_BYTES, OpenAiBudget, ProviderSettings, ProviderSpec,
    SIMULATOR_MODEL, ServeOptions, SimulatorOptions,
};
use crate::app::server::Server;
use crate::engine::scheduler;

#[derive(Debug, clap::Args)]
pub(super) struct Args {
    /// Keep the database in this directory instead of a temporary one.
    #[arg(long)]
    data_dir: Option<PathBuf>,
    /// After the demo, keep its last server (act two's database, with the bake-off) running
    /// so its console at /ui can be looked at; stop it with Ctrl-C.
    #[arg(long)]
    keep_running: bool,
}

pub(super) async fn run(args: Args) -> anyhow::Result<ExitCode> {
    let temp = tempfile::tempdir().context("cannot create a temporary directory")?;
    let root = args.data_dir.unwrap_or_else(|| temp.path().to_path_buf());
    let workers = serve_options(root.join("workers"), Vec::new(), scheduler::Settings::default());
    let server = Server::start(&workers).await?;
    let first_db = server.database_path();
    println!(
        "commitpoint demo, act one: external workers. Server on http://{}, database {}\n",
        server.addr(),
        first_db.display()
    );
    println!("Console (open in a browser while the act runs): http://{}/ui\n", server.addr());
    let outcome = scenario::run(&format!("http://{}", server.addr())).await;
    server.stop().await?;
    let mut summary = outcome?;
    let mut ok = verify(&first_db).await?;

    let simulator = ProviderSettings {
        name: "simulator".to_string(),
        spec: ProviderSpec::Simulator(SimulatorOptions {
            model: SIMULATOR_MODEL.to_string(),
            budget: OpenAiBudget {
                max_completion_tokens: Some(provider::DEMO_MAX_COMPLETION_TOKENS),
                ..OpenAiBudget::default()
            },
        }),
        reask: None,
        min_batch_wait: None,
        min_batch_fallback: None,
    };
    let quick = scheduler::Settings {
        batch_max_size: 4,
        batch_max_wait: Duration::from_millis(300),
        poll_interval: Duration::from_millis(200),
        ..scheduler::Settings::default()
    };
    let server = Server::start(&serve_options(root.join("provider"), vec![simulator], quick.clone())).await?;
    let second_db = server.database_path();
    println!(
        "\ncommitpoint demo, act two: built-in provider. Server on http://{}, database {}\n",
        server.addr(),
        second_db.display()
    );
    println!("Console (open in a browser while the act runs): http://{}/ui\n", server.addr());
    println!(
        "(The same lifecycle drives Anthropic, Gemini batch mode and Amazon Bedrock batch inference: \
         [providers.<name>] kind = \"gemini\" or kind = \"bedrock\" (job files in S3, credentials from the \
         standard AWS chain); try them keyless with `commitpoint simulator --dialect gemini` or \
         `--dialect bedrock --s3-endpoint URL`.)\n"
    );
    let outcome = provider::run(&server, &mut summary).await;
    server.stop().await?;
    outcome?;
    ok &= verify(&second_db).await?;
    println!(
        "\nThe same adapter drives Azure OpenAI (kind = \"azure\") and OpenAI-shaped batch platforms such as Groq \
         (kind = \"openai\", base_url); try them on `commitpoint simulator --dialect azure` or `--platform groq`."
    );

    let candidates = bakeoff::Candidates::start().await?;
    let mut options = serve_options(root.join("provider"), Vec::new(), quick);
    let config = candidates.configure(&root, &mut options)?;
    let server = Server::start(&options).await?;
    println!(
        "\ncommitpoint demo, act three: a bake-off. Act two's database served again on http://{}, with two more \
         providers ({})\n",
        server.addr(),
        config.display()
    );
    println!("Console (open in a browser while the act runs): http://{}/ui\n", server.addr());
    let outcome = bakeoff::run(&server, &candidates, &mut summary).await;
    if args.keep_running {
        println!("\nThe demo is done; its server keeps running. Console: http://{}/ui (Ctrl-C to stop)", server.addr());
        tokio::signal::ctrl_c().await.context("cannot wait for Ctrl-C")?;
    }
    server.stop().await?;
    outcome?;
    ok &= verify(&second_db).await?;

    let ok = ok && summary.all_checks_passed();
    println!("{}", if ok { "demo: every check passed" } else { "demo: SOME CHECKS FAILED" });
    Ok(if ok { ExitCode::SUCCESS } else { ExitCode::from(EXIT_PROBLEMS) })
}

fn serve_options(data_dir: PathBuf, providers: Vec<ProviderSettings>, scheduler: scheduler::Settings) -> ServeOptions {
    ServeOptions {
        retention: crate::app::config::RetentionOptions::default(),
        store: crate::app::config::StoreChoice::Redb,
        data_dir,
        listen: ([127, 0, 0, 1], 0).into(),
        schema_dir: None,
        max_body_bytes: DEFAULT_MAX_BODY_BYTES,
        cache_bytes: DEFAULT_CACHE_BYTES,
        limits: crate::app::config::ServerLimits::default(),
        allowed_hosts: Vec::new(),
        providers,
        scheduler,
        access: AccessOptions::default(),
        routes: crate::engine::routing::Routes::default(),
        prices: demo_prices(),
        budgets: crate::engine::ledger::Budgets::default(),
        fairness: crate::store::Fairness::default(),
        sinks: Vec::new(),
        webhooks: Vec::new(),
        notes: Vec::new(),
        max_findings: crate::service::DEFAULT_MAX_FINDINGS,
        max_metadata_bytes: crate::service::DEFAULT_MAX_METADATA_BYTES,
        tenant_series: crate::service::DEFAULT_TENANT_SERIES,
        telemetry: Default::default(),
    }
}

/// The demo's ledger prices the simulated reviewer at gpt-4o-mini's published list price.
fn demo_prices() -> crate::engine::ledger::PriceTable {
    let mut table = crate::engine::ledger::PriceTable::default();
    let price = crate::engine::ledger::Price {
        input: 150_000,
        cached_input: 75_000,
        cache_write: 150_000,
        output: 600_000,
        batch_percent: 50,
    };
    table.insert("simulator", "simulated-reviewer", price);
    table
}

async fn verify(database: &std::path::Path) -> anyhow::Result<bool> {
    let path = database.to_path_buf();
    let report = tokio::task::spawn_blocking(move || crate::store::verify_file(&path)).await??;
    println!("\n== commitpoint verify {} ==\n{report}", database.display());
    Ok(report.is_ok())
}
