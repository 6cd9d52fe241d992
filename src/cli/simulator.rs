//! `commitpoint simulator`: run the built-in SIMULATED batch provider (OpenAI Batch API,
//! Anthropic Message Batches, Gemini batch mode, Amazon Bedrock batch inference or Mistral batch) on its own, for trying an adapter or a script against it.
//! It is a rule-based stand-in, not a model.

use std::net::SocketAddr;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context;

use crate::simulator::{Dialect, Faults, S3Access, Simulator, SimulatorConfig};

#[derive(Debug, clap::Args)]
pub(super) struct Args {
    /// Loopback address to listen on; port 0 picks a free port (printed on stdout).
    #[arg(long, default_value = "127.0.0.1:0")]
    pub listen: SocketAddr,
    /// Which provider's wire protocol to speak.
    #[arg(long, value_enum, default_value = "openai")]
    pub dialect: DialectArg,
    /// Name of an environment variable holding the API key clients must send
    /// (`Authorization: Bearer <key>`, `x-api-key` for anthropic, `x-goog-api-key` for gemini). Without it, any key
    /// (or none) is accepted.
    #[arg(long, value_name = "NAME")]
    pub api_key_env: Option<String>,
    /// Time from batch creation to `completed`.
    #[arg(long, value_parser = humantime::parse_duration, default_value = "300ms")]
    pub complete_after: Duration,
    /// Fault knobs as JSON, e.g. '{"rate_limit_next":2,"expire_batches":true}'.
    #[arg(long, value_name = "JSON")]
    pub faults: Option<String>,
    /// TEST BEHAVIOUR: per source, the first N answers violate the request's schema (a
    /// required property left out; code-review@1: line 0, severity `urgent`), as a model
    /// does before it is re-asked. Sets the `invalid_first` fault knob (over --faults).
    #[arg(long, value_name = "N")]
    pub invalid_first: Option<u32>,
    /// TEST BEHAVIOUR: after the invalid ones, the next N answers per source are
    /// schema-valid but ungrounded (findings on lines past the end of the source, in a file
    /// it never names, quoting text it does not contain). Sets `ungrounded_first`.
    #[arg(long, value_name = "N")]
    pub ungrounded_first: Option<u32>,
    /// The S3-compatible server the bedrock dialect reads job input from and writes output
    /// to (signed with AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY from the environment).
    #[arg(long, value_name = "URL")]
    pub s3_endpoint: Option<String>,
    /// The Cloud Storage JSON API (a GCS emulator) the vertex dialect reads job input from
    /// and writes predictions to.
    #[arg(long, value_name = "URL")]
    pub gcs_endpoint: Option<String>,
    #[command(flatten)]
    pub platform: super::simulator_platform::PlatformArgs,
}

#[derive(Debug, Clone, Copy, clap::ValueEnum)]
pub(super) enum DialectArg {
    Openai,
    Anthropic,
    Gemini,
    /// Azure OpenAI: `/openai/v1` (and dated `/openai?api-version=`), the `api-key` header.
    Azure,
    /// Amazon Bedrock batch inference: SigV4-signed control plane, job files in S3 (--s3-endpoint).
    Bedrock,
    /// Mistral batch: `/v1/files`, `/v1/batch/jobs`, Mistral's error bodies.
    Mistral,
    /// Vertex AI batch prediction: OAuth tokens from its own /token, job files in Cloud Storage (--gcs-endpoint).
    Vertex,
}

pub(super) async fn run(args: Args) -> anyhow::Result<ExitCode> {
    let api_key = match &args.api_key_env {
        None => None,
        Some(name) => {
            Some(std::env::var(name).with_context(|| format!("--api-key-env {name}: the variable is not set"))?)
        }
    };
    let mut faults = match &args.faults {
        None => Faults::default(),
        Some(json) => serde_json::from_str(json).context("--faults is not a valid fault JSON object")?,
    };
    faults.invalid_first = args.invalid_first.unwrap_or(faults.invalid_first);
    faults.ungrounded_first = args.ungrounded_first.unwrap_or(faults.ungrounded_first);
    let dialect = match args.dialect {
        DialectArg::Openai => Dialect::OpenAi,
        DialectArg::Anthropic => Dialect::Anthropic,
        DialectArg::Gemini => Dialect::Gemini,
        DialectArg::Azure => Dialect::Azure,
        DialectArg::Bedrock => Dialect::Bedrock,
        DialectArg::Mistral => Dialect::Mistral,
        DialectArg::Vertex => Dialect::Vertex,
    };
    if matches!(dialect, Dialect::Bedrock) && args.s3_endpoint.is_none() {
        anyhow::bail!(
            "--dialect bedrock needs --s3-endpoint URL: jobs read their input from S3 and write their output there"
        );
    }
    if matches!(dialect, Dialect::Vertex) && args.gcs_endpoint.is_none() {
        anyhow::bail!(
            "--dialect vertex needs --gcs-endpoint URL: jobs read their input from Cloud Storage and write their output there"
        );
    }
    let config = SimulatorConfig {
        dialect,
        faults,
        api_key,
        complete_after: args.complete_after,
        variant: args.platform.variant().map_err(anyhow::Error::msg)?,
        s3: args.s3_endpoint.as_ref().map(|endpoint| S3Access {
            endpoint: endpoint.clone(),
            access_key_id: std::env::var("AWS_ACCESS_KEY_ID").unwrap_or_default(),
            secret_access_key: std::env::var("AWS_SECRET_ACCESS_KEY").unwrap_or_default(),
        }),
        gcs_endpoint: args.gcs_endpoint.clone(),
        ..SimulatorConfig::default()
    };
    let signals = super::signals::Signals::install().context("cannot install signal handlers")?;
    let simulator = Simulator::start(args.listen, config)
        .await
        .with_context(|| format!("cannot listen on {}: is another process using it?", args.listen))?;
    // Scripts that pass port 0 read the real address from this line.
    match dialect {
        Dialect::OpenAi => println!(
            "commitpoint simulator listening on {} (SIMULATED provider, not a real model)",
            simulator.base_url()
        ),
        Dialect::Azure => println!(
            "commitpoint simulator listening on {} (SIMULATED Azure OpenAI resource, endpoint {}, not a real model)",
            simulator.base_url(),
            simulator.origin()
        ),
        Dialect::Anthropic => println!(
            "commitpoint simulator listening on {} (SIMULATED Anthropic Message Batches provider, not a real model)",
            simulator.base_url()
        ),
        Dialect::Gemini => println!(
            "commitpoint simulator listening on {} (SIMULATED Gemini API batch mode provider, not a real model)",
            simulator.base_url()
        ),
        Dialect::Bedrock => println!(
            "commitpoint simulator listening on {} (SIMULATED Amazon Bedrock batch inference control plane, not a real model)",
            simulator.base_url()
        ),
        Dialect::Mistral => println!(
            "commitpoint simulator listening on {} (SIMULATED Mistral batch provider, not a real model)",
            simulator.base_url()
        ),
        Dialect::Vertex => println!(
            "commitpoint simulator listening on {} (SIMULATED Vertex AI batch prediction, token endpoint {}/token, not a real model)",
            simulator.base_url(),
            simulator.origin()
        ),
    }
    signals.wait(|| tracing::info!("SIGHUP: the simulator has nothing to reload")).await;
    simulator.stop().await;
    Ok(ExitCode::SUCCESS)
}
