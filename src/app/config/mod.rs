//! Settings for `serve`. Defaults live here so every entry point agrees on them; the
//! file format and the merge order are in `file`.

mod azure;
mod extras;
mod file;
mod kind_bedrock;
mod kind_gemini;
mod kind_mistral;
mod kind_vertex;
mod kinds;
mod limits;
mod providers;
mod retention;
mod store;
mod telemetry;
mod tenants;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use std::time::Duration;

pub(crate) use crate::http::limits::{DEFAULT_MAX_BODY_BYTES, ServerLimits};
pub(crate) use crate::service::WebhookOptions;
#[cfg(test)] // the Azure adapter's tests build their options as config does
pub(crate) use azure::{AzureOptions, RawAzure};
pub(crate) use extras::SinkOptions;
pub(crate) use file::{DEFAULT_CONFIG_PATH, RawConfig};
pub(crate) use kinds::{OpenAiBudget, SIMULATOR_MODEL, SimulatorOptions};
pub(crate) use providers::{ProviderKind, ProviderSettings, ProviderSpec};
pub(crate) use retention::RetentionOptions;
pub(crate) use store::StoreChoice;
pub(crate) use telemetry::TelemetryOptions;

pub(crate) use crate::domain::secret::{KeySource, SecretError};
use crate::engine::scheduler;

pub(crate) const DEFAULT_DATA_DIR: &str = "/var/lib/commitpoint";
/// redb page cache: enough for the hot B-tree levels; bounded so memory stays flat however
/// large a batch's result file is.
pub(crate) const DEFAULT_CACHE_BYTES: usize = 16 * 1024 * 1024;
pub(crate) const DEFAULT_OPENAI_BASE_URL: &str = "https://api.openai.com/v1";
pub(crate) const DEFAULT_OPENAI_KEY_ENV: &str = "OPENAI_API_KEY";
pub(crate) const DEFAULT_MODEL: &str = "gpt-4o-mini";
/// Past this, one commit would hold the writer (and so every intake) for seconds.
pub(crate) const MAX_FINDINGS_LIMIT: usize = 100_000;
/// The most tenants `[metrics] tenant_series` may give series of their own: eight series
/// each (seven states and an age), so 10,000 is 80,000 series per scrape, about the most
/// one Prometheus target should carry.
const MAX_TENANT_SERIES: usize = 10_000;

#[derive(Debug, Clone)]
pub(crate) struct ServeOptions {
    pub data_dir: PathBuf,
    pub listen: SocketAddr,
    pub schema_dir: Option<PathBuf>,
    pub max_body_bytes: usize,
    /// Cap of the database's page cache.
    pub cache_bytes: usize,
    /// Timeouts and the connection cap.
    pub limits: ServerLimits,
    /// `[server] allowed_hosts`: `Host` names accepted besides loopback and the listen address.
    pub allowed_hosts: Vec<String>,
    /// Every configured provider, each run by its own scheduler. Empty: external workers
    /// claim pending work.
    pub providers: Vec<ProviderSettings>,
    /// How every provider's scheduler forms batches and polls.
    pub scheduler: scheduler::Settings,
    pub access: AccessOptions,
    pub routes: crate::engine::routing::Routes,
    pub prices: crate::engine::ledger::PriceTable,
    pub budgets: crate::engine::ledger::Budgets,
    /// `[tenants.<name>]` and `[scheduler] fair_quantum_bytes`.
    pub fairness: crate::store::Fairness,
    pub sinks: Vec<SinkOptions>,
    pub webhooks: Vec<WebhookOptions>,
    /// One line per old configuration form in use, pointing to its new form; `serve` logs
    /// them and `config check` prints them.
    pub notes: Vec<String>,
    /// `[limits] max_findings_per_output`.
    pub max_findings: usize,
    /// `[limits] max_metadata_bytes`.
    pub max_metadata_bytes: usize,
    /// `[retention]`: what is dropped how long after commit.
    pub retention: RetentionOptions,
    /// `[store]`: redb under `data_dir`, or PostgreSQL.
    pub store: StoreChoice,
    /// `[metrics] tenant_series`: tenants with series of their own on `/metrics`.
    pub tenant_series: usize,
    /// `[telemetry]`: OTLP trace export, off unless an endpoint is given.
    pub telemetry: TelemetryOptions,
}

