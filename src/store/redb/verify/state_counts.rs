//! `verify`'s look at the per-state counters (`store/state_counts.rs` keeps them).

use redb::{ReadTransaction, ReadableTable};

use super::Report;
use crate::domain::lifecycle::StateName;
use crate::store::Error;
use crate::store::redb::tables;

/// Each counter equals the number of records in its state, and no counter names a state
/// that does not exist. A file that predates the counters has no table and is fine as it
/// is: the next open counts it.
pub(super) fn check_state_counts(txn: &ReadTransaction, report: &mut Report) -> Result<(), Error> {
    let counts = match txn.open_table(tables::STATE_COUNTS) {
        Ok(counts) => counts,
        Err(redb::TableError::TableDoesNotExist(_)) => return Ok(()),
        Err(e) => return Err(e.into()),
    };
    for state in StateName::ALL {
        let stored = counts.get(state.code())?.map_or(0, |v| v.value());
        let actual = report.by_state.get(state.as_str()).copied().unwrap_or(0);
        if stored != actual {
            report.problem(format!("{} counter says {stored}, but {actual} extractions are {0}", state.as_str()));
        }
    }
    for entry in counts.iter()? {
        let code = entry?.0.value();
        if StateName::from_code(code.into()).is_none() {
            report.problem(format!("a state counter for unknown state code {code}"));
        }
    }
    Ok(())
}
