//! Provider adapters behind one small trait. Wire types and error bodies stay inside
//! each adapter; what crosses this boundary is our own vocabulary: job ids, phases,
//! per-member line results, and errors already sorted into DESIGN §3 classes.

pub mod anthropic;
pub mod bedrock;
pub mod chat;
pub mod gemini;
pub mod generic;
mod job_list;
pub(crate) mod lines;
pub mod mistral;
pub mod openai;
mod ratelimit;
#[cfg(test)]
mod reask_tests;
mod retry;
mod transport;
pub mod vertex;

use std::fmt;
use std::time::Duration;

use async_trait::async_trait;
use tokio::sync::mpsc;

pub use crate::domain::redact::redact;
pub use retry::{classify_status, parse_retry_after};
pub use transport::ApiKey;
pub(crate) use transport::{OriginProblem, api_origin, describe_transport, truncate};

use crate::domain::batch::{BatchMember, LineResult, OutputBudget};
use crate::domain::identity::ExtractionId;
use crate::domain::schema::Schema;

/// How a provider call failed, in the terms the scheduler acts on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorClass {
    /// 429 / overload: wait as told, then try again; never gives up.
    RateLimited,
    /// 5xx, timeouts, resets: exponential backoff with jitter, bounded attempts.
    Transient,
    /// 401/403: stop calling this provider; keep the work queued.
    Auth,
    /// Quota or billing exhausted: not a rate limit; stop submitting and surface it.
    Budget,
    /// The request itself is wrong: terminal for the items in it.
    InvalidRequest,
    /// The provider does not know the job (or file) any more.
    Gone,
    /// The provider answered something we cannot understand.
    Protocol,
    /// The batch is more than the provider takes in one job (input file size, request
    /// count): it is split, never failed, unless a single member is itself too large.
    TooLarge,
}

#[derive(Debug, Clone, thiserror::Error)]
#[error("{provider}: {message}")]
pub struct ProviderError {
    pub provider: &'static str,
    pub class: ErrorClass,
    pub status: Option<u16>,
    /// Private, so the only way in is [`ProviderError::new`], which redacts it.
    message: String,
    /// The delay the provider asked for (`retry-after-ms` / `Retry-After`).
    pub retry_after: Option<Duration>,
}

impl ProviderError {
    /// The message is often a provider's own error text: keys and credential-shaped
    /// words are cut out here, once, before it can be logged, stored or shown.
    pub fn new(provider: &'static str, class: ErrorClass, status: Option<u16>, message: &str) -> Self {
        Self { provider, class, status, message: redact(message), retry_after: None }
    }

    pub fn message(&self) -> &str {
        &self.message
    }
}

/// A result line with any provider-written reason redacted (see [`redact`]).
pub(crate) fn scrub(line: ResultLine) -> ResultLine {
    let (id, result) = line;
    let result = match result {
        LineResult::Refused { class, reason } => LineResult::Refused { class, reason: redact(&reason) },
        LineResult::Retry { reason } => LineResult::Retry { reason: redact(&reason) },
        LineResult::Unusable { class, reason, usage } => LineResult::Unusable { class, reason: redact(&reason), usage },
        answer @ LineResult::Answer { .. } => answer,
    };
    (id, result)
}

/// One batch as the adapter must send it.
#[derive(Debug)]
pub struct BatchSpec<'a> {
    pub batch_key: &'a str,
    pub schema: &'a Schema,
    pub members: &'a [BatchMember],
}

/// A submit intent the provider may or may not have acted on (a crash or a timeout
/// after the call), as an adapter needs it to look the job up.
#[derive(Debug)]
pub struct IntentRef<'a> {
    pub batch_key: &'a str,
    /// When the intent was committed: no job created before it can be ours.
    pub created_at_ms: u64,
    pub members: &'a [ExtractionId],
    /// Job ids already recorded for other batches since about then: never this intent's.
    /// Lets a provider without batch metadata rule candidates out without waiting.
    pub known_jobs: &'a [String],
}

/// What a lookup of an intent's job found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Lookup {
    Found(String),
    /// The provider has no job for the intent: submitting is safe.
    Absent,
    /// A job that might be ours cannot be told apart yet (a provider without batch
    /// metadata, whose candidate is still running): ask again later, never resubmit now.
    Undecided {
        recheck_after: Duration,
        reason: String,
    },
}

