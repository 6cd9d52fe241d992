//! Retention: dropping the stored content and the raw result of a committed extraction
//! some time after its commit. The identity, hash, record, findings and ledger stay, so a
//! redelivery of the same source is still recognised as a duplicate for ever.
//!
//! Candidates are found on a read snapshot, then dropped by one small write job that
//! checks each one again, so the sweep never holds the writer for long.

use redb::{ReadableDatabase, ReadableTable};

use super::Error;
use super::codec::decode;
use super::extractions::load;
use super::records::ExtractionRecord;
use super::rules::retention::{RetentionPolicy, RetentionStep};
use super::tables;
use super::write_tables::WriteTables;
use crate::domain::clock;
use crate::domain::lifecycle::StateName;

type Candidates = (Vec<u64>, Option<u64>);

pub(super) fn candidates(
    db: &redb::Database,
    policy: &RetentionPolicy,
    after: u64,
    scan: usize,
) -> Result<Candidates, Error> {
    let txn = db.begin_read()?;
    let index = txn.open_table(tables::STATE_INDEX)?;
    let extractions = txn.open_table(tables::EXTRACTIONS)?;
    let retired = txn.open_table(tables::RETIRED)?;
    let now_ms = clock::now_ms();
    let code = StateName::Committed.code();
    let mut due = Vec::new();
    let mut seen = 0;
    for entry in index.range((code, after.saturating_add(1))..=(code, u64::MAX))? {
        let seq = entry?.0.value().1;
        seen += 1;
        let already = retired.get(seq)?.map_or(0, |v| v.value());
        // Most of a long-running store is already retired: skip it without decoding.
        if policy.may_drop_more(already) {
            let Some(value) = extractions.get(seq)? else { continue };
            let record: ExtractionRecord = decode(value.value())?;
            if policy.due(&record, already, now_ms) != 0 {
                due.push(seq);
            }
        }
        if seen >= scan {
            return Ok((due, Some(seq)));
        }
    }
    Ok((due, None))
}

/// Checked again under the writer: the snapshot may be stale (a retry, an erasure).
pub(super) fn drop_due(
    t: &mut WriteTables<'_>,
    policy: &RetentionPolicy,
    due: &[u64],
) -> Result<(RetentionStep, bool), Error> {
    let mut step = RetentionStep::default();
    let mut wrote = false;
    for &seq in due {
        if t.extractions.get(seq)?.is_none() {
            continue;
        }
        let record = load(t, seq)?;
        let already = t.retired.get(seq)?.map_or(0, |v| v.value());
        let Some(retire) = policy.plan(&record, already, t.now_ms) else {
            continue;
        };
        let content = retire.content && t.contents.remove(seq)?.is_some();
        let raw_result = retire.raw_result && t.results.remove(seq)?.is_some();
        step.count(content, raw_result);
        t.retired.insert(seq, retire.marks)?;
        wrote = true;
    }
    Ok((step, wrote))
}
