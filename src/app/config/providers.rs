//! `[providers.<name>]`: every provider is a named table with a `kind`, so two accounts of
//! one kind (or an OpenAI-compatible platform beside OpenAI) run side by side. The table's
//! name is the provider's name everywhere: in the store, routing, pause/resume, /healthz.
//!
//! The old forms still work, each with a note: `[provider]` and the `--provider` flags
//! (named `openai` or `simulator`), and `[providers.anthropic|generic|chat]` without
//! `kind`. Batches already stored under those names keep being driven because the
//! shorthands produce exactly those names.

use std::time::Duration;

use std::collections::BTreeMap;

use super::ProviderChoice;
use super::azure::{AzureOptions, RawAzure};
use super::extras::name_ok;
use super::file::RawProvider;
use super::kind_bedrock::{BedrockOptions, RawBedrock};
use super::kind_gemini::{GeminiOptions, RawGemini};
use super::kind_mistral::{MistralOptions, RawMistral};
use super::kind_vertex::{RawVertex, VertexOptions};
use super::kinds::{
    AnthropicOptions, ChatOptions, GenericOptions, OpenAiBudget, OpenAiOptions, RawAnthropic, RawChat, RawGeneric,
    RawOpenAi, RawSimulator, SIMULATOR_MODEL, SimulatorOptions, at_least_one,
};
use super::{DEFAULT_MODEL, DEFAULT_OPENAI_BASE_URL, DEFAULT_OPENAI_KEY_ENV, Error, KeySource, Overrides};
use crate::domain::schema::Dialect;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ProviderKind {
    Openai,
    Anthropic,
    Generic,
    Chat,
    Simulator,
    Gemini,
    Azure,
    Bedrock,
    Mistral,
    Vertex,
}

impl ProviderKind {
    const ALL: [ProviderKind; 10] = [
        ProviderKind::Openai,
        ProviderKind::Anthropic,
        ProviderKind::Generic,
        ProviderKind::Chat,
        ProviderKind::Simulator,
        ProviderKind::Gemini,
        ProviderKind::Azure,
        ProviderKind::Bedrock,
        ProviderKind::Mistral,
        ProviderKind::Vertex,
    ];

    pub(crate) fn as_str(self) -> &'static str {
        match self {
            ProviderKind::Openai => "openai",
            ProviderKind::Anthropic => "anthropic",
            ProviderKind::Generic => "generic",
            ProviderKind::Chat => "chat",
            ProviderKind::Simulator => "simulator",
            ProviderKind::Gemini => "gemini",
            ProviderKind::Azure => "azure",
            ProviderKind::Bedrock => "bedrock",
            ProviderKind::Mistral => "mistral",
            ProviderKind::Vertex => "vertex",
        }
    }

    fn parse(text: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|k| k.as_str() == text)
    }

    /// The structured-output dialect the kind's adapter sends. The generic contract's
    /// items and the chat adapter both carry a strict chat body.
    pub(crate) fn dialect(self) -> Dialect {
        match self {
            ProviderKind::Anthropic | ProviderKind::Bedrock => Dialect::AnthropicTool,
            ProviderKind::Gemini | ProviderKind::Vertex => Dialect::GeminiJson,
            ProviderKind::Openai
            | ProviderKind::Generic
            | ProviderKind::Chat
            | ProviderKind::Simulator
            | ProviderKind::Azure
            | ProviderKind::Mistral => Dialect::OpenAiStrict,
        }
    }

    /// `submit` returns with the answers (a chat server called synchronously).
    pub(crate) fn is_synchronous(self) -> bool {
        self == ProviderKind::Chat
    }
}

/// One configured provider: its name, and its kind with that kind's settings.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct ProviderSettings {
    pub name: String,
    pub spec: ProviderSpec,
    /// `reask`: how many times this provider's invalid answers are asked again, overriding
    /// each schema's `x-commitpoint-reask`.
    pub reask: Option<u32>,
    /// `min_batch_wait`: how long work under the provider's minimum job size waits for
    /// more before it is failed (only Bedrock has a minimum).
    pub min_batch_wait: Option<Duration>,
    /// `min_batch_fallback`: the provider such work is sent to instead of being failed;
    /// another configured provider without a minimum of its own (`check_fallbacks`).
    pub min_batch_fallback: Option<String>,
}

