//! Secrets out of provider text. Gateways and proxies often repeat the request's
//! `Authorization` header in an error body, and that text ends up in the log, in
//! `/healthz`, in extraction records and so in backups. Every error, failure reason and
//! line reason an adapter reports passes through [`redact`] before it leaves
//! `providers`.
//!
//! Two nets: the configured keys themselves (registered as each [`super::secret::ApiKey`] is
//! made, so no adapter can forget to pass its key), and anything shaped like a
//! credential: the word after an auth scheme or a credential-named field, well-known key
//! prefixes, and long mixed-case alphanumeric runs. Lower-case hex (our extraction ids,
//! finding keys, most provider job ids) and ordinary words are left alone.

use std::sync::{Mutex, PoisonError};

pub const REDACTED: &str = "[redacted]";

/// Shorter keys are not secrets worth the name, and replacing them would mangle text.
const MIN_REGISTERED_KEY: usize = 8;
/// Below this, a mixed run is more likely an identifier than a key.
const MIN_ENTROPY_RUN: usize = 32;
/// What follows a known key prefix must be at least this long to count as a key.
const MIN_AFTER_PREFIX: usize = 10;

static KEYS: Mutex<Vec<String>> = Mutex::new(Vec::new());

/// Auth schemes: the word after one is a credential. (`Token x` is left to the shape
/// rules: "the token is invalid" is prose.)
const SCHEMES: &[&str] = &["bearer", "basic"];
/// Field names whose value is a credential (`name: value`, `name=value`, `"name":"value"`).
const SECRET_FIELDS: &[&str] = &[
    "authorization",
    "proxy-authorization",
    "x-api-key",
    "api-key",
    "api_key",
    "apikey",
    "x-goog-api-key",
    "access_token",
    "access-token",
    "client_secret",
    "password",
    "secret",
];
/// Prefixes of provider keys (OpenAI `sk-`/`sk-proj-`, Anthropic `sk-ant-`, and others).
const KEY_PREFIXES: &[&str] =
    &["sk-", "sk_", "rk-", "rk_", "pk-", "pk_", "ghp_", "gho_", "github_pat_", "xoxb-", "AIza"];
/// Provider identifiers that are mixed-case but not secret; operators need them.
/// Google's resource names (`projects/{p}/locations/{l}/batchPredictionJobs/{id}`) are paths.
const ID_PREFIXES: &[&str] =
    &["msgbatch_", "msg_", "batch_", "file-", "file_", "req_", "chatcmpl-", "job_", "job-", "projects/"];

/// Remembers a configured key so that it is cut out of every later provider text.
pub fn register(key: &str) {
    let key = key.trim();
    if key.len() < MIN_REGISTERED_KEY {
        return;
    }
    let mut keys = KEYS.lock().unwrap_or_else(PoisonError::into_inner);
    if !keys.iter().any(|k| k == key) {
        keys.push(key.to_string());
    }
}

/// The text with every configured key and every credential-shaped word replaced.
pub fn redact(text: &str) -> String {
    let mut text = text.to_string();
    {
        let keys = KEYS.lock().unwrap_or_else(PoisonError::into_inner);
        for key in keys.iter() {
            if text.contains(key.as_str()) {
                text = text.replace(key.as_str(), REDACTED);
            }
        }
    }
    redact_shapes(&text)
}

fn is_word_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"-_.~+/".contains(&b)
}

/// Byte ranges of the words (runs of token characters) in `text`.
fn words(text: &str) -> Vec<(usize, usize)> {
    let bytes = text.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < bytes.len() {
        if is_word_byte(bytes[i]) {
            let start = i;
            while i < bytes.len() && is_word_byte(bytes[i]) {
                i += 1;
            }
            out.push((start, i));
        } else {
            i += 1;
        }
    }
    out
}