/// Where a provider job stands.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum JobPhase {
    Running,
    /// Alive, but it will not go on by itself (Vertex's `JOB_STATE_PAUSED`): polled like a
    /// running job, its members kept with it, and `reason` shown to the operator, who may
    /// resume or cancel it.
    Stalled {
        reason: String,
    },
    Completed,
    /// Ended before every request ran; what ran is in the result files and is billed.
    Expired,
    Cancelled,
    /// The whole batch was rejected (e.g. input validation, or the provider's capacity).
    Failed {
        reason: String,
        cause: FailureCause,
    },
}

/// Whose fault a failed batch is, which decides what happens to its members.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FailureCause {
    /// The provider had no room for it (OpenAI's enqueued-token limit): nobody's fault.
    /// The members go back as the same attempt and new submissions wait.
    Capacity,
    /// Validation failed without naming a line: nothing says a member is at fault, so the
    /// members are treated as for `Capacity`.
    Unattributed,
    /// Validation named these input lines (1-based, in submit order): those members are
    /// refused, the others go back as the same attempt.
    Lines(Vec<u64>),
}

impl ErrorClass {
    /// The snake_case name used in metric labels and the docs (DESIGN §3, PROVIDERS.md).
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorClass::RateLimited => "rate_limited",
            ErrorClass::Transient => "transient",
            ErrorClass::Auth => "auth",
            ErrorClass::Budget => "budget",
            ErrorClass::InvalidRequest => "invalid_request",
            ErrorClass::Gone => "gone",
            ErrorClass::Protocol => "protocol",
            ErrorClass::TooLarge => "too_large",
        }
    }
}

impl JobPhase {
    pub fn is_terminal(&self) -> bool {
        !matches!(self, JobPhase::Running | JobPhase::Stalled { .. })
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JobStatus {
    pub job_id: String,
    pub phase: JobPhase,
    /// Opaque handles of the files holding result lines (output and error files).
    pub result_files: Vec<String>,
}

/// One parsed result line, joined on our custom id (never on line order).
pub type ResultLine = (String, LineResult);

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StreamCounts {
    pub lines: u64,
    pub malformed: u64,
}

/// What `provider check` learned of a provider's key, model and schema.
#[derive(Debug)]
pub enum Probe {
    /// Nothing was refused; what was actually sent and accepted is in [`Checked`].
    Passed(Checked),
    /// The provider (or the way to it) answered with an error: its status and words.
    Refused(ProviderError),
}

/// Whether a probe put one of the key, the model and the schema to the provider.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Coverage {
    /// Sent, and accepted.
    Exercised,
    /// Never put to the provider: why, and what would check it.
    NotChecked(String),
}

/// What a probe that was not refused exercised, one by one. `provider check` prints its
/// verdict from this alone, so no adapter can claim it checked what it never sent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Checked {
    pub key: Coverage,
    pub model: Coverage,
    pub schema: Coverage,
}

impl Checked {
    /// One call took the key, the model and the schema.
    pub fn everything() -> Self {
        Self { key: Coverage::Exercised, model: Coverage::Exercised, schema: Coverage::Exercised }
    }

    /// Nothing could be put to the provider, for this reason.
    pub fn nothing(why: &str) -> Self {
        let not = || Coverage::NotChecked(why.to_string());
        Self { key: not(), model: not(), schema: not() }
    }

    /// `accepted (key, model and schema)`, or what was accepted and, grouped by reason,
    /// what was not checked: `accepted (key and model); schema not checked: …`.
    pub fn verdict(&self) -> String {
        let parts = [("key", &self.key), ("model", &self.model), ("schema", &self.schema)];
        let exercised: Vec<&str> =
            parts.iter().filter(|(_, c)| **c == Coverage::Exercised).map(|(name, _)| *name).collect();
        let mut unchecked: Vec<(Vec<&str>, &str)> = Vec::new();
        for (name, coverage) in parts {
            let Coverage::NotChecked(why) = coverage else { continue };
            match unchecked.iter_mut().find(|(_, reason)| *reason == why.as_str()) {
                Some((names, _)) => names.push(name),
                None => unchecked.push((vec![name], why.as_str())),
            }
        }
        let mut said: Vec<String> = Vec::new();
        if !exercised.is_empty() {
            said.push(format!("accepted ({})", listed(&exercised)));
        }
        said.extend(unchecked.iter().map(|(names, why)| format!("{} not checked: {why}", listed(names))));
        said.join("; ")
    }
}

/// `a`, `a and b`, `a, b and c`.
fn listed(names: &[&str]) -> String {
    match names {
        [] => String::new(),
        [one] => (*one).to_string(),
        [init @ .., last] => format!("{} and {last}", init.join(", ")),
    }
}

