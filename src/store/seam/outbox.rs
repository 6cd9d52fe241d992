//! Outbox events and their delivery through the seam.

use super::*;
use async_trait::async_trait;

/// Outbox events and their delivery (the deliverer and the operator's calls).
#[async_trait]
pub trait Outbox: Send + Sync + std::fmt::Debug {
    async fn due_events(&self, now_ms: u64, limit: usize) -> Result<Vec<OutboxRecord>, Error>;
    async fn record_delivery(&self, seq: u64, report: DeliveryReport) -> Result<Option<OutboxRecord>, Error>;
    async fn next_event_due(&self) -> Result<Option<u64>, Error>;
    async fn list_outbox(&self, filter: OutboxFilter, after: u64, limit: usize) -> Result<Vec<OutboxRecord>, Error>;
    /// (pending, dead, oldest pending's due time).
    async fn outbox_counts(&self) -> Result<(u64, u64, Option<u64>), Error>;
    async fn redeliver(&self, seq: u64) -> Result<Option<OutboxRecord>, Error>;
    async fn set_sink_disabled(&self, sink: String, disabled: bool) -> Result<(), Error>;
    async fn sink_disabled(&self, sink: String) -> Result<bool, Error>;
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
