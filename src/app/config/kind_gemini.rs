//! `[providers.<name>] kind = "gemini"`: the Gemini API's batch mode (docs/PROVIDERS.md,
//! "Gemini").

use std::path::PathBuf;

use serde::Deserialize;

use super::file::one_source;
use super::kinds::at_least_one;
use super::{Error, KeySource};
use crate::providers::gemini;

/// The variable the official Gemini SDKs read the key from.
pub(crate) const DEFAULT_GEMINI_KEY_ENV: &str = "GEMINI_API_KEY";

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawGemini {
    /// The API origin without `/v1beta` (default the public endpoint).
    pub base_url: Option<String>,
    /// A model id such as `gemini-2.5-flash` (without `models/`).
    pub model: String,
    /// Sent as each request's `generationConfig.maxOutputTokens` when set.
    pub max_output_tokens: Option<u32>,
    /// The most a truncated answer's one retry may ask for (default 16384).
    pub max_output_tokens_cap: Option<u32>,
    /// A batch whose inline create body would be larger goes through the File API as JSONL
    /// (default: the documented 20 MB of inline requests).
    pub inline_max_bytes: Option<u64>,
    pub api_key_env: Option<String>,
    pub api_key_file: Option<PathBuf>,
    pub api_key_credential: Option<String>,
}

#[derive(Debug, Clone, PartialEq)]
pub(crate) struct GeminiOptions {
    pub base_url: Option<String>,
    pub model: String,
    pub max_output_tokens: Option<u32>,
    pub max_output_tokens_cap: u32,
    pub inline_max_bytes: u64,
    pub key: KeySource,
}

impl RawGemini {
    pub(super) fn resolve(self) -> Result<GeminiOptions, Error> {
        let key = one_source("api_key_*", &self.api_key_env, &self.api_key_file, &self.api_key_credential)?
            .unwrap_or_else(|| KeySource::Env(DEFAULT_GEMINI_KEY_ENV.to_string()));
        if self.model.trim().is_empty() || self.model.starts_with("models/") {
            return Err(Error::Invalid {
                key: "model",
                reason: format!("{:?} must be a model id such as \"gemini-2.5-flash\" (no `models/`)", self.model),
            });
        }
        let inline_max_bytes = match self.inline_max_bytes {
            Some(0) => return Err(Error::Invalid { key: "inline_max_bytes", reason: "must be at least 1".into() }),
            Some(n) => n.min(gemini::INLINE_MAX_BYTES),
            None => gemini::INLINE_MAX_BYTES,
        };
        Ok(GeminiOptions {
            base_url: self.base_url,
            model: self.model,
            max_output_tokens: at_least_one("max_output_tokens", self.max_output_tokens)?,
            max_output_tokens_cap: at_least_one("max_output_tokens_cap", self.max_output_tokens_cap)?
                .unwrap_or(gemini::DEFAULT_MAX_OUTPUT_TOKENS_CAP),
            inline_max_bytes,
            key,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn resolve(text: &str) -> Result<GeminiOptions, Error> {
        toml::from_str::<RawGemini>(text).map_err(|e| Error::Invalid { key: "t", reason: e.to_string() })?.resolve()
    }

    #[test]
    fn defaults_and_refusals() {
        let o = resolve("model = \"gemini-2.5-flash\"").unwrap();
        assert_eq!(o.key, KeySource::Env(DEFAULT_GEMINI_KEY_ENV.into()));
        assert_eq!((o.max_output_tokens, o.inline_max_bytes), (None, gemini::INLINE_MAX_BYTES));
        assert!(resolve("model = \"models/gemini-2.5-flash\"").unwrap_err().to_string().contains("no `models/`"));
        assert!(resolve("model = \"m\"\ninline_max_bytes = 0").is_err());
        assert!(resolve("model = \"m\"\nmax_output_tokens = 0").is_err());
        assert!(resolve("model = \"m\"\nconcurrency = 2").is_err(), "another kind's key");
        assert_eq!(resolve("model = \"m\"\ninline_max_bytes = 99999999999").unwrap().inline_max_bytes, 20_000_000);
    }
}
