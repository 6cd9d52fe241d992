//! The provider registry: the one place typed provider settings become adapters. `serve`
//! and `provider check` build through [`build`]; `config check` runs [`check`], the same
//! secret loading and adapter set-up without starting anything, so a configuration the
//! check passes does not fail at start.

use std::sync::Arc;
use std::time::Duration;

use crate::app::config::{self, ProviderKind, ProviderSettings, ProviderSpec};
use crate::providers::anthropic::{AnthropicBatches, AnthropicConfig};
use crate::providers::bedrock::{BedrockBatches, BedrockConfig};
use crate::providers::chat::{ChatCompletions, ChatConfig};
use crate::providers::gemini::{GeminiBatches, GeminiConfig};
use crate::providers::generic::{GenericBatches, GenericConfig};
use crate::providers::mistral::{MistralBatches, MistralConfig};
use crate::providers::openai::{Flavour, OpenAiBatches, OpenAiConfig};
use crate::providers::vertex::{VertexBatches, VertexConfig};
use crate::providers::{ApiKey, BatchProvider, ProviderError};
use crate::simulator::{Simulator, SimulatorConfig};

#[derive(Debug, thiserror::Error)]
pub(crate) enum Error {
    #[error(transparent)]
    Config(#[from] config::Error),
    #[error("provider {name:?}: cannot set it up")]
    Provider {
        name: String,
        #[source]
        source: ProviderError,
    },
    #[error("provider {name:?}: {reason}")]
    Setup { name: String, reason: String },
    #[error("provider {name:?}: cannot start the built-in simulator")]
    Simulator {
        name: String,
        #[source]
        source: std::io::Error,
    },
}

impl Error {
    /// Configuration mistakes an operator must fix; restarting will not help.
    pub(crate) fn is_config(&self) -> bool {
        !matches!(self, Error::Simulator { .. })
    }
}

/// One running provider: its adapter, and its kind (schedulers pace synchronous kinds
/// differently).
#[derive(Debug, Clone)]
pub(crate) struct Built {
    pub kind: ProviderKind,
    pub adapter: Arc<dyn BatchProvider>,
    /// The provider's override of the schemas' re-ask limits.
    pub reask: Option<u32>,
}

/// Every configured provider's adapter, in configuration order, and the embedded
/// simulators they talk to (each lives as long as its handle).
#[derive(Debug, Default)]
pub(crate) struct Providers {
    pub providers: Vec<Built>,
    pub simulators: Vec<Simulator>,
}

/// Builds every provider; a `simulator` kind starts its simulator on a loopback port.
pub(crate) async fn build(settings: &[ProviderSettings]) -> Result<Providers, Error> {
    let mut built = Providers::default();
    for provider in settings {
        let simulator_url = match &provider.spec {
            ProviderSpec::Simulator(_) => {
                let simulator = Simulator::start(([127, 0, 0, 1], 0).into(), SimulatorConfig::default())
                    .await
                    .map_err(|source| Error::Simulator { name: provider.name.clone(), source })?;
                let url = simulator.base_url();
                tracing::warn!(provider = %provider.name, %url, "provider is the built-in SIMULATOR: results come from a rule-based stand-in, not a model");
                built.simulators.push(simulator);
                Some(url)
            }
            _ => None,
        };
        let adapter = adapter(provider, simulator_url)?;
        built.providers.push(Built { kind: provider.kind(), adapter, reask: provider.reask });
    }
    Ok(built)
}

/// Everything [`build`] does that can fail on configuration (secrets, URLs, keys an HTTP
/// header cannot carry), without starting a simulator or calling anyone.
pub(crate) fn check(settings: &[ProviderSettings]) -> Result<(), Error> {
    for provider in settings {
        if !matches!(provider.spec, ProviderSpec::Simulator(_)) {
            adapter(provider, None)?;
        }
    }
    Ok(())
}

fn adapter(settings: &ProviderSettings, simulator_url: Option<String>) -> Result<Arc<dyn BatchProvider>, Error> {
    let name = settings.name.clone();
    let secret = settings.load_secret()?;
    let key = || ApiKey::new(secret.clone().unwrap_or_default());
    let provider_error = |source| Error::Provider { name: name.clone(), source };
    let adapter: Arc<dyn BatchProvider> = match &settings.spec {
        ProviderSpec::Openai(o) => Arc::new(
            OpenAiBatches::new(OpenAiConfig {
                name: name.clone(),
                base_url: o.base_url.clone(),
                api_key: key(),
                model: o.model.clone(),
                request_timeout: Duration::from_secs(120),
                max_completion_tokens: o.budget.max_completion_tokens,
                max_completion_tokens_cap: o.budget.max_completion_tokens_cap,
            })
            .map_err(provider_error)?
            .with_flavour(Flavour::openai(o.batch_metadata)),
        ),
        ProviderSpec::Azure(a) => {
            Arc::new(crate::providers::openai::azure_adapter(&name, &a.target(), key()).map_err(provider_error)?)
        }
        ProviderSpec::Simulator(s) => Arc::new(
            OpenAiBatches::new(OpenAiConfig {
                name: name.clone(),
                base_url: simulator_url.unwrap_or_default(),
                api_key: ApiKey::new("simulator-needs-no-key".to_string()),
                model: s.model.clone(),
                request_timeout: Duration::from_secs(30),
                max_completion_tokens: s.budget.max_completion_tokens,
                max_completion_tokens_cap: s.budget.max_completion_tokens_cap,
            })
            .map_err(provider_error)?,
        ),
        ProviderSpec::Anthropic(a) => {
            let mut config = AnthropicConfig { name: name.clone(), ..AnthropicConfig::new(key(), a.model.clone()) };
            if let Some(base) = &a.base_url {
                config.base_url = base.clone();
            }
            config.max_tokens = a.max_tokens;
            config.max_tokens_cap = a.max_tokens_cap;
            let adapter = AnthropicBatches::new(config)
                .map_err(|e| Error::Setup { name: name.clone(), reason: e.to_string() })?;
            Arc::new(adapter)
        }
        ProviderSpec::Generic(g) => {
            let mut config = GenericConfig::new(g.base_url.clone(), key(), g.model.clone());
            config.name = name.clone();
            if let Some(capability) = &g.capability {
                config.capability = capability.clone();
            }
            config.max_tokens = g.max_tokens;
            config.max_tokens_cap = g.max_tokens_cap;
            g.fields
                .apply(&mut config.fields)
                .map_err(|e| Error::Setup { name: name.clone(), reason: e.to_string() })?;
            Arc::new(GenericBatches::new(config).map_err(provider_error)?)
        }
        ProviderSpec::Chat(c) => {
            let mut config = ChatConfig::new(c.base_url.clone(), c.model.clone());
            config.name = name.clone();
            config.api_key = secret.clone().map(ApiKey::new);
            if let Some(concurrency) = c.concurrency {
                config.concurrency = concurrency;
            }
            config.max_tokens = c.max_tokens;
            config.max_tokens_cap = c.max_tokens_cap;
            Arc::new(ChatCompletions::new(config).map_err(provider_error)?)
        }
        ProviderSpec::Gemini(g) => {
            let mut config = GeminiConfig { name: name.clone(), ..GeminiConfig::new(key(), g.model.clone()) };
            if let Some(base) = &g.base_url {
                config.base_url = base.clone();
            }
            config.max_output_tokens = g.max_output_tokens;
            config.max_output_tokens_cap = g.max_output_tokens_cap;
            config.inline_max_bytes = g.inline_max_bytes;
            let adapter =
                GeminiBatches::new(config).map_err(|e| Error::Setup { name: name.clone(), reason: e.to_string() })?;
            Arc::new(adapter)
        }
        ProviderSpec::Bedrock(b) => {
            let mut config = BedrockConfig::new(&b.region, &b.model, &b.role_arn, b.input.clone(), b.output.clone());
            config.name = name.clone();
            config.endpoint = b.endpoint.clone();
            config.s3_endpoint = b.s3_endpoint.clone();
            config.max_tokens = b.max_tokens;
            config.max_tokens_cap = b.max_tokens_cap;
            config.min_records = b.min_records;
            config.max_records = b.max_records;
            config.timeout_hours = b.timeout_hours;
            let adapter =
                BedrockBatches::new(config).map_err(|e| Error::Setup { name: name.clone(), reason: e.to_string() })?;
            Arc::new(adapter)
        }
        ProviderSpec::Mistral(m) => {
            let mut config = MistralConfig { name: name.clone(), ..MistralConfig::new(key(), m.model.clone()) };
            if let Some(base) = &m.base_url {
                config.base_url = base.clone();
            }
            config.max_tokens = m.max_tokens;
            config.max_tokens_cap = m.max_tokens_cap;
            config.timeout_hours = m.timeout_hours;
            let adapter =
                MistralBatches::new(config).map_err(|e| Error::Setup { name: name.clone(), reason: e.to_string() })?;
            Arc::new(adapter)
        }
        ProviderSpec::Vertex(v) => {
            let mut config = VertexConfig::new(
                &v.project,
                &v.location,
                &v.model,
                v.input.clone(),
                v.output.clone(),
                v.credentials.clone(),
            );
            config.name = name.clone();
            config.endpoint = v.endpoint.clone();
            config.gcs_endpoint = v.gcs_endpoint.clone();
            config.max_output_tokens = v.max_output_tokens;
            config.max_output_tokens_cap = v.max_output_tokens_cap;
            let adapter =
                VertexBatches::new(config).map_err(|e| Error::Setup { name: name.clone(), reason: e.to_string() })?;
            Arc::new(adapter)
        }
    };
    Ok(adapter)
}
