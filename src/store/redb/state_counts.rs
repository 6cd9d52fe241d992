//! How many extractions are in each state, kept in `STATE_COUNTS` by the same write that
//! changes `STATE_INDEX`, so status answers read seven numbers instead of counting.
//!
//! Every `STATE_INDEX` change goes through `index` / `unindex`, which move the counter
//! only when the entry really appeared or disappeared: the counters equal the index's
//! per-state sizes by construction. A file written before the counters existed, or by an
//! older binary after a rollback, is recounted when it is opened.

use redb::{ReadTransaction, ReadableTable, ReadableTableMetadata};

use super::Error;
use super::tables;
use super::write_tables::WriteTables;
use crate::domain::lifecycle::StateName;

/// Adds `seq` to the queue of state `code`.
pub(super) fn index(t: &mut WriteTables<'_>, code: u8, seq: u64) -> Result<(), Error> {
    let added = t.state_index.insert((code, seq), ())?.is_none();
    if added {
        let now = t.state_counts.get(code)?.map_or(0, |v| v.value());
        t.state_counts.insert(code, now.saturating_add(1))?;
    }
    Ok(())
}

/// Takes `seq` out of the queue of state `code`.
pub(super) fn unindex(t: &mut WriteTables<'_>, code: u8, seq: u64) -> Result<(), Error> {
    let removed = t.state_index.remove((code, seq))?.is_some();
    if removed {
        let now = t.state_counts.get(code)?.map_or(0, |v| v.value());
        t.state_counts.insert(code, now.saturating_sub(1))?;
    }
    Ok(())
}

/// Counts the index (keys only, no record reads) and rewrites the counters where they
/// disagree. Runs in the opening transaction. Returns how many counters it corrected.
pub(super) fn reconcile(t: &mut WriteTables<'_>) -> Result<u64, Error> {
    let mut corrected = 0;
    for state in StateName::ALL {
        let code = state.code();
        let actual = t.state_index.range((code, 0)..=(code, u64::MAX))?.count() as u64;
        let stored = t.state_counts.get(code)?.map(|v| v.value());
        if stored != Some(actual) {
            t.state_counts.insert(code, actual)?;
            corrected += 1;
        }
    }
    // A code no state has could only come from a damaged file; it would count nothing.
    let known: Vec<u8> = StateName::ALL.iter().map(|s| s.code()).collect();
    let before = t.state_counts.len()?;
    t.state_counts.retain(|code, _| known.contains(&code))?;
    corrected += before.saturating_sub(t.state_counts.len()?);
    if corrected > 0 {
        tracing::info!(
            corrected,
            "recounted the per-state counters (the file predates them, or an older binary wrote to it)"
        );
    }
    Ok(corrected)
}

/// The stored count of every state, in `StateName::ALL` order.
pub(super) fn read(txn: &ReadTransaction) -> Result<Vec<(StateName, u64)>, Error> {
    let counts = txn.open_table(tables::STATE_COUNTS)?;
    let mut out = Vec::with_capacity(StateName::ALL.len());
    for state in StateName::ALL {
        out.push((state, counts.get(state.code())?.map_or(0, |v| v.value())));
    }
    Ok(out)
}

/// The stored count of one state inside a write.
pub(super) fn get(t: &WriteTables<'_>, state: StateName) -> Result<u64, Error> {
    Ok(t.state_counts.get(state.code())?.map_or(0, |v| v.value()))
}
