//! placeholder
use std::process::ExitCode;
#[derive(Debug, clap::Args)]
pub struct Args {}
pub async fn run(_args: Args) -> anyhow::Result<ExitCode> {
    Ok(ExitCode::SUCCESS)
}
