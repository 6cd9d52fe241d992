//! The tenant cost ledger: what each paid model call cost, and the reports and budgets
//! built on it. Entries are written by the store in the transaction of the state change
//! they pay for (see `store::ledger`); this module decides prices and reads entries back.
//!
//! Money is integer micro-dollars throughout. A price of P dollars per million tokens is
//! P micro-dollars per token, which is why prices are kept as micro-dollars per million
//! tokens and costs are `tokens × price / 1e6`, rounded once per entry.

pub(crate) mod estimate;
mod report;

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};

pub(crate) use crate::domain::budget::{BudgetPeriod, Budgets};
pub(crate) use report::{Bucket, CostQuery, CostReport, GroupBy, Split};

use crate::domain::batch::Usage;
use crate::store::{CostSource, Pricing};

/// Prices of one model at one provider, in micro-dollars per million tokens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Price {
    pub input: u64,
    pub cached_input: u64,
    pub cache_write: u64,
    pub output: u64,
    /// Percent of the list price charged for calls through a batch API (50 at OpenAI
    /// and Anthropic).
    pub batch_percent: u64,
}

/// Unpriced (provider, model) pairs remembered, and so warned of, per table.
const MAX_WARNED: usize = 1_000;
/// How much of a provider's or model's name a log line carries.
const MAX_LOGGED_NAME_BYTES: usize = 256;

/// The configured prices, looked up by (provider, model). A model's dated snapshot
/// (`gpt-4o-mini-2024-07-18`) falls back to the longest configured prefix (`gpt-4o-mini`).
#[derive(Debug, Clone, Default)]
pub(crate) struct PriceTable {
    prices: HashMap<(String, String), Price>,
    /// (provider, model) pairs already warned of as unpriced: a log line per model, not
    /// one per call. Shared by the clones of one table; a reloaded table warns afresh.
    /// Keyed provider → models, so a repeated unpriced call (on the store's writer thread)
    /// is looked up by `&str` and allocates nothing.
    warned: Arc<Mutex<HashMap<String, HashSet<String>>>>,
}

impl PriceTable {
    pub(crate) fn insert(&mut self, provider: &str, model: &str, price: Price) {
        self.prices.insert((provider.to_string(), model.to_string()), price);
    }

    pub(crate) fn len(&self) -> usize {
        self.prices.len()
    }

    /// Whether any model of `provider` has a price (for a provider whose model the config
    /// does not name, an Azure deployment).
    pub(crate) fn for_provider(&self, provider: &str) -> bool {
        self.prices.keys().any(|(p, _)| p == provider)
    }

    pub(crate) fn lookup(&self, provider: &str, model: &str) -> Option<&Price> {
        if let Some(price) = self.prices.get(&(provider.to_string(), model.to_string())) {
            return Some(price);
        }
        self.prices
            .iter()
            .filter(|((p, m), _)| p == provider && is_snapshot_of(model, m))
            .max_by_key(|((_, m), _)| m.len())
            .map(|(_, price)| price)
    }

    /// The cost of one call by the table, or `None` when the model has no price.
    pub(crate) fn cost(&self, provider: &str, usage: &Usage, batch: bool) -> Option<u64> {
        let price = self.lookup(provider, &usage.model)?;
        let cached = usage.cached_input_tokens.min(usage.input_tokens);
        let uncached = usage.input_tokens - cached;
        let list: u128 = u128::from(uncached) * u128::from(price.input)
            + u128::from(cached) * u128::from(price.cached_input)
            + u128::from(usage.cache_write_tokens) * u128::from(price.cache_write)
            + u128::from(usage.output_tokens) * u128::from(price.output);
        let percent = if batch { u128::from(price.batch_percent) } else { 100 };
        let denominator = 100 * 1_000_000u128;
        let micros = (list * percent + denominator / 2) / denominator;
        Some(u64::try_from(micros).unwrap_or(u64::MAX))
    }
}

impl Pricing for PriceTable {
    /// The provider's own figure wins: it is what the invoice will say.
    fn price(&self, provider: &str, usage: &Usage, batch: bool) -> (u64, CostSource) {
        if let Some(micros) = usage.provider_cost_micros {
            return (micros, CostSource::Provider);
        }
        match self.cost(provider, usage, batch) {
            Some(micros) => (micros, CostSource::PriceTable),
            None => {
                self.warn_unpriced(provider, &usage.model);
                (0, CostSource::Unpriced)
            }
        }
    }
}

