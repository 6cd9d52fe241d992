//! What a set of sources will cost before it is sent: the estimator behind
//! `POST /v1/estimates`, `commitpoint estimate` and `commitpoint submit --max-cost`.
//!
//! Input tokens are counted from bytes (`domain::batch::approx_tokens`, 4 bytes a token:
//! OpenAI's rule of thumb for English) over the text every adapter sends: the schema's
//! instructions, then `source_id: ID` and a blank line, then the content. The simulator
//! bills by the same function, so on it the input estimate is exact; a real tokenizer reads
//! code and non-English text into more tokens, and a provider also counts the schema it is
//! sent. No tokenizer is used: OpenAI's (tiktoken) covers its own models only, Anthropic's
//! local tokenizer is no longer accurate from Claude 3 on and its exact count is an API call
//! (`count_tokens`), which an estimate must not make; docs/PROVIDERS.md has the sources.
//!
//! Output tokens have no such rule: each answer is as long as its findings. The estimate
//! takes the tenant's own mean output per fresh answer at that provider over the last
//! 30 days when it has one (`history`), else the provider's output budget (`budget`, the
//! most an answer may cost).

use serde::Serialize;

use super::PriceTable;
use crate::domain::batch::{Usage, approx_tokens};

/// What the user turn adds around the content: `source_id: ` and `\n\n`.
const USER_TURN_FRAME_BYTES: u64 = 13;

/// A provider as an estimate sees it: which model its answers are priced by, whether it
/// goes through a batch API (and its discount), and its output budget.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ProviderProfile {
    pub name: String,
    /// `None` for an Azure deployment: the model behind it is known only from its answers.
    pub model: Option<String>,
    pub batch: bool,
    /// Output tokens an answer may use: the configured budget, or its cap where unset.
    pub output_budget: u32,
}

/// The sources to estimate: each one's `source_id` and content length, or a count with
/// their total bytes (source ids then count as empty).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Sources {
    Items(Vec<(String, u64)>),
    Counted { count: u64, bytes: u64 },
}

impl Sources {
    pub(crate) fn count(&self) -> u64 {
        match self {
            Self::Items(items) => items.len() as u64,
            Self::Counted { count, .. } => *count,
        }
    }

    /// Input tokens of every request, with `instructions_bytes` of instructions in each.
    pub(crate) fn input_tokens(&self, instructions_bytes: u64) -> u64 {
        let frame = instructions_bytes + USER_TURN_FRAME_BYTES;
        match self {
            // Saturating throughout: the sizes come from a request body.
            Self::Items(items) => items.iter().fold(0u64, |sum, (id, bytes)| {
                sum.saturating_add(approx_tokens(frame.saturating_add(id.len() as u64).saturating_add(*bytes)))
            }),
            Self::Counted { count, bytes } => {
                // Spread evenly: the same rule per request, on the mean request.
                if *count == 0 {
                    return 0;
                }
                approx_tokens(frame.saturating_mul(*count).saturating_add(*bytes)).max(*count)
            }
        }
    }
}

/// Where an estimate's output tokens come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum OutputBasis {
    History,
    Budget,
}

/// One provider's estimate for the sources.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Estimate {
    pub provider: String,
    pub model: Option<String>,
    pub requests: u64,
    pub input_tokens: u64,
    pub output_tokens: u64,
    pub output_basis: OutputBasis,
    /// With the batch discount where the provider batches; `None` when no price row (and
    /// no provider-reported cost, which only an answer carries) prices the model.
    pub cost_micros: Option<u64>,
    pub batch: bool,
}

/// The estimate of `sources` at `provider`. `mean_output` is the tenant's mean output
/// tokens per fresh answer there, when its ledger has any.
pub(crate) fn estimate(
    provider: &ProviderProfile,
    sources: &Sources,
    instructions_bytes: u64,
    mean_output: Option<u64>,
    prices: &PriceTable,
) -> Estimate {
    let requests = sources.count();
    let input_tokens = sources.input_tokens(instructions_bytes);
    let (per_answer, output_basis) = match mean_output {
        Some(mean) => (mean, OutputBasis::History),
        None => (u64::from(provider.output_budget), OutputBasis::Budget),
    };
    let output_tokens = per_answer.saturating_mul(requests);
    // The table's own cost, not `Pricing::price`: an estimate is no paid call, and must not
    // use up the one warning an unpriced model's first real call gives.
    let cost_micros = provider.model.as_ref().and_then(|model| {
        let usage = Usage { model: model.clone(), input_tokens, output_tokens, ..Usage::default() };
        prices.cost(&provider.name, &usage, provider.batch)
    });
    Estimate {
        provider: provider.name.clone(),
        model: provider.model.clone(),
        requests,
        input_tokens,
        output_tokens,
        output_basis,
        cost_micros,
        batch: provider.batch,
    }
}