#[derive(Debug, Clone, PartialEq)]
pub(crate) enum ProviderSpec {
    Openai(OpenAiOptions),
    /// The built-in simulator, started on a loopback port for this provider.
    Simulator(SimulatorOptions),
    Anthropic(AnthropicOptions),
    /// Boxed: its field-name overrides make it several times larger than the others.
    Generic(Box<GenericOptions>),
    Chat(ChatOptions),
    Gemini(GeminiOptions),
    /// Azure OpenAI's Batch API through the OpenAI adapter.
    Azure(Box<AzureOptions>),
    /// Amazon Bedrock batch inference (Claude's Messages body).
    Bedrock(Box<BedrockOptions>),
    /// Mistral's batch API.
    Mistral(MistralOptions),
    /// Vertex AI batch prediction (Gemini's GenerateContentRequest).
    Vertex(Box<VertexOptions>),
}

impl ProviderSettings {
    /// The fewest requests the provider takes in one job: Bedrock's `min_records`, else 1.
    pub(crate) fn min_batch(&self) -> usize {
        match &self.spec {
            ProviderSpec::Bedrock(b) => b.min_records,
            _ => 1,
        }
    }

    pub(crate) fn kind(&self) -> ProviderKind {
        match self.spec {
            ProviderSpec::Openai(_) => ProviderKind::Openai,
            ProviderSpec::Simulator(_) => ProviderKind::Simulator,
            ProviderSpec::Anthropic(_) => ProviderKind::Anthropic,
            ProviderSpec::Generic(_) => ProviderKind::Generic,
            ProviderSpec::Chat(_) => ProviderKind::Chat,
            ProviderSpec::Gemini(_) => ProviderKind::Gemini,
            ProviderSpec::Azure(_) => ProviderKind::Azure,
            ProviderSpec::Bedrock(_) => ProviderKind::Bedrock,
            ProviderSpec::Mistral(_) => ProviderKind::Mistral,
            ProviderSpec::Vertex(_) => ProviderKind::Vertex,
        }
    }

    /// The model its answers are priced by, where the config names it. An Azure deployment
    /// is a name of the operator's: the model behind it is known only from its answers.
    pub(crate) fn model(&self) -> Option<&str> {
        match &self.spec {
            ProviderSpec::Openai(o) => Some(&o.model),
            ProviderSpec::Simulator(s) => Some(&s.model),
            ProviderSpec::Anthropic(a) => Some(&a.model),
            ProviderSpec::Generic(g) => Some(&g.model),
            ProviderSpec::Chat(c) => Some(&c.model),
            ProviderSpec::Gemini(g) => Some(&g.model),
            ProviderSpec::Bedrock(b) => Some(&b.model),
            ProviderSpec::Mistral(m) => Some(&m.model),
            ProviderSpec::Vertex(v) => Some(&v.model),
            ProviderSpec::Azure(_) => None,
        }
    }

    /// The output tokens one answer may use: the configured budget, or where it is unset
    /// (the model's own limit applies) the cap a truncation retry may raise it to.
    pub(crate) fn output_budget(&self) -> u32 {
        match &self.spec {
            ProviderSpec::Openai(OpenAiOptions { budget, .. })
            | ProviderSpec::Simulator(SimulatorOptions { budget, .. }) => {
                budget.max_completion_tokens.unwrap_or(budget.max_completion_tokens_cap)
            }
            ProviderSpec::Azure(a) => a.budget.max_completion_tokens.unwrap_or(a.budget.max_completion_tokens_cap),
            ProviderSpec::Anthropic(a) => a.max_tokens,
            ProviderSpec::Generic(g) => g.max_tokens.unwrap_or(g.max_tokens_cap),
            ProviderSpec::Chat(c) => c.max_tokens.unwrap_or(c.max_tokens_cap),
            ProviderSpec::Gemini(g) => g.max_output_tokens.unwrap_or(g.max_output_tokens_cap),
            ProviderSpec::Bedrock(b) => b.max_tokens,
            ProviderSpec::Mistral(m) => m.max_tokens.unwrap_or(m.max_tokens_cap),
            ProviderSpec::Vertex(v) => v.max_output_tokens.unwrap_or(v.max_output_tokens_cap),
        }
    }

