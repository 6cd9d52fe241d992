//! Retention: dropping the stored content and the raw result of a committed extraction
//! some time after its commit. The identity, hash, record, findings and ledger stay, so a
//! redelivery of the same source is still recognised as a duplicate for ever.
//!
//! Candidates are found on a read snapshot, then dropped by one small write job that
//! checks each one again, so the sweep never holds the writer for long.

use std::collections::HashMap;

use redb::{ReadableDatabase, ReadableTable};

use super::codec::decode;
use super::extractions::load;
use super::records::ExtractionRecord;
use super::rules::retention::{RetentionPolicy, RetentionStep};
use super::tables;
use super::write_tables::WriteTables;
use super::{Error, Store};
use crate::domain::clock;
use crate::domain::lifecycle::StateName;

impl Store {
    /// Looks at up to `scan` committed extractions after sequence `after` and drops what
    /// `policy` no longer keeps, in one write transaction.
    pub async fn retention_step(
        &self,
        policy: RetentionPolicy,
        after: u64,
        scan: usize,
    ) -> Result<RetentionStep, Error> {
        let db = std::sync::Arc::clone(&self.db);
        let (due, next_after) = tokio::task::spawn_blocking(move || candidates(&db, &policy, after, scan.max(1)))
            .await
            .map_err(|e| Error::task("read", e))??;
        if due.is_empty() {
            return Ok(RetentionStep { next_after, ..RetentionStep::default() });
        }
        let mut step = self.writer.write(move |t| drop_due(t, &policy, &due)).await?;
        step.next_after = next_after;
        Ok(step)
    }

    /// The `RETIRED_*` bits of each of `seqs` that retention touched (absent: nothing dropped).
    pub async fn retired(&self, seqs: Vec<u64>) -> Result<HashMap<u64, u8>, Error> {
        self.read(move |txn| {
            let retired = txn.open_table(tables::RETIRED)?;
            let mut out = HashMap::new();
            for seq in seqs {
                if let Some(bits) = retired.get(seq)? {
                    out.insert(seq, bits.value());
                }
            }
            Ok(out)
        })
        .await
    }
}

type Candidates = (Vec<u64>, Option<u64>);

fn candidates(db: &redb::Database, policy: &RetentionPolicy, after: u64, scan: usize) -> Result<Candidates, Error> {
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
fn drop_due(t: &mut WriteTables<'_>, policy: &RetentionPolicy, due: &[u64]) -> Result<(RetentionStep, bool), Error> {
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
