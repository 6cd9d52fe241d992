//! Access tokens from the metadata server of the machine we run on (GCE, GKE workload
//! identity, Cloud Run), for a provider without a key file (docs/PROVIDERS.md, "Vertex AI").
//! The host is `GCE_METADATA_HOST` (then the older `GCE_METADATA_ROOT`), as Google's own
//! libraries read it, so a test or a local emulator can stand in for
//! `metadata.google.internal`. A token is kept until less than [`REFRESH_MARGIN`] of its
//! life is left, then asked for again by the next caller; callers meanwhile wait on that one
//! request rather than each sending their own.

use std::time::Duration;

use reqwest::Url;
use reqwest::header::HeaderValue;
use serde::Deserialize;
use tokio::sync::Mutex;
use tokio::time::Instant;

use super::auth::AuthError;
use super::error;
use crate::providers::{ErrorClass, ProviderError, describe_transport, truncate};

pub(super) const HOST_VAR: &str = "GCE_METADATA_HOST";
/// The variable's first name, still read by the Python library when the new one is unset.
const OLD_HOST_VAR: &str = "GCE_METADATA_ROOT";
pub(super) const DEFAULT_HOST: &str = "metadata.google.internal";
const TOKEN_PATH: &str = "/computeMetadata/v1/instance/service-accounts/default/token";
/// The metadata server keeps handing out the token it cached until about four minutes
/// before it expires; asking earlier than that would only get the same token back.
pub(super) const REFRESH_MARGIN: Duration = Duration::from_secs(3 * 60 + 45);
/// Off Google Cloud the name does not resolve or nothing answers; say so quickly.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

/// What the token endpoint answers; the token itself never reaches a log or an error.
#[derive(Deserialize)]
struct TokenAnswer {
    access_token: String,
    expires_in: u64,
    token_type: String,
}

struct Cached {
    bearer: HeaderValue,
    refresh_at: Instant,
}

pub(super) struct MetadataTokens {
    host: String,
    url: Url,
    http: reqwest::Client,
    cached: Mutex<Option<Cached>>,
}

impl std::fmt::Debug for MetadataTokens {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MetadataTokens").field("host", &self.host).finish_non_exhaustive()
    }
}

/// The metadata host the environment names, else the default.
pub(super) fn host_from_env() -> String {
    host_from(|var| std::env::var(var).ok())
}

fn host_from(lookup: impl Fn(&str) -> Option<String>) -> String {
    let named = |var: &str| lookup(var).map(|h| h.trim().to_string()).filter(|h| !h.is_empty());
    named(HOST_VAR).or_else(|| named(OLD_HOST_VAR)).unwrap_or_else(|| DEFAULT_HOST.to_string())
}

impl MetadataTokens {
    /// `host` is `name` or `name:port`, as `GCE_METADATA_HOST` holds it.
    pub(super) fn new(host: &str, scope: &str) -> Result<Self, AuthError> {
        // No proxy: the server is link-local to the machine, and a proxy that forwarded
        // the request would hand the token to whoever runs it.
        let http = reqwest::Client::builder()
            .no_proxy()
            .connect_timeout(CONNECT_TIMEOUT)
            .timeout(REQUEST_TIMEOUT)
            .build()
            .map_err(|e| AuthError::MetadataHost { host: host.to_string(), reason: e.to_string() })?;
        Self::with_client(host, scope, http)
    }

    pub(super) fn with_client(host: &str, scope: &str, http: reqwest::Client) -> Result<Self, AuthError> {
        let refuse = |reason: &str| AuthError::MetadataHost { host: host.to_string(), reason: reason.to_string() };
        let rule = "a host name or address with an optional :port, and nothing else";
        if host.is_empty() || host.contains(['/', '?', '#', '@', ' ']) {
            return Err(refuse(rule));
        }
        let mut url = Url::parse(&format!("http://{host}{TOKEN_PATH}")).map_err(|_| refuse(rule))?;
        // The Python and Go libraries name the scopes they want; a GKE or Cloud Run server
        // mints the token for them.
        url.query_pairs_mut().append_pair("scopes", scope);
        Ok(Self { host: host.to_string(), url, http, cached: Mutex::new(None) })
    }

    /// `Authorization: Bearer …`: the kept token while it has more than the margin left.
    pub(super) async fn bearer(&self) -> Result<HeaderValue, ProviderError> {
        let mut cached = self.cached.lock().await;
        if let Some(kept) = cached.as_ref().filter(|c| Instant::now() < c.refresh_at) {
            return Ok(kept.bearer.clone());
        }
        let (bearer, lifetime) = self.fetch().await?;
        let refresh_at = Instant::now() + lifetime.saturating_sub(REFRESH_MARGIN);
        *cached = Some(Cached { bearer: bearer.clone(), refresh_at });
        Ok(bearer)
    }

    async fn fetch(&self) -> Result<(HeaderValue, Duration), ProviderError> {
        let host = &self.host;
        let response = self.http.get(self.url.clone()).header("Metadata-Flavor", "Google").send().await.map_err(|e| {
            error(
                ErrorClass::Auth,
                None,
                format!(
                    "cannot reach the metadata server at {host}: {}. Without credentials_file, tokens come from the \
                     metadata server of a Google Cloud machine (GCE, GKE workload identity, Cloud Run): set \
                     credentials_file to a service-account key file, or run on Google Cloud",
                    describe_transport(&e)
                ),
            )
        })?;
        let status = response.status();
        if !status.is_success() {
            let body = response.text().await.unwrap_or_default();
            let class = if status.is_server_error() || status.as_u16() == 429 {
                ErrorClass::Transient
            } else {
                ErrorClass::Auth
            };
            return Err(error(
                class,
                Some(status.as_u16()),
                format!("the metadata server at {host} refused a token ({status}): {}", truncate(&text_of(&body))),
            ));
        }
        let unexpected = |what: &str| {
            error(ErrorClass::Protocol, Some(status.as_u16()), format!("the metadata server at {host} answered {what}"))
        };
        // Parsed without quoting the body anywhere: it holds the token.
        let answer: TokenAnswer = response.json().await.map_err(|_| unexpected("no token JSON"))?;
        if !answer.token_type.eq_ignore_ascii_case("bearer") || answer.access_token.is_empty() {
            return Err(unexpected("a token that is not a bearer token"));
        }
        let mut bearer = HeaderValue::from_str(&format!("Bearer {}", answer.access_token))
            .map_err(|_| unexpected("a token that is not header-safe"))?;
        bearer.set_sensitive(true);
        Ok((bearer, Duration::from_secs(answer.expires_in)))
    }
}

/// The words of an HTML error page (GCE answers its refusals so): tags and the style sheet
/// dropped, so the sentence that says what is wrong fits in the error.
fn text_of(body: &str) -> String {
    let mut rest = body;
    let mut text = String::with_capacity(body.len());
    while let Some(start) = rest.find('<') {
        text.push_str(&rest[..start]);
        let tag = &rest[start..];
        let skip_to = if tag.starts_with("<style") { "</style>" } else { ">" };
        match tag.find(skip_to) {
            Some(end) => rest = &tag[end + skip_to.len()..],
            None => rest = "",
        }
        text.push(' ');
    }
    text.push_str(rest);
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

#[cfg(test)]
mod tests;
