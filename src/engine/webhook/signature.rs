//! Secrets, signing, and the two verifiers. Every comparison of a tag goes through
//! `Mac::verify_slice`, which checks the length and compares in constant time.

use std::fmt;
use std::time::Duration;

use base64::Engine as _;
use base64::engine::general_purpose::{STANDARD, STANDARD_PAD_INDIFFERENT};
use hmac::{Hmac, KeyInit, Mac};
use sha2::Sha256;

use super::{
    Delivery, GITHUB_DELIVERY, GITHUB_SIGNATURE, MAX_DELIVERY_ID_LEN, SignatureError, StandardHeaders, WEBHOOK_ID,
    WEBHOOK_SIGNATURE, WEBHOOK_TIMESTAMP,
};

type HmacSha256 = Hmac<Sha256>;

const STANDARD_SECRET_PREFIX: &str = "whsec_";
const STANDARD_V1_PREFIX: &str = "v1,";
const GITHUB_PREFIX: &str = "sha256=";
const HEX_DIGITS: &[u8; 16] = b"0123456789abcdef";

/// Why a configured secret was refused. Never carries the secret itself.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SecretError {
    #[error("webhook secret is empty")]
    Empty,
    #[error("Standard Webhooks secret must be `whsec_` followed by the base64 key")]
    MissingPrefix,
    #[error("Standard Webhooks secret has no key bytes after `whsec_`")]
    EmptyKey,
    #[error("Standard Webhooks secret: the part after `whsec_` is not valid base64")]
    InvalidBase64,
    #[error("webhook secret cannot be used as an HMAC-SHA256 key")]
    UnusableKey,
}

/// An HMAC-SHA256 key. Surrounding whitespace in the configured text (a file's trailing
/// newline) is not part of the secret. Debug output is redacted.
#[derive(Clone)]
pub struct WebhookSecret {
    // Keyed once here, where a failure can be reported, so signing is infallible.
    keyed: HmacSha256,
}

impl WebhookSecret {
    /// A Standard Webhooks secret: `whsec_` + base64; the key is the decoded bytes.
    /// Padding is optional, since senders differ on it.
    pub fn standard(text: &str) -> Result<Self, SecretError> {
        let text = text.trim();
        if text.is_empty() {
            return Err(SecretError::Empty);
        }
        let encoded = text.strip_prefix(STANDARD_SECRET_PREFIX).ok_or(SecretError::MissingPrefix)?;
        let key = STANDARD_PAD_INDIFFERENT.decode(encoded).map_err(|_| SecretError::InvalidBase64)?;
        if key.is_empty() {
            return Err(SecretError::EmptyKey);
        }
        Self::from_key(&key)
    }

    /// A GitHub secret: the text's UTF-8 bytes are the key.
    pub fn github(text: &str) -> Result<Self, SecretError> {
        let text = text.trim();
        if text.is_empty() {
            return Err(SecretError::Empty);
        }
        Self::from_key(text.as_bytes())
    }

    fn from_key(key: &[u8]) -> Result<Self, SecretError> {
        let keyed = HmacSha256::new_from_slice(key).map_err(|_| SecretError::UnusableKey)?;
        Ok(Self { keyed })
    }

    fn mac(&self) -> HmacSha256 {
        self.keyed.clone()
    }
}

impl fmt::Debug for WebhookSecret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("WebhookSecret(<redacted>)")
    }
}

/// The `webhook-signature` value for an outgoing delivery: `v1,<base64>`. `msg_id` must
/// not contain `.` (the spec forbids it: it would make the signed content ambiguous).
pub fn sign_standard(secret: &WebhookSecret, msg_id: &str, timestamp_secs: u64, body: &[u8]) -> String {
    let tag = standard_mac(secret, msg_id, &timestamp_secs.to_string(), body).finalize().into_bytes();
    format!("{STANDARD_V1_PREFIX}{}", STANDARD.encode(tag))
}

/// The `X-Hub-Signature-256` value GitHub would send for `body`: `sha256=<hex>`.
pub fn sign_github(secret: &WebhookSecret, body: &[u8]) -> String {
    let mut mac = secret.mac();
    mac.update(body);
    let tag = mac.finalize().into_bytes();
    let mut out = String::with_capacity(GITHUB_PREFIX.len() + 2 * tag.len());
    out.push_str(GITHUB_PREFIX);
    for byte in tag.iter() {
        out.push(char::from(HEX_DIGITS[usize::from(byte >> 4)]));
        out.push(char::from(HEX_DIGITS[usize::from(byte & 0x0f)]));
    }
    out
}

