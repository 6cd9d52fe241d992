//! The TOML configuration file, and how it merges with the environment and flags.
//!
//! Precedence, lowest first: built-in defaults → the file → environment variables →
//! command-line flags. Unknown keys are errors (a typo must not silently fall back to a
//! default), and secrets are never values in the file: only where to read them.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

use super::extras::{RawBudgets, RawOutbox, RawPrice, RawRouting, RawWebhook};
use super::{Error, KeySource, ProviderChoice};

/// Where `serve` looks when neither `--config` nor `COMMITPOINT_CONFIG` names a file.
pub(crate) const DEFAULT_CONFIG_PATH: &str = "/etc/commitpoint/config.toml";

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawConfig {
    #[serde(default)]
    pub server: RawServer,
    /// The old single-provider table; `[providers.openai]` with `kind = "openai"` is its
    /// new form.
    #[serde(default)]
    pub provider: RawProvider,
    #[serde(default)]
    pub scheduler: RawScheduler,
    #[serde(default)]
    pub access: RawAccess,
    /// `[providers.<name>]`: each table is read by its kind's rules (config::providers),
    /// which the kind key chooses, so it is kept as a table here.
    #[serde(default)]
    pub providers: BTreeMap<String, toml::Table>,
    #[serde(default)]
    pub routing: RawRouting,
    #[serde(default)]
    pub prices: Vec<RawPrice>,
    #[serde(default)]
    pub budgets: RawBudgets,
    /// `[tenants.<name>]`: how each tenant shares the work (config::tenants).
    #[serde(default)]
    pub tenants: BTreeMap<String, super::tenants::RawTenant>,
    #[serde(default)]
    pub outbox: RawOutbox,
    #[serde(default)]
    pub webhooks: Vec<RawWebhook>,
    #[serde(default)]
    pub limits: RawLimits,
    #[serde(default)]
    pub retention: super::retention::RawRetention,
    #[serde(default)]
    pub store: super::store::RawStore,
    #[serde(default)]
    pub metrics: RawMetrics,
    #[serde(default)]
    pub telemetry: super::telemetry::RawTelemetry,
}

/// What `/metrics` exposes beyond the fixed series.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawMetrics {
    /// How many tenants get series of their own in `commitpoint_tenant_extractions`
    /// (the rest are summed under `tenant="(other)"`); 0 turns the per-tenant series off.
    pub tenant_series: Option<usize>,
}

/// Bounds on what one request may make the server hold or write.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawLimits {
    /// Findings one output may hold; a larger output fails (class validation).
    pub max_findings_per_output: Option<usize>,
    /// Compact JSON bytes of one intake's `metadata`; more is refused (413).
    pub max_metadata_bytes: Option<usize>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawAccess {
    /// Wrong tokens or console logins an address may send before the backoff starts.
    pub wrong_token_allowance: Option<u32>,
    pub admin_token_env: Option<String>,
    pub admin_token_file: Option<PathBuf>,
    pub admin_token_credential: Option<String>,
    /// `tenant token` per line, mode 0600.
    pub tenant_tokens_file: Option<PathBuf>,
    /// The same file as a systemd credential (`$CREDENTIALS_DIRECTORY/NAME`).
    pub tenant_tokens_credential: Option<String>,
    /// `worker token [tenants=…] [schemas=…]` per line, mode 0600.
    pub worker_tokens_file: Option<PathBuf>,
    pub worker_tokens_credential: Option<String>,
}

impl RawAccess {
    pub(crate) fn admin_source(&self) -> Result<Option<KeySource>, Error> {
        one_source("access.admin_token_*", &self.admin_token_env, &self.admin_token_file, &self.admin_token_credential)
    }

    /// Where the tenant tokens file is: a path, or a systemd credential.
    pub(crate) fn tenant_tokens_source(&self) -> Result<Option<KeySource>, Error> {
        one_source("access.tenant_tokens_*", &None, &self.tenant_tokens_file, &self.tenant_tokens_credential)
    }

