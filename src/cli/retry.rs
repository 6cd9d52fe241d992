//! `commitpoint ctl retry`: move failed extractions back to pending in bulk.

use std::process::ExitCode;

use anyhow::Context;
use serde_json::{Value, json};

use super::EXIT_PROBLEMS;

#[derive(Debug, clap::Args)]
pub(super) struct Args {
    /// Only extractions failed with this class (validation, truncated, refused, …).
    #[arg(long, value_parser = crate::domain::lifecycle::FailureClass::ALL.map(|c| c.as_str()))]
    failure_class: Option<String>,
    #[arg(long)]
    tenant: Option<String>,
    /// Only extractions of this schema (`name@version`).
    #[arg(long)]
    schema: Option<String>,
    /// Retry at most this many (default: every match).
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
    limit: Option<u64>,
    #[command(flatten)]
    admin: super::AdminUrl,
}

pub(super) async fn run(args: Args) -> anyhow::Result<ExitCode> {
    let base = args.admin.resolve();
    let mut body = json!({});
    for (key, value) in [("failure_class", &args.failure_class), ("tenant", &args.tenant), ("schema", &args.schema)] {
        if let Some(v) = value {
            body[key] = json!(v);
        }
    }
    if let Some(limit) = args.limit {
        body["limit"] = json!(limit);
    }
    let response = args
        .admin
        .client()?
        .post(format!("{base}/v1/admin/retry"))
        .json(&body)
        .send()
        .await
        .with_context(|| format!("cannot reach the server at {base}"))?;
    let status = response.status();
    let answer: Value = response.json().await.context("the server sent a non-JSON answer")?;
    if !status.is_success() {
        eprintln!("commitpoint: the server refused: {status}: {}", answer["error"]["message"].as_str().unwrap_or("?"));
        return Ok(ExitCode::from(EXIT_PROBLEMS));
    }
    println!("retried {}", answer["retried"]);
    Ok(ExitCode::SUCCESS)
}
