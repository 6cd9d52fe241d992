//! `commitpoint serve` flags and their translation into `ServeOptions`.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context;

use super::signals::Signals;
use crate::config::{
    DEFAULT_DATA_DIR, DEFAULT_LISTEN, DEFAULT_MAX_BODY_BYTES, DEFAULT_MODEL, DEFAULT_OPENAI_BASE_URL,
    DEFAULT_OPENAI_KEY_ENV, KeySource, ProviderChoice, ProviderOptions, ServeOptions,
};
use crate::scheduler;
use crate::server::Server;

#[derive(Debug, clap::Args)]
pub struct Args {
    #[arg(long, env = "COMMITPOINT_DATA_DIR", default_value = DEFAULT_DATA_DIR)]
    data_dir: PathBuf,
    #[arg(long, env = "COMMITPOINT_LISTEN", default_value = DEFAULT_LISTEN)]
    listen: SocketAddr,
    /// Directory of extra JSON Schemas, one `name@version.json` file each.
    #[arg(long)]
    schema_dir: Option<PathBuf>,
    /// Largest accepted request body.
    #[arg(long, default_value_t = DEFAULT_MAX_BODY_BYTES)]
    max_body_bytes: usize,
    /// Built-in provider for pending work (`none`: external workers claim it).
    #[arg(long, value_enum, default_value = "none")]
    provider: ProviderChoice,
    /// Base URL of the OpenAI-compatible Batch API.
    #[arg(long, default_value = DEFAULT_OPENAI_BASE_URL)]
    provider_base_url: String,
    /// Environment variable holding the API key.
    #[arg(long, default_value = DEFAULT_OPENAI_KEY_ENV, conflicts_with = "provider_key_file")]
    provider_key_env: String,
    /// File holding the API key (must not be readable by group or others).
    #[arg(long)]
    provider_key_file: Option<PathBuf>,
    #[arg(long, default_value = DEFAULT_MODEL)]
    model: String,
    /// Most extractions in one provider batch.
    #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u32).range(1..=50_000))]
    batch_max_size: u32,
    /// Longest a pending extraction waits for its batch to fill (e.g. `2s`, `1m`).
    #[arg(long, default_value = "2s", value_parser = humantime::parse_duration)]
    batch_max_wait: Duration,
    /// Time between polls of a running provider job.
    #[arg(long, default_value = "5s", value_parser = humantime::parse_duration)]
    poll_interval: Duration,
}

impl Args {
    pub fn into_options(self) -> ServeOptions {
        let key = match self.provider_key_file {
            Some(path) => KeySource::File(path),
            None => KeySource::Env(self.provider_key_env),
        };
        let scheduler = scheduler::Settings {
            batch_max_size: self.batch_max_size as usize,
            batch_max_wait: self.batch_max_wait,
            poll_interval: self.poll_interval,
            ..scheduler::Settings::default()
        };
        ServeOptions {
            data_dir: self.data_dir,
            listen: self.listen,
            schema_dir: self.schema_dir,
            max_body_bytes: self.max_body_bytes,
            provider: ProviderOptions {
                choice: self.provider,
                base_url: self.provider_base_url,
                key,
                model: self.model,
                scheduler,
            },
        }
    }
}

pub async fn run(args: Args) -> anyhow::Result<ExitCode> {
    let signals = Signals::install().context("cannot install signal handlers")?;
    let server = Server::start(&args.into_options()).await?;
    // Scripts and tests that pass port 0 read the real address from this line.
    println!("commitpoint listening on http://{}", server.addr());
    signals.wait().await;
    tracing::info!("shutting down: draining requests, then closing the store");
    server.stop().await?;
    Ok(ExitCode::SUCCESS)
}
