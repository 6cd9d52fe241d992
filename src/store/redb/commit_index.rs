//! The commit index: a tenant's committed extractions in commit order, so an export walks
//! one key range instead of every record. The commit writes its entry (`ops::transition`);
//! a file written before the index existed gets it built once, when it is opened.

use redb::{ReadableTable, ReadableTableMetadata};

use super::Error;
use super::codec::decode;
use super::records::ExtractionRecord;
use super::tables::{META_COMMIT_INDEX, required};
use super::write_tables::WriteTables;
use crate::domain::lifecycle::{State, StateName};

/// Fills the index from the committed records unless `META` says it is complete and it
/// has one entry per committed extraction. Runs in the opening transaction, so the marker
/// and the entries land together or not at all. The count check catches a file that an
/// older binary, which knows no index, committed to after a rollback; it reads the
/// committed counter, which `state_counts::reconcile` has just checked against the
/// index. Returns how many entries it wrote.
pub(super) fn build_if_absent(t: &mut WriteTables<'_>) -> Result<u64, Error> {
    let code = StateName::Committed.code();
    let committed = super::state_counts::get(t, StateName::Committed)?;
    if t.meta.get(META_COMMIT_INDEX)?.is_some() && t.commit_index.len()? == committed {
        return Ok(0);
    }
    t.commit_index.retain(|_, _| false)?;
    let seqs: Vec<u64> =
        t.state_index.range((code, 0)..=(code, u64::MAX))?.map(|e| Ok(e?.0.value().1)).collect::<Result<_, Error>>()?;
    let mut built = 0;
    for seq in seqs {
        let record: ExtractionRecord = decode(&required(t.extractions.get(seq)?, "extraction", seq)?)?;
        if let State::Committed { at_ms } = record.state {
            t.commit_index.insert((record.tenant.as_str(), at_ms, seq), ())?;
            built += 1;
        }
    }
    t.meta.insert(META_COMMIT_INDEX, 1)?;
    if built > 0 {
        tracing::info!(
            entries = built,
            "built the commit index (the file predates it, or an older binary wrote to it)"
        );
    }
    Ok(built)
}
