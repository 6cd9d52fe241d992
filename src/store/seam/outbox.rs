//! Outbox events and their delivery through the seam.

use super::*;

seam! {
    /// Outbox events and their delivery (the deliverer and the operator's calls).
    pub trait Outbox {
        fn due_events(&self, now_ms: u64, limit: usize) -> Vec<OutboxRecord>;
        fn record_delivery(&self, seq: u64, report: DeliveryReport) -> Option<OutboxRecord>;
        fn next_event_due(&self) -> Option<u64>;
        fn list_outbox(&self, filter: OutboxFilter, after: u64, limit: usize) -> Vec<OutboxRecord>;
        /// (pending, dead, oldest pending's due time).
        fn outbox_counts(&self) -> (u64, u64, Option<u64>);
        fn redeliver(&self, seq: u64) -> Option<OutboxRecord>;
        fn set_sink_disabled(&self, sink: String, disabled: bool) -> ();
        fn sink_disabled(&self, sink: String) -> bool;
    }
}

/// What one delivery attempt came to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DeliveryReport {
    Delivered {
        status: u16,
    },
    /// Try again at `at_ms`.
    Retry {
        at_ms: u64,
        error: String,
    },
    /// Give up: the event goes to the dead-letter list.
    Dead {
        reason: String,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OutboxFilter {
    Pending,
    Dead,
}