    /// What an estimate needs of this provider (`engine::ledger::estimate`).
    pub(crate) fn estimate_profile(&self) -> crate::engine::ledger::estimate::ProviderProfile {
        crate::engine::ledger::estimate::ProviderProfile {
            name: self.name.clone(),
            model: self.model().map(str::to_string),
            // `chat` calls a synchronous completions endpoint: list price, no batch discount.
            batch: self.kind() != ProviderKind::Chat,
            output_budget: self.output_budget(),
        }
    }

    pub(crate) fn key_source(&self) -> Option<&KeySource> {
        match &self.spec {
            ProviderSpec::Openai(o) => Some(&o.key),
            ProviderSpec::Anthropic(a) => Some(&a.key),
            ProviderSpec::Generic(g) => Some(&g.key),
            ProviderSpec::Chat(c) => c.key.as_ref(),
            ProviderSpec::Gemini(g) => Some(&g.key),
            ProviderSpec::Azure(a) => Some(&a.key),
            ProviderSpec::Mistral(m) => Some(&m.key),
            // Credentials come from the standard AWS chain, or a Google service account,
            // never from the config.
            ProviderSpec::Simulator(_) | ProviderSpec::Bedrock(_) | ProviderSpec::Vertex(_) => None,
        }
    }

    /// The provider's API key, read from where the config names it: the one loader both
    /// `serve` and `config check` use, so a config the check passes does not fail at start.
    /// `None` when the kind takes no key or none is configured for it.
    pub(crate) fn load_secret(&self) -> Result<Option<String>, Error> {
        let Some(source) = self.key_source() else { return Ok(None) };
        source.load_secret().map(Some).map_err(|e| Error::ProviderSecret { name: self.name.clone(), source: e })
    }

    /// The provider as a `[providers.<name>]` table; the key only says where it comes from.
    pub(crate) fn describe(&self) -> String {
        let mut lines = vec![format!("[providers.{}]", self.name), format!("kind = \"{}\"", self.kind().as_str())];
        let line = |lines: &mut Vec<String>, key: &str, value: &str| lines.push(format!("{key} = {value:?}"));
        // Unset budgets are comments, so the output stays a config that reads back the same.
        let budget = |lines: &mut Vec<String>, key: &str, value: Option<u32>, unset: &str| {
            lines.push(value.map_or_else(|| format!("# {key}: unset, {unset}"), |n| format!("{key} = {n}")));
        };
        match &self.spec {
            ProviderSpec::Openai(OpenAiOptions { base_url, model, budget: b, batch_metadata, .. }) => {
                line(&mut lines, "base_url", base_url);
                line(&mut lines, "model", model);
                lines.push(format!("batch_metadata = {batch_metadata}"));
                budget(&mut lines, "max_completion_tokens", b.max_completion_tokens, "the model's own limit");
                budget(&mut lines, "max_completion_tokens_cap", Some(b.max_completion_tokens_cap), "");
            }
            ProviderSpec::Simulator(SimulatorOptions { model, budget: b }) => {
                line(&mut lines, "model", model);
                budget(&mut lines, "max_completion_tokens", b.max_completion_tokens, "the model's own limit");
                budget(&mut lines, "max_completion_tokens_cap", Some(b.max_completion_tokens_cap), "");
            }
            ProviderSpec::Anthropic(a) => {
                if let Some(base) = &a.base_url {
                    line(&mut lines, "base_url", base);
                }
                line(&mut lines, "model", &a.model);
                budget(&mut lines, "max_tokens", Some(a.max_tokens), "");
                budget(&mut lines, "max_tokens_cap", Some(a.max_tokens_cap), "");
            }
            ProviderSpec::Generic(g) => {
                line(&mut lines, "base_url", &g.base_url);
                line(&mut lines, "model", &g.model);
                budget(&mut lines, "max_tokens", g.max_tokens, "the model's own limit");
                budget(&mut lines, "max_tokens_cap", Some(g.max_tokens_cap), "");
            }
            ProviderSpec::Azure(a) => super::azure::describe(a, &mut lines),
            ProviderSpec::Bedrock(b) => super::kind_bedrock::describe(b, &mut lines),
            ProviderSpec::Mistral(m) => super::kind_mistral::describe(m, &mut lines),
            ProviderSpec::Vertex(v) => super::kind_vertex::describe(v, &mut lines),
            ProviderSpec::Chat(c) => {
                line(&mut lines, "base_url", &c.base_url);
                line(&mut lines, "model", &c.model);
                budget(&mut lines, "max_tokens", c.max_tokens, "the server's own limit");
                budget(&mut lines, "max_tokens_cap", Some(c.max_tokens_cap), "");
            }
            ProviderSpec::Gemini(g) => {
                if let Some(base) = &g.base_url {
                    line(&mut lines, "base_url", base);
                }
                line(&mut lines, "model", &g.model);
                budget(&mut lines, "max_output_tokens", g.max_output_tokens, "the model's own limit");
                budget(&mut lines, "max_output_tokens_cap", Some(g.max_output_tokens_cap), "");
                lines.push(format!("inline_max_bytes = {}", g.inline_max_bytes));
            }
        }
        if self.min_batch() > 1 {
            if let Some(wait) = self.min_batch_wait {
                line(&mut lines, "min_batch_wait", &humantime::format_duration(wait).to_string());
            }
            lines.push(self.min_batch_fallback.as_ref().map_or_else(
                || "# min_batch_fallback: unset, work under the minimum fails after min_batch_wait".to_string(),
                |target| format!("min_batch_fallback = {target:?}"),
            ));
        }
        match self.key_source() {
            Some(key) => lines.push(format!("# api key: {key} (value redacted)")),
            None => lines.push("# api key: none".to_string()),
        }
        lines.join("\n")
    }
}