/// What one batch member is reserved at against its tenant's budget (`store::rules::
/// reserve`): this estimate with the provider's output budget as the output (the record's
/// own, where a truncated answer raised it), so a member's reservation is the most its
/// answer may cost unless its input is underestimated. `None` when no price row prices
/// the provider's model: such work is bounded by charged spend only.
pub(crate) fn member_estimate(
    provider: &ProviderProfile,
    instructions_bytes: impl Fn(&str) -> u64 + Send + Sync + 'static,
    prices: &PriceTable,
) -> Option<crate::store::MemberEstimate> {
    let usage = Usage { model: provider.model.clone()?, ..Usage::default() };
    prices.cost(&provider.name, &usage, provider.batch)?;
    let (provider, prices) = (provider.clone(), prices.clone());
    Some(crate::store::MemberEstimate(std::sync::Arc::new(move |record: &crate::store::ExtractionRecord| {
        let sources = Sources::Items(vec![(record.source_id.clone(), record.content_bytes)]);
        let instructions = instructions_bytes(&record.schema);
        let cost = |profile: &ProviderProfile| estimate(profile, &sources, instructions, None, &prices).cost_micros;
        // A truncation retry raised this member's budget: it may use that much.
        let raised = record.output_budget.filter(|&b| b > provider.output_budget);
        let micros = match raised {
            Some(output_budget) => cost(&ProviderProfile { output_budget, ..provider.clone() }),
            None => cost(&provider),
        };
        micros.unwrap_or(0)
    })))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::ledger::{PriceTable, test_price_table};

    fn prices() -> PriceTable {
        test_price_table()
    }

    fn openai(budget: u32) -> ProviderProfile {
        ProviderProfile { name: "openai".into(), model: Some("gpt-4o-mini".into()), batch: true, output_budget: budget }
    }

    #[test]
    fn a_member_is_reserved_at_its_estimate_with_the_output_budget_raised_where_its_own_is() {
        use crate::domain::identity::{ExtractionId, SourceHash};
        let hash = SourceHash::compute(b"x", "s@1");
        let new = crate::store::NewExtraction {
            id: ExtractionId::compute("t", "a.rs", &hash, "s@1"),
            tenant: "t".into(),
            source_id: "a.rs".into(),
            source_hash: hash,
            schema: "s@1".into(),
            metadata_json: None,
            content: "x".repeat(4000),
        };
        let mut record = new.pending(1, 4000, 0);
        let member = member_estimate(&openai(1000), |_| 200, &prices()).expect("priced");
        let sources = Sources::Items(vec![("a.rs".into(), 4000)]);
        let expected = |budget| estimate(&openai(budget), &sources, 200, None, &prices()).cost_micros;
        assert_eq!(Some((member.0)(&record)), expected(1000), "the estimate, output at the budget");
        record.output_budget = Some(2000);
        assert_eq!(Some((member.0)(&record)), expected(2000), "a truncation retry's larger budget");
        record.output_budget = Some(500);
        assert_eq!(Some((member.0)(&record)), expected(1000), "never below the provider's");
        let unpriced = ProviderProfile { model: Some("no-such-model".into()), ..openai(1000) };
        assert!(member_estimate(&unpriced, |_| 200, &prices()).is_none(), "nothing to reserve without a price");
    }

    #[test]
    fn input_tokens_count_the_instructions_the_frame_and_the_content() {
        // 100 bytes of instructions, "source_id: " + "a.rs" + "\n\n" (17), 283 of content: 400 bytes.
        let one = Sources::Items(vec![("a.rs".into(), 283)]);
        assert_eq!(one.input_tokens(100), 100);
        assert_eq!(Sources::Items(vec![("a".into(), 0)]).input_tokens(0), 3, "14 bytes round down");
        assert_eq!(Sources::Items(vec![(String::new(), 0)]).input_tokens(0), 3);
        assert_eq!(Sources::Counted { count: 0, bytes: 0 }.input_tokens(100), 0);
        // Ten sources of 387 bytes without ids: each 100 + 13 + 387 = 500 bytes, 125 tokens.
        assert_eq!(Sources::Counted { count: 10, bytes: 3870 }.input_tokens(100), 1250);
        // Sizes from a request body saturate instead of overflowing (a panic in debug builds,
        // a tiny estimate in release ones).
        assert_eq!(Sources::Counted { count: 1 << 62, bytes: 1 }.input_tokens(100), 1 << 62);
        assert_eq!(Sources::Items(vec![("a".into(), u64::MAX), ("b".into(), 8)]).input_tokens(0), u64::MAX / 4 + 5);
    }

    #[test]
    fn output_comes_from_history_then_the_budget_and_the_batch_discount_applies() {
        let sources = Sources::Items(vec![("a.rs".into(), 283); 1000]);
        let history = estimate(&openai(4096), &sources, 100, Some(200), &prices());
        assert_eq!((history.input_tokens, history.output_tokens), (100_000, 200_000));
        assert_eq!(history.output_basis, OutputBasis::History);
        // 100k × $0.15/M + 200k × $0.60/M = $0.135, half through the batch API.
        assert_eq!(history.cost_micros, Some(67_500));
        let budget = estimate(&openai(500), &sources, 100, None, &prices());
        assert_eq!((budget.output_tokens, budget.output_basis), (500_000, OutputBasis::Budget));
        let sync = ProviderProfile { batch: false, ..openai(500) };
        assert_eq!(estimate(&sync, &sources, 100, Some(200), &prices()).cost_micros, Some(135_000), "list price");
    }

    #[test]
    fn an_unpriced_or_unknown_model_has_no_cost() {
        let sources = Sources::Counted { count: 3, bytes: 900 };
        let other = ProviderProfile { model: Some("gpt-5".into()), ..openai(500) };
        assert_eq!(estimate(&other, &sources, 0, Some(10), &prices()).cost_micros, None);
        let azure = ProviderProfile { model: None, ..openai(500) };
        assert_eq!(estimate(&azure, &sources, 0, Some(10), &prices()).cost_micros, None);
    }
}
