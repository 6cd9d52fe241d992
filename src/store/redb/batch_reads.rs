//! The scheduler's reads of provider batches in the redb store: open batches, their
//! members with content, recorded job ids, and staged answers awaiting commit. Each is one
//! read transaction's snapshot.

use redb::ReadableTable;

use super::codec::decode;
use super::records::{BatchRecord, BatchState, StoredContent};
use super::tables;
use super::{Error, ExtractionRecord, Store};
use crate::domain::batch::BatchMember;
use crate::domain::identity::ExtractionId;
use crate::domain::lifecycle::{State, StateName};
use crate::store::seam::ReadyItem;

impl Store {
    pub async fn open_batches(&self) -> Result<Vec<BatchRecord>, Error> {
        self.read(|txn| {
            let open = txn.open_table(tables::OPEN_BATCHES)?;
            let batches = txn.open_table(tables::BATCHES)?;
            let mut out = Vec::new();
            for entry in open.iter()? {
                let seq = entry?.0.value();
                let value = batches.get(seq)?.ok_or_else(|| Error::Corrupt {
                    kind: "batch",
                    reason: format!("open batch #{seq} has no record"),
                })?;
                out.push(decode(value.value())?);
            }
            Ok(out)
        })
        .await
    }

    /// Job ids of `provider`'s batches created at or after `since_ms`, newest first.
    pub async fn recorded_jobs_since(&self, provider: String, since_ms: u64) -> Result<Vec<String>, Error> {
        self.read(move |txn| {
            let batches = txn.open_table(tables::BATCHES)?;
            let mut jobs = Vec::new();
            // Batch sequences grow with time: walk back until the window is passed.
            for entry in batches.iter()?.rev() {
                let record: BatchRecord = decode(entry?.1.value())?;
                if record.created_at_ms < since_ms {
                    break;
                }
                let job = match record.state {
                    BatchState::Submitted { job_id } | BatchState::Closed { job_id: Some(job_id), .. } => job_id,
                    _ => continue,
                };
                if record.provider == provider.as_str() {
                    jobs.push(job);
                }
            }
            Ok(jobs)
        })
        .await
    }

    pub async fn batch_members(&self, batch: u64) -> Result<Vec<BatchMember>, Error> {
        self.read(move |txn| {
            let batches = txn.open_table(tables::BATCHES)?;
            let extractions = txn.open_table(tables::EXTRACTIONS)?;
            let contents = txn.open_table(tables::CONTENTS)?;
            let record: BatchRecord = match batches.get(batch)? {
                Some(v) => decode(v.value())?,
                None => return Ok(Vec::new()),
            };
            let mut members = Vec::with_capacity(record.members.len());
            for seq in record.members {
                let missing = |kind| Error::Corrupt { kind, reason: format!("batch member #{seq} is missing") };
                let Some(value) = extractions.get(seq)? else {
                    // Erased after submission: a line no one owns keeps the others' positions.
                    members.push(BatchMember {
                        id: ExtractionId([0; 32]),
                        source_id: String::new(),
                        content: String::new(),
                        output_budget: None,
                    });
                    continue;
                };
                let extraction: ExtractionRecord = decode(value.value())?;
                let content: StoredContent = decode(contents.get(seq)?.ok_or_else(|| missing("content"))?.value())?;
                members.push(BatchMember {
                    id: extraction.id,
                    source_id: extraction.source_id,
                    content: content.text,
                    output_budget: extraction.output_budget,
                });
            }
            Ok(members)
        })
        .await
    }

    /// Up to `limit` extractions whose answer from `provider` is staged and awaits commit.
    /// Each provider's scheduler commits only its own, so no answer is validated twice.
    pub async fn ready_items(&self, provider: String, limit: usize) -> Result<Vec<ReadyItem>, Error> {
        self.read(move |txn| {
            let index = txn.open_table(tables::STATE_INDEX)?;
            let extractions = txn.open_table(tables::EXTRACTIONS)?;
            let staged = txn.open_table(tables::STAGED)?;
            let code = StateName::Ready.code();
            let mut out = Vec::new();
            for entry in index.range((code, 0)..=(code, u64::MAX))? {
                if out.len() >= limit {
                    break;
                }
                let seq = entry?.0.value().1;
                let missing = |kind| Error::Corrupt { kind, reason: format!("ready extraction #{seq} has no {kind}") };
                let record: ExtractionRecord =
                    decode(extractions.get(seq)?.ok_or_else(|| missing("extraction"))?.value())?;
                if !matches!(&record.state, State::Ready { provider: p, .. } if *p == provider.as_str()) {
                    continue;
                }
                let staged = decode(staged.get(seq)?.ok_or_else(|| missing("staged answer"))?.value())?;
                out.push(ReadyItem { record, staged });
            }
            Ok(out)
        })
        .await
    }
}
