//! OAuth access tokens for Vertex AI and Cloud Storage, from one of two sources: a service
//! account's JSON key file (named by path in the config, read at start; `gcp_auth` signs
//! the JWT and asks the file's own `token_uri`, caching the token until it expires), or,
//! without one, the metadata server of the machine (`metadata`: GCE, GKE workload identity,
//! Cloud Run). One scope serves both APIs. A token is only ever put into a header marked
//! sensitive, never logged.

use std::path::{Path, PathBuf};

use gcp_auth::{CustomServiceAccount, TokenProvider};
use reqwest::header::{HeaderMap, HeaderValue, WWW_AUTHENTICATE};

use super::error;
use super::metadata::{self, MetadataTokens};
use crate::providers::{ErrorClass, ProviderError};

/// `cloud-platform` covers both `aiplatform.googleapis.com` and Cloud Storage.
const SCOPE: &str = "https://www.googleapis.com/auth/cloud-platform";

/// Said after Google's words when a metadata-server token lacks the scope.
const SCOPE_HINT: &str = " (the metadata server's token lacks the cloud-platform scope: on Compute Engine it \
    carries the VM's access scopes, whatever a client asks for; stop the VM and set its access scopes to \
    cloud-platform, \"Allow full access to all Cloud APIs\", or set credentials_file to a service-account key file)";

/// Where the service account's identity comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Credentials {
    /// A service-account JSON key file (`"type": "service_account"`), by path.
    KeyFile(PathBuf),
    /// The metadata server (`GCE_METADATA_HOST`, else `metadata.google.internal`): the
    /// attached service account.
    MetadataServer,
}

#[derive(Debug, thiserror::Error)]
pub enum AuthError {
    #[error("cannot read the service-account key file {path}: {reason}")]
    KeyFile { path: PathBuf, reason: String },
    #[error("GCE_METADATA_HOST {host:?}: {reason}")]
    MetadataHost { host: String, reason: String },
}

/// Hands out bearer tokens. The metadata server is only asked once a token is needed, so a
/// process off Google Cloud starts (and `config check` runs) without it.
pub(super) enum Tokens {
    KeyFile { path: PathBuf, account: Box<CustomServiceAccount> },
    MetadataServer(MetadataTokens),
}

/// Names the source only: gcp_auth's own debug output would show its cached tokens.
impl std::fmt::Debug for Tokens {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::KeyFile { path, .. } => f.debug_struct("Tokens").field("key_file", path).finish_non_exhaustive(),
            Self::MetadataServer(tokens) => f.debug_tuple("Tokens").field(tokens).finish(),
        }
    }
}

impl Tokens {
    /// A key file is read and parsed now, so a missing or broken one stops the start; so
    /// does a metadata host that is not one.
    pub(super) fn new(source: Credentials) -> Result<Self, AuthError> {
        match source {
            Credentials::KeyFile(path) => Ok(Self::KeyFile { account: Box::new(key_file(&path)?), path }),
            Credentials::MetadataServer => {
                Ok(Self::MetadataServer(MetadataTokens::new(&metadata::host_from_env(), SCOPE)?))
            }
        }
    }

    /// What to add to a refusal of a token without `cloud-platform`. Ours always ask for
    /// it, so only a metadata server that grants the machine's access scopes whatever is
    /// asked (Compute Engine, GKE without workload identity) hands out such a token; a key
    /// file's cannot lack it. Vertex names the reason in its `ErrorInfo`; Cloud Storage is
    /// reported to say `insufficient_scope` in `WWW-Authenticate` instead.
    pub(super) fn scope_hint(&self, headers: &HeaderMap, body: &str) -> &'static str {
        let challenge = headers.get(WWW_AUTHENTICATE).and_then(|v| v.to_str().ok()).unwrap_or_default();
        let lacks_scope = body.contains("ACCESS_TOKEN_SCOPE_INSUFFICIENT") || challenge.contains("insufficient_scope");
        match self {
            Self::MetadataServer(_) if lacks_scope => SCOPE_HINT,
            _ => "",
        }
    }

    /// `Authorization: Bearer …`, marked sensitive so no debug output shows it.
    pub(super) async fn bearer(&self) -> Result<HeaderValue, ProviderError> {
        let (path, account) = match self {
            Self::MetadataServer(tokens) => return tokens.bearer().await,
            Self::KeyFile { path, account } => (path, account),
        };
        let token = account.token(&[SCOPE]).await.map_err(|e| {
            error(
                ErrorClass::Auth,
                None,
                format!("cannot get an OAuth access token for the key file {}: {}", path.display(), describe(&e)),
            )
        })?;
        let mut value = HeaderValue::from_str(&format!("Bearer {}", token.as_str()))
            .map_err(|_| error(ErrorClass::Protocol, None, "the access token is not header-safe".to_string()))?;
        value.set_sensitive(true);
        Ok(value)
    }
}

/// Whether `path` is a service-account key file the token flow can use (read, then
/// dropped): what `config check` and the start refuse a provider for.
pub fn check_key_file(path: &Path) -> Result<(), AuthError> {
    key_file(path).map(drop)
}

/// Reads a key file, saying which part is wrong without quoting any of it.
fn key_file(path: &Path) -> Result<CustomServiceAccount, AuthError> {
    let fail = |reason: String| AuthError::KeyFile { path: path.to_path_buf(), reason };
    let text = std::fs::read_to_string(path).map_err(|e| fail(e.to_string()))?;
    let value: serde_json::Value = serde_json::from_str(&text).map_err(|_| fail("not JSON".to_string()))?;
    if value["type"] != "service_account" {
        return Err(fail("\"type\" must be \"service_account\" (a user or external-account file is not one)".into()));
    }
    for field in ["client_email", "private_key", "token_uri"] {
        if !value[field].is_string() {
            return Err(fail(format!("no {field:?}")));
        }
    }
    CustomServiceAccount::from_json(&text).map_err(|e| fail(describe(&e)))
}

/// The error and its causes in one line. gcp_auth's errors name what failed (a status, a
/// parse step), never a key or a token.
fn describe(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(cause) = source {
        text.push_str(&format!(": {cause}"));
        source = cause.source();
    }
    text
}
