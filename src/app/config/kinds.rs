//! What each provider kind's `[providers.<name>]` table may hold, and its typed options.
//! Every table is checked against its kind's own key list, so a key another kind takes
//! (say `concurrency` on an OpenAI account) is an error, not silently ignored.

use std::path::PathBuf;

use serde::Deserialize;

use super::file::one_source;
use super::{DEFAULT_MODEL, DEFAULT_OPENAI_BASE_URL, DEFAULT_OPENAI_KEY_ENV, Error, KeySource};
use crate::providers::openai::DEFAULT_MAX_COMPLETION_TOKENS_CAP;
use crate::providers::{anthropic, chat};

/// The model name sent to the built-in simulator when none is configured for it.
pub(crate) const SIMULATOR_MODEL: &str = "simulated-reviewer";
pub(super) const DEFAULT_ANTHROPIC_KEY_ENV: &str = "ANTHROPIC_API_KEY";

/// The OpenAI Batch API, or a platform speaking it.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawOpenAi {
    pub base_url: Option<String>,
    pub model: Option<String>,
    pub api_key_env: Option<String>,
    pub api_key_file: Option<PathBuf>,
    pub api_key_credential: Option<String>,
    /// Sent as each request's `max_completion_tokens` (default unset: the model's own limit).
    pub max_completion_tokens: Option<u32>,
    /// The most a truncated answer's one retry may ask for (default 16384).
    pub max_completion_tokens_cap: Option<u32>,
    /// Whether the platform keeps a batch's `metadata` (default: true for OpenAI's own
    /// URL, false for any other, whose lost jobs are then looked up by input file).
    pub batch_metadata: Option<bool>,
}

/// The built-in simulator on a loopback port: it takes no URL and no key. It speaks the
/// OpenAI Batch API, so it takes that kind's output budgets.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawSimulator {
    pub model: Option<String>,
    pub max_completion_tokens: Option<u32>,
    pub max_completion_tokens_cap: Option<u32>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawAnthropic {
    pub base_url: Option<String>,
    pub model: String,
    /// `max_tokens` of every request (default 4096: the API requires one).
    pub max_tokens: Option<u32>,
    /// The most a truncated answer's one retry may ask for (default 8192).
    pub max_tokens_cap: Option<u32>,
    pub api_key_env: Option<String>,
    pub api_key_file: Option<PathBuf>,
    pub api_key_credential: Option<String>,
}

/// A platform speaking the generic REST batch contract (PROVIDERS.md §4).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawGeneric {
    pub base_url: String,
    pub model: String,
    pub capability: Option<String>,
    /// Sent as each item's `max_tokens` when set.
    pub max_tokens: Option<u32>,
    /// The most a truncated answer's one retry may ask for (default 8192).
    pub max_tokens_cap: Option<u32>,
    pub api_key_env: Option<String>,
    pub api_key_file: Option<PathBuf>,
    pub api_key_credential: Option<String>,
    /// Field names the contract leaves unconfirmed; each defaults as documented in
    /// docs/PROVIDERS.md.
    #[serde(default)]
    pub fields: GenericFieldOverrides,
}

/// An OpenAI-compatible chat server called synchronously (vLLM, llama.cpp, Ollama).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawChat {
    pub base_url: String,
    pub model: String,
    pub concurrency: Option<usize>,
    /// Sent as each request's `max_tokens` when set.
    pub max_tokens: Option<u32>,
    /// The most a truncated answer's one retry may ask for (default 8192).
    pub max_tokens_cap: Option<u32>,
    /// Optional: local servers often take no key.
    pub api_key_env: Option<String>,
    pub api_key_file: Option<PathBuf>,
    pub api_key_credential: Option<String>,
}

/// Overrides of the generic contract's unconfirmed field names (JSON Pointers, except
/// `item_id`, a plain key) and batch state names.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct GenericFieldOverrides {
    pub item_id: Option<String>,
    pub state: Option<String>,
    pub results: Option<String>,
    pub results_url: Option<String>,
    pub item_response: Option<String>,
    pub item_error: Option<String>,
    pub item_cost_usd: Option<String>,
    pub item_request_id: Option<String>,
    pub running_states: Option<Vec<String>>,
    pub completed_states: Option<Vec<String>>,
    pub failed_states: Option<Vec<String>>,
    pub cancelled_states: Option<Vec<String>>,
    pub expired_states: Option<Vec<String>>,
}

#[derive(Debug, Clone, PartialEq)]
pub(crate) struct OpenAiOptions {
    pub base_url: String,
    pub model: String,
    pub key: KeySource,
    pub budget: OpenAiBudget,
    /// The platform keeps batch `metadata`, so a lookup by batch key is conclusive.
    pub batch_metadata: bool,
}

