//! `commitpoint serve` and `commitpoint config check`: flags, their merge with the
//! configuration file and the environment, and running the server.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context;

use super::signals::{Signals, Stopped};
use super::{EXIT_CONFIG, EXIT_SOFTWARE};
use crate::app::config::{DEFAULT_CONFIG_PATH, KeySource, Overrides, ProviderChoice, ServeOptions};
use crate::app::server::Server;
use crate::app::telemetry::Export;
use crate::domain::schema::Registry;
use crate::http::access::AccessPolicy;

/// Every flag is optional: unset ones come from the configuration file, then defaults.
#[derive(Debug, Clone, clap::Args)]
pub(super) struct Args {
    /// Configuration file (TOML). A missing default file means built-in defaults.
    #[arg(long, env = "COMMITPOINT_CONFIG")]
    config: Option<PathBuf>,
    /// Directory holding commitpoint.redb [default: /var/lib/commitpoint].
    #[arg(long, env = "COMMITPOINT_DATA_DIR")]
    data_dir: Option<PathBuf>,
    /// PostgreSQL store instead of redb, e.g. `postgres://commitpoint@db:5432/commitpoint`;
    /// the password comes from `[store] password_env`/`_file`/`_credential`, never the URL.
    #[arg(long, env = "COMMITPOINT_STORE_URL")]
    store_url: Option<String>,
    /// HTTP listen address [default: 127.0.0.1:7878].
    #[arg(long, env = "COMMITPOINT_LISTEN")]
    listen: Option<SocketAddr>,
    /// Directory of extra JSON Schemas, one `name@version.json` file each.
    #[arg(long)]
    schema_dir: Option<PathBuf>,
    /// Largest accepted request body [default: 8388608].
    #[arg(long)]
    max_body_bytes: Option<usize>,
    /// Built-in provider for pending work [default: none, external workers claim it]. The
    /// old form of a `[providers.<name>]` table; named `openai` or `simulator`.
    #[arg(long, value_enum)]
    provider: Option<ProviderChoice>,
    /// Base URL of the OpenAI-compatible Batch API [default: https://api.openai.com/v1].
    #[arg(long)]
    provider_base_url: Option<String>,
    /// Environment variable holding the API key [default: OPENAI_API_KEY].
    #[arg(long, conflicts_with = "provider_key_file")]
    provider_key_env: Option<String>,
    /// File holding the API key (must not be readable by group or others).
    #[arg(long)]
    provider_key_file: Option<PathBuf>,
    /// Model name sent to the provider [default: gpt-4o-mini].
    #[arg(long)]
    model: Option<String>,
    /// Most extractions in one provider batch [default: 100].
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=50_000))]
    batch_max_size: Option<u32>,
    /// Longest a pending extraction waits for its batch to fill, e.g. `2s` [default: 2s].
    #[arg(long, value_parser = humantime::parse_duration)]
    batch_max_wait: Option<Duration>,
    /// Time between polls of a running provider job, e.g. `5s` [default: 5s].
    #[arg(long, value_parser = humantime::parse_duration)]
    poll_interval: Option<Duration>,
    /// OTLP/HTTP collector to export traces to, e.g. `http://127.0.0.1:4318`
    /// [default: `[telemetry] otlp_endpoint`, else off].
    #[arg(long, env = "OTEL_EXPORTER_OTLP_ENDPOINT")]
    otlp_endpoint: Option<String>,
}

impl Args {
    pub(super) fn resolve(self) -> Result<ServeOptions, crate::app::config::Error> {
        let explicit = self.config.is_some();
        let path = self.config.unwrap_or_else(|| PathBuf::from(DEFAULT_CONFIG_PATH));
        let key = match (self.provider_key_file, self.provider_key_env) {
            (Some(file), _) => Some(KeySource::File(file)),
            (None, Some(env)) => Some(KeySource::Env(env)),
            (None, None) => None,
        };
        let overrides = Overrides {
            data_dir: self.data_dir,
            listen: self.listen,
            schema_dir: self.schema_dir,
            max_body_bytes: self.max_body_bytes,
            provider: self.provider,
            base_url: self.provider_base_url,
            key,
            model: self.model,
            batch_max_size: self.batch_max_size,
            batch_max_wait: self.batch_max_wait,
            poll_interval: self.poll_interval,
            store_url: self.store_url,
            otlp_endpoint: self.otlp_endpoint,
        };
        ServeOptions::load(&path, explicit, overrides)
    }
}

