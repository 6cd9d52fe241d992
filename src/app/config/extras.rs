//! Config sections beyond the server and the providers: routing, prices and budgets,
//! outbox sinks and webhook endpoints. Secrets here, as everywhere, are only named (`*_env`, `*_file`, `*_credential`), never written.

use std::collections::HashMap;
use std::path::PathBuf;
use std::time::Duration;

use serde::Deserialize;

use super::file::{http_url, one_source, parse_duration};
use super::{Error, KeySource};
use crate::engine::ledger::{BudgetPeriod, Budgets, Price, PriceTable, dollars_to_micros};
use crate::engine::routing::{Routes, Rule};
use crate::engine::webhook::Scheme;
use crate::service::{Field, WebhookOptions};

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawRouting {
    pub default: Option<String>,
    #[serde(default)]
    pub reroute_when_paused: bool,
    #[serde(default)]
    pub rules: Vec<RawRule>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawRule {
    pub schema: Option<String>,
    pub tenant: Option<String>,
    pub provider: String,
}

/// Dollars per million tokens, as providers publish them.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawPrice {
    pub provider: String,
    pub model: String,
    pub input_per_mtok: f64,
    pub cached_input_per_mtok: Option<f64>,
    pub cache_write_per_mtok: Option<f64>,
    pub output_per_mtok: f64,
    /// Fraction of the list price charged through a batch API; 0.5 when absent.
    pub batch_discount: Option<f64>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawBudgets {
    #[serde(default)]
    pub period: BudgetPeriod,
    /// tenant → dollars per period.
    #[serde(default)]
    pub tenants: HashMap<String, f64>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawOutbox {
    #[serde(default)]
    pub sinks: Vec<RawSink>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawSink {
    pub name: String,
    pub url: String,
    pub secret_env: Option<String>,
    pub secret_file: Option<PathBuf>,
    pub secret_credential: Option<String>,
    pub max_attempts: Option<u32>,
    pub max_age: Option<String>,
    pub timeout: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawWebhook {
    pub name: String,
    pub scheme: Scheme,
    pub secret_env: Option<String>,
    pub secret_file: Option<PathBuf>,
    pub secret_credential: Option<String>,
    /// A fixed tenant, or a JSON Pointer into the payload (`tenant_pointer`).
    pub tenant: Option<String>,
    pub tenant_pointer: Option<String>,
    pub source_id_pointer: String,
    pub content_pointer: String,
    pub schema: Option<String>,
    pub schema_pointer: Option<String>,
    /// Allowed clock difference for Standard Webhooks timestamps; 5 minutes when absent.
    pub tolerance: Option<String>,
    /// Largest accepted delivery body, in bytes; 1 MiB when absent.
    pub max_body_bytes: Option<usize>,
}

#[derive(Debug, Clone)]
pub(crate) struct SinkOptions {
    pub name: String,
    pub url: String,
    pub secret: KeySource,
    pub max_attempts: u32,
    pub max_age: Duration,
    pub timeout: Duration,
}

pub(super) fn name_ok(key: &'static str, name: &str) -> Result<(), Error> {
    let ok =
        !name.is_empty() && name.len() <= 64 && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_');
    if ok {
        Ok(())
    } else {
        Err(Error::Invalid { key, reason: format!("{name:?} must be 1-64 letters, digits, '-' or '_'") })
    }
}

/// A table keyed by tenant for a name intake never accepts would never apply: refused, so a
/// typo (`café`, `acme/eu`) is not a budget that silently holds nobody back.
pub(super) fn tenant_ok(key: &'static str, tenant: &str) -> Result<(), Error> {
    if crate::service::is_tenant_name(tenant) {
        Ok(())
    } else {
        Err(Error::Invalid {
            key,
            reason: format!("{tenant:?} can never be a tenant: tenants are 1-128 characters of [A-Za-z0-9._-]"),
        })
    }
}

fn pointer(key: &'static str, text: &str) -> Result<Field, Error> {
    if text.is_empty() || text.starts_with('/') {
        Ok(Field::Pointer(text.to_string()))
    } else {
        Err(Error::Invalid { key, reason: format!("{text:?} is not a JSON Pointer (it must start with '/')") })
    }
}

fn fixed_or_pointer(key: &'static str, fixed: Option<String>, ptr: Option<String>) -> Result<Field, Error> {
    match (fixed, ptr) {
        (Some(value), None) => Ok(Field::Fixed(value)),
        (None, Some(p)) => pointer(key, &p),
        _ => Err(Error::Invalid { key, reason: "give exactly one of the fixed value and the _pointer".into() }),
    }
}

fn required_secret(
    key: &'static str,
    env: &Option<String>,
    file: &Option<PathBuf>,
    cred: &Option<String>,
) -> Result<KeySource, Error> {
    one_source(key, env, file, cred)?
        .ok_or(Error::Invalid { key, reason: "a secret is required (_env, _file or _credential)".into() })
}

impl RawRouting {
    /// `implied`: the provider unrouted work goes to when `default` is not set.
    pub(crate) fn resolve(self, implied: Option<&str>, known: &[&str]) -> Result<Routes, Error> {
        let default = self.default.or(implied.map(str::to_string));
        let check = |name: &str| {
            if known.contains(&name) {
                Ok(())
            } else {
                Err(Error::Invalid {
                    key: "routing",
                    reason: format!("provider {name:?} is not configured (configured: {})", known.join(", ")),
                })
            }
        };
        match &default {
            Some(d) => check(d)?,
            None if known.len() > 1 => {
                return Err(Error::Invalid {
                    key: "routing.default",
                    reason: format!(
                        "{} providers are configured ({}); name the one that takes work no rule routes",
                        known.len(),
                        known.join(", ")
                    ),
                });
            }
            None => {}
        }
        let mut rules = Vec::with_capacity(self.rules.len());
        for rule in self.rules {
            check(&rule.provider)?;
            if let Some(tenant) = &rule.tenant {
                tenant_ok("routing.rules.tenant", tenant)?;
            }
            rules.push(Rule { schema: rule.schema, tenant: rule.tenant, provider: rule.provider });
        }
        Ok(Routes { default, rules, reroute_when_paused: self.reroute_when_paused })
    }
}

pub(super) fn resolve_prices(raw: Vec<RawPrice>) -> Result<PriceTable, Error> {
    let mut table = PriceTable::default();
    // A second row for one model replaced the first without a word, so a stray $0 row
    // zeroed the model's cost: which row is meant is the operator's call.
    let mut rows: HashMap<(&str, &str), usize> = HashMap::new();
    for (index, p) in raw.iter().enumerate() {
        if let Some(first) = rows.insert((&p.provider, &p.model), index + 1) {
            return Err(Error::Invalid {
                key: "prices",
                reason: format!(
                    "rows {first} and {} both price provider {:?} model {:?}; keep one",
                    index + 1,
                    p.provider,
                    p.model
                ),
            });
        }
    }
    for p in raw {
        let micros = |v: f64| {
            dollars_to_micros(v).ok_or(Error::Invalid { key: "prices", reason: format!("{v} is not a price") })
        };
        let discount = p.batch_discount.unwrap_or(0.5);
        if !(0.0..=1.0).contains(&discount) {
            return Err(Error::Invalid { key: "prices.batch_discount", reason: "must be between 0 and 1".into() });
        }
        let input = micros(p.input_per_mtok)?;
        let price = Price {
            input,
            cached_input: p.cached_input_per_mtok.map(micros).transpose()?.unwrap_or(input),
            cache_write: p.cache_write_per_mtok.map(micros).transpose()?.unwrap_or(input),
            output: micros(p.output_per_mtok)?,
            batch_percent: (discount * 100.0).round() as u64,
        };
        table.insert(&p.provider, &p.model, price);
    }
    Ok(table)
}

impl RawBudgets {
    pub(crate) fn resolve(self) -> Result<Budgets, Error> {
        let mut limits = HashMap::new();
        for (tenant, dollars) in self.tenants {
            tenant_ok("budgets.tenants", &tenant)?;
            let micros = dollars_to_micros(dollars).ok_or(Error::Invalid {
                key: "budgets.tenants",
                reason: format!("{tenant}: {dollars} is not an amount"),
            })?;
            limits.insert(tenant, micros);
        }
        Ok(Budgets { period: self.period, limits })
    }
}

pub(super) fn resolve_sinks(raw: RawOutbox) -> Result<Vec<SinkOptions>, Error> {
    let mut sinks: Vec<SinkOptions> = Vec::new();
    for s in raw.sinks {
        name_ok("outbox.sinks.name", &s.name)?;
        if sinks.iter().any(|other| other.name == s.name) {
            return Err(Error::Invalid { key: "outbox.sinks.name", reason: format!("{:?} is named twice", s.name) });
        }
        http_url("outbox.sinks.url", &s.url)?;
        let secret = required_secret("outbox.sinks.secret_*", &s.secret_env, &s.secret_file, &s.secret_credential)?;
        sinks.push(SinkOptions {
            name: s.name,
            url: s.url,
            secret,
            max_attempts: s.max_attempts.unwrap_or(crate::engine::outbox::DEFAULT_MAX_ATTEMPTS).max(1),
            max_age: s
                .max_age
                .map(|t| parse_duration("outbox.sinks.max_age", &t))
                .transpose()?
                .unwrap_or(crate::engine::outbox::DEFAULT_MAX_AGE),
            timeout: s
                .timeout
                .map(|t| parse_duration("outbox.sinks.timeout", &t))
                .transpose()?
                .unwrap_or(crate::engine::outbox::DEFAULT_TIMEOUT),
        });
    }
    Ok(sinks)
}

pub(super) fn resolve_webhooks(raw: Vec<RawWebhook>) -> Result<Vec<WebhookOptions>, Error> {
    let mut hooks: Vec<WebhookOptions> = Vec::new();
    for w in raw {
        name_ok("webhooks.name", &w.name)?;
        if hooks.iter().any(|other| other.name == w.name) {
            return Err(Error::Invalid { key: "webhooks.name", reason: format!("{:?} is named twice", w.name) });
        }
        hooks.push(WebhookOptions {
            secret: required_secret("webhooks.secret_*", &w.secret_env, &w.secret_file, &w.secret_credential)?,
            scheme: w.scheme,
            tenant: fixed_or_pointer("webhooks.tenant", w.tenant, w.tenant_pointer)?,
            source_id: pointer("webhooks.source_id_pointer", &w.source_id_pointer)?,
            content: pointer("webhooks.content_pointer", &w.content_pointer)?,
            schema: fixed_or_pointer("webhooks.schema", w.schema, w.schema_pointer)?,
            tolerance: w
                .tolerance
                .map(|t| parse_duration("webhooks.tolerance", &t))
                .transpose()?
                .unwrap_or(crate::engine::webhook::DEFAULT_TOLERANCE),
            max_body_bytes: match w.max_body_bytes {
                Some(0) => {
                    return Err(Error::Invalid { key: "webhooks.max_body_bytes", reason: "must be at least 1".into() });
                }
                Some(n) => n,
                None => crate::engine::webhook::DEFAULT_MAX_BODY_BYTES,
            },
            name: w.name,
        });
    }
    Ok(hooks)
}
