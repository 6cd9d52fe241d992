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

/// Why a configured API origin cannot be used.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum OriginProblem {
    NotHttp,
    /// It already ends in the API version the adapter adds itself.
    WithVersion,
}

/// `base_url` as an API origin: an absolute http(s) URL with a host, not ending in
/// `/{version}` (adapters that add their versioned paths would double it).
pub(crate) fn api_origin(base_url: &str, version: &str) -> Result<reqwest::Url, OriginProblem> {
    let base = reqwest::Url::parse(base_url.trim_end_matches('/'))
        .ok()
        .filter(|u| matches!(u.scheme(), "http" | "https") && u.has_host())
        .ok_or(OriginProblem::NotHttp)?;
    if base.path().trim_end_matches('/').ends_with(&format!("/{version}")) {
        return Err(OriginProblem::WithVersion);
    }
    Ok(base)
}
