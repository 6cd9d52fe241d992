//! `[providers.<name>] kind = "mistral"`: Mistral's batch API (docs/PROVIDERS.md, "Mistral").

use std::path::PathBuf;

use serde::Deserialize;

use super::file::one_source;
use super::kinds::at_least_one;
use super::{Error, KeySource};
use crate::providers::mistral;

/// The variable Mistral's SDK examples read the key from.
pub(crate) const DEFAULT_MISTRAL_KEY_ENV: &str = "MISTRAL_API_KEY";

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawMistral {
    /// The API origin without `/v1` (default the public endpoint).
    pub base_url: Option<String>,
    /// A model id such as `mistral-small-latest`.
    pub model: String,
    /// Sent as each request's `max_tokens` when set.
    pub max_tokens: Option<u32>,
    /// The most a truncated answer's one retry may ask for (default 16384).
    pub max_tokens_cap: Option<u32>,
    /// The job's `timeout_hours` (Mistral's default, 24 in its SDKs, when unset).
    pub timeout_hours: Option<u32>,
    pub api_key_env: Option<String>,
    pub api_key_file: Option<PathBuf>,
    pub api_key_credential: Option<String>,
}

#[derive(Debug, Clone, PartialEq)]
pub(crate) struct MistralOptions {
    pub base_url: Option<String>,
    pub model: String,
    pub max_tokens: Option<u32>,
    pub max_tokens_cap: u32,
    pub timeout_hours: Option<u32>,
    pub key: KeySource,
}

impl RawMistral {
    pub(super) fn resolve(self) -> Result<MistralOptions, Error> {
        let key = one_source("api_key_*", &self.api_key_env, &self.api_key_file, &self.api_key_credential)?
            .unwrap_or_else(|| KeySource::Env(DEFAULT_MISTRAL_KEY_ENV.to_string()));
        let model = self.model.trim();
        if model.is_empty() || model.contains('/') || model.contains(char::is_whitespace) {
            return Err(Error::Invalid {
                key: "model",
                reason: format!("{:?} must be a Mistral model id such as \"mistral-small-latest\"", self.model),
            });
        }
        if let Some(base) = &self.base_url
            && base.trim_end_matches('/').ends_with("/v1")
        {
            return Err(Error::Invalid {
                key: "base_url",
                reason: format!("{base:?} must be the origin without /v1 (e.g. \"{}\")", mistral::DEFAULT_BASE_URL),
            });
        }
        let max_tokens_cap =
            at_least_one("max_tokens_cap", self.max_tokens_cap)?.unwrap_or(mistral::DEFAULT_MAX_TOKENS_CAP);
        let max_tokens = at_least_one("max_tokens", self.max_tokens)?;
        if max_tokens.is_some_and(|m| m > max_tokens_cap) {
            return Err(Error::Invalid {
                key: "max_tokens",
                reason: format!("must not exceed max_tokens_cap ({max_tokens_cap})"),
            });
        }
        Ok(MistralOptions {
            base_url: self.base_url,
            model: self.model,
            max_tokens,
            max_tokens_cap,
            timeout_hours: at_least_one("timeout_hours", self.timeout_hours)?,
            key,
        })
    }
}

/// `config check` / `describe` lines for the table.
pub(super) fn describe(m: &MistralOptions, lines: &mut Vec<String>) {
    if let Some(base) = &m.base_url {
        lines.push(format!("base_url = {base:?}"));
    }
    lines.push(format!("model = {:?}", m.model));
    lines.push(
        m.max_tokens
            .map_or_else(|| "# max_tokens: unset, the model's own limit".to_string(), |n| format!("max_tokens = {n}")),
    );
    lines.push(format!("max_tokens_cap = {}", m.max_tokens_cap));
    lines.push(
        m.timeout_hours.map_or_else(
            || "# timeout_hours: unset, Mistral's default".to_string(),
            |n| format!("timeout_hours = {n}"),
        ),
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    fn resolve(text: &str) -> Result<MistralOptions, Error> {
        toml::from_str::<RawMistral>(text).map_err(|e| Error::Invalid { key: "t", reason: e.to_string() })?.resolve()
    }

    #[test]
    fn defaults_and_refusals() {
        let o = resolve("model = \"mistral-small-latest\"").unwrap();
        assert_eq!(o.key, KeySource::Env(DEFAULT_MISTRAL_KEY_ENV.into()));
        assert_eq!((o.max_tokens, o.max_tokens_cap, o.timeout_hours), (None, 16_384, None));
        assert!(resolve("model = \"\"").is_err());
        assert!(resolve("model = \"mistralai/mistral-small\"").is_err(), "a hub path is no API model id");
        let v1 = resolve("model = \"m\"\nbase_url = \"https://api.mistral.ai/v1\"").unwrap_err();
        assert!(v1.to_string().contains("without /v1"), "{v1}");
        assert!(resolve("model = \"m\"\nbase_url = \"https://api.mistral.ai\"").is_ok());
        assert!(resolve("model = \"m\"\ntimeout_hours = 0").is_err());
        assert!(resolve("model = \"m\"\nmax_tokens = 0").is_err());
        assert!(resolve("model = \"m\"\nmax_tokens = 9000\nmax_tokens_cap = 4000").is_err());
        assert!(resolve("model = \"m\"\nmax_completion_tokens = 100").is_err(), "OpenAI's name is not Mistral's");
        assert!(resolve("model = \"m\"\napi_key_env = \"A\"\napi_key_file = \"/k\"").is_err());
    }
}