/// Tokens a probe may spend on its answer: enough to show the model started answering
/// in the schema, few enough that the call costs well under a cent.
pub const PROBE_MAX_OUTPUT_TOKENS: u32 = 16;

/// The member a probe asks about: a one-line source with one obvious finding.
pub fn probe_member() -> BatchMember {
    let content = "let n = input.parse::<u32>().unwrap();\n".to_string();
    let hash = crate::domain::identity::SourceHash::compute(content.as_bytes(), "probe");
    BatchMember {
        id: ExtractionId::compute("commitpoint-provider-check", "probe.rs", &hash, "probe"),
        source_id: "probe.rs".to_string(),
        content,
        output_budget: Some(PROBE_MAX_OUTPUT_TOKENS),
        previous_attempt: None,
    }
}

#[async_trait]
pub trait BatchProvider: Send + Sync + fmt::Debug {
    /// The name stored with each batch and shown to operators.
    fn name(&self) -> &str;

    /// The output token budget requests ask for by default, and the cap a truncation
    /// retry may raise it to (a member's own raised budget travels on [`BatchMember`]).
    fn output_budget(&self) -> OutputBudget;

    /// True when calls go through a batch API and are billed at its discount; a
    /// synchronous API behind this trait answers false and is priced at list price.
    fn batch_api(&self) -> bool {
        true
    }

    /// Creates the job. Not idempotent at every provider: callers look the intent up with
    /// [`BatchProvider::find_job`] before calling this again.
    async fn submit(&self, spec: &BatchSpec<'_>) -> Result<String, ProviderError>;

    /// Finds the job an earlier submit of this intent created, if any.
    async fn find_job(&self, intent: &IntentRef<'_>) -> Result<Lookup, ProviderError>;

    async fn poll(&self, job_id: &str) -> Result<JobStatus, ProviderError>;

    /// Streams every result line of a finished job into `out`; memory stays bounded by
    /// the channel, whatever the file size.
    async fn stream_results(
        &self,
        job: &JobStatus,
        out: &mpsc::Sender<ResultLine>,
    ) -> Result<StreamCounts, ProviderError>;

    async fn cancel(&self, job_id: &str) -> Result<(), ProviderError>;

    /// Sends one tiny synchronous request for `schema`'s structured output (billed, a cent
    /// or less), or the free reads a kind has, to learn whether the key, the model and the
    /// schema are accepted; says which of them it could not put to the provider.
    async fn probe(&self, schema: &Schema) -> Probe {
        let _ = schema;
        Probe::Passed(Checked::nothing("this provider kind has no synchronous call to check with"))
    }

    /// Deletes what a finished job left stored at the provider (input, output and error
    /// files), once its results are ingested. Returns how many were deleted; a provider
    /// that keeps nothing worth deleting does nothing.
    async fn delete_files(&self, _job: &JobStatus) -> Result<u64, ProviderError> {
        Ok(0)
    }
}

#[cfg(test)]
mod tests {
    use super::{Checked, Coverage, ErrorClass};

    #[test]
    fn the_verdict_claims_only_what_was_exercised() {
        assert_eq!(Checked::everything().verdict(), "accepted (key, model and schema)");
        let not = |why: &str| Coverage::NotChecked(why.to_string());
        let schema_only = Checked { schema: not("no call takes it"), ..Checked::everything() };
        assert_eq!(schema_only.verdict(), "accepted (key and model); schema not checked: no call takes it");
        let two_reasons = Checked { key: Coverage::Exercised, model: not("a"), schema: not("b") };
        assert_eq!(two_reasons.verdict(), "accepted (key); model not checked: a; schema not checked: b");
        let one_reason = Checked { key: Coverage::Exercised, model: not("a"), schema: not("a") };
        assert_eq!(one_reason.verdict(), "accepted (key); model and schema not checked: a");
        assert_eq!(Checked::nothing("no call").verdict(), "key, model and schema not checked: no call");
    }

    #[test]
    fn class_names_are_the_snake_case_the_docs_use() {
        let names = [
            (ErrorClass::RateLimited, "rate_limited"),
            (ErrorClass::InvalidRequest, "invalid_request"),
            (ErrorClass::TooLarge, "too_large"),
            (ErrorClass::Transient, "transient"),
        ];
        for (class, name) in names {
            assert_eq!(class.as_str(), name, "{class:?}");
        }
    }
}