/// Whether batch metadata may be trusted when the config does not say: only OpenAI's
/// own API is known to keep it (docs/PROVIDERS.md, "OpenAI-compatible batch platforms").
pub(super) fn metadata_kept_by_default(base_url: &str) -> bool {
    base_url.trim_end_matches('/') == DEFAULT_OPENAI_BASE_URL
}

/// The output budgets of a provider speaking the OpenAI Batch API (OpenAI, simulator).
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct OpenAiBudget {
    /// Sent as `max_completion_tokens` when set.
    pub max_completion_tokens: Option<u32>,
    /// The most a truncated answer's one retry may ask for.
    pub max_completion_tokens_cap: u32,
}

impl Default for OpenAiBudget {
    fn default() -> Self {
        Self { max_completion_tokens: None, max_completion_tokens_cap: DEFAULT_MAX_COMPLETION_TOKENS_CAP }
    }
}

impl OpenAiBudget {
    /// Keys are relative to the provider's table (the caller names the table).
    pub(crate) fn resolve(max_completion_tokens: Option<u32>, cap: Option<u32>) -> Result<Self, Error> {
        Ok(Self {
            max_completion_tokens: at_least_one("max_completion_tokens", max_completion_tokens)?,
            max_completion_tokens_cap: at_least_one("max_completion_tokens_cap", cap)?
                .unwrap_or(DEFAULT_MAX_COMPLETION_TOKENS_CAP),
        })
    }
}

#[derive(Debug, Clone, PartialEq)]
pub(crate) struct SimulatorOptions {
    pub model: String,
    pub budget: OpenAiBudget,
}

#[derive(Debug, Clone, PartialEq)]
pub(crate) struct AnthropicOptions {
    pub base_url: Option<String>,
    pub model: String,
    pub max_tokens: u32,
    pub max_tokens_cap: u32,
    pub key: KeySource,
}

#[derive(Debug, Clone, PartialEq)]
pub(crate) struct GenericOptions {
    pub base_url: String,
    pub model: String,
    pub capability: Option<String>,
    pub max_tokens: Option<u32>,
    pub max_tokens_cap: u32,
    pub key: KeySource,
    pub fields: GenericFieldOverrides,
}

#[derive(Debug, Clone, PartialEq)]
pub(crate) struct ChatOptions {
    pub base_url: String,
    pub model: String,
    pub concurrency: Option<usize>,
    pub max_tokens: Option<u32>,
    pub max_tokens_cap: u32,
    pub key: Option<KeySource>,
}

impl GenericFieldOverrides {
    /// Applies the overrides onto the adapter's defaults, checking pointers are pointers.
    pub(crate) fn apply(&self, fields: &mut crate::providers::generic::GenericFields) -> Result<(), Error> {
        let set = |target: &mut String, value: &Option<String>, pointer: bool| -> Result<(), Error> {
            if let Some(v) = value {
                if pointer && !v.is_empty() && !v.starts_with('/') {
                    return Err(Error::Invalid {
                        key: "fields",
                        reason: format!("{v:?} is not a JSON Pointer (it must start with '/')"),
                    });
                }
                *target = v.clone();
            }
            Ok(())
        };
        set(&mut fields.item_id, &self.item_id, false)?;
        set(&mut fields.state, &self.state, true)?;
        set(&mut fields.results, &self.results, true)?;
        set(&mut fields.results_url, &self.results_url, true)?;
        set(&mut fields.item_response, &self.item_response, true)?;
        set(&mut fields.item_error, &self.item_error, true)?;
        set(&mut fields.item_cost_usd, &self.item_cost_usd, true)?;
        set(&mut fields.item_request_id, &self.item_request_id, true)?;
        let states = &mut fields.states;
        for (target, value) in [
            (&mut states.running, &self.running_states),
            (&mut states.completed, &self.completed_states),
            (&mut states.failed, &self.failed_states),
            (&mut states.cancelled, &self.cancelled_states),
            (&mut states.expired, &self.expired_states),
        ] {
            if let Some(names) = value {
                target.clone_from(names);
            }
        }
        Ok(())
    }
}

/// Key names in these errors are relative to the provider's table; the caller adds
/// `providers.<name>`.
const API_KEY: &str = "api_key_*";

fn required_key(raw: (&Option<String>, &Option<PathBuf>, &Option<String>)) -> Result<KeySource, Error> {
    one_source(API_KEY, raw.0, raw.1, raw.2)?
        .ok_or(Error::Invalid { key: API_KEY, reason: "a secret is required (_env, _file or _credential)".into() })
}

/// Token budgets of 0 are refused: no provider accepts one.
pub(super) fn at_least_one(key: &'static str, value: Option<u32>) -> Result<Option<u32>, Error> {
    match value {
        Some(0) => Err(Error::Invalid { key, reason: "must be at least 1".into() }),
        other => Ok(other),
    }
}

