//! Records the rules' tests start from.

use crate::domain::identity::{ExtractionId, SourceHash};
use crate::domain::lifecycle::State;
use crate::store::records::ExtractionRecord;

/// An extraction of tenant `t` at its first attempt, in `state`.
pub(super) fn record(state: State) -> ExtractionRecord {
    ExtractionRecord {
        id: ExtractionId([1; 32]),
        seq: 1,
        tenant: "t".into(),
        source_id: "s".into(),
        source_hash: SourceHash([2; 32]),
        schema: "code-review@1".into(),
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
    }
}
