//! The first and last steps of a tenant erasure: the rows that point at the tenant's
//! extractions (outbox events, webhook delivery ids). They are found on a read snapshot, so
//! the writer is never held for a scan of a whole table, then removed in small write jobs
//! that check each row again (it may have changed since the snapshot).

use redb::{ReadTransaction, ReadableTable};

use super::codec::decode;
use super::records::{ExtractionRecord, OutboxRecord};
use super::tables;
use super::write_tables::WriteTables;
use super::{Error, Store};
use crate::store::seam::ErasureReport;

/// Rows removed per write job.
const ROWS_PER_JOB: usize = 1000;

/// (endpoint, delivery id, the extraction sequence it pointed at).
type Delivery = (String, String, u64);

struct References {
    events: Vec<u64>,
    deliveries: Vec<Delivery>,
    /// The newest outbox event in the snapshot: later ones are for the chunks to check.
    last_event: u64,
}

impl Store {
    /// Removes the tenant's outbox events and the delivery ids that lead to its (or to no)
    /// extraction. Returns the counts and the last outbox sequence the snapshot held.
    pub(super) async fn erase_references(&self, tenant: &str) -> Result<(ErasureReport, u64), Error> {
        let name = tenant.to_string();
        let found = self.read(move |txn| find(txn, &name)).await?;
        let mut report = ErasureReport::default();
        for chunk in found.events.chunks(ROWS_PER_JOB) {
            let (name, seqs) = (tenant.to_string(), chunk.to_vec());
            report.outbox_events += self.writer.write(move |t| drop_events(t, &name, &seqs)).await?;
        }
        for chunk in found.deliveries.chunks(ROWS_PER_JOB) {
            let (name, keys) = (tenant.to_string(), chunk.to_vec());
            report.webhook_deliveries += self.writer.write(move |t| drop_deliveries(t, &name, &keys)).await?;
        }
        Ok((report, found.last_event))
    }
}

fn find(txn: &ReadTransaction, tenant: &str) -> Result<References, Error> {
    let outbox = txn.open_table(tables::OUTBOX)?;
    let mut events = Vec::new();
    for entry in outbox.iter()? {
        let (seq, value) = entry?;
        if decode::<OutboxRecord>(value.value())?.tenant == tenant {
            events.push(seq.value());
        }
    }
    let last_event = outbox.last()?.map_or(0, |(k, _)| k.value());
    let extractions = txn.open_table(tables::EXTRACTIONS)?;
    let mut deliveries = Vec::new();
    for entry in txn.open_table(tables::WEBHOOK_DELIVERIES)?.iter()? {
        let (key, seq) = entry?;
        let seq = seq.value();
        if leads_to(extractions.get(seq)?.map(|v| v.value().to_vec()), tenant)? {
            let (endpoint, id) = key.value();
            deliveries.push((endpoint.to_string(), id.to_string(), seq));
        }
    }
    Ok(References { events, deliveries, last_event })
}

/// Whether a delivery id pointing at this stored record (or at none: left by intake racing
/// an earlier step of this erasure) goes with the tenant.
fn leads_to(record: Option<Vec<u8>>, tenant: &str) -> Result<bool, Error> {
    match record {
        Some(bytes) => Ok(decode::<ExtractionRecord>(&bytes)?.tenant == tenant),
        None => Ok(true),
    }
}

fn drop_events(t: &mut WriteTables<'_>, tenant: &str, seqs: &[u64]) -> Result<(u64, bool), Error> {
    let mut dropped = 0;
    for &seq in seqs {
        let Some(event) = t.outbox.get(seq)?.map(|v| decode::<OutboxRecord>(v.value())).transpose()? else {
            continue;
        };
        if event.tenant != tenant {
            continue;
        }
        t.outbox.remove(seq)?;
        t.outbox_due.remove((event.next_attempt_at_ms, seq))?;
        t.outbox_dead.remove(seq)?;
        dropped += 1;
    }
    Ok((dropped, dropped > 0))
}

fn drop_deliveries(t: &mut WriteTables<'_>, tenant: &str, keys: &[Delivery]) -> Result<(u64, bool), Error> {
    let mut dropped = 0;
    for (endpoint, id, seq) in keys {
        let key = (endpoint.as_str(), id.as_str());
        if t.webhook_deliveries.get(key)?.map(|v| v.value()) != Some(*seq) {
            continue;
        }
        if !leads_to(t.extractions.get(*seq)?.map(|v| v.value().to_vec()), tenant)? {
            continue;
        }
        t.webhook_deliveries.remove(key)?;
        dropped += 1;
    }
    Ok((dropped, dropped > 0))
}