/// Every configured provider, in a fixed order (the old primary first, then the tables),
/// the provider unrouted work goes to when `[routing] default` does not say, and notes
/// for operators on the old forms used.
#[derive(Debug, Default)]
pub(super) struct Resolved {
    pub providers: Vec<ProviderSettings>,
    pub implied_default: Option<String>,
    pub notes: Vec<String>,
}

/// The names the old shorthand tables imply their kind from, in the order they became
/// the default provider before tables were named.
const SHORTHAND_TABLES: [ProviderKind; 3] = [ProviderKind::Anthropic, ProviderKind::Generic, ProviderKind::Chat];

pub(super) fn resolve(
    primary: &RawProvider,
    o: &Overrides,
    tables: BTreeMap<String, toml::Table>,
) -> Result<Resolved, Error> {
    let mut resolved = Resolved::default();
    let primary = resolve_primary(primary, o, &mut resolved.notes)?;
    let mut shorthand = Vec::new();
    let mut named = Vec::new();
    for (name, table) in tables {
        let (settings, implied) = resolve_table(name, table)?;
        if implied {
            resolved.notes.push(format!(
                "[providers.{0}] without `kind` is the old form and still works; add kind = \"{0}\" to it",
                settings.name
            ));
            shorthand.push(settings);
        } else {
            named.push(settings);
        }
    }
    shorthand.sort_by_key(|s| SHORTHAND_TABLES.iter().position(|k| *k == s.kind()));
    if let Some(p) = &primary
        && let Some(twin) = shorthand.iter().chain(&named).find(|s| s.name == p.name)
    {
        return Err(Error::Invalid {
            key: "providers",
            reason: format!(
                "the provider name {:?} is configured twice: by [provider] (or --provider) and by [providers.{}]",
                p.name, twin.name
            ),
        });
    }
    // Before tables had names the primary, else the first shorthand, took unrouted work;
    // with several named tables and neither, which one does must be said.
    let old_form = primary.is_some() || !shorthand.is_empty();
    let all: Vec<ProviderSettings> = primary.into_iter().chain(shorthand).chain(named).collect();
    if old_form || all.len() == 1 {
        resolved.implied_default = all.first().map(|s| s.name.clone());
    }
    check_fallbacks(&all)?;
    resolved.providers = all;
    Ok(resolved)
}

