//! What an evaluation stores (docs/EVALUATIONS.md): the frozen set and its candidates, one
//! trial per (candidate, member) once it is sent, and the trial batches that carry them to
//! a provider. Trials live apart from extractions: nothing here is a commit, and only a
//! promotion (`rules::evaluation::promote`) turns a trial's answer into one.

use serde::{Deserialize, Serialize};

use crate::domain::batch::Usage;
use crate::domain::identity::{ExtractionId, SourceHash};

use super::codec::Versioned;

/// The most members one evaluation holds: a review set, not a backfill.
pub const MAX_MEMBERS: usize = 100_000;

/// A named, frozen set of extractions and the providers asked about them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EvaluationRecord {
    pub name: String,
    /// The one tenant the set was drawn from, if the request named one.
    pub tenant: Option<String>,
    pub schema: String,
    /// `[providers.<name>]` tables, in the order the request listed them.
    pub candidates: Vec<String>,
    /// Trial spend past which no more trial batches are sent.
    pub budget_micros: Option<u64>,
    /// How the members were chosen, in words (`ids`, `sample 200 of committed, seed 7`).
    pub selection: String,
    pub created_at_ms: u64,
    pub cancelled_at_ms: Option<u64>,
    /// Frozen at creation: later intakes never join.
    pub members: Vec<EvalMember>,
}

impl Versioned for EvaluationRecord {
    const KIND: &'static str = "evaluation";
    const VERSION: u8 = 1;
}

impl EvaluationRecord {
    pub fn is_running(&self) -> bool {
        self.cancelled_at_ms.is_none()
    }

    pub fn has_candidate(&self, candidate: &str) -> bool {
        self.candidates.iter().any(|c| c == candidate)
    }
}

/// One identity of the set, with the content hash it had when the set was frozen.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EvalMember {
    pub seq: u64,
    pub id: ExtractionId,
    pub source_hash: SourceHash,
    pub tenant: String,
    pub source_id: String,
    /// Its tenant was erased: its source id is gone with its trials, and it is never sent.
    pub erased: bool,
}

/// One candidate's trial of one member: sent in a trial batch, then answered (or not).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TrialRecord {
    pub batch: u64,
    pub sent_at_ms: u64,
    pub outcome: Option<TrialOutcome>,
}

impl Versioned for TrialRecord {
    const KIND: &'static str = "trial";
    const VERSION: u8 = 1;
}

/// How a trial ended, what it used and what it cost (the ledger's `evaluation` entry).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TrialOutcome {
    pub verdict: TrialVerdict,
    pub answered_at_ms: u64,
    pub usage: Option<Usage>,
    pub cost_micros: u64,
}

/// A trial's answer as judged against the schema (and its grounding rules).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum TrialVerdict {
    /// Passed: kept whole, so a promotion commits exactly this answer.
    Valid { output_json: String, findings: Vec<TrialFinding> },
    /// Answered, but not in the schema (or citing what the source does not hold).
    Invalid { reason: String },
    /// Cut off at its output budget: paid, never usable.
    Truncated { reason: String },
    /// The model declined.
    Refused { reason: String },
    /// No answer: the provider refused the request, or the batch ended without one.
    Failed { reason: String },
}

impl TrialVerdict {
    pub fn name(&self) -> &'static str {
        match self {
            TrialVerdict::Valid { .. } => "valid",
            TrialVerdict::Invalid { .. } => "invalid",
            TrialVerdict::Truncated { .. } => "truncated",
            TrialVerdict::Refused { .. } => "refused",
            TrialVerdict::Failed { .. } => "failed",
        }
    }

    /// Whether the provider answered (and billed) anything.
    pub fn answered(&self) -> bool {
        !matches!(self, TrialVerdict::Failed { .. })
    }
}

/// A finding of a valid trial answer: its canonical identity and body.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TrialFinding {
    pub canonical_identity: String,
    pub body_json: String,
}

/// A provider job carrying trials of one candidate, from intent to close. Persisted before
/// the provider is called, so a restart looks the job up by `batch_key` instead of paying
/// for it twice.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TrialBatchRecord {
    pub seq: u64,
    pub evaluation: String,
    pub candidate: String,
    pub batch_key: String,
    /// Indexes into the evaluation's members.
    pub members: Vec<u32>,
    pub created_at_ms: u64,
    pub job_id: Option<String>,
    pub next_action_at_ms: u64,
    /// Failed provider calls in a row (submit or poll).
    pub failures: u32,
    pub note: Option<String>,
    /// How it ended; `None` while it is open.
    pub closed: Option<String>,
}

impl Versioned for TrialBatchRecord {
    const KIND: &'static str = "trial_batch";
    const VERSION: u8 = 1;
}

/// One stored trial, with where it belongs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Trial {
    pub candidate: String,
    pub index: u32,
    pub record: TrialRecord,
}
