//! The Upkeep seam on this backend.

use super::Error;
use super::PgStore;
use super::pg;
use super::rows::big;
use super::rows::decode_record;
use super::rows::unbig;
use crate::domain::clock;
use crate::domain::lifecycle::StateName;
use crate::store::BackupReport;
use crate::store::ErasureReport;
use crate::store::RetentionPolicy;
use crate::store::RetentionStep;
use crate::store::seam::Upkeep;
use async_trait::async_trait;
use std::collections::BTreeSet;
use std::path::PathBuf;

#[async_trait]
impl Upkeep for PgStore {
    /// Erases `tenant`. Idempotent: a tenant with nothing stored erases nothing.
    async fn erase_tenant(&self, tenant: String) -> Result<ErasureReport, Error> {
        let mut batches = BTreeSet::new();
        let mut last_error = None;
        for _ in 0..super::erase::ROUNDS {
            let mut client = self.client().await?;
            let tx = client.transaction().await.map_err(pg("cannot begin a transaction"))?;
            match super::erase::erase_in(&tx, &tenant, &batches, clock::now_ms()).await {
                Ok(super::erase::Round::Done(report)) => {
                    tx.commit().await.map_err(pg("erasure commit failed"))?;
                    return Ok(report);
                }
                // Rolled back (the transaction is dropped): nothing of this round stays.
                Ok(super::erase::Round::LockAlso(more)) => batches.extend(more),
                Err(e) if super::erase::lost_a_race(&e) => last_error = Some(e),
                Err(e) => return Err(e),
            }
        }
        Err(last_error.unwrap_or_else(|| Error::Conflict {
            reason: format!("erasing tenant {tenant:?} kept racing provider batches"),
            cause: None,
        }))
    }

    /// A round trip to the database: proof that it still answers.
    async fn ping_writer(&self) -> Result<(), Error> {
        let client = self.client().await?;
        client.execute("SELECT 1", &[]).await.map_err(pg("the database does not answer"))?;
        Ok(())
    }

    /// Looks at up to `scan` committed extractions after sequence `after` and drops what
    /// `policy` no longer keeps.
    async fn retention_step(&self, policy: RetentionPolicy, after: u64, scan: usize) -> Result<RetentionStep, Error> {
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
            if policy.due(&decode_record(bytes)?, super::retention::retired_bits(row.get(1)), now_ms) != 0 {
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
            let already = super::retention::retired_bits(row.get(2));
            let Some(retire) = policy.plan(&decode_record(row.get(1))?, already, now_ms) else {
                continue;
            };
            let content = retire.content
                && super::retention::removed(&tx, super::retention::DROP_CONTENT, seq, "cannot drop content").await?;
            let raw_result = retire.raw_result
                && super::retention::removed(&tx, super::retention::DROP_RESULT, seq, "cannot drop a raw result")
                    .await?;
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

    /// PostgreSQL is backed up with its own tools; commitpoint does not copy it.
    async fn backup(&self, _dest: PathBuf) -> Result<BackupReport, Error> {
        Err(Error::NotOnBackend {
            operation: "backup",
            backend: "postgres",
            hint: "back the database up with pg_dump or pg_basebackup (docs/SCALE-OUT.md)",
        })
    }

    /// commitpoint takes no backups of a PostgreSQL store, so it knows of none.
    async fn last_backup_ms(&self) -> Result<Option<u64>, Error> {
        Ok(None)
    }
}
