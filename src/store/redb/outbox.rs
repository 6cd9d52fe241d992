//! The outbox in the store: events are created by the transaction that commits (or
//! terminally fails) an extraction, one per configured sink, and leave the due index
//! only when delivered or given up on. A crash during delivery leaves the event due,
//! so it is sent again with the same event id.

use crate::store::seam::Outbox;
use async_trait::async_trait;
use redb::{ReadableTable, ReadableTableMetadata};

use super::codec::{decode, encode};
use super::records::{ExtractionRecord, OutboxKind, OutboxRecord};
use super::rules::outbox;
use super::tables::{self, META_SINK_DISABLED_PREFIX, required};
use super::write_tables::WriteTables;
use super::{Error, Store};
use crate::domain::lifecycle::State;
use crate::store::seam::{DeliveryReport, OutboxFilter};

/// Called by `transition` for every state change: terminal states get their events.
pub(super) fn enqueue_events(
    t: &mut WriteTables<'_>,
    record: &ExtractionRecord,
    next: &State,
    committed: Option<&OutboxKind>,
) -> Result<(), Error> {
    let policies = std::sync::Arc::clone(&t.policies);
    let events = outbox::new_events(record, next, &policies.sinks, committed);
    insert_events(t, record, events)
}

/// Numbers and stores new events about `record`, due now.
pub(super) fn insert_events(
    t: &mut WriteTables<'_>,
    record: &ExtractionRecord,
    events: Vec<outbox::NewEvent<'_>>,
) -> Result<(), Error> {
    for event in events {
        let event = event.numbered(t.allocate_outbox_seq(), record, t.now_ms);
        t.outbox.insert(event.seq, encode(&event)?.as_slice())?;
        t.outbox_due.insert((t.now_ms, event.seq), ())?;
    }
    Ok(())
}

fn load_event(t: &WriteTables<'_>, seq: u64) -> Result<Option<OutboxRecord>, Error> {
    t.outbox.get(seq)?.map(|v| decode(v.value())).transpose()
}

fn record_delivery(
    t: &mut WriteTables<'_>,
    seq: u64,
    report: DeliveryReport,
) -> Result<(Option<OutboxRecord>, bool), Error> {
    let Some(mut event) = load_event(t, seq)? else {
        return Ok((None, false));
    };
    let Some(moved) = outbox::record_delivery(&mut event, report, t.now_ms) else {
        return Ok((Some(event), false));
    };
    t.outbox_due.remove((moved.was_due_at_ms, seq))?;
    if let Some(at_ms) = moved.due_at_ms {
        t.outbox_due.insert((at_ms, seq), ())?;
    }
    if moved.dead {
        t.outbox_dead.insert(seq, ())?;
    }
    t.outbox.insert(seq, encode(&event)?.as_slice())?;
    Ok((Some(event), true))
}

fn redeliver(t: &mut WriteTables<'_>, seq: u64) -> Result<(Option<OutboxRecord>, bool), Error> {
    let Some(mut event) = load_event(t, seq)? else {
        return Ok((None, false));
    };
    if !outbox::redeliver(&mut event, t.now_ms) {
        return Ok((Some(event), false));
    }
    t.outbox_dead.remove(seq)?;
    t.outbox_due.insert((event.next_attempt_at_ms, seq), ())?;
    t.outbox.insert(seq, encode(&event)?.as_slice())?;
    Ok((Some(event), true))
}

impl Store {
    pub async fn outbox_event(&self, seq: u64) -> Result<Option<OutboxRecord>, Error> {
        self.read(move |txn| txn.open_table(tables::OUTBOX)?.get(seq)?.map(|v| decode(v.value())).transpose()).await
    }
}

#[async_trait]
impl Outbox for Store {
    async fn record_delivery(&self, seq: u64, report: DeliveryReport) -> Result<Option<OutboxRecord>, Error> {
        self.writer.write(move |t| record_delivery(t, seq, report)).await
    }

    /// Moves a dead event back to pending, due now. Anything else is returned unchanged.
    async fn redeliver(&self, seq: u64) -> Result<Option<OutboxRecord>, Error> {
        self.writer.write(move |t| redeliver(t, seq)).await
    }

