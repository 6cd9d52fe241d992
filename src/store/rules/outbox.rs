//! What the outbox does, the same on both backends: which events a state change creates
//! (one per configured sink, under one event id), and what a delivery attempt's report or
//! an operator's redelivery does to an event and to the lists it is on.

use crate::domain::lifecycle::State;
use crate::store::records::{DeliveryState, ExtractionRecord, OutboxKind, OutboxRecord};
use crate::store::seam::DeliveryReport;

/// The event id receivers deduplicate on: the same for every sink and every attempt,
/// different for each attempt of the extraction and for committed versus failed.
pub(crate) fn event_id(record: &ExtractionRecord, kind: &OutboxKind) -> String {
    let mut hasher = blake3::Hasher::new_derive_key("commitpoint outbox event v1");
    hasher.update(record.id.as_bytes());
    hasher.update(&record.attempt.to_le_bytes());
    hasher.update(match kind {
        // A revision's committed event is still the commit's one event.
        OutboxKind::Committed | OutboxKind::Revision { .. } => b"committed",
        OutboxKind::Failed { .. } => b"failed",
        OutboxKind::Cancelled => b"cancelled",
        // A revision is superseded once.
        OutboxKind::Superseded { .. } => b"superseded",
    });
    format!("msg_{}", &hasher.finalize().to_hex()[..32])
}

/// An event a state change creates, still to be numbered by the backend's sequence.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(in crate::store) struct NewEvent<'a> {
    id: String,
    sink: &'a str,
    kind: OutboxKind,
}

impl NewEvent<'_> {
    /// The event as stored under `seq`: undelivered and due at once.
    pub(in crate::store) fn numbered(self, seq: u64, record: &ExtractionRecord, now_ms: u64) -> OutboxRecord {
        OutboxRecord::due_now(seq, self.id, self.sink.to_string(), self.kind, record, now_ms)
    }
}

/// The events `record` moving to `next` creates: terminal states get one per sink. A
/// commit's events are of `committed` kind (`rules::revision` decides it; `None`: plain).
pub(in crate::store) fn new_events<'a>(
    record: &ExtractionRecord,
    next: &State,
    sinks: &'a [String],
    committed: Option<&OutboxKind>,
) -> Vec<NewEvent<'a>> {
    if sinks.is_empty() {
        return Vec::new();
    }
    let kind = match next {
        State::Committed { .. } => committed.cloned().unwrap_or(OutboxKind::Committed),
        State::Failed { class, reason } => OutboxKind::Failed { class: *class, reason: reason.clone() },
        State::Cancelled { .. } => OutboxKind::Cancelled,
        _ => return Vec::new(),
    };
    let id = event_id(record, &kind);
    sinks.iter().map(|sink| NewEvent { id: id.clone(), sink, kind: kind.clone() }).collect()
}

/// The `extraction.superseded` events about `record`, one per sink.
pub(in crate::store) fn superseded_events<'a>(
    record: &ExtractionRecord,
    kind: &OutboxKind,
    sinks: &'a [String],
) -> Vec<NewEvent<'a>> {
    let id = event_id(record, kind);
    sinks.iter().map(|sink| NewEvent { id: id.clone(), sink, kind: kind.clone() }).collect()
}

/// How an event moves between the due and dead lists.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(in crate::store) struct Moved {
    /// Its entry on the due list, which goes.
    pub was_due_at_ms: u64,
    /// Its new entry on the due list, if it is tried again.
    pub due_at_ms: Option<u64>,
    /// It goes to the dead-letter list.
    pub dead: bool,
}

