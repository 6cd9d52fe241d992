//! The Upkeep seam on this backend.

use super::Error;
use super::Store;
use super::rules::retention::RetentionPolicy;
use super::rules::retention::RetentionStep;
use super::tables;
use crate::store::seam::BackupReport;
use crate::store::seam::ErasureReport;
use crate::store::seam::Upkeep;
use async_trait::async_trait;
use std::path::PathBuf;

#[async_trait]
impl Upkeep for Store {
    /// Writes a snapshot to `dest` (which must not exist). Blocking work runs off the runtime.
    async fn backup(&self, dest: PathBuf) -> Result<BackupReport, Error> {
        let report = self.read(move |txn| super::backup::write_snapshot(txn, &dest)).await?;
        // Recorded after the snapshot (which therefore never contains its own timestamp),
        // so operators and alerts see the last good backup across restarts.
        self.writer
            .write(|t| {
                t.meta.insert(tables::META_LAST_BACKUP, t.now_ms)?;
                Ok(((), true))
            })
            .await?;
        Ok(report)
    }

    /// Erases `tenant`. Idempotent: a tenant with nothing stored erases nothing.
    async fn erase_tenant(&self, tenant: String) -> Result<ErasureReport, Error> {
        let mut total = ErasureReport::default();
        let (first, since) = self.erase_references(&tenant).await?;
        total.add(&first);
        loop {
            let name = tenant.clone();
            let (chunk, more) = self.writer.write(move |t| super::erase::erase_chunk(t, &name, since)).await?;
            total.add(&chunk);
            if !more {
                break;
            }
        }
        let name = tenant.clone();
        self.writer.write(move |t| super::erase::erase_evaluations(t, &name)).await?;
        // Intake that raced the first step may have added a delivery id or an event since.
        total.add(&self.erase_references(&tenant).await?.0);
        Ok(total)
    }

    /// Round-trips an empty job through the writer thread: proof that it still commits.
    async fn ping_writer(&self) -> Result<(), Error> {
        self.writer.write(|_| Ok(((), false))).await
    }

    /// Unix ms of the last successful online backup, if any was ever taken.
    async fn last_backup_ms(&self) -> Result<Option<u64>, Error> {
        self.read(|txn| {
            let meta = txn.open_table(tables::META)?;
            Ok(meta.get(tables::META_LAST_BACKUP)?.map(|v| v.value()))
        })
        .await
    }

    /// Looks at up to `scan` committed extractions after sequence `after` and drops what
    /// `policy` no longer keeps, in one write transaction.
    async fn retention_step(&self, policy: RetentionPolicy, after: u64, scan: usize) -> Result<RetentionStep, Error> {
        let db = std::sync::Arc::clone(&self.db);
        let (due, next_after) =
            tokio::task::spawn_blocking(move || super::retention::candidates(&db, &policy, after, scan.max(1)))
                .await
                .map_err(|e| Error::task("read", e))??;
        if due.is_empty() {
            return Ok(RetentionStep { next_after, ..RetentionStep::default() });
        }
        let mut step = self.writer.write(move |t| super::retention::drop_due(t, &policy, &due)).await?;
        step.next_after = next_after;
        Ok(step)
    }
}
