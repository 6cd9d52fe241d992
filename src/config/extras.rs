//! Config sections beyond the server and its primary provider: further providers,
//! routing, prices and budgets, outbox sinks and webhook endpoints. Secrets here, as
//! everywhere, are only named (`*_env`, `*_file`, `*_credential`), never written.

use std::collections::HashMap;
use std::path::PathBuf;
use std::time::Duration;

use serde::Deserialize;

use super::file::{one_source, parse_duration};
use super::{Error, KeySource};
use crate::ledger::{BudgetPeriod, Budgets, Price, PriceTable, dollars_to_micros};
use crate::routing::{Routes, Rule};
use crate::webhook::Scheme;

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawProviders {
    pub anthropic: Option<RawAnthropic>,
    pub generic: Option<RawGeneric>,
    pub chat: Option<RawChat>,
}

/// A platform speaking the generic REST batch contract (PROVIDERS.md §4).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawGeneric {
    pub base_url: String,
    pub model: String,
    pub capability: Option<String>,
    pub max_tokens: Option<u32>,
    /// The most a truncated answer's one retry may ask for (default 8192).
    pub max_tokens_cap: Option<u32>,
    pub api_key_env: Option<String>,
    pub api_key_file: Option<PathBuf>,
    pub api_key_credential: Option<String>,
    /// Field names the contract leaves unconfirmed; each defaults as documented in
    /// docs/PROVIDERS.md.
    #[serde(default)]
    pub fields: GenericFieldOverrides,
}

/// Overrides of the generic contract's unconfirmed field names (JSON Pointers, except
/// `item_id`, a plain key) and batch state names.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GenericFieldOverrides {
    pub item_id: Option<String>,
    pub state: Option<String>,
    pub results: Option<String>,
    pub results_url: Option<String>,
    pub item_response: Option<String>,
    pub item_error: Option<String>,
    pub item_cost_usd: Option<String>,
    pub item_request_id: Option<String>,
    pub running_states: Option<Vec<String>>,
    pub completed_states: Option<Vec<String>>,
    pub failed_states: Option<Vec<String>>,
    pub cancelled_states: Option<Vec<String>>,
    pub expired_states: Option<Vec<String>>,
}

impl GenericFieldOverrides {
    /// Applies the overrides onto the adapter's defaults, checking pointers are pointers.
    pub fn apply(&self, fields: &mut crate::providers::generic::GenericFields) -> Result<(), Error> {
        let set = |target: &mut String, value: &Option<String>, pointer: bool| -> Result<(), Error> {
            if let Some(v) = value {
                if pointer && !v.is_empty() && !v.starts_with('/') {
                    return Err(Error::Invalid {
                        key: "providers.generic.fields",
                        reason: format!("{v:?} is not a JSON Pointer (it must start with '/')"),
                    });
                }
                *target = v.clone();
            }
            Ok(())
        };
        set(&mut fields.item_id, &self.item_id, false)?;
        set(&mut fields.state, &self.state, true)?;
        set(&mut fields.results, &self.results, true)?;
        set(&mut fields.results_url, &self.results_url, true)?;
        set(&mut fields.item_response, &self.item_response, true)?;
        set(&mut fields.item_error, &self.item_error, true)?;
        set(&mut fields.item_cost_usd, &self.item_cost_usd, true)?;
        set(&mut fields.item_request_id, &self.item_request_id, true)?;
        let states = &mut fields.states;
        for (target, value) in [
            (&mut states.running, &self.running_states),
            (&mut states.completed, &self.completed_states),
            (&mut states.failed, &self.failed_states),
            (&mut states.cancelled, &self.cancelled_states),
            (&mut states.expired, &self.expired_states),
        ] {
            if let Some(names) = value {
                target.clone_from(names);
            }
        }
        Ok(())
    }
}

/// An OpenAI-compatible chat server called synchronously (vLLM, llama.cpp, Ollama).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawChat {
    pub base_url: String,
    pub model: String,
    pub concurrency: Option<usize>,
    pub max_tokens: Option<u32>,
    /// The most a truncated answer's one retry may ask for (default 8192).
    pub max_tokens_cap: Option<u32>,
    /// Optional: local servers often take no key.
    pub api_key_env: Option<String>,
    pub api_key_file: Option<PathBuf>,
    pub api_key_credential: Option<String>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct GenericOptions {
    pub base_url: String,
    pub model: String,
    pub capability: Option<String>,
    pub max_tokens: Option<u32>,
    pub max_tokens_cap: Option<u32>,
    pub key: KeySource,
    pub fields: GenericFieldOverrides,
}

