//! Records the rules' tests start from: one extraction, and a batch of provider "p" under
//! key "b-1" with members as a backend would have loaded them.

use crate::domain::batch::OutputBudget;
use crate::domain::identity::{ExtractionId, SourceHash};
use crate::domain::lifecycle::State;
use crate::store::records::{BatchRecord, BatchState, ExtractionRecord};
use crate::store::rules::member::MemberRules;

/// An extraction of tenant `t` at its first attempt, in `state`.
pub(super) fn record(state: State) -> ExtractionRecord {
    ExtractionRecord {
        id: ExtractionId([1; 32]),
        seq: 1,
        tenant: "t".into(),
        source_id: "s".into(),
        source_hash: SourceHash([2; 32]),
        schema: SCHEMA.into(),
        metadata_json: None,
        state,
        attempt: 1,
        claims: 0,
        content_bytes: 1,
        created_at_ms: 0,
        updated_at_ms: 0,
        requeues: 0,
        output_budget: None,
        truncation_retried: false,
        reasks: 0,
        previous_attempt: None,
        superseded_by: None,
        past_failures: Vec::new(),
    }
}

pub(super) const KEY: &str = "b-1";
pub(super) const SCHEMA: &str = "code-review@1";
/// When the batch was created; the planners run at `NOW`.
pub(super) const CREATED: u64 = 1_000;
pub(super) const NOW: u64 = 5_000;

pub(super) const RULES: MemberRules =
    MemberRules { max_attempts: 3, budget: OutputBudget { default: Some(1000), cap: 3000 }, batch_api: true };

pub(super) fn batch(state: BatchState, members: &[u64]) -> BatchRecord {
    BatchRecord {
        seq: 7,
        batch_key: KEY.into(),
        provider: "p".into(),
        schema: SCHEMA.into(),
        members: members.to_vec(),
        state,
        next_action_at_ms: 0,
        failures: 2,
        last_error: Some("earlier".into()),
        created_at_ms: CREATED,
        updated_at_ms: CREATED,
        not_found_since_ms: None,
    }
}

pub(super) fn submitted_job() -> BatchState {
    BatchState::Submitted { job_id: "job-1".into() }
}

/// A member of batch `KEY` whose job is known.
pub(super) fn in_job() -> State {
    State::Submitted { provider: "p".into(), batch_key: KEY.into(), job_id: Some("job-1".into()) }
}

/// Member `seq` of batch `KEY`, as a backend would have loaded it: its own source and identity.
pub(super) fn member(seq: u64, state: State) -> ExtractionRecord {
    let source_id = format!("s{seq}");
    let source_hash = SourceHash::compute(source_id.as_bytes(), SCHEMA);
    ExtractionRecord {
        id: ExtractionId::compute("t", &source_id, &source_hash, SCHEMA),
        seq,
        source_id,
        source_hash,
        ..record(state)
    }
}
