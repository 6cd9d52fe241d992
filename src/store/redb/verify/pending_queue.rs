//! `verify`'s look at the pending queue (`store/pending_queue.rs` keeps it).

use std::collections::BTreeMap;

use redb::{ReadTransaction, ReadableTableMetadata};

use super::Report;
use crate::domain::lifecycle::State;
use crate::store::Error;
use crate::store::records::ExtractionRecord;
use crate::store::redb::tables::{self, META_PENDING_QUEUE};

/// Exactly one entry per pending extraction, under its schema and tenant. A file that
/// predates the queue has no marker and is fine as it is: the next open builds it.
pub(super) fn check_pending_queue(
    txn: &ReadTransaction,
    records: &BTreeMap<u64, ExtractionRecord>,
    report: &mut Report,
) -> Result<(), Error> {
    if txn.open_table(tables::META)?.get(META_PENDING_QUEUE)?.is_none() {
        return Ok(());
    }
    let queue = txn.open_table(tables::PENDING_QUEUE)?;
    let mut pending = 0u64;
    for (seq, record) in records {
        if matches!(record.state, State::Pending) {
            pending += 1;
            if queue.get((record.schema.as_str(), record.tenant.as_str(), *seq))?.is_none() {
                report.problem(format!("{}: pending but missing from the pending queue", record.id));
            }
        }
    }
    let found = queue.len()?;
    if found != pending {
        report.problem(format!("pending queue has {found} entries, expected {pending}"));
    }
    Ok(())
}