/// `[provider]` and the `--provider…` flags: the provider named `openai` or `simulator`.
fn resolve_primary(
    raw: &RawProvider,
    o: &Overrides,
    notes: &mut Vec<String>,
) -> Result<Option<ProviderSettings>, Error> {
    let file_key = raw.key_source()?;
    let choice = o.provider.or(raw.kind.map(Into::into)).unwrap_or(ProviderChoice::None);
    if !raw.is_empty() {
        notes.push(match choice {
            ProviderChoice::None => {
                "[provider] is the old form and still works; naming no provider, it can simply be removed".to_string()
            }
            _ => format!(
                "[provider] is the old form and still works; the new form is [providers.{0}] with kind = \"{0}\"",
                choice_name(choice)
            ),
        });
    }
    let flags = o.provider.is_some() || o.base_url.is_some() || o.key.is_some() || o.model.is_some();
    if flags && choice != ProviderChoice::None {
        notes.push(format!(
            "the --provider, --provider-base-url, --provider-key-* and --model flags are the old form and still \
             work; the new form is a [providers.{0}] table with kind = \"{0}\" in the config file",
            choice_name(choice)
        ));
    }
    let model = o.model.clone().or_else(|| raw.model.clone()).unwrap_or_else(|| DEFAULT_MODEL.to_string());
    // Checked even when no provider is chosen, as before tables were named.
    let budget = OpenAiBudget {
        max_completion_tokens: at_least_one("provider.max_completion_tokens", raw.max_completion_tokens)?,
        max_completion_tokens_cap: at_least_one("provider.max_completion_tokens_cap", raw.max_completion_tokens_cap)?
            .unwrap_or(OpenAiBudget::default().max_completion_tokens_cap),
    };
    let spec = match choice {
        ProviderChoice::None => return Ok(None),
        ProviderChoice::Openai => ProviderSpec::Openai(OpenAiOptions {
            batch_metadata: super::kinds::metadata_kept_by_default(
                o.base_url.as_deref().or(raw.base_url.as_deref()).unwrap_or(DEFAULT_OPENAI_BASE_URL),
            ),
            base_url: o
                .base_url
                .clone()
                .or_else(|| raw.base_url.clone())
                .unwrap_or_else(|| DEFAULT_OPENAI_BASE_URL.to_string()),
            model,
            key: o.key.clone().or(file_key).unwrap_or_else(|| KeySource::Env(DEFAULT_OPENAI_KEY_ENV.to_string())),
            budget,
        }),
        // The OpenAI default model means nothing to the simulator: it gets its own.
        ProviderChoice::Simulator => ProviderSpec::Simulator(SimulatorOptions {
            model: if model == DEFAULT_MODEL { SIMULATOR_MODEL.to_string() } else { model },
            budget,
        }),
    };
    Ok(Some(ProviderSettings {
        name: choice_name(choice).to_string(),
        spec,
        reask: None,
        min_batch_wait: None,
        min_batch_fallback: None,
    }))
}

fn choice_name(choice: ProviderChoice) -> &'static str {
    match choice {
        ProviderChoice::None => "none",
        ProviderChoice::Openai => "openai",
        ProviderChoice::Simulator => "simulator",
    }
}

