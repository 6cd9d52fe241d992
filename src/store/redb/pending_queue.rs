//! Pending work by (schema, tenant), so a claim for one schema and a batch intent for one
//! provider read only the work they can take, oldest first, instead of walking every
//! pending extraction and skipping the rest.
//!
//! `ops::transition` (and intake, and erasure) keep `PENDING_QUEUE` in step with the
//! `Pending` state in the same write. A file written before the queue existed gets it
//! built when it is opened.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::ops::Bound;

use redb::{ReadableTable, ReadableTableMetadata};

use super::Error;
use super::codec::decode;
use super::records::ExtractionRecord;
use super::tables::{META_PENDING_QUEUE, required};
use super::write_tables::WriteTables;
use crate::domain::lifecycle::{State, StateName};

type Key = (&'static str, &'static str, u64);

/// Keeps the queue in step with `record` moving from its current state to `to`.
pub(super) fn follow(t: &mut WriteTables<'_>, record: &ExtractionRecord, to: &State) -> Result<(), Error> {
    let key = (record.schema.as_str(), record.tenant.as_str(), record.seq);
    match (matches!(record.state, State::Pending), matches!(to, State::Pending)) {
        (false, true) => {
            t.pending_queue.insert(key, ())?;
        }
        (true, false) => {
            t.pending_queue.remove(key)?;
        }
        _ => {}
    }
    Ok(())
}

/// Takes an extraction that is being removed out of the queue.
pub(super) fn forget(t: &mut WriteTables<'_>, record: &ExtractionRecord) -> Result<(), Error> {
    if matches!(record.state, State::Pending) {
        t.pending_queue.remove((record.schema.as_str(), record.tenant.as_str(), record.seq))?;
    }
    Ok(())
}

/// Up to `limit` pending sequences of `schema` whose tenant `accept`s, in intake order.
/// Costs one seek per tenant with pending work of the schema, then one step per result:
/// each tenant's entries are already in intake order, so the oldest overall is the
/// smallest of the tenants' heads.
pub(super) fn oldest<T: ReadableTable<Key, ()>>(
    table: &T,
    schema: &str,
    accept: &dyn Fn(&str) -> bool,
    limit: usize,
) -> Result<Vec<u64>, Error> {
    let mut ranges = Vec::new();
    let mut heads = BinaryHeap::new();
    let mut tenant: Option<String> = None;
    loop {
        let start = match &tenant {
            None => Bound::Included((schema, "", 0)),
            Some(last) => Bound::Excluded((schema, last.as_str(), u64::MAX)),
        };
        let Some(entry) = table.range::<(&str, &str, u64)>((start, Bound::Unbounded))?.next() else { break };
        let (key, _) = entry?;
        let (found_schema, found_tenant, _) = key.value();
        if found_schema != schema {
            break;
        }
        let name = found_tenant.to_string();
        if accept(&name) {
            let mut range = table.range((schema, name.as_str(), 0)..=(schema, name.as_str(), u64::MAX))?;
            if let Some(first) = range.next() {
                heads.push(Reverse((first?.0.value().2, ranges.len())));
                ranges.push(range);
            }
        }
        tenant = Some(name);
    }
    let mut out = Vec::with_capacity(limit.min(1024));
    while out.len() < limit {
        let Some(Reverse((seq, which))) = heads.pop() else { break };
        out.push(seq);
        if let Some(next) = ranges.get_mut(which).and_then(Iterator::next) {
            heads.push(Reverse((next?.0.value().2, which)));
        }
    }
    Ok(out)
}

/// Fills the queue from the pending records unless `META` says it is complete and it has
/// one entry per pending extraction (the count check catches an older binary's writes
/// after a rollback). Runs in the opening transaction, after the counters are checked.
pub(super) fn build_if_absent(t: &mut WriteTables<'_>) -> Result<u64, Error> {
    let pending = super::state_counts::get(t, StateName::Pending)?;
    if t.meta.get(META_PENDING_QUEUE)?.is_some() && t.pending_queue.len()? == pending {
        return Ok(0);
    }
    t.pending_queue.retain(|_, _| false)?;
    let code = StateName::Pending.code();
    let seqs: Vec<u64> =
        t.state_index.range((code, 0)..=(code, u64::MAX))?.map(|e| Ok(e?.0.value().1)).collect::<Result<_, Error>>()?;
    let mut built = 0;
    for seq in seqs {
        let record: ExtractionRecord = decode(&required(t.extractions.get(seq)?, "extraction", seq)?)?;
        if matches!(record.state, State::Pending) {
            t.pending_queue.insert((record.schema.as_str(), record.tenant.as_str(), seq), ())?;
            built += 1;
        }
    }
    t.meta.insert(META_PENDING_QUEUE, 1)?;
    if built > 0 {
        tracing::info!(
            entries = built,
            "built the pending queue (the file predates it, or an older binary wrote to it)"
        );
    }
    Ok(built)
}