/// Where the API tokens come from. None configured: the API is open, loopback only.
#[derive(Debug, Clone, Default)]
pub(crate) struct AccessOptions {
    pub admin_token: Option<KeySource>,
    /// A file (or systemd credential) with `tenant token` per line.
    pub tenant_tokens: Option<KeySource>,
    /// A file (or systemd credential) with `worker token [tenants=…] [schemas=…]` per line.
    pub worker_tokens: Option<KeySource>,
    /// `[access] wrong_token_allowance`; `None`: the default (`http::guesses`).
    pub wrong_token_allowance: Option<u32>,
}

/// The old `--provider` flag and `[provider] kind`: `None` leaves pending work to external
/// workers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum ProviderChoice {
    None,
    Openai,
    /// The built-in OpenAI Batch API simulator on a loopback port: no key, no cost.
    Simulator,
}

#[derive(Debug, thiserror::Error)]
pub(crate) enum Error {
    #[error(transparent)]
    Secret(#[from] SecretError),
    #[error(transparent)]
    Access(#[from] crate::http::access::LoadError),
    #[error("{path}: cannot read the configuration file")]
    ConfigRead {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: {reason}")]
    ConfigParse { path: PathBuf, reason: String },
    #[error("{key}: {reason}")]
    Invalid { key: &'static str, reason: String },
    #[error("providers.{name}: {reason}")]
    Provider { name: String, reason: String },
    #[error("provider {name:?}: cannot load its API key")]
    ProviderSecret {
        name: String,
        #[source]
        source: SecretError,
    },
}

/// Values given on the command line or in the environment; they override the file.
#[derive(Debug, Clone, Default)]
pub(crate) struct Overrides {
    pub data_dir: Option<PathBuf>,
    pub listen: Option<SocketAddr>,
    pub schema_dir: Option<PathBuf>,
    pub max_body_bytes: Option<usize>,
    pub provider: Option<ProviderChoice>,
    pub base_url: Option<String>,
    pub key: Option<KeySource>,
    pub model: Option<String>,
    pub batch_max_size: Option<u32>,
    pub batch_max_wait: Option<Duration>,
    pub poll_interval: Option<Duration>,
    /// `--store-url`: PostgreSQL at this URL instead of redb.
    pub store_url: Option<String>,
    /// `OTEL_EXPORTER_OTLP_ENDPOINT` or `--otlp-endpoint`: over `[telemetry] otlp_endpoint`.
    pub otlp_endpoint: Option<String>,
}

impl ServeOptions {
    /// Reads the file (`explicit`: it was named, so it must exist) and applies overrides.
    pub(crate) fn load(config_path: &Path, explicit: bool, overrides: Overrides) -> Result<Self, Error> {
        let raw = file::load(config_path, explicit)?;
        Self::resolve(raw, overrides)
    }

    fn resolve(raw: RawConfig, o: Overrides) -> Result<Self, Error> {
        let limits = limits::resolve(&raw.server)?;
        let allowed_hosts = limits::allowed_hosts(&raw.server)?;
        let listen = match (o.listen, raw.server.listen) {
            (Some(addr), _) => addr,
            (None, Some(text)) => text.parse().map_err(|e| Error::Invalid {
                key: "server.listen",
                reason: format!("{text:?} is not an address like 127.0.0.1:7878: {e}"),
            })?,
            (None, None) => default_listen(),
        };
        let mut scheduler = scheduler::Settings::default();
        if let Some(size) = o.batch_max_size.or(raw.scheduler.batch_max_size) {
            if !(1..=50_000).contains(&size) {
                return Err(Error::Invalid { key: "scheduler.batch_max_size", reason: "must be 1..=50000".into() });
            }
            scheduler.batch_max_size = size as usize;
        }
        scheduler.batch_max_wait = match (o.batch_max_wait, &raw.scheduler.batch_max_wait) {
            (Some(d), _) => d,
            (None, Some(text)) => file::parse_duration("scheduler.batch_max_wait", text)?,
            (None, None) => scheduler.batch_max_wait,
        };
        scheduler.poll_interval = match (o.poll_interval, &raw.scheduler.poll_interval) {
            (Some(d), _) => d,
            (None, Some(text)) => file::parse_duration("scheduler.poll_interval", text)?,
            (None, None) => scheduler.poll_interval,
        };
        if scheduler.poll_interval.is_zero() {
            return Err(Error::Invalid { key: "scheduler.poll_interval", reason: "must be more than 0s".into() });
        }
        if let Some(n) = raw.scheduler.max_submit_failures {
            scheduler.max_submit_failures = n.max(1);
        }
        if let Some(text) = &raw.scheduler.job_gone_after {
            scheduler.job_gone_after = file::parse_duration("scheduler.job_gone_after", text)?;
        }
        if let Some(delete) = raw.scheduler.delete_provider_files {
            scheduler.delete_provider_files = delete;
        }
        if let Some(n) = raw.scheduler.max_attempts {
            if n == 0 {
                return Err(Error::Invalid { key: "scheduler.max_attempts", reason: "must be at least 1".into() });
            }
            scheduler.max_attempts = n;
        }
        let resolved = providers::resolve(&raw.provider, &o, raw.providers)?;
        let access = AccessOptions {
            admin_token: raw.access.admin_source()?,
            tenant_tokens: raw.access.tenant_tokens_source()?,
            worker_tokens: raw.access.worker_tokens_source()?,
            wrong_token_allowance: raw.access.wrong_token_allowance,
        };
        if !listen.ip().is_loopback() && access.admin_token.is_none() {
            return Err(Error::Invalid {
                key: "server.listen",
                reason: format!(
                    "refusing to listen on {listen} without an admin token: the API would be open to the network \
                     (set access.admin_token_* or listen on 127.0.0.1)"
                ),
            });
        }
        let known: Vec<&str> = resolved.providers.iter().map(|p| p.name.as_str()).collect();
        let routes = raw.routing.resolve(resolved.implied_default.as_deref(), &known)?;
        Ok(ServeOptions {
            providers: resolved.providers,
            scheduler,
            notes: resolved.notes,
            routes,
            prices: extras::resolve_prices(raw.prices)?,
            budgets: raw.budgets.resolve()?,
            fairness: tenants::resolve(raw.tenants, raw.scheduler.fair_quantum_bytes)?,
            sinks: extras::resolve_sinks(raw.outbox)?,
            webhooks: extras::resolve_webhooks(raw.webhooks)?,
            max_findings: match raw.limits.max_findings_per_output {
                None => crate::service::DEFAULT_MAX_FINDINGS,
                Some(n) if (1..=MAX_FINDINGS_LIMIT).contains(&n) => n,
                Some(_) => {
                    return Err(Error::Invalid {
                        key: "limits.max_findings_per_output",
                        reason: format!("must be 1..={MAX_FINDINGS_LIMIT}"),
                    });
                }
            },
            max_metadata_bytes: match raw.limits.max_metadata_bytes {
                None => crate::service::DEFAULT_MAX_METADATA_BYTES,
                Some(0) => {
                    return Err(Error::Invalid {
                        key: "limits.max_metadata_bytes",
                        reason: "must be at least 1".into(),
                    });
                }
                Some(n) => n,
            },
            retention: RetentionOptions::resolve(&raw.retention)?,
            store: StoreChoice::resolve(&raw.store, o.store_url.clone())?,
            telemetry: TelemetryOptions::resolve(&raw.telemetry, o.otlp_endpoint.as_deref())?,
            tenant_series: match raw.metrics.tenant_series {
                None => crate::service::DEFAULT_TENANT_SERIES,
                Some(n) if n <= MAX_TENANT_SERIES => n,
                Some(_) => {
                    return Err(Error::Invalid {
                        key: "metrics.tenant_series",
                        reason: format!(
                            "must be 0..={MAX_TENANT_SERIES}: each tenant adds one series per state to every scrape"
                        ),
                    });
                }
            },
            access,
            data_dir: o.data_dir.or(raw.server.data_dir).unwrap_or_else(|| PathBuf::from(DEFAULT_DATA_DIR)),
            listen,
            schema_dir: o.schema_dir.or(raw.server.schema_dir),
            max_body_bytes: o.max_body_bytes.or(raw.server.max_body_bytes).unwrap_or(DEFAULT_MAX_BODY_BYTES),
            cache_bytes: raw.server.cache_bytes.unwrap_or(DEFAULT_CACHE_BYTES),
            allowed_hosts,
            limits,
        })
    }

    /// Every configured provider with the structured-output dialect its adapter sends:
    /// each registered schema must have a view in it, or start-up refuses.
    pub(crate) fn schema_targets(&self) -> Vec<(String, crate::domain::schema::Dialect)> {
        self.providers.iter().map(|p| (p.name.clone(), p.kind().dialect())).collect()
    }

    /// Each configured provider whose answers no `[[prices]]` row prices, said as a person
    /// should read it. Their calls are booked at $0 unless the provider reports its own
    /// cost, so a budget never holds them back and a bill built on the ledger misses them.
    pub(crate) fn unpriced_providers(&self) -> Vec<String> {
        let booked_at_zero = "its calls are booked at $0 unless it reports its own cost";
        self.providers
            .iter()
            .filter_map(|p| match p.model() {
                Some(model) if self.prices.lookup(&p.name, model).is_none() => {
                    Some(format!("provider {:?} model {model:?} has no [[prices]] row: {booked_at_zero}", p.name))
                }
                None if !self.prices.for_provider(&p.name) => {
                    Some(format!("provider {:?} has no [[prices]] row for any model: {booked_at_zero}", p.name))
                }
                _ => None,
            })
            .collect()
    }

    /// The effective configuration as TOML. Secrets never appear: only where they come from.
    pub(crate) fn describe(&self) -> String {
        let mut text = self.describe_core();
        let mut extra: Vec<String> = self.providers.iter().map(ProviderSettings::describe).collect();
        if extra.is_empty() {
            extra.push("# providers: none; external workers claim pending work".to_string());
        }
        extra.push(format!(
            "[routing]\n{}\n# {} rule(s); reroute_when_paused = {}",
            self.routes.default.as_ref().map_or_else(|| "# default: none".to_string(), |d| format!("default = {d:?}")),
            self.routes.rules.len(),
            self.routes.reroute_when_paused
        ));
        extra.push(format!(
            "# prices: {} model(s); budgets: {} tenant(s) per {:?}",
            self.prices.len(),
            self.budgets.limits.len(),
            self.budgets.period
        ));
        extra.push(tenants::describe(&self.fairness));
        for gap in self.unpriced_providers() {
            extra.push(format!("# unpriced: {gap}"));
        }
        let names = |list: Vec<&str>| if list.is_empty() { "none".to_string() } else { list.join(", ") };
        extra.push(format!(
            "# outbox sinks: {} (secrets redacted)\n# webhook endpoints: {} (secrets redacted)",
            names(self.sinks.iter().map(|s| s.name.as_str()).collect()),
            names(self.webhooks.iter().map(|w| w.name.as_str()).collect())
        ));
        extra.push(format!(
            "[limits]\nmax_findings_per_output = {}\nmax_metadata_bytes = {}",
            self.max_findings, self.max_metadata_bytes
        ));
        extra.push(format!(
            "[metrics]\ntenant_series = {}{}",
            self.tenant_series,
            if self.tenant_series == 0 { "   # per-tenant series off" } else { "" }
        ));
        extra.push(self.retention.describe());
        extra.push(self.store.describe());
        extra.push(self.telemetry.describe());
        text.push('\n');
        text.push_str(&extra.join("\n\n"));
        text.push('\n');
        text
    }

    fn describe_core(&self) -> String {
        let s = &self.scheduler;
        format!(
            "[server]\nlisten = \"{}\"\ndata_dir = \"{}\"\n{}\nmax_body_bytes = {}\ncache_bytes = {}\n{}\n\n\
             [scheduler]\nbatch_max_size = {}\nbatch_max_wait = \"{}\"\npoll_interval = \"{}\"\nmax_submit_failures = {}\n\
             job_gone_after = \"{}\"\ndelete_provider_files = {}\nmax_attempts = {}\n\n\
             [access]\n# admin token: {}\n# tenant tokens: {}\n# worker tokens: {}\n",
            self.listen,
            self.data_dir.display(),
            self.schema_dir.as_ref().map_or_else(
                || "# schema_dir: none, built-in schemas only".to_string(),
                |d| format!("schema_dir = \"{}\"", d.display())
            ),
            self.max_body_bytes,
            self.cache_bytes,
            self.limits.describe(),
            s.batch_max_size,
            humantime::format_duration(s.batch_max_wait),
            humantime::format_duration(s.poll_interval),
            s.max_submit_failures,
            humantime::format_duration(s.job_gone_after),
            s.delete_provider_files,
            s.max_attempts,
            self.access
                .admin_token
                .as_ref()
                .map_or_else(|| "none (open API, loopback only)".to_string(), |k| format!("{k} (value redacted)")),
            self.access.tenant_tokens.as_ref().map_or_else(|| "none".to_string(), |f| format!("{f} (values redacted)")),
            self.access.worker_tokens.as_ref().map_or_else(|| "none".to_string(), |f| format!("{f} (values redacted)")),
        )
    }
}

/// The `[server] listen` address a config file names, if it can be read (client commands
/// use it to find the server).
pub(crate) fn listen_in_file(path: &Path) -> Option<SocketAddr> {
    file::load(path, false).ok()?.server.listen?.parse().ok()
}

/// The data directory a config file names, if it names one (the CLI looks there for the
/// address a server bound to port 0 wrote).
pub(crate) fn data_dir_in_file(path: &Path) -> Option<std::path::PathBuf> {
    file::load(path, false).ok()?.server.data_dir
}

/// The store a config file's `[store]` and `--store-url` choose, resolved as `serve`
/// resolves them (`explicit`: the file was named, so it must exist). Commands that only
/// open the store (`verify`) read no other setting, so nothing else must be set up for them.
pub(crate) fn store_in_file(path: &Path, explicit: bool, url_override: Option<String>) -> Result<StoreChoice, Error> {
    StoreChoice::resolve(&file::load(path, explicit)?.store, url_override)
}

fn default_listen() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], 7878))
}

