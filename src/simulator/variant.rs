//! How an OpenAI-shaped platform departs from OpenAI's own Batch API, as simulator options:
//! Azure OpenAI (`--dialect azure`) and the compatible platforms (a Groq-like one: another
//! base path, metadata dropped or refused, other rate-limit headers, one-page lists).
//! The handlers stay OpenAI's; they consult this where the platforms differ.

use serde::{Deserialize, Serialize};

use super::error::ApiError;

/// What the platform does with a batch's `metadata`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MetadataMode {
    /// Stored and listed back (OpenAI, Azure).
    #[default]
    Kept,
    /// Accepted and dropped: the batch answers `metadata: null`.
    Ignored,
    /// A create carrying it is refused with a 400 naming it.
    Refused,
}

/// How a 429 says when to come back.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum RateLimitHeaders {
    /// `retry-after`, `retry-after-ms` and the `x-ratelimit-*` family (OpenAI).
    #[default]
    Openai,
    /// `retry-after` in seconds, no `retry-after-ms`, resets as `2m59.56s`-style durations
    /// with the exhausted limit at 0 remaining (Groq).
    Groq,
    /// Only `x-ratelimit-reset-*` durations, no `retry-after` at all.
    ResetOnly,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Variant {
    /// Where the Files and Batches API lives, e.g. `/v1` (OpenAI) or `/openai/v1` (Groq).
    pub base_path: String,
    pub metadata: MetadataMode,
    pub rate_limit_headers: RateLimitHeaders,
    /// Lists carry `has_more` / `first_id` / `last_id` and honour `limit` / `after`; off,
    /// a list is everything in one answer with none of those fields (Groq).
    pub paged_lists: bool,
    /// Azure OpenAI: the `api-key` header, the dated `/openai` routes beside `/openai/v1`,
    /// `/chat/completions` lines, 100,000 requests per file, 14–30-day file expiry given as
    /// `expires_after.anchor` / `expires_after.seconds`.
    pub azure: bool,
}

impl Default for Variant {
    fn default() -> Self {
        Self {
            base_path: "/v1".to_string(),
            metadata: MetadataMode::Kept,
            rate_limit_headers: RateLimitHeaders::Openai,
            paged_lists: true,
            azure: false,
        }
    }
}

/// Azure's base path for the v1 API; the dated API versions live one level up.
pub(super) const AZURE_V1_PATH: &str = "/openai/v1";
pub(super) const AZURE_DATED_PATH: &str = "/openai";
/// Azure's input files take up to 100,000 requests (OpenAI: 50,000).
pub(super) const AZURE_MAX_LINES: usize = 100_000;
/// Azure's file expiry range, 14 to 30 days.
pub(super) const AZURE_EXPIRY_SECS: std::ops::RangeInclusive<i64> = 1_209_600..=2_592_000;

impl Variant {
    pub fn azure() -> Self {
        Self { base_path: AZURE_V1_PATH.to_string(), azure: true, ..Self::default() }
    }

    /// Groq as its SDK and docs describe it: `/openai/v1`, one-page lists, its 429 headers,
    /// and (the case commitpoint must survive) metadata that does not come back.
    pub fn groq_like() -> Self {
        Self {
            base_path: "/openai/v1".to_string(),
            metadata: MetadataMode::Ignored,
            rate_limit_headers: RateLimitHeaders::Groq,
            paged_lists: false,
            azure: false,
        }
    }

    /// The request URLs an input line may name, and a create's `endpoint` with them.
    pub fn request_urls(&self) -> &'static [&'static str] {
        if self.azure { &["/v1/chat/completions", "/chat/completions"] } else { &["/v1/chat/completions"] }
    }

    pub fn max_lines(&self) -> usize {
        if self.azure { AZURE_MAX_LINES } else { super::input::MAX_LINES }
    }

    /// Rewrites an injected 429's headers into this platform's style.
    pub fn restyle(&self, mut error: ApiError) -> ApiError {
        if error.status != axum::http::StatusCode::TOO_MANY_REQUESTS
            || self.rate_limit_headers == RateLimitHeaders::Openai
        {
            return error;
        }
        let Some(secs) = error.headers.iter().find(|(n, _)| *n == "retry-after").map(|(_, v)| v.clone()) else {
            return error;
        };
        error.headers.clear();
        if self.rate_limit_headers == RateLimitHeaders::Groq {
            error.headers.push(("retry-after", secs.clone()));
        }
        // Tokens per minute exhausted; the daily request limit is not, and resets far later.
        for (name, value) in [
            ("x-ratelimit-limit-requests", "14400".to_string()),
            ("x-ratelimit-remaining-requests", "14370".to_string()),
            ("x-ratelimit-reset-requests", "2m59.56s".to_string()),
            ("x-ratelimit-limit-tokens", "18000".to_string()),
            ("x-ratelimit-remaining-tokens", "0".to_string()),
            ("x-ratelimit-reset-tokens", format!("{secs}.00s")),
        ] {
            error.headers.push((name, value));
        }
        error
    }
}

/// Whether an Azure request's api-version takes `expires_after` / `output_expires_after`:
/// the v1 API (no api-version) and dated versions from `2025-03-01-preview` on, the version
/// Azure's batch how-to moved to when it added them (MicrosoftDocs/azure-ai-docs 0a3ff77,
/// 2025-03-31; before, it used `2024-10-21` without them).
pub(super) fn azure_expiry_accepted(query: Option<&str>) -> bool {
    let version = query.and_then(|q| q.split('&').find_map(|p| p.strip_prefix("api-version=")));
    version.is_none_or(|v| v.get(..10).is_some_and(|date| date >= FIRST_EXPIRY_VERSION))
}

const FIRST_EXPIRY_VERSION: &str = "2025-03-01";

#[cfg(test)]
mod tests {
    use super::*;
    use crate::simulator::faults::Injected;

    #[test]
    fn groq_and_reset_only_429s_carry_their_own_headers() {
        let groq = Variant::groq_like().restyle(Injected::RateLimited { retry_after_secs: 2 }.into_error());
        assert_eq!(groq.header_value("retry-after"), Some("2"));
        assert_eq!(groq.header_value("retry-after-ms"), None);
        assert_eq!(groq.header_value("x-ratelimit-reset-tokens"), Some("2.00s"));
        let reset_only = Variant { rate_limit_headers: RateLimitHeaders::ResetOnly, ..Variant::default() }
            .restyle(Injected::RateLimited { retry_after_secs: 3 }.into_error());
        assert_eq!(reset_only.header_value("retry-after"), None);
        assert_eq!(reset_only.header_value("x-ratelimit-remaining-tokens"), Some("0"));
        let openai = Variant::default().restyle(Injected::RateLimited { retry_after_secs: 3 }.into_error());
        assert_eq!(openai.header_value("retry-after-ms"), Some("3000"));
    }

    #[test]
    fn azure_expiry_fields_from_2025_03_01_preview_and_on_v1() {
        assert!(azure_expiry_accepted(None) && azure_expiry_accepted(Some("x=1")));
        assert!(azure_expiry_accepted(Some("api-version=2025-03-01-preview")));
        assert!(azure_expiry_accepted(Some("a=b&api-version=2025-04-01-preview")));
        assert!(!azure_expiry_accepted(Some("api-version=2024-10-21")));
        assert!(!azure_expiry_accepted(Some("api-version=2025-02-01-preview")));
        assert!(!azure_expiry_accepted(Some("api-version=junk")));
    }
}
