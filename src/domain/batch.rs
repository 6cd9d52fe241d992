//! What a batch is made of and what comes back: the members an adapter sends, the answer
//! it parses for each, the output budgets it asks for, and what a call used.

use serde::{Deserialize, Serialize};

use super::identity::ExtractionId;
use super::lifecycle::FailureClass;
use super::schema::ValidationIssue;

/// Most characters of a refused answer kept for its re-ask. Providers' request limits are
/// far larger (the smallest is Bedrock's per-record size), but a long wrong answer mostly
/// costs input tokens on every re-ask: the start of it shows the model its mistake.
pub const MAX_PREVIOUS_OUTPUT_CHARS: usize = 16 * 1024;

/// An answer that failed validation or grounding, as the re-ask shows it to the model:
/// what it answered (cut to `MAX_PREVIOUS_OUTPUT_CHARS`) and what was wrong with it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PreviousAttempt {
    pub output: String,
    pub issues: Vec<ValidationIssue>,
}

impl PreviousAttempt {
    /// Keeps the start of `output`; a cut answer says how much was left out, so the model
    /// is not told its answer ended where it did not.
    pub fn new(output: &str, issues: Vec<ValidationIssue>) -> Self {
        let output = match output.char_indices().nth(MAX_PREVIOUS_OUTPUT_CHARS) {
            Some((end, _)) => format!("{}… [cut: {} more bytes]", &output[..end], output.len() - end),
            None => output.to_string(),
        };
        Self { output, issues }
    }

    /// The follow-up turn every dialect sends after the previous answer: the issues, one per
    /// line as `path: message` (`/` for the whole answer), and what to do about them.
    pub fn feedback(&self) -> String {
        let mut text = String::from(
            "Your previous answer was refused: it does not satisfy the required JSON Schema or cites something that is not in the source. The problems:\n",
        );
        for issue in &self.issues {
            let path = if issue.path.is_empty() { "/" } else { issue.path.as_str() };
            text.push_str(&format!("- {path}: {}\n", issue.message));
        }
        text.push_str(
            "Answer again with the complete corrected JSON only, following the same instructions and schema, and cite only files, lines and text that appear in the source.",
        );
        text
    }
}

/// One member as the provider adapter needs it.
#[derive(Debug, Clone)]
pub struct BatchMember {
    pub id: ExtractionId,
    pub source_id: String,
    pub content: String,
    /// The output token budget to ask for, when raised after a truncation; `None` asks
    /// for the provider's configured default.
    pub output_budget: Option<u32>,
    /// The refused answer this request asks again about, with its issues; `None` for a
    /// first ask.
    pub previous_attempt: Option<PreviousAttempt>,
}

/// A provider's answer for one member, as parsed by its adapter.
#[derive(Debug, Clone)]
pub enum LineResult {
    Answer {
        output: String,
        usage: Option<Usage>,
    },
    /// A paid answer that must never be committed, whatever it says (even if it would pass
    /// validation): `class` is `Truncated` (cut off at the output budget) or `Refused`
    /// (the model declined). Charged; a truncated one is retried once with a larger budget.
    Unusable {
        class: FailureClass,
        reason: String,
        usage: Option<Usage>,
    },
    /// The provider will never answer this member (invalid request and the like).
    Refused {
        class: FailureClass,
        reason: String,
    },
    /// No answer this time (expired, cancelled, transient): try again in a new batch.
    Retry {
        reason: String,
    },
}

/// A provider's output token budgets: what a request asks for unless its member's own
/// budget was raised, and the most a truncation retry may ask for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OutputBudget {
    /// `None`: nothing is sent, the model's own limit applies.
    pub default: Option<u32>,
    pub cap: u32,
}

impl OutputBudget {
    /// The budget for the retry of an answer truncated under `used` (else the default,
    /// else the output tokens the cut-off answer was billed, which is where it stopped):
    /// double it, up to the cap. `None` when no larger budget is possible or known.
    pub fn raised(&self, used: Option<u32>, billed_output_tokens: Option<u64>) -> Option<u32> {
        let billed = billed_output_tokens.filter(|t| *t > 0).map(|t| u32::try_from(t).unwrap_or(u32::MAX));
        let previous = used.or(self.default).or(billed)?;
        let next = previous.saturating_mul(2).min(self.cap);
        (next > previous).then_some(next)
    }
}

/// Bytes of text per token in commitpoint's own counts: OpenAI's rule of thumb for English
/// (docs/PROVIDERS.md, "How the simulator counts tokens"). The cost estimator prices by it
/// and the simulator bills by it, so on the simulator an estimate's input is exact.
pub const BYTES_PER_TOKEN: u64 = 4;

/// `bytes` of text in tokens by [`BYTES_PER_TOKEN`]: at least one.
pub fn approx_tokens(bytes: u64) -> u64 {
    (bytes / BYTES_PER_TOKEN).max(1)
}

/// What one paid model call used, as the provider reported it. Raw token counts are
/// kept so that costs can be recomputed when a price table changes.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Usage {
    pub model: String,
    /// All prompt tokens, cached ones included.
    pub input_tokens: u64,
    pub output_tokens: u64,
    /// The part of `input_tokens` served from the provider's prompt cache.
    pub cached_input_tokens: u64,
    /// Tokens written into the prompt cache (Anthropic bills them apart).
    pub cache_write_tokens: u64,
    /// The part of `output_tokens` spent on reasoning, where the provider says.
    pub reasoning_tokens: u64,
    /// The cost the provider itself reported for the call, in micro-dollars.
    pub provider_cost_micros: Option<u64>,
    /// The provider's id for the request, to match the ledger against its invoice.
    pub request_id: Option<String>,
}
