//! What every adapter's HTTP layer shares: short, key-free descriptions of transport
//! failures and error bodies.

pub use crate::domain::secret::ApiKey;

/// A short description of a reqwest failure: its kind and its immediate cause (never the
/// URL, which may carry a query string).
pub(crate) fn describe_transport(e: &reqwest::Error) -> String {
    let kind = if e.is_timeout() {
        "timed out"
    } else if e.is_connect() {
        "could not connect"
    } else if e.is_decode() {
        "could not decode"
    } else {
        "transport error"
    };
    let detail = std::error::Error::source(e).map_or_else(|| kind.to_string(), ToString::to_string);
    format!("{kind} ({detail})")
}

/// The start of an error body, enough to recognise it in a log.
pub(crate) fn truncate(body: &str) -> String {
    body.chars().take(300).collect()
}