#[cfg(test)]
mod tests {

    use super::*;

    #[test]
    fn flags_override_the_file_which_overrides_defaults() {
        let raw: RawConfig = toml::from_str(
            "[server]\nlisten = \"127.0.0.1:9000\"\ndata_dir = \"/srv/a\"\n[scheduler]\npoll_interval = \"7s\"\n\
             job_gone_after = \"3m\"\ndelete_provider_files = false",
        )
        .unwrap();
        let overrides = Overrides { data_dir: Some("/srv/b".into()), ..Overrides::default() };
        let options = ServeOptions::resolve(raw, overrides).unwrap();
        assert_eq!(options.listen, "127.0.0.1:9000".parse().unwrap());
        assert_eq!(options.data_dir, PathBuf::from("/srv/b"));
        assert_eq!(options.scheduler.poll_interval, Duration::from_secs(7));
        assert_eq!(options.max_body_bytes, DEFAULT_MAX_BODY_BYTES);
        let described = options.describe();
        assert!(described.contains("poll_interval = \"7s\""), "{described}");
        assert!(described.contains("# providers: none"), "{described}");
        assert_eq!(options.scheduler.job_gone_after, Duration::from_secs(180));
        assert!(!options.scheduler.delete_provider_files);
        assert!(described.contains("job_gone_after = \"3m\"\ndelete_provider_files = false"), "{described}");
        let reparsed: RawConfig = toml::from_str(&described).unwrap();
        assert_eq!(reparsed.server.data_dir, Some(PathBuf::from("/srv/b")), "check output is a valid config");
    }