pub(super) async fn run(args: Args, format: super::logging::Format) -> anyhow::Result<ExitCode> {
    let options = match args.clone().resolve() {
        Ok(options) => options,
        Err(e) => {
            super::init_tracing(format, None);
            return Ok(config_error(&e));
        }
    };
    let export = match Export::start(&options.telemetry) {
        Ok(export) => export,
        Err(e) => {
            super::init_tracing(format, None);
            return Ok(config_error(&e));
        }
    };
    super::init_tracing(format, export.as_ref().map(Export::layer));
    let signals = Signals::install().context("cannot install signal handlers")?;
    if let Some(url) = &options.telemetry.traces_url {
        tracing::info!(%url, service = %options.telemetry.service_name, "exporting traces over OTLP/HTTP");
    }
    for note in &options.notes {
        tracing::warn!("{note}");
    }
    let server = Server::start(&options).await?;
    // Scripts and tests that pass port 0 read the real address from this line.
    println!("commitpoint listening on http://{}", server.addr());
    crate::app::systemd::ready(&format!("listening on {}", server.addr()));
    let reload = || match args.clone().resolve() {
        Ok(options) => server.reload(&options),
        Err(e) => {
            tracing::error!(error = %e, "reload refused: the configuration is invalid; keeping the running settings")
        }
    };
    let stopped = signals.wait_or(reload, server.task_failed()).await;
    match stopped {
        Stopped::Signal => tracing::info!("shutting down: draining requests, then closing the store"),
        Stopped::TaskFailed => {
            tracing::error!(
                "a background task failed: draining requests, closing the store, then exiting {EXIT_SOFTWARE}"
            )
        }
    }
    let failures = server.task_failures();
    let stopped = server.stop().await;
    // After the store is closed, so the commits of the last step are in the trace.
    if let Some(export) = export {
        export.shutdown().await;
    }
    stopped?;
    // A task that fails during a signalled shutdown still means the process was unwell.
    let failed = failures.all();
    if failed.is_empty() {
        return Ok(ExitCode::SUCCESS);
    }
    for failure in &failed {
        eprintln!("commitpoint: background task {:?} failed: {}", failure.task, failure.cause);
    }
    Ok(ExitCode::from(EXIT_SOFTWARE))
}

/// Runs every check `serve` would run before binding, and prints the effective config.
pub(super) fn check(args: Args) -> ExitCode {
    let options = match args.resolve() {
        Ok(options) => options,
        Err(e) => return config_error(&e),
    };
    for note in &options.notes {
        eprintln!("commitpoint: note: {note}");
    }
    let registry = match Registry::load(options.schema_dir.as_deref()) {
        Ok(registry) => registry,
        Err(e) => return config_error(&e),
    };
    let targets = options.schema_targets();
    if let Err(e) = registry.check_providers(&targets) {
        eprint!("{}", registry.describe_views(&targets));
        return config_error(&e);
    }
    if let Err(e) = AccessPolicy::load(
        options.access.admin_token.as_ref(),
        options.access.tenant_tokens.as_ref(),
        options.access.worker_tokens.as_ref(),
    ) {
        return config_error(&e);
    }
    if let Err(e) = crate::app::provider_registry::check(&options.providers) {
        return config_error(&e);
    }
    if let Err(e) = crate::app::secrets::load(&options) {
        return config_error(&e);
    }
    for gap in options.unpriced_providers() {
        eprintln!("commitpoint: warning: {gap}");
    }
    print!("{}", options.describe());
    print!("\n{}", registry.describe_views(&targets));
    eprintln!("config: ok");
    ExitCode::SUCCESS
}

/// Prints the error with its causes (a provider's secret error says which secret).
pub(super) fn config_error(e: &dyn std::error::Error) -> ExitCode {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(cause) = source {
        text.push_str(&format!(": {cause}"));
        source = cause.source();
    }
    eprintln!("commitpoint: configuration error: {text}");
    ExitCode::from(EXIT_CONFIG)
}