fn redact_shapes(text: &str) -> String {
    let spans = words(text);
    let mut out = String::with_capacity(text.len());
    let mut copied = 0;
    for (i, &(start, end)) in spans.iter().enumerate() {
        let word = &text[start..end];
        let secret = looks_like_key(word)
            || i.checked_sub(1).is_some_and(|p| {
                let (prev_start, prev_end) = spans[p];
                let prev = text[prev_start..prev_end].trim_end_matches(['.', '/']);
                let gap = &text[prev_end..start];
                follows_scheme(prev, gap) || (follows_field(prev, gap) && !is_scheme(word))
            });
        if secret {
            out.push_str(&text[copied..start]);
            out.push_str(REDACTED);
            copied = end;
        }
    }
    out.push_str(&text[copied..]);
    out
}

fn is_scheme(word: &str) -> bool {
    SCHEMES.iter().any(|s| word.eq_ignore_ascii_case(s))
}

fn follows_scheme(prev: &str, gap: &str) -> bool {
    is_scheme(prev) && !gap.is_empty() && gap.bytes().all(|b| b == b' ' || b == b'\t')
}

/// `field: v`, `field=v`, `"field": "v"`, `'field'='v'`.
fn follows_field(prev: &str, gap: &str) -> bool {
    if !SECRET_FIELDS.iter().any(|f| prev.eq_ignore_ascii_case(f)) {
        return false;
    }
    let inner = gap.trim_matches(|c: char| c == '"' || c == '\'' || c.is_whitespace() || c == '\\');
    inner == ":" || inner == "="
}

fn looks_like_key(word: &str) -> bool {
    let word = word.trim_end_matches('.');
    for prefix in KEY_PREFIXES {
        if let Some(rest) = word.strip_prefix(prefix)
            && rest.len() >= MIN_AFTER_PREFIX
        {
            return true;
        }
    }
    if word.len() < MIN_ENTROPY_RUN || ID_PREFIXES.iter().any(|p| word.starts_with(p)) {
        return false;
    }
    let upper = word.bytes().any(|b| b.is_ascii_uppercase());
    let lower = word.bytes().any(|b| b.is_ascii_lowercase());
    let digit = word.bytes().any(|b| b.is_ascii_digit());
    upper && lower && digit
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn credentials_are_cut_out() {
        let cases = [
            ("Authorization: Bearer abc.def-ghi", "Authorization: Bearer [redacted]"),
            ("header authorization=Basic dXNlcjpwYXNz", "header authorization=Basic [redacted]"),
            ("bad key sk-proj-AbCdEf0123456789xyz here", "bad key [redacted] here"),
            ("sk-ant-api03-abcdefghijklmnop", "[redacted]"),
            (r#"{"x-api-key": "hunter2hunter2"}"#, r#"{"x-api-key": "[redacted]"}"#),
            ("api_key=plainsecret&x=1", "api_key=[redacted]&x=1"),
            ("token Zx9aQ7bR2cS5dT8eU1fV4gW6hX3iY0jK", "token [redacted]"),
        ];
        for (input, want) in cases {
            assert_eq!(redact(input), want, "{input}");
        }
    }

    #[test]
    fn ordinary_text_and_our_ids_survive() {
        let id = "3f".repeat(32);
        let text = format!(
            "No batch found with id batch_6788b4d0a37c8190b8e9a0b4f2e3a1c5 or msgbatch_01HkcTjaV5uDC8jWR4ZsDV8d \
             or projects/650231661283/locations/us-central1/batchPredictionJobs/2544655663456321536 \
             for extraction {id}: Incorrect API key provided: sk-abc***xyz. The token is invalid; \
             see https://platform.example.com/docs/errors. Rate limit: 1000 requests/min."
        );
        assert_eq!(redact(&text), text);
    }

    #[test]
    fn registered_keys_are_cut_out_whatever_their_shape() {
        register("plain-words-key");
        register("short");
        assert_eq!(redact("got plain-words-key from you"), "got [redacted] from you");
        assert_eq!(redact("short"), "short");
    }
}