/// Applies a delivery attempt's report to a pending event; `None` (nothing to write) for
/// an event already delivered or given up on: a late or repeated report changes nothing.
pub(in crate::store) fn record_delivery(
    event: &mut OutboxRecord,
    report: DeliveryReport,
    now_ms: u64,
) -> Option<Moved> {
    if event.state != DeliveryState::Pending {
        return None;
    }
    let mut moved = Moved { was_due_at_ms: event.next_attempt_at_ms, due_at_ms: None, dead: false };
    event.deliveries += 1;
    match report {
        DeliveryReport::Delivered { status } => event.state = DeliveryState::Delivered { at_ms: now_ms, status },
        DeliveryReport::Retry { at_ms, error } => {
            event.next_attempt_at_ms = at_ms;
            event.last_error = Some(error);
            moved.due_at_ms = Some(at_ms);
        }
        DeliveryReport::Dead { reason } => {
            event.last_error = Some(reason.clone());
            event.state = DeliveryState::Dead { reason };
            moved.dead = true;
        }
    }
    Some(moved)
}

/// Moves a dead event back to pending, due now; `false` (nothing to write) for any other.
pub(in crate::store) fn redeliver(event: &mut OutboxRecord, now_ms: u64) -> bool {
    if !matches!(event.state, DeliveryState::Dead { .. }) {
        return false;
    }
    event.state = DeliveryState::Pending;
    event.next_attempt_at_ms = now_ms;
    true
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::lifecycle::FailureClass;
    use crate::store::rules::fixtures::record;

    fn event() -> OutboxRecord {
        let sinks = ["a".to_string()];
        let r = record(State::Pending);
        new_events(&r, &State::Committed { at_ms: 1 }, &sinks, None).remove(0).numbered(4, &r, 100)
    }

    #[test]
    fn terminal_states_make_one_event_per_sink_under_one_id_and_others_none() {
        let sinks = ["a".to_string(), "b".to_string()];
        let r = record(State::Pending);
        let failed = State::Failed { class: FailureClass::Auth, reason: "401".into() };
        let events = new_events(&r, &failed, &sinks, None);
        assert_eq!(events.len(), 2);
        let stored: Vec<_> = events.into_iter().zip([7, 8]).map(|(e, seq)| e.numbered(seq, &r, 50)).collect();
        assert_eq!(stored[0].event_id, stored[1].event_id);
        assert_eq!((stored[0].sink.as_str(), stored[1].sink.as_str(), stored[1].seq), ("a", "b", 8));
        assert!(matches!(stored[0].kind, OutboxKind::Failed { class: FailureClass::Auth, .. }));
        assert_ne!(stored[0].event_id, event().event_id, "failed and committed differ");
        assert!(new_events(&r, &State::Pending, &sinks, None).is_empty());
        assert!(new_events(&r, &State::Cancelled { at_ms: 1 }, &[], None).is_empty(), "no sink, no event");
    }

    #[test]
    fn a_report_moves_a_pending_event_once_and_a_late_one_changes_nothing() {
        let mut retried = event();
        let moved = record_delivery(&mut retried, DeliveryReport::Retry { at_ms: 900, error: "503".into() }, 200);
        assert_eq!(moved, Some(Moved { was_due_at_ms: 100, due_at_ms: Some(900), dead: false }));
        assert_eq!(
            (retried.deliveries, retried.next_attempt_at_ms, retried.last_error.as_deref()),
            (1, 900, Some("503"))
        );
        let mut dead = retried.clone();
        let moved = record_delivery(&mut dead, DeliveryReport::Dead { reason: "gone".into() }, 950);
        assert_eq!(moved, Some(Moved { was_due_at_ms: 900, due_at_ms: None, dead: true }));
        assert_eq!(record_delivery(&mut dead, DeliveryReport::Delivered { status: 200 }, 990), None);
        assert!(matches!(dead.state, DeliveryState::Dead { .. }), "a late report does not revive it");
        assert!(redeliver(&mut dead, 1_000));
        assert_eq!((dead.state.clone(), dead.next_attempt_at_ms), (DeliveryState::Pending, 1_000));
        assert!(!redeliver(&mut dead, 1_001), "only a dead event is redelivered");
        let delivered = record_delivery(&mut dead, DeliveryReport::Delivered { status: 204 }, 1_100);
        assert_eq!(delivered.map(|m| (m.due_at_ms, m.dead)), Some((None, false)));
        assert_eq!(dead.state, DeliveryState::Delivered { at_ms: 1_100, status: 204 });
    }
}