    /// Where the worker tokens file is: a path, or a systemd credential.
    pub(crate) fn worker_tokens_source(&self) -> Result<Option<KeySource>, Error> {
        one_source("access.worker_tokens_*", &None, &self.worker_tokens_file, &self.worker_tokens_credential)
    }
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawServer {
    pub listen: Option<String>,
    pub data_dir: Option<PathBuf>,
    pub schema_dir: Option<PathBuf>,
    pub max_body_bytes: Option<usize>,
    /// Cap of the database page cache, in bytes.
    pub cache_bytes: Option<usize>,
    pub header_read_timeout: Option<String>,
    pub body_read_timeout: Option<String>,
    pub max_connections: Option<usize>,
    pub stream_stall_timeout: Option<String>,
    pub max_exports: Option<usize>,
    pub max_exports_per_tenant: Option<usize>,
    pub max_page_bytes: Option<usize>,
    /// `Host` names (a name, or `name:port`) besides loopback and the listen address.
    pub allowed_hosts: Option<Vec<String>>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawProvider {
    pub kind: Option<PrimaryKind>,
    pub base_url: Option<String>,
    pub model: Option<String>,
    /// Name of an environment variable holding the key.
    pub api_key_env: Option<String>,
    /// A file holding the key (mode 0600 or stricter).
    pub api_key_file: Option<PathBuf>,
    /// A systemd credential (`LoadCredential=NAME:…`), read from `$CREDENTIALS_DIRECTORY/NAME`.
    pub api_key_credential: Option<String>,
    /// Sent as each request's `max_completion_tokens` (default unset: the model's own limit).
    pub max_completion_tokens: Option<u32>,
    /// The most a truncated answer's one retry may ask for (default 16384).
    pub max_completion_tokens_cap: Option<u32>,
}

/// The kinds the old `[provider]` table knew.
#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum PrimaryKind {
    None,
    Openai,
    Simulator,
}

impl From<PrimaryKind> for ProviderChoice {
    fn from(kind: PrimaryKind) -> Self {
        match kind {
            PrimaryKind::None => ProviderChoice::None,
            PrimaryKind::Openai => ProviderChoice::Openai,
            PrimaryKind::Simulator => ProviderChoice::Simulator,
        }
    }
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawScheduler {
    pub batch_max_size: Option<u32>,
    pub batch_max_wait: Option<String>,
    pub poll_interval: Option<String>,
    pub max_submit_failures: Option<u32>,
    pub job_gone_after: Option<String>,
    pub delete_provider_files: Option<bool>,
    /// Provider attempts per extraction across requeues (default 5).
    pub max_attempts: Option<u32>,
    /// Bytes of sources each tenant takes per round of the fair pick (default 4096).
    pub fair_quantum_bytes: Option<u64>,
}

/// Reads the file. A missing file is fine only when nobody asked for it explicitly.
pub(super) fn load(path: &Path, explicit: bool) -> Result<RawConfig, Error> {
    let text = match std::fs::read_to_string(path) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound && !explicit => return Ok(RawConfig::default()),
        Err(source) => return Err(Error::ConfigRead { path: path.to_path_buf(), source }),
    };
    toml::from_str(&text).map_err(|e| Error::ConfigParse { path: path.to_path_buf(), reason: e.to_string() })
}

/// A URL commitpoint sends something to (an outbox sink, a trace collector): http or
/// https, with a host.
pub(super) fn http_url(key: &'static str, value: &str) -> Result<reqwest::Url, Error> {
    let url = reqwest::Url::parse(value)
        .map_err(|e| Error::Invalid { key, reason: format!("{value:?} is not a URL ({e})") })?;
    if !matches!(url.scheme(), "http" | "https") || url.host_str().is_none_or(str::is_empty) {
        return Err(Error::Invalid {
            key,
            reason: format!("{value:?} must be an http:// or https:// URL with a host"),
        });
    }
    Ok(url)
}

pub(super) fn parse_duration(key: &'static str, value: &str) -> Result<Duration, Error> {
    humantime::parse_duration(value)
        .map_err(|e| Error::Invalid { key, reason: format!("{value:?} is not a duration like \"30s\": {e}") })
}

impl RawProvider {
    /// No key was written: the table is absent or empty.
    pub(crate) fn is_empty(&self) -> bool {
        self.kind.is_none()
            && self.base_url.is_none()
            && self.model.is_none()
            && self.api_key_env.is_none()
            && self.api_key_file.is_none()
            && self.api_key_credential.is_none()
            && self.max_completion_tokens.is_none()
            && self.max_completion_tokens_cap.is_none()
    }

    pub(crate) fn key_source(&self) -> Result<Option<KeySource>, Error> {
        one_source("provider.api_key_*", &self.api_key_env, &self.api_key_file, &self.api_key_credential)
    }
}

/// At most one place may be named for a secret: two would leave the winner ambiguous.
pub(super) fn one_source(
    key: &'static str,
    env: &Option<String>,
    file: &Option<PathBuf>,
    credential: &Option<String>,
) -> Result<Option<KeySource>, Error> {
    match (env, file, credential) {
        (None, None, None) => Ok(None),
        (Some(name), None, None) => Ok(Some(KeySource::Env(name.clone()))),
        (None, Some(path), None) => Ok(Some(KeySource::File(path.clone()))),
        (None, None, Some(name)) => Ok(Some(KeySource::Credential(name.clone()))),
        _ => Err(Error::Invalid { key, reason: "name only one of the _env, _file and _credential keys".to_string() }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<RawConfig, String> {
        toml::from_str(text).map_err(|e| e.to_string())
    }

    #[test]
    fn a_full_file_parses() {
        let raw = parse(
            r#"
            [server]
            listen = "127.0.0.1:9000"
            data_dir = "/srv/cp"
            [provider]
            kind = "openai"
            model = "gpt-4o-mini"
            api_key_credential = "openai-key"
            [scheduler]
            batch_max_wait = "3s"
            "#,
        )
        .unwrap();
        assert_eq!(raw.server.listen.as_deref(), Some("127.0.0.1:9000"));
        assert!(matches!(raw.provider.kind, Some(PrimaryKind::Openai)));
        assert_eq!(raw.provider.key_source().unwrap(), Some(KeySource::Credential("openai-key".into())));
        assert_eq!(
            parse_duration("x", raw.scheduler.batch_max_wait.as_deref().unwrap()).unwrap(),
            Duration::from_secs(3)
        );
    }

    #[test]
    fn unknown_keys_and_secrets_in_the_file_are_refused() {
        let err = parse("[server]\nlisten_addr = \"x\"").unwrap_err();
        assert!(err.contains("listen_addr"), "{err}");
        let err = parse("[provider]\napi_key = \"sk-live\"").unwrap_err();
        assert!(err.contains("api_key"), "{err}");
        assert!(parse("[provider]\nkind = \"gpt\"").is_err());
        assert!(parse_duration("scheduler.poll_interval", "soon").is_err());
    }

    #[test]
    fn a_missing_default_file_is_empty_but_a_named_one_is_an_error() {
        let missing = Path::new("/nonexistent/commitpoint.toml");
        assert!(load(missing, false).is_ok());
        assert!(matches!(load(missing, true), Err(Error::ConfigRead { .. })));
    }

    #[test]
    fn two_key_sources_are_ambiguous() {
        let raw = parse("[provider]\napi_key_env = \"A\"\napi_key_file = \"/k\"").unwrap();
        assert!(raw.provider.key_source().is_err());
    }
}
