//! Retention on PostgreSQL: a committed extraction's content and raw result are dropped
//! some time after its commit, with the same marks as on redb (`retired`: which kinds were
//! dropped), so the identity, hash, record, findings and ledger stay and a redelivery of
//! the same source is still a duplicate. What is due is `store::retention_rules`, shared
//! with the redb store.
//!
//! A step reads up to `scan` committed extractions after a sequence number (one
//! statement), then drops what is due in one short transaction that locks those rows and
//! checks each one again: it may have been erased or changed since the read.

use std::collections::HashMap;

use tokio_postgres::Transaction;

use super::rows::{big, decode_record, unbig};
use super::{Error, PgStore, pg};
use crate::domain::clock;
use crate::domain::lifecycle::StateName;
use crate::store::{RetentionPolicy, RetentionStep};

impl PgStore {
    /// Looks at up to `scan` committed extractions after sequence `after` and drops what
    /// `policy` no longer keeps.
    pub(super) async fn retention_step(
        &self,
        policy: RetentionPolicy,
        after: u64,
        scan: usize,
    ) -> Result<RetentionStep, Error> {
        let scan = big(scan.max(1) as u64);
        let all = i16::from(policy.all_bits());
        let now_ms = clock::now_ms();
        let mut client = self.client().await?;
        // Most of a long-running store is already retired: those rows' records are not read.
        let rows = client
            .query(
                "SELECT e.seq, coalesce(r.bits, 0::smallint), \
                 CASE WHEN coalesce(r.bits, 0::smallint) & $3 <> $3 THEN e.record END \
                 FROM extractions e LEFT JOIN retired r ON r.extraction_seq = e.seq \
                 WHERE e.state_code = $1 AND e.seq > $2 ORDER BY e.seq LIMIT $4",
                &[&i16::from(StateName::Committed.code()), &big(after), &all, &scan],
            )
            .await
            .map_err(pg("cannot read committed extractions"))?;
        let next_after = (rows.len() as i64 == scan).then(|| rows.last().map(|r| unbig(r.get(0)))).flatten();
        let mut due = Vec::new();
        for row in &rows {
            let Some(bytes) = row.get::<_, Option<&[u8]>>(2) else { continue };
            if policy.due(&decode_record(bytes)?, retired_bits(row.get(1)), now_ms) != 0 {
                due.push(row.get::<_, i64>(0));
            }
        }
        let mut step = RetentionStep { next_after, ..RetentionStep::default() };
        if due.is_empty() {
            return Ok(step);
        }
        let tx = client.transaction().await.map_err(pg("cannot begin a transaction"))?;
        let now_ms = clock::now_ms();
        let locked = tx
            .query(
                "SELECT e.seq, e.record, coalesce(r.bits, 0::smallint) FROM extractions e \
                 LEFT JOIN retired r ON r.extraction_seq = e.seq WHERE e.seq = ANY($1) ORDER BY e.seq FOR UPDATE OF e",
                &[&due],
            )
            .await
            .map_err(pg("cannot lock extractions"))?;
        for row in &locked {
            let seq: i64 = row.get(0);
            let already = retired_bits(row.get(2));
            let Some(retire) = policy.plan(&decode_record(row.get(1))?, already, now_ms) else {
                continue;
            };
            let content = retire.content && removed(&tx, DROP_CONTENT, seq, "cannot drop content").await?;
            let raw_result = retire.raw_result && removed(&tx, DROP_RESULT, seq, "cannot drop a raw result").await?;
            step.count(content, raw_result);
            tx.execute(
                "INSERT INTO retired (extraction_seq, bits) VALUES ($1, $2) \
                 ON CONFLICT (extraction_seq) DO UPDATE SET bits = excluded.bits",
                &[&seq, &i16::from(retire.marks)],
            )
            .await
            .map_err(pg("cannot mark what retention dropped"))?;
        }
        tx.commit().await.map_err(pg("retention commit failed"))?;
        Ok(step)
    }

    /// The `RETIRED_*` bits of each of `seqs` that retention touched (absent: nothing dropped).
    pub(super) async fn retired(&self, seqs: Vec<u64>) -> Result<HashMap<u64, u8>, Error> {
        let client = self.client().await?;
        let wanted: Vec<i64> = seqs.into_iter().map(big).collect();
        let rows = client
            .query("SELECT extraction_seq, bits FROM retired WHERE extraction_seq = ANY($1)", &[&wanted])
            .await
            .map_err(pg("cannot read what retention dropped"))?;
        Ok(rows.iter().map(|r| (unbig(r.get(0)), retired_bits(r.get(1)))).collect())
    }
}

const DROP_CONTENT: &str = "UPDATE extractions SET content = NULL WHERE seq = $1 AND content IS NOT NULL";
const DROP_RESULT: &str = "DELETE FROM results WHERE extraction_seq = $1";

/// Runs one of the drops on extraction `seq`; whether it found something to drop.
async fn removed(tx: &Transaction<'_>, sql: &str, seq: i64, what: &'static str) -> Result<bool, Error> {
    Ok(tx.execute(sql, &[&seq]).await.map_err(pg(what))? > 0)
}

/// The stored bits; the column holds only values this store wrote (`RETIRED_*`).
fn retired_bits(column: i16) -> u8 {
    u8::try_from(column).unwrap_or(0)
}