impl PriceTable {
    /// Whether this is the first unpriced call of (provider, model) this table has seen.
    /// The names come from providers and workers, so the set is bounded: past
    /// `MAX_WARNED` names nothing more is remembered, and nothing more is warned of.
    fn first_unpriced(&self, provider: &str, model: &str) -> bool {
        // A poisoned set only means a panic elsewhere mid-insert: the set itself is sound.
        let mut warned = self.warned.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if warned.get(provider).is_some_and(|models| models.contains(model)) {
            return false;
        }
        if warned.values().map(HashSet::len).sum::<usize>() >= MAX_WARNED {
            return false;
        }
        warned.entry(provider.to_string()).or_default().insert(model.to_string())
    }

    fn warn_unpriced(&self, provider: &str, model: &str) {
        if self.first_unpriced(provider, model) {
            tracing::warn!(
                provider = &provider[..provider.floor_char_boundary(MAX_LOGGED_NAME_BYTES)],
                model = &model[..model.floor_char_boundary(MAX_LOGGED_NAME_BYTES)],
                "a paid call has no [[prices]] row: booked at $0 (cost_source unpriced); \
                 budgets do not see it and the cost report counts it as unpriced"
            );
        }
    }
}

/// Whether `model` is a pinned snapshot of the priced `family`: the family's name followed
/// by nothing but a release date or version as providers write them (OpenAI
/// `gpt-4o-mini-2024-07-18`, Anthropic `claude-3-5-haiku-20241022`, Anthropic on Vertex
/// `claude-3-5-haiku@20241022`, Bedrock's `…-20241022-v1:0`, Gemini `gemini-2.0-flash-001`).
/// Any other name that merely starts with the family is another model (`o1-pro` is not
/// `o1`, `gpt-4o-mini` is not `gpt-4o`) and gets no price from its row.
fn is_snapshot_of(model: &str, family: &str) -> bool {
    let Some(rest) = model.strip_prefix(family).filter(|_| !family.is_empty()) else {
        return false;
    };
    let number = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    let digits = |s: &str, n: usize| s.len() == n && number(s);
    let iso = |s: &str| matches!(s.split('-').collect::<Vec<_>>()[..], [y, m, d] if digits(y, 4) && digits(m, 2) && digits(d, 2));
    let dated = |text: &str| {
        let (date, tag) = match text.split_once("-v") {
            Some((date, tag)) => (date, Some(tag)),
            None => (text, None),
        };
        let tag_ok = tag.is_none_or(|tag| {
            let (major, minor) = tag.split_once(':').unwrap_or((tag, "0"));
            number(major) && number(minor)
        });
        (digits(date, 8) || iso(date)) && tag_ok
    };
    match rest.split_at_checked(1) {
        Some(("-", tail)) => dated(tail) || digits(tail, 3),
        Some(("@", tail)) => dated(tail),
        _ => false,
    }
}

/// Micro-dollars as dollars, to the micro-dollar: `$0.001234`. Every view of money (the CLI,
/// the console, the evaluation report) prints it so.
pub(crate) fn dollars(micros: u64) -> String {
    format!("${}.{:06}", micros / 1_000_000, micros % 1_000_000)
}

/// Dollars (as written in config) to micro-dollars; `None` for negative or absurd values.
pub(crate) fn dollars_to_micros(dollars: f64) -> Option<u64> {
    let micros = (dollars * 1_000_000.0).round();
    (dollars.is_finite() && (0.0..1e15).contains(&micros)).then_some(micros as u64)
}

