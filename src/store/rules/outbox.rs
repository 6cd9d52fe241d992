//! Which events an outbox entry carries, the same on both backends.

use crate::store::records::{ExtractionRecord, OutboxKind};

/// The event id receivers deduplicate on: the same for every sink and every attempt,
/// different for each attempt of the extraction and for committed versus failed.
pub(crate) fn event_id(record: &ExtractionRecord, kind: &OutboxKind) -> String {
    let mut hasher = blake3::Hasher::new_derive_key("commitpoint outbox event v1");
    hasher.update(record.id.as_bytes());
    hasher.update(&record.attempt.to_le_bytes());
    hasher.update(match kind {
        OutboxKind::Committed => b"committed",
        OutboxKind::Failed { .. } => b"failed",
        OutboxKind::Cancelled => b"cancelled",
    });
    format!("msg_{}", &hasher.finalize().to_hex()[..32])
}
