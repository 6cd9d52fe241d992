//! Reads the operator console shows that the JSON API answers piecemeal: the batches in
//! flight and their history, an extraction's stored raw result and its undelivered or
//! dead outbox events.

use super::{Error, Service};
use crate::domain::identity::ExtractionId;
use crate::store::{BatchRecord, ExtractionRecord, OutboxFilter, OutboxRecord, ResultRecord};

/// How many outbox events (per list) are searched for one extraction's.
const OUTBOX_SCAN: usize = 1000;

impl Service {
    /// Per schema with grounding rules, the findings refused as ungrounded since start
    /// (`commitpoint_findings_ungrounded_total`).
    pub fn ungrounded_findings(&self) -> Vec<(String, u64)> {
        self.judge.ungrounded_counts()
    }

    /// Every batch the schedulers still drive, oldest first.
    pub async fn open_batches(&self) -> Result<Vec<BatchRecord>, Error> {
        Ok(self.store.open_batches().await?)
    }

    /// Up to `limit` batches below sequence `before` (0: from the newest), newest first,
    /// closed ones included.
    pub async fn batch_history(&self, before: u64, limit: usize) -> Result<Vec<BatchRecord>, Error> {
        Ok(self.store.batch_history(before, limit).await?)
    }

    /// A batch, its member count, and the first `limit` members as they are now (a member
    /// may have moved on to a later batch, or been erased: erased members are left out).
    pub async fn batch_detail(
        &self,
        seq: u64,
        limit: usize,
    ) -> Result<Option<(BatchRecord, Vec<ExtractionRecord>)>, Error> {
        let Some(batch) = self.store.batch(seq).await? else { return Ok(None) };
        let mut members = Vec::with_capacity(batch.members.len().min(limit));
        for member in batch.members.iter().take(limit) {
            if let Some(record) = self.store.get_by_seq(*member).await? {
                members.push(record);
            }
        }
        Ok(Some((batch, members)))
    }

    /// The raw output an extraction committed (`None` before it commits or after retention
    /// dropped it).
    pub async fn raw_result(&self, id: ExtractionId) -> Result<Option<ResultRecord>, Error> {
        Ok(self.store.result(id).await?)
    }

    /// What the committed output says besides its findings (`None` before it commits,
    /// once retention dropped the raw result, or when its schema is no longer loaded).
    pub async fn output_fields(&self, record: &ExtractionRecord) -> Result<Option<serde_json::Value>, Error> {
        let Some(result) = self.store.result(record.id).await? else { return Ok(None) };
        Ok(self.registry().output_fields(&record.schema, &result.output_json))
    }

    /// The extraction's outbox events still waiting or dead (delivered ones leave both
    /// lists), from the first events of each list.
    pub async fn outbox_of(&self, id: ExtractionId) -> Result<Vec<OutboxRecord>, Error> {
        let mut events = Vec::new();
        for filter in [OutboxFilter::Pending, OutboxFilter::Dead] {
            let page = self.store.list_outbox(filter, 0, OUTBOX_SCAN).await?;
            events.extend(page.into_iter().filter(|e| e.extraction_id == id));
        }
        Ok(events)
    }
}
