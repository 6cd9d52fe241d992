//! `commitpoint submit`: send files as sources, many at once, with a progress bar.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::{Context, bail};
use indicatif::{ProgressBar, ProgressStyle};
use serde_json::{Value, json};
use tokio::sync::Semaphore;

use super::EXIT_PROBLEMS;
use super::files::{Source, collect};

#[derive(Debug, clap::Args)]
pub(super) struct Args {
    /// Files, or directories whose files are all submitted (recursively).
    #[arg(required = true)]
    paths: Vec<PathBuf>,
    #[arg(long)]
    tenant: String,
    #[arg(long, default_value = crate::domain::schema::BUILTIN_CODE_REVIEW)]
    schema: String,
    /// Requests in flight at once.
    #[arg(long, default_value_t = 16)]
    concurrency: usize,
    #[command(flatten)]
    admin: super::AdminUrl,
    /// Refuse to submit anything (exit 1) when the server's estimate for the files, at the
    /// provider routing sends them to, is above this many dollars (`commitpoint estimate`
    /// shows it); an estimate that cannot be told (no price row) refuses too.
    #[arg(long, value_name = "DOLLARS", value_parser = parse_dollars)]
    max_cost: Option<u64>,
}

fn parse_dollars(text: &str) -> Result<u64, String> {
    let dollars: f64 = text.trim_start_matches('$').parse().map_err(|_| format!("{text:?} is not an amount"))?;
    crate::engine::ledger::dollars_to_micros(dollars).ok_or_else(|| format!("{text:?} is not a non-negative amount"))
}

pub(super) async fn run(args: Args) -> anyhow::Result<ExitCode> {
    if args.concurrency == 0 {
        bail!("--concurrency must be at least 1");
    }
    let sources = collect(&args.paths)?;
    let client = args.admin.client()?;
    if let Some(max) = args.max_cost {
        let base = args.admin.resolve();
        if let Err(refusal) =
            super::estimate::check_max_cost(&client, &base, &args.tenant, &args.schema, &sources, max).await?
        {
            eprintln!("commitpoint: {refusal}");
            return Ok(ExitCode::from(EXIT_PROBLEMS));
        }
    }
    let bar = ProgressBar::new(sources.len() as u64);
    bar.set_style(
        ProgressStyle::with_template("{bar:40} {pos}/{len} {msg}").unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    let url = format!("{}/v1/extractions", args.admin.resolve());
    let gate = Arc::new(Semaphore::new(args.concurrency));
    let mut tasks = tokio::task::JoinSet::new();
    for source in sources {
        let (client, url, gate, bar) = (client.clone(), url.clone(), Arc::clone(&gate), bar.clone());
        let (tenant, schema) = (args.tenant.clone(), args.schema.clone());
        tasks.spawn(async move {
            let _permit = gate.acquire_owned().await;
            let outcome = submit_one(&client, &url, &tenant, &schema, &source).await;
            bar.inc(1);
            (source.source_id, outcome)
        });
    }
    let (mut created, mut existing, mut failed) = (0, 0, 0);
    while let Some(joined) = tasks.join_next().await {
        let (source_id, outcome) = joined?;
        match outcome {
            Ok((true, _)) => created += 1,
            Ok((false, _)) => existing += 1,
            Err(e) => {
                failed += 1;
                bar.println(format!("{source_id}: {e:#}"));
            }
        }
    }
    bar.finish_and_clear();
    println!("submitted: {created} created, {existing} already known, {failed} failed");
    Ok(if failed == 0 { ExitCode::SUCCESS } else { ExitCode::from(EXIT_PROBLEMS) })
}

async fn submit_one(
    client: &reqwest::Client,
    url: &str,
    tenant: &str,
    schema: &str,
    source: &Source,
) -> anyhow::Result<(bool, String)> {
    let bytes =
        tokio::fs::read(&source.path).await.with_context(|| format!("cannot read {}", source.path.display()))?;
    let content =
        String::from_utf8(bytes).map_err(|_| anyhow::anyhow!("{} is not UTF-8 text", source.path.display()))?;
    let body = json!({"tenant": tenant, "source_id": source.source_id, "schema": schema, "content": content});
    let response = client.post(url).json(&body).send().await.with_context(|| format!("cannot reach {url}"))?;
    let status = response.status();
    let answer: Value = response.json().await.context("the server sent a non-JSON answer")?;
    if !status.is_success() {
        let message = answer["error"]["message"].as_str().unwrap_or("no message");
        bail!("{status}: {message}");
    }
    let id = answer["extraction_id"].as_str().unwrap_or_default().to_string();
    Ok((answer["created"].as_bool().unwrap_or(false), id))
}
