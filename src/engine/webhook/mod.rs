//! Signed webhooks: verifying the ones we receive and signing the ones we send.
//!
//! Two schemes, both HMAC-SHA256 over the exact raw body (never re-serialized JSON):
//! - [Standard Webhooks](https://www.standardwebhooks.com/) v1: `webhook-id`,
//!   `webhook-timestamp` and `webhook-signature` headers, signed content
//!   `{id}.{timestamp}.{body}`, secrets `whsec_<base64>`. The timestamp bounds replays.
//! - GitHub: `X-Hub-Signature-256: sha256=<hex>` over the body alone, `X-GitHub-Delivery`
//!   as the delivery id. With no timestamp a captured delivery can be replayed, so the
//!   caller must dedupe on the delivery id.
//!
//! Pure: headers come in as plain `Option<&str>` values and the time as a number, so
//! the HTTP layer and clock stay outside. Deduplication on [`Delivery::id`] is the
//! caller's job.

mod signature;
#[cfg(test)]
mod tests;

use std::time::Duration;

pub use signature::{SecretError, WebhookSecret, sign_github, sign_standard, verify_github, verify_standard};

/// The Standard Webhooks header names, lowercase.
pub const WEBHOOK_ID: &str = "webhook-id";
pub const WEBHOOK_TIMESTAMP: &str = "webhook-timestamp";
pub const WEBHOOK_SIGNATURE: &str = "webhook-signature";
/// GitHub's header names, lowercase.
pub const GITHUB_SIGNATURE: &str = "x-hub-signature-256";
pub const GITHUB_DELIVERY: &str = "x-github-delivery";

/// How far `webhook-timestamp` may be from our clock, either way. Five minutes is what
/// the Standard Webhooks reference libraries hard-code.
pub const DEFAULT_TOLERANCE: Duration = Duration::from_secs(5 * 60);

/// Senders' payloads are small; a webhook route is unauthenticated until the signature is
/// checked, so it gets a far smaller body limit than the token-protected API.
pub const DEFAULT_MAX_BODY_BYTES: usize = 1024 * 1024;

/// Delivery ids become dedupe keys in the store; real ones are a few dozen bytes.
pub const MAX_DELIVERY_ID_LEN: usize = 256;

/// An authenticated delivery.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Delivery {
    /// The sender's event id, the same on every retry: the idempotency key.
    pub id: String,
}

/// The three Standard Webhooks header values, as received.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StandardHeaders<'h> {
    pub id: Option<&'h str>,
    pub timestamp: Option<&'h str>,
    pub signature: Option<&'h str>,
}

/// Why a delivery was refused. Messages are meant for the sender's operator, so they
/// say what to fix but never carry the secret or the signature we expected.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SignatureError {
    #[error("missing header {name}")]
    MissingHeader { name: &'static str },
    #[error("malformed header {name}: expected {expected}")]
    MalformedHeader { name: &'static str, expected: &'static str },
    #[error("header {WEBHOOK_SIGNATURE} has no v1 signature; only v1 (HMAC-SHA256) is supported")]
    NoSupportedSignature,
    #[error("no signature matches: wrong secret, or the body or headers changed after signing")]
    SignatureMismatch,
    #[error("webhook-timestamp is {age_secs}s old, more than the {tolerance_secs}s allowed (replay or clock skew)")]
    TimestampTooOld { age_secs: u64, tolerance_secs: u64 },
    #[error("webhook-timestamp is {ahead_secs}s in the future, more than the {tolerance_secs}s allowed (clock skew)")]
    TimestampInFuture { ahead_secs: u64, tolerance_secs: u64 },
}

/// Which signing scheme a webhook source uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Scheme {
    Standard,
    Github,
}

impl Scheme {
    /// Parses a configured secret the way this scheme uses it.
    pub fn parse_secret(self, text: &str) -> Result<WebhookSecret, SecretError> {
        match self {
            Self::Standard => WebhookSecret::standard(text),
            Self::Github => WebhookSecret::github(text),
        }
    }

    /// Verifies a delivery under this scheme. `header` looks a header up by its
    /// lowercase name and must match names case-insensitively, as HTTP does. GitHub
    /// ignores `now_secs` and `tolerance`: it sends no timestamp.
    pub fn verify<'h>(
        self,
        secrets: &[WebhookSecret],
        header: &dyn Fn(&str) -> Option<&'h str>,
        body: &[u8],
        now_secs: u64,
        tolerance: Duration,
    ) -> Result<Delivery, SignatureError> {
        match self {
            Self::Standard => {
                let headers = StandardHeaders {
                    id: header(WEBHOOK_ID),
                    timestamp: header(WEBHOOK_TIMESTAMP),
                    signature: header(WEBHOOK_SIGNATURE),
                };
                verify_standard(secrets, headers, body, now_secs, tolerance)
            }
            Self::Github => verify_github(secrets, header(GITHUB_SIGNATURE), header(GITHUB_DELIVERY), body),
        }
    }
}
