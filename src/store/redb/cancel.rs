//! Operator and tenant actions on many or one extraction: cancelling one, and retrying
//! every failed extraction that matches a filter. A bulk retry is cut into write jobs of
//! bounded size, so it never holds the writer (and everyone's intake) for long, and each
//! job leaves every invariant in place on its own.

use redb::ReadableTable;

use super::Error;
use super::extractions::{load, transition};
use super::rules::operator::{self, SCAN_CHUNK, Step};
use super::write_tables::WriteTables;
use crate::domain::identity::ExtractionId;
use crate::domain::lifecycle::StateName;
use crate::store::seam::{CancelOutcome, RetryFilter};

pub(super) fn cancel(t: &mut WriteTables<'_>, id: &ExtractionId) -> Result<(CancelOutcome, bool), Error> {
    let Some(seq) = t.identity.get(id.as_bytes())?.map(|v| v.value()) else {
        return Ok((CancelOutcome::NotFound, false));
    };
    let mut record = load(t, seq)?;
    match operator::cancel(&record, t.now_ms) {
        Step::Move(next) => {
            transition(t, &mut record, next)?;
            Ok((CancelOutcome::Cancelled(Box::new(record)), true))
        }
        Step::Answer(outcome) => Ok((outcome, false)),
    }
}

/// One bounded job: returns how many moved, and where the next job starts (`None`: the
/// failed queue is exhausted).
pub(super) fn retry_chunk(
    t: &mut WriteTables<'_>,
    filter: &RetryFilter,
    after: u64,
    want: usize,
) -> Result<((u64, Option<u64>), bool), Error> {
    let code = StateName::Failed.code();
    // Collected first: each retry removes its entry from the range being walked.
    let mut seqs = Vec::with_capacity(SCAN_CHUNK);
    for entry in t.state_index.range((code, after.saturating_add(1))..=(code, u64::MAX))? {
        seqs.push(entry?.0.value().1);
        if seqs.len() == SCAN_CHUNK {
            break;
        }
    }
    let exhausted = seqs.len() < SCAN_CHUNK;
    let scanned = seqs.iter().map(|&seq| load(t, seq));
    let step = operator::bulk_retry(scanned, exhausted, filter, after, want, t.now_ms)?;
    let moved = step.moves.len() as u64;
    for (mut record, next) in step.moves {
        transition(t, &mut record, next)?;
    }
    Ok(((moved, step.next_after), moved > 0))
}