/// Verifies a Standard Webhooks delivery against any of `secrets` (several during a
/// rotation). Any matching `v1` entry of the space-separated signature list is enough;
/// entries of other versions are skipped. With no secrets nothing verifies.
pub fn verify_standard(
    secrets: &[WebhookSecret],
    headers: StandardHeaders<'_>,
    body: &[u8],
    now_secs: u64,
    tolerance: Duration,
) -> Result<Delivery, SignatureError> {
    let id = delivery_id(WEBHOOK_ID, headers.id)?;
    if id.contains('.') {
        return Err(malformed(WEBHOOK_ID, "an id without '.'"));
    }
    let timestamp_text = headers.timestamp.ok_or(SignatureError::MissingHeader { name: WEBHOOK_TIMESTAMP })?;
    let timestamp = parse_timestamp(timestamp_text)?;
    let signature = headers.signature.ok_or(SignatureError::MissingHeader { name: WEBHOOK_SIGNATURE })?;
    let v1_entries: Vec<&str> =
        signature.split_ascii_whitespace().filter_map(|entry| entry.strip_prefix(STANDARD_V1_PREFIX)).collect();
    if v1_entries.is_empty() {
        return Err(SignatureError::NoSupportedSignature);
    }
    // An entry that is not base64 cannot match; it is not worth a distinct error.
    let tags: Vec<Vec<u8>> = v1_entries.iter().filter_map(|e| STANDARD_PAD_INDIFFERENT.decode(e).ok()).collect();
    let authentic = secrets.iter().any(|secret| {
        let mac = standard_mac(secret, id, timestamp_text, body);
        tags.iter().any(|tag| mac.clone().verify_slice(tag).is_ok())
    });
    if !authentic {
        return Err(SignatureError::SignatureMismatch);
    }
    // Judged only after authenticating, so a timestamp error always means a genuine
    // delivery that arrived late or early (replay or clock skew), never a forger's guess.
    check_window(timestamp, now_secs, tolerance)?;
    Ok(Delivery { id: id.to_owned() })
}

/// Verifies a GitHub delivery against any of `secrets`. GitHub sends no timestamp, so
/// replays are only caught by deduping on the returned id.
pub fn verify_github(
    secrets: &[WebhookSecret],
    signature_header: Option<&str>,
    delivery_header: Option<&str>,
    body: &[u8],
) -> Result<Delivery, SignatureError> {
    let signature = signature_header.ok_or(SignatureError::MissingHeader { name: GITHUB_SIGNATURE })?;
    let id = delivery_id(GITHUB_DELIVERY, delivery_header)?;
    let tag = signature
        .strip_prefix(GITHUB_PREFIX)
        .and_then(decode_hex)
        .filter(|tag| tag.len() == 32)
        .ok_or_else(|| malformed(GITHUB_SIGNATURE, "sha256= followed by 64 hex digits"))?;
    let authentic = secrets.iter().any(|secret| {
        let mut mac = secret.mac();
        mac.update(body);
        mac.verify_slice(&tag).is_ok()
    });
    if !authentic {
        return Err(SignatureError::SignatureMismatch);
    }
    Ok(Delivery { id: id.to_owned() })
}

/// The MAC over `{id}.{timestamp}.{body}`, fed in pieces so the body is never copied.
fn standard_mac(secret: &WebhookSecret, id: &str, timestamp: &str, body: &[u8]) -> HmacSha256 {
    let mut mac = secret.mac();
    mac.update(id.as_bytes());
    mac.update(b".");
    mac.update(timestamp.as_bytes());
    mac.update(b".");
    mac.update(body);
    mac
}

fn malformed(name: &'static str, expected: &'static str) -> SignatureError {
    SignatureError::MalformedHeader { name, expected }
}

fn delivery_id<'h>(name: &'static str, value: Option<&'h str>) -> Result<&'h str, SignatureError> {
    let id = value.ok_or(SignatureError::MissingHeader { name })?;
    if id.is_empty() || id.len() > MAX_DELIVERY_ID_LEN {
        return Err(malformed(name, "a non-empty id of at most 256 bytes"));
    }
    Ok(id)
}

/// ASCII digits only, as the spec defines it; `str::parse` alone would also take a `+`.
fn parse_timestamp(text: &str) -> Result<u64, SignatureError> {
    let invalid = || malformed(WEBHOOK_TIMESTAMP, "integer Unix seconds");
    if text.is_empty() || !text.bytes().all(|b| b.is_ascii_digit()) {
        return Err(invalid());
    }
    text.parse().map_err(|_| invalid())
}

fn check_window(timestamp: u64, now_secs: u64, tolerance: Duration) -> Result<(), SignatureError> {
    let tolerance_secs = tolerance.as_secs();
    if timestamp < now_secs && now_secs - timestamp > tolerance_secs {
        return Err(SignatureError::TimestampTooOld { age_secs: now_secs - timestamp, tolerance_secs });
    }
    if timestamp > now_secs && timestamp - now_secs > tolerance_secs {
        return Err(SignatureError::TimestampInFuture { ahead_secs: timestamp - now_secs, tolerance_secs });
    }
    Ok(())
}

fn decode_hex(text: &str) -> Option<Vec<u8>> {
    let digits = text.as_bytes();
    if !digits.len().is_multiple_of(2) {
        return None;
    }
    let nibble = |b: u8| char::from(b).to_digit(16);
    digits.chunks_exact(2).map(|pair| u8::try_from(nibble(pair[0])? * 16 + nibble(pair[1])?).ok()).collect()
}