    /// Marks a sink disabled (its receiver answered 410 Gone), or enabled again.
    async fn set_sink_disabled(&self, sink: String, disabled: bool) -> Result<(), Error> {
        self.writer
            .write(move |t| {
                let key = format!("{META_SINK_DISABLED_PREFIX}{sink}");
                if disabled {
                    t.meta.insert(key.as_str(), t.now_ms)?;
                } else {
                    t.meta.remove(key.as_str())?;
                }
                Ok(((), true))
            })
            .await
    }

    async fn sink_disabled(&self, sink: String) -> Result<bool, Error> {
        self.read(move |txn| {
            let meta = txn.open_table(tables::META)?;
            Ok(meta.get(format!("{META_SINK_DISABLED_PREFIX}{sink}").as_str())?.is_some())
        })
        .await
    }

    /// Pending events due at or before `now_ms`, most overdue first.
    async fn due_events(&self, now_ms: u64, limit: usize) -> Result<Vec<OutboxRecord>, Error> {
        self.read(move |txn| {
            let due = txn.open_table(tables::OUTBOX_DUE)?;
            let outbox = txn.open_table(tables::OUTBOX)?;
            let mut events = Vec::new();
            for entry in due.range((0, 0)..=(now_ms, u64::MAX))?.take(limit) {
                let seq = entry?.0.value().1;
                events.push(decode(&required(outbox.get(seq)?, "outbox", seq)?)?);
            }
            Ok(events)
        })
        .await
    }

    /// When the earliest pending event is due, if any.
    async fn next_event_due(&self) -> Result<Option<u64>, Error> {
        self.read(|txn| Ok(txn.open_table(tables::OUTBOX_DUE)?.first()?.map(|(k, _)| k.value().0))).await
    }

    /// Pending or dead events in sequence order, starting after `after`.
    async fn list_outbox(&self, filter: OutboxFilter, after: u64, limit: usize) -> Result<Vec<OutboxRecord>, Error> {
        self.read(move |txn| {
            let outbox = txn.open_table(tables::OUTBOX)?;
            let mut events = Vec::new();
            match filter {
                OutboxFilter::Dead => {
                    let dead = txn.open_table(tables::OUTBOX_DEAD)?;
                    for entry in dead.range(after.saturating_add(1)..)?.take(limit) {
                        let seq = entry?.0.value();
                        events.push(decode(&required(outbox.get(seq)?, "outbox", seq)?)?);
                    }
                }
                OutboxFilter::Pending => {
                    let due = txn.open_table(tables::OUTBOX_DUE)?;
                    let mut seqs: Vec<u64> =
                        due.iter()?.map(|e| e.map(|(k, _)| k.value().1)).collect::<Result<_, _>>()?;
                    seqs.sort_unstable();
                    for seq in seqs.into_iter().filter(|s| *s > after).take(limit) {
                        events.push(decode(&required(outbox.get(seq)?, "outbox", seq)?)?);
                    }
                }
            }
            Ok(events)
        })
        .await
    }

    /// (pending, dead, creation time of the oldest pending event) for status and metrics.
    async fn outbox_counts(&self) -> Result<(u64, u64, Option<u64>), Error> {
        self.read(|txn| {
            let due = txn.open_table(tables::OUTBOX_DUE)?;
            let dead = txn.open_table(tables::OUTBOX_DEAD)?;
            let outbox = txn.open_table(tables::OUTBOX)?;
            let mut oldest: Option<u64> = None;
            // Bounded: a huge backlog's oldest is among its most overdue entries.
            for entry in due.iter()?.take(1000) {
                let seq = entry?.0.value().1;
                let event: OutboxRecord = decode(&required(outbox.get(seq)?, "outbox", seq)?)?;
                oldest = Some(oldest.map_or(event.created_at_ms, |o: u64| o.min(event.created_at_ms)));
            }
            Ok((due.len()?, dead.len()?, oldest))
        })
        .await
    }
}