/// gpt-4o-mini at "openai": $0.15 / $0.075 / $0.60 per million tokens, half price through
/// the batch API (the ledger's tests and the estimator's).
#[cfg(test)]
pub(crate) fn test_price_table() -> PriceTable {
    let mut table = PriceTable::default();
    let price = Price { input: 150_000, cached_input: 75_000, cache_write: 0, output: 600_000, batch_percent: 50 };
    table.insert("openai", "gpt-4o-mini", price);
    table
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table() -> PriceTable {
        test_price_table()
    }

    fn usage(model: &str, input: u64, cached: u64, output: u64) -> Usage {
        Usage {
            model: model.into(),
            input_tokens: input,
            cached_input_tokens: cached,
            output_tokens: output,
            ..Usage::default()
        }
    }

    #[test]
    fn costs_follow_the_table_with_cache_and_batch_discount() {
        let t = table();
        // 1M input + 1M output at list price: $0.15 + $0.60.
        assert_eq!(t.cost("openai", &usage("gpt-4o-mini", 1_000_000, 0, 1_000_000), false), Some(750_000));
        assert_eq!(t.cost("openai", &usage("gpt-4o-mini", 1_000_000, 0, 1_000_000), true), Some(375_000));
        // Half the prompt cached: 500k × 0.15 + 500k × 0.075 = $0.1125.
        assert_eq!(t.cost("openai", &usage("gpt-4o-mini", 1_000_000, 500_000, 0), false), Some(112_500));
        // 1000 in + 100 out: 150 + 60 = 210 micro-dollars... ×1e-6 per token → 0.15 + 0.06.
        assert_eq!(t.cost("openai", &usage("gpt-4o-mini", 1000, 0, 100), false), Some(210));
        // Dated snapshots use the family's price; unknown models and providers have none.
        assert_eq!(t.cost("openai", &usage("gpt-4o-mini-2024-07-18", 1000, 0, 100), false), Some(210));
        assert_eq!(t.cost("openai", &usage("gpt-4o-mini-high", 1000, 0, 100), false), None, "another model");
        assert_eq!(t.cost("openai", &usage("gpt-5", 1000, 0, 100), false), None);
        assert_eq!(t.cost("anthropic", &usage("gpt-4o-mini", 1000, 0, 100), false), None);
    }

    #[test]
    fn only_a_dated_or_versioned_snapshot_takes_its_familys_row() {
        for (snapshot, family) in [
            ("o1-2024-12-17", "o1"),
            ("claude-3-5-haiku-20241022", "claude-3-5-haiku"),
            ("claude-3-5-haiku@20241022", "claude-3-5-haiku"),
            ("anthropic.claude-3-5-haiku-20241022-v1:0", "anthropic.claude-3-5-haiku"),
            ("anthropic.claude-3-5-sonnet-20241022-v2", "anthropic.claude-3-5-sonnet"),
            ("gemini-2.0-flash-001", "gemini-2.0-flash"),
        ] {
            assert!(is_snapshot_of(snapshot, family), "{snapshot} of {family}");
        }
        for other in [
            ("o1-pro", "o1"),
            ("o1x", "o1"),
            ("gpt-4o-mini", "gpt-4o"),
            ("o1-2024-12-17-pro", "o1"),
            ("o1-preview-2024-09-12", "o1"),
            ("o1-2024-1217", "o1"),
            ("o1-20241217-v", "o1"),
            ("o1-20241217-vx:0", "o1"),
            ("o1@001", "o1"),
            ("o1-0001", "o1"),
            ("o1", ""),
            ("o1", "o1"),
        ] {
            assert!(!is_snapshot_of(other.0, other.1), "{other:?}");
        }
    }

    #[test]
    fn a_reported_cost_beats_the_table() {
        let t = table();
        let mut u = usage("gpt-4o-mini", 1000, 0, 100);
        assert_eq!(t.price("openai", &u, false), (210, CostSource::PriceTable));
        u.provider_cost_micros = Some(999);
        assert_eq!(t.price("openai", &u, false), (999, CostSource::Provider));
        assert_eq!(t.price("other", &usage("m", 5, 0, 5), false), (0, CostSource::Unpriced));
    }

    #[test]
    fn an_unpriced_model_is_warned_of_once_per_table() {
        let t = table();
        let clone = t.clone();
        assert!(t.first_unpriced("openai", "gpt-5"));
        assert!(!clone.first_unpriced("openai", "gpt-5"), "clones share what was warned of");
        assert!(t.first_unpriced("openai", "o3"));
        assert!(t.first_unpriced("other", "gpt-5"));
        assert!(table().first_unpriced("openai", "gpt-5"), "a reloaded table warns again");
        // Names come from providers and workers: the set stops growing at its bound.
        let t = table();
        let remembered = (0..MAX_WARNED + 10).filter(|i| t.first_unpriced("w", &format!("m{i}"))).count();
        assert_eq!(remembered, MAX_WARNED);
    }

    #[test]
    fn dollars_convert_exactly_enough() {
        assert_eq!(dollars_to_micros(0.15), Some(150_000));
        assert_eq!(dollars_to_micros(2.5), Some(2_500_000));
        assert_eq!(dollars_to_micros(-1.0), None);
        assert_eq!(dollars_to_micros(f64::NAN), None);
    }
}