/// One `[providers.<name>]` table; `true` when its kind was implied by its name.
fn resolve_table(name: String, mut table: toml::Table) -> Result<(ProviderSettings, bool), Error> {
    let invalid = |reason: String| Error::Provider { name: name.clone(), reason };
    name_ok("providers", &name).map_err(|e| invalid(e.to_string()))?;
    let kinds = || ProviderKind::ALL.map(ProviderKind::as_str).join(", ");
    let (kind, implied) = match table.remove("kind") {
        Some(toml::Value::String(text)) => match ProviderKind::parse(&text) {
            Some(kind) => (kind, false),
            None => return Err(invalid(format!("kind {text:?} is not one of {}", kinds()))),
        },
        Some(other) => return Err(invalid(format!("kind must be a string (one of {}), not {other}", kinds()))),
        None => match SHORTHAND_TABLES.into_iter().find(|k| k.as_str() == name) {
            Some(kind) => (kind, true),
            None => return Err(invalid(format!("`kind` is required (one of {})", kinds()))),
        },
    };
    let reask = match table.remove("reask") {
        None => None,
        Some(toml::Value::Integer(n)) => Some(u32::try_from(n).map_err(|_| {
            invalid(format!("reask must be a whole number of re-asks from 0 to {}, not {n}", u32::MAX))
        })?),
        Some(other) => return Err(invalid(format!("reask must be a whole number of re-asks, not {other}"))),
    };
    let min_batch_wait = match table.remove("min_batch_wait") {
        None => None,
        Some(toml::Value::String(text)) => {
            let wait = super::file::parse_duration("min_batch_wait", &text).map_err(|e| invalid(e.to_string()))?;
            if wait.is_zero() {
                return Err(invalid("min_batch_wait must be longer than 0s".to_string()));
            }
            Some(wait)
        }
        Some(other) => return Err(invalid(format!("min_batch_wait must be a duration like \"1h\", not {other}"))),
    };
    let min_batch_fallback = match table.remove("min_batch_fallback") {
        None => None,
        Some(toml::Value::String(target)) => Some(target),
        Some(other) => return Err(invalid(format!("min_batch_fallback must name a provider, not {other}"))),
    };
    let value = toml::Value::Table(table);
    let parse_error = |e: toml::de::Error| invalid(e.message().trim().to_string());
    let in_table = |e: Error| match e {
        Error::Invalid { key, reason } => invalid(format!("{key}: {reason}")),
        other => invalid(other.to_string()),
    };
    let spec = match kind {
        ProviderKind::Openai => {
            ProviderSpec::Openai(value.try_into::<RawOpenAi>().map_err(parse_error)?.resolve().map_err(in_table)?)
        }
        ProviderKind::Simulator => {
            ProviderSpec::Simulator(value.try_into::<RawSimulator>().map_err(parse_error)?.resolve().map_err(in_table)?)
        }
        ProviderKind::Anthropic => {
            ProviderSpec::Anthropic(value.try_into::<RawAnthropic>().map_err(parse_error)?.resolve().map_err(in_table)?)
        }
        ProviderKind::Generic => ProviderSpec::Generic(Box::new(
            value.try_into::<RawGeneric>().map_err(parse_error)?.resolve().map_err(in_table)?,
        )),
        ProviderKind::Chat => {
            ProviderSpec::Chat(value.try_into::<RawChat>().map_err(parse_error)?.resolve().map_err(in_table)?)
        }
        ProviderKind::Gemini => {
            ProviderSpec::Gemini(value.try_into::<RawGemini>().map_err(parse_error)?.resolve().map_err(in_table)?)
        }
        ProviderKind::Azure => ProviderSpec::Azure(Box::new(
            value.try_into::<RawAzure>().map_err(parse_error)?.resolve().map_err(in_table)?,
        )),
        ProviderKind::Bedrock => ProviderSpec::Bedrock(Box::new(
            value.try_into::<RawBedrock>().map_err(parse_error)?.resolve().map_err(in_table)?,
        )),
        ProviderKind::Mistral => {
            ProviderSpec::Mistral(value.try_into::<RawMistral>().map_err(parse_error)?.resolve().map_err(in_table)?)
        }
        ProviderKind::Vertex => ProviderSpec::Vertex(Box::new(
            value.try_into::<RawVertex>().map_err(parse_error)?.resolve().map_err(in_table)?,
        )),
    };
    for (key, set) in
        [("min_batch_wait", min_batch_wait.is_some()), ("min_batch_fallback", min_batch_fallback.is_some())]
    {
        if set && !matches!(kind, ProviderKind::Bedrock) {
            return Err(invalid(format!(
                "{key} applies to providers with a minimum job size (bedrock), not {}",
                kind.as_str()
            )));
        }
    }
    Ok((ProviderSettings { name, spec, reask, min_batch_wait, min_batch_fallback }, implied))
}

/// Each `min_batch_fallback` must name another configured provider that takes a job of any
/// size: work handed to it must not wait for a minimum again, nor be handed on.
fn check_fallbacks(providers: &[ProviderSettings]) -> Result<(), Error> {
    for provider in providers {
        let Some(target) = &provider.min_batch_fallback else { continue };
        let refuse = |reason: String| Err(Error::Provider { name: provider.name.clone(), reason });
        if *target == provider.name {
            return refuse(format!("min_batch_fallback {target:?} names this provider itself: it must be another one"));
        }
        let Some(fallback) = providers.iter().find(|p| p.name == *target) else {
            let known: Vec<&str> = providers.iter().map(|p| p.name.as_str()).collect();
            return refuse(format!(
                "min_batch_fallback {target:?} is not a configured provider (configured: {})",
                known.join(", ")
            ));
        };
        if fallback.min_batch() > 1 {
            return refuse(format!(
                "min_batch_fallback {target:?} has a minimum job size of its own ({} records): the fallback must \
                 take work under this provider's minimum in a job of any size",
                fallback.min_batch()
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
#[path = "providers_tests.rs"]
mod tests;
