//! `verify`'s look at the commit index (`store/commit_index.rs` keeps it).

use std::collections::BTreeMap;

use redb::{ReadTransaction, ReadableTableMetadata};

use super::Report;
use crate::domain::lifecycle::State;
use crate::store::Error;
use crate::store::records::ExtractionRecord;
use crate::store::redb::tables::{self, META_COMMIT_INDEX};

/// `verify`: exactly one entry per committed extraction, under its tenant and commit time.
/// A file that predates the index has neither it nor the marker, and is fine as it is:
/// the next open builds it.
pub(super) fn check_commit_index(
    txn: &ReadTransaction,
    records: &BTreeMap<u64, ExtractionRecord>,
    report: &mut Report,
) -> Result<(), Error> {
    if txn.open_table(tables::META)?.get(META_COMMIT_INDEX)?.is_none() {
        return Ok(());
    }
    let index = txn.open_table(tables::COMMIT_INDEX)?;
    let mut committed = 0u64;
    for (seq, record) in records {
        if let State::Committed { at_ms } = record.state {
            committed += 1;
            if index.get((record.tenant.as_str(), at_ms, *seq))?.is_none() {
                report.problem(format!("{}: committed but missing from the commit index", record.id));
            }
        }
    }
    let found = index.len()?;
    if found != committed {
        report.problem(format!("commit index has {found} entries, expected {committed}"));
    }
    Ok(())
}