    #[test]
    fn tenant_series_has_a_default_a_cap_and_reads_back() {
        let resolve = |text: &str| ServeOptions::resolve(toml::from_str(text).unwrap(), Overrides::default());
        assert_eq!(resolve("").unwrap().tenant_series, crate::service::DEFAULT_TENANT_SERIES);
        let off = resolve("[metrics]\ntenant_series = 0").unwrap();
        assert_eq!(off.tenant_series, 0);
        let reparsed: RawConfig = toml::from_str(&off.describe()).unwrap();
        assert_eq!(reparsed.metrics.tenant_series, Some(0), "check output reads back");
        let error = resolve("[metrics]\ntenant_series = 10001").unwrap_err().to_string();
        assert!(error.contains("metrics.tenant_series") && error.contains("0..=10000"), "{error}");
    }

    #[test]
    fn providers_whose_model_has_no_price_are_named() {
        let resolve = |text: &str| ServeOptions::resolve(toml::from_str(text).unwrap(), Overrides::default());
        let text = "[routing]\ndefault = \"a\"\n[providers.a]\nkind = \"simulator\"\nmodel = \"m1\"\n\
                    [providers.b]\nkind = \"simulator\"\nmodel = \"m2-2026-01-01\"\n\
                    [[prices]]\nprovider = \"b\"\nmodel = \"m2\"\ninput_per_mtok = 1.0\noutput_per_mtok = 2.0\n";
        let options = resolve(text).unwrap();
        let gaps = options.unpriced_providers();
        assert_eq!(gaps.len(), 1, "b's dated model falls back to its family's row: {gaps:?}");
        assert!(gaps[0].starts_with("provider \"a\" model \"m1\" has no [[prices]] row"), "{gaps:?}");
        assert!(options.describe().contains("# unpriced: provider \"a\""));
    }

