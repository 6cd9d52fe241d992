//! `commitpoint erase-tenant T --yes`: asks the running server to erase a tenant.

use std::process::ExitCode;

use anyhow::{Context, bail};
use serde_json::Value;

use super::{EXIT_PROBLEMS, EXIT_USAGE};

#[derive(Debug, clap::Args)]
pub(super) struct Args {
    /// The tenant whose extractions, contents, findings, results and events are erased.
    tenant: String,
    /// Confirms the erasure: it cannot be undone.
    #[arg(long)]
    yes: bool,
    #[command(flatten)]
    admin: super::AdminUrl,
}

pub(super) async fn run(args: Args) -> anyhow::Result<ExitCode> {
    if !args.yes {
        eprintln!(
            "commitpoint: erasing tenant {:?} removes all of its data for good; add --yes to confirm",
            args.tenant
        );
        return Ok(ExitCode::from(EXIT_USAGE));
    }
    let base = args.admin.resolve();
    let client = args.admin.client()?;
    let mut url = reqwest::Url::parse(&format!("{base}/v1/tenants/")).context("the server address is not a URL")?;
    url.path_segments_mut()
        .map_err(|()| anyhow::anyhow!("the server address cannot carry a path"))?
        .pop_if_empty()
        .push(&args.tenant);
    let response = client.delete(url).send().await.with_context(|| format!("cannot reach {base}"))?;
    let status = response.status();
    let body: Value = response.json().await.context("the server sent a non-JSON answer")?;
    if !status.is_success() {
        let message = body["error"]["message"].as_str().unwrap_or("no message");
        if status.is_client_error() {
            eprintln!("commitpoint: the server refused the erasure ({status}): {message}");
            return Ok(ExitCode::from(EXIT_PROBLEMS));
        }
        bail!("the server could not erase the tenant ({status}): {message}");
    }
    println!("{}", serde_json::to_string_pretty(&body)?);
    Ok(ExitCode::SUCCESS)
}