#[derive(Debug, Clone, PartialEq)]
pub struct ChatOptions {
    pub base_url: String,
    pub model: String,
    pub concurrency: Option<usize>,
    pub max_tokens: Option<u32>,
    pub max_tokens_cap: Option<u32>,
    pub key: Option<KeySource>,
}

impl RawGeneric {
    pub fn resolve(self) -> Result<GenericOptions, Error> {
        let key = required_secret(
            "providers.generic.api_key_*",
            &self.api_key_env,
            &self.api_key_file,
            &self.api_key_credential,
        )?;
        Ok(GenericOptions {
            base_url: self.base_url,
            model: self.model,
            capability: self.capability,
            max_tokens: at_least_one("providers.generic.max_tokens", self.max_tokens)?,
            max_tokens_cap: at_least_one("providers.generic.max_tokens_cap", self.max_tokens_cap)?,
            key,
            fields: self.fields,
        })
    }
}

impl RawChat {
    pub fn resolve(self) -> Result<ChatOptions, Error> {
        let key =
            one_source("providers.chat.api_key_*", &self.api_key_env, &self.api_key_file, &self.api_key_credential)?;
        if self.concurrency == Some(0) {
            return Err(Error::Invalid { key: "providers.chat.concurrency", reason: "must be at least 1".into() });
        }
        Ok(ChatOptions {
            base_url: self.base_url,
            model: self.model,
            concurrency: self.concurrency,
            max_tokens: at_least_one("providers.chat.max_tokens", self.max_tokens)?,
            max_tokens_cap: at_least_one("providers.chat.max_tokens_cap", self.max_tokens_cap)?,
            key,
        })
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawAnthropic {
    pub base_url: Option<String>,
    pub model: String,
    pub max_tokens: Option<u32>,
    /// The most a truncated answer's one retry may ask for (default 8192).
    pub max_tokens_cap: Option<u32>,
    pub api_key_env: Option<String>,
    pub api_key_file: Option<PathBuf>,
    pub api_key_credential: Option<String>,
}

/// Token budgets of 0 are refused: no provider accepts one.
pub(super) fn at_least_one(key: &'static str, value: Option<u32>) -> Result<Option<u32>, Error> {
    match value {
        Some(0) => Err(Error::Invalid { key, reason: "must be at least 1".into() }),
        other => Ok(other),
    }
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawRouting {
    pub default: Option<String>,
    #[serde(default)]
    pub reroute_when_paused: bool,
    #[serde(default)]
    pub rules: Vec<RawRule>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawRule {
    pub schema: Option<String>,
    pub tenant: Option<String>,
    pub provider: String,
}

/// Dollars per million tokens, as providers publish them.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawPrice {
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
pub struct RawBudgets {
    #[serde(default)]
    pub period: BudgetPeriod,
    /// tenant → dollars per period.
    #[serde(default)]
    pub tenants: HashMap<String, f64>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawOutbox {
    #[serde(default)]
    pub sinks: Vec<RawSink>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawSink {
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
pub struct RawWebhook {
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

#[derive(Debug, Clone, PartialEq)]
pub struct AnthropicOptions {
    pub base_url: Option<String>,
    pub model: String,
    pub max_tokens: Option<u32>,
    pub max_tokens_cap: Option<u32>,
    pub key: KeySource,
}

#[derive(Debug, Clone)]
pub struct SinkOptions {
    pub name: String,
    pub url: String,
    pub secret: KeySource,
    pub max_attempts: u32,
    pub max_age: Duration,
    pub timeout: Duration,
}

/// Where a field of the extraction comes from in a webhook's payload.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Field {
    Fixed(String),
    Pointer(String),
}

#[derive(Debug, Clone)]
pub struct WebhookOptions {
    pub name: String,
    pub scheme: Scheme,
    pub secret: KeySource,
    pub tenant: Field,
    pub source_id: Field,
    pub content: Field,
    pub schema: Field,
    pub tolerance: Duration,
    pub max_body_bytes: usize,
}

fn name_ok(key: &'static str, name: &str) -> Result<(), Error> {
    let ok =
        !name.is_empty() && name.len() <= 64 && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_');
    if ok {
        Ok(())
    } else {
        Err(Error::Invalid { key, reason: format!("{name:?} must be 1-64 letters, digits, '-' or '_'") })
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

impl RawAnthropic {
    pub fn resolve(self) -> Result<AnthropicOptions, Error> {
        let key = one_source(
            "providers.anthropic.api_key_*",
            &self.api_key_env,
            &self.api_key_file,
            &self.api_key_credential,
        )?
        .unwrap_or_else(|| KeySource::Env("ANTHROPIC_API_KEY".to_string()));
        Ok(AnthropicOptions {
            base_url: self.base_url,
            model: self.model,
            max_tokens: at_least_one("providers.anthropic.max_tokens", self.max_tokens)?,
            max_tokens_cap: at_least_one("providers.anthropic.max_tokens_cap", self.max_tokens_cap)?,
            key,
        })
    }
}

impl RawRouting {
    pub fn resolve(self, primary: Option<&str>, known: &[&str]) -> Result<Routes, Error> {
        let default = self.default.or(primary.map(str::to_string));
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
        if let Some(d) = &default {
            check(d)?;
        }
        let mut rules = Vec::with_capacity(self.rules.len());
        for rule in self.rules {
            check(&rule.provider)?;
            rules.push(Rule { schema: rule.schema, tenant: rule.tenant, provider: rule.provider });
        }
        Ok(Routes { default, rules, reroute_when_paused: self.reroute_when_paused })
    }
}

pub fn resolve_prices(raw: Vec<RawPrice>) -> Result<PriceTable, Error> {
    let mut table = PriceTable::default();
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
    pub fn resolve(self) -> Result<Budgets, Error> {
        let mut limits = HashMap::new();
        for (tenant, dollars) in self.tenants {
            let micros = dollars_to_micros(dollars).ok_or(Error::Invalid {
                key: "budgets.tenants",
                reason: format!("{tenant}: {dollars} is not an amount"),
            })?;
            limits.insert(tenant, micros);
        }
        Ok(Budgets { period: self.period, limits })
    }
}

pub fn resolve_sinks(raw: RawOutbox) -> Result<Vec<SinkOptions>, Error> {
    let mut sinks: Vec<SinkOptions> = Vec::new();
    for s in raw.sinks {
        name_ok("outbox.sinks.name", &s.name)?;
        if sinks.iter().any(|other| other.name == s.name) {
            return Err(Error::Invalid { key: "outbox.sinks.name", reason: format!("{:?} is named twice", s.name) });
        }
        let parsed = reqwest::Url::parse(&s.url)
            .map_err(|e| Error::Invalid { key: "outbox.sinks.url", reason: format!("{:?}: {e}", s.url) })?;
        if !matches!(parsed.scheme(), "http" | "https") {
            return Err(Error::Invalid { key: "outbox.sinks.url", reason: format!("{:?} is not http(s)", s.url) });
        }
        let secret = required_secret("outbox.sinks.secret_*", &s.secret_env, &s.secret_file, &s.secret_credential)?;
        sinks.push(SinkOptions {
            name: s.name,
            url: s.url,
            secret,
            max_attempts: s.max_attempts.unwrap_or(crate::outbox::DEFAULT_MAX_ATTEMPTS).max(1),
            max_age: s
                .max_age
                .map(|t| parse_duration("outbox.sinks.max_age", &t))
                .transpose()?
                .unwrap_or(crate::outbox::DEFAULT_MAX_AGE),
            timeout: s
                .timeout
                .map(|t| parse_duration("outbox.sinks.timeout", &t))
                .transpose()?
                .unwrap_or(crate::outbox::DEFAULT_TIMEOUT),
        });
    }
    Ok(sinks)
}

pub fn resolve_webhooks(raw: Vec<RawWebhook>) -> Result<Vec<WebhookOptions>, Error> {
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
                .unwrap_or(crate::webhook::DEFAULT_TOLERANCE),
            max_body_bytes: match w.max_body_bytes {
                Some(0) => {
                    return Err(Error::Invalid { key: "webhooks.max_body_bytes", reason: "must be at least 1".into() });
                }
                Some(n) => n,
                None => crate::webhook::DEFAULT_MAX_BODY_BYTES,
            },
            name: w.name,
        });
    }
    Ok(hooks)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::providers::generic::GenericFields;

    #[test]
    fn generic_field_names_can_be_overridden_and_are_checked() {
        let raw: RawGeneric = toml::from_str(
            "base_url = \"https://b\"\nmodel = \"m\"\napi_key_env = \"K\"\n\
             [fields]\nitem_id = \"id\"\nstate = \"/status\"\ncompleted_states = [\"done\"]\n",
        )
        .unwrap();
        let options = raw.resolve().unwrap();
        let mut fields = GenericFields::default();
        options.fields.apply(&mut fields).unwrap();
        assert_eq!((fields.item_id.as_str(), fields.state.as_str()), ("id", "/status"));
        assert_eq!(fields.states.completed, vec!["done".to_string()]);
        assert_eq!(fields.results, GenericFields::default().results, "unnamed fields keep their defaults");

        let bad = GenericFieldOverrides { results: Some("results".into()), ..GenericFieldOverrides::default() };
        assert!(bad.apply(&mut GenericFields::default()).is_err());
        assert!(toml::from_str::<RawGeneric>("base_url = \"b\"\nmodel = \"m\"\n[fields]\nstatus = \"/x\"\n").is_err());
    }
}