    #[test]
    fn the_attempt_cap_and_output_budgets_have_defaults_and_refuse_zero() {
        let resolve = |text: &str| ServeOptions::resolve(toml::from_str(text).unwrap(), Overrides::default());
        let defaults = resolve("[provider]\nkind = \"openai\"").unwrap();
        assert_eq!(defaults.scheduler.max_attempts, 5);
        let ProviderSpec::Openai(openai) = &defaults.providers[0].spec else { panic!("{defaults:?}") };
        assert_eq!(openai.budget.max_completion_tokens, None);
        assert_eq!(openai.budget.max_completion_tokens_cap, 16_384);
        let set = resolve(
            "[scheduler]\nmax_attempts = 3\n[provider]\nkind = \"openai\"\nmax_completion_tokens = 1000\n\
             max_completion_tokens_cap = 4000\n\
             [providers.chat]\nbase_url = \"http://127.0.0.1:1/v1\"\nmodel = \"m\"\nmax_tokens_cap = 2048\n",
        )
        .unwrap();
        assert_eq!(set.scheduler.max_attempts, 3);
        let ProviderSpec::Openai(openai) = &set.providers[0].spec else { panic!("{set:?}") };
        assert_eq!((openai.budget.max_completion_tokens, openai.budget.max_completion_tokens_cap), (Some(1000), 4000));
        let ProviderSpec::Chat(chat) = &set.providers[1].spec else { panic!("{set:?}") };
        assert_eq!((chat.max_tokens, chat.max_tokens_cap), (None, 2048));
        let described = set.describe();
        assert!(described.contains("max_attempts = 3") && described.contains("max_completion_tokens = 1000"));
        let reparsed: RawConfig = toml::from_str(&described).unwrap();
        assert_eq!(reparsed.scheduler.max_attempts, Some(3));
        for (text, key) in [
            ("[scheduler]\nmax_attempts = 0", "scheduler.max_attempts"),
            ("[provider]\nmax_completion_tokens_cap = 0", "provider.max_completion_tokens_cap"),
            (
                "[providers.anthropic]\nmodel = \"m\"\napi_key_env = \"X\"\nmax_tokens_cap = 0",
                "providers.anthropic: max_tokens_cap",
            ),
        ] {
            let err = resolve(text).unwrap_err();
            assert!(err.to_string().starts_with(key), "{err}");
        }
    }

    #[test]
    fn bad_values_name_their_key() {
        let raw: RawConfig = toml::from_str("[server]\nlisten = \"everywhere\"").unwrap();
        let err = ServeOptions::resolve(raw, Overrides::default()).unwrap_err();
        assert!(err.to_string().starts_with("server.listen"), "{err}");
    }
}