impl RawOpenAi {
    pub(super) fn resolve(self) -> Result<OpenAiOptions, Error> {
        let key = one_source(API_KEY, &self.api_key_env, &self.api_key_file, &self.api_key_credential)?;
        let base_url = self.base_url.unwrap_or_else(|| DEFAULT_OPENAI_BASE_URL.to_string());
        Ok(OpenAiOptions {
            batch_metadata: self.batch_metadata.unwrap_or_else(|| metadata_kept_by_default(&base_url)),
            base_url,
            model: self.model.unwrap_or_else(|| DEFAULT_MODEL.to_string()),
            key: key.unwrap_or_else(|| KeySource::Env(DEFAULT_OPENAI_KEY_ENV.to_string())),
            budget: OpenAiBudget::resolve(self.max_completion_tokens, self.max_completion_tokens_cap)?,
        })
    }
}

impl RawSimulator {
    pub(super) fn resolve(self) -> Result<SimulatorOptions, Error> {
        Ok(SimulatorOptions {
            model: self.model.unwrap_or_else(|| SIMULATOR_MODEL.to_string()),
            budget: OpenAiBudget::resolve(self.max_completion_tokens, self.max_completion_tokens_cap)?,
        })
    }
}

impl RawAnthropic {
    pub(super) fn resolve(self) -> Result<AnthropicOptions, Error> {
        let key = one_source(API_KEY, &self.api_key_env, &self.api_key_file, &self.api_key_credential)?
            .unwrap_or_else(|| KeySource::Env(DEFAULT_ANTHROPIC_KEY_ENV.to_string()));
        Ok(AnthropicOptions {
            base_url: self.base_url,
            model: self.model,
            max_tokens: at_least_one("max_tokens", self.max_tokens)?.unwrap_or(anthropic::DEFAULT_MAX_TOKENS),
            max_tokens_cap: at_least_one("max_tokens_cap", self.max_tokens_cap)?
                .unwrap_or(anthropic::DEFAULT_MAX_TOKENS_CAP),
            key,
        })
    }
}

impl RawGeneric {
    pub(super) fn resolve(self) -> Result<GenericOptions, Error> {
        let key = required_key((&self.api_key_env, &self.api_key_file, &self.api_key_credential))?;
        // Checked here, not first at start-up, so `config check` refuses a bad pointer too.
        self.fields.apply(&mut crate::providers::generic::GenericFields::default())?;
        Ok(GenericOptions {
            base_url: self.base_url,
            model: self.model,
            capability: self.capability,
            max_tokens: at_least_one("max_tokens", self.max_tokens)?,
            max_tokens_cap: at_least_one("max_tokens_cap", self.max_tokens_cap)?
                .unwrap_or(chat::DEFAULT_MAX_TOKENS_CAP),
            key,
            fields: self.fields,
        })
    }
}

impl RawChat {
    pub(super) fn resolve(self) -> Result<ChatOptions, Error> {
        let key = one_source(API_KEY, &self.api_key_env, &self.api_key_file, &self.api_key_credential)?;
        if self.concurrency == Some(0) {
            return Err(Error::Invalid { key: "concurrency", reason: "must be at least 1".into() });
        }
        Ok(ChatOptions {
            base_url: self.base_url,
            model: self.model,
            concurrency: self.concurrency,
            max_tokens: at_least_one("max_tokens", self.max_tokens)?,
            max_tokens_cap: at_least_one("max_tokens_cap", self.max_tokens_cap)?
                .unwrap_or(chat::DEFAULT_MAX_TOKENS_CAP),
            key,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::providers::generic::GenericFields;

    #[test]
    fn generic_field_names_can_be_overridden_and_are_checked() {
        let raw: RawGeneric = toml::from_str(
            "base_url = \"https://b\"\nmodel = \"m\"\napi_key_env = \"K\"\n\
             [fields]\nitem_id = \"id\"\nstate = \"/status\"\ncompleted_states = [\"done\"]\n",
        )
        .unwrap();
        let options = raw.resolve().unwrap();
        let mut fields = GenericFields::default();
        options.fields.apply(&mut fields).unwrap();
        assert_eq!((fields.item_id.as_str(), fields.state.as_str()), ("id", "/status"));
        assert_eq!(fields.states.completed, vec!["done".to_string()]);
        assert_eq!(fields.results, GenericFields::default().results, "unnamed fields keep their defaults");

        let bad = GenericFieldOverrides { results: Some("results".into()), ..GenericFieldOverrides::default() };
        assert!(bad.apply(&mut GenericFields::default()).is_err());
        assert!(toml::from_str::<RawGeneric>("base_url = \"b\"\nmodel = \"m\"\n[fields]\nstatus = \"/x\"\n").is_err());
        let refused: RawGeneric =
            toml::from_str("base_url = \"b\"\nmodel = \"m\"\napi_key_env = \"K\"\n[fields]\nresults = \"r\"\n")
                .unwrap();
        assert!(refused.resolve().is_err(), "a bad pointer is refused when the config is read");
    }
}
