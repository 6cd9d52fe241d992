//! `commitpoint submit`: send files as sources, many at once, with a progress bar;
//! optionally wait for their answers (`wait.rs`).

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
    /// A JSON object stored with every source as its metadata (shown on the extraction,
    /// in exports and in outbox events).
    #[arg(long, value_name = "JSON", value_parser = parse_metadata)]
    metadata: Option<Value>,
    /// Print one JSON object per file on stdout (path, source_id, extraction_id, created,
    /// and with --wait its final state, or the error), the summary on stderr.
    #[arg(long)]
    json: bool,
    /// Wait until every submitted extraction is committed or failed, with a progress bar,
    /// and print each failure's class and reason; exit 1 if any failed.
    #[arg(long)]
    wait: bool,
    /// Give up waiting after this long (e.g. `30m`), exit 75; default: wait as long as it takes.
    #[arg(long, value_name = "DURATION", value_parser = humantime::parse_duration, requires = "wait")]
    wait_timeout: Option<std::time::Duration>,
}

fn parse_metadata(text: &str) -> Result<Value, String> {
    match serde_json::from_str::<Value>(text) {
        Ok(object @ Value::Object(_)) => Ok(object),
        Ok(_) => Err("the metadata must be a JSON object, e.g. '{\"team\": \"payments\"}'".to_string()),
        Err(e) => Err(format!("not JSON: {e}")),
    }
}

/// What became of one file.
pub(super) struct Submitted {
    pub path: PathBuf,
    pub source_id: String,
    /// `(created, extraction id)`, or why the file was not taken.
    pub outcome: Result<(bool, String), String>,
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
        let (tenant, schema, metadata) = (args.tenant.clone(), args.schema.clone(), args.metadata.clone());
        tasks.spawn(async move {
            let _permit = gate.acquire_owned().await;
            let outcome = submit_one(&client, &url, (&tenant, &schema, metadata), &source).await;
            bar.inc(1);
            Submitted { path: source.path, source_id: source.source_id, outcome: outcome.map_err(|e| format!("{e:#}")) }
        });
    }
    let mut submitted = Vec::new();
    while let Some(joined) = tasks.join_next().await {
        let one = joined?;
        if let Err(e) = &one.outcome {
            // `println` on a hidden bar (stderr not a terminal) prints nothing: suspend it.
            bar.suspend(|| eprintln!("{}: {e}", one.source_id));
        }
        submitted.push(one);
    }
    bar.finish_and_clear();
    submitted.sort_by(|a, b| a.source_id.cmp(&b.source_id));
    let created = submitted.iter().filter(|s| matches!(s.outcome, Ok((true, _)))).count();
    let existing = submitted.iter().filter(|s| matches!(s.outcome, Ok((false, _)))).count();
    let failed = submitted.len() - created - existing;
    let summary = format!("submitted: {created} created, {existing} already known, {failed} failed");
    let waited = if args.wait {
        let ids: Vec<String> =
            submitted.iter().filter_map(|s| s.outcome.as_ref().ok().map(|(_, id)| id.clone())).collect();
        Some(super::wait::until_settled(&client, &args.admin.resolve(), &ids, args.wait_timeout).await?)
    } else {
        None
    };
    if args.json {
        for one in &submitted {
            println!("{}", line(one, waited.as_ref()));
        }
        eprintln!("{summary}");
    } else {
        println!("{summary}");
    }
    let Some(waited) = waited else {
        return Ok(if failed == 0 { ExitCode::SUCCESS } else { ExitCode::from(EXIT_PROBLEMS) });
    };
    for record in waited.failed() {
        eprintln!(
            "{}: {} ({}): {}",
            record["source_id"].as_str().unwrap_or("?"),
            record["state"].as_str().unwrap_or("?"),
            record["failure_class"].as_str().unwrap_or("no class"),
            record["failure_reason"].as_str().unwrap_or("no reason given"),
        );
    }
    let summary = waited.summary();
    if args.json {
        eprintln!("{summary}")
    } else {
        println!("{summary}")
    }
    Ok(if !waited.finished() {
        ExitCode::from(super::EXIT_TEMPFAIL)
    } else if failed > 0 || waited.failed().next().is_some() {
        ExitCode::from(EXIT_PROBLEMS)
    } else {
        ExitCode::SUCCESS
    })
}

/// One file's JSON line: what was submitted and, after a wait, how it ended.
fn line(one: &Submitted, waited: Option<&super::wait::Settled>) -> Value {
    let mut out = json!({"path": one.path.display().to_string(), "source_id": one.source_id});
    match &one.outcome {
        Ok((created, id)) => {
            out["extraction_id"] = json!(id);
            out["created"] = json!(created);
            if let Some(record) = waited.and_then(|w| w.record(id)) {
                for field in ["state", "failure_class", "failure_reason"] {
                    out[field] = record[field].clone();
                }
            }
        }
        Err(e) => out["error"] = json!(e),
    }
    out
}

async fn submit_one(
    client: &reqwest::Client,
    url: &str,
    (tenant, schema, metadata): (&str, &str, Option<Value>),
    source: &Source,
) -> anyhow::Result<(bool, String)> {
    let bytes =
        tokio::fs::read(&source.path).await.with_context(|| format!("cannot read {}", source.path.display()))?;
    let content =
        String::from_utf8(bytes).map_err(|_| anyhow::anyhow!("{} is not UTF-8 text", source.path.display()))?;
    let mut body = json!({"tenant": tenant, "source_id": source.source_id, "schema": schema, "content": content});
    if let Some(metadata) = metadata {
        body["metadata"] = metadata;
    }
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
