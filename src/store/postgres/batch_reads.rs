//! The scheduler's reads of provider batches on PostgreSQL: open batches, their members
//! with content, recorded job ids, and staged answers awaiting commit. Plain reads, no
//! locks: each answer is one statement's snapshot, as each is one read transaction on redb.

use super::batches::CLOSED;
use super::rows::{big, decode_record, stored_content, unbig};
use super::{Error, PgStore, pg};
use crate::domain::batch::BatchMember;
use crate::domain::identity::ExtractionId;
use crate::domain::lifecycle::{State, StateName};
use crate::store::ReadyItem;
use crate::store::codec::decode;
use crate::store::records::{BatchRecord, StoredContent};

/// How many `Ready` rows one read of `ready_items` looks at before filtering by provider.
const READY_PAGE: i64 = 256;

impl PgStore {
    pub(super) async fn open_batches(&self) -> Result<Vec<BatchRecord>, Error> {
        let client = self.client().await?;
        let rows = client
            .query("SELECT record FROM batches WHERE state_code <> $1 ORDER BY seq", &[&CLOSED])
            .await
            .map_err(pg("cannot list open batches"))?;
        rows.iter().map(|r| decode(r.get(0))).collect()
    }

    /// Job ids of `provider`'s batches created at or after `since_ms`, newest first.
    pub(super) async fn recorded_jobs_since(&self, provider: String, since_ms: u64) -> Result<Vec<String>, Error> {
        let client = self.client().await?;
        let rows = client
            .query(
                "SELECT job_id FROM batches WHERE provider = $1 AND created_at_ms >= $2 AND job_id IS NOT NULL \
                 ORDER BY seq DESC",
                &[&provider, &big(since_ms)],
            )
            .await
            .map_err(pg("cannot list recorded jobs"))?;
        Ok(rows.iter().map(|r| r.get(0)).collect())
    }

    /// The members in submit order, with their content; a missing member keeps its place.
    pub(super) async fn batch_members(&self, batch: u64) -> Result<Vec<BatchMember>, Error> {
        let client = self.client().await?;
        let Some(row) = client
            .query_opt("SELECT record FROM batches WHERE seq = $1", &[&big(batch)])
            .await
            .map_err(pg("cannot read a batch"))?
        else {
            return Ok(Vec::new());
        };
        let record: BatchRecord = decode(row.get(0))?;
        let seqs: Vec<i64> = record.members.iter().map(|&s| big(s)).collect();
        let rows = client
            .query("SELECT seq, record, content FROM extractions WHERE seq = ANY($1)", &[&seqs])
            .await
            .map_err(pg("cannot read batch members"))?;
        let mut found = std::collections::HashMap::with_capacity(rows.len());
        for row in &rows {
            let extraction = decode_record(row.get(1))?;
            let content: StoredContent = decode(stored_content(row.get(2), extraction.seq)?)?;
            found.insert(unbig(row.get(0)), (extraction, content.text));
        }
        Ok(record
            .members
            .iter()
            .map(|seq| match found.remove(seq) {
                Some((extraction, content)) => BatchMember {
                    id: extraction.id,
                    source_id: extraction.source_id,
                    content,
                    output_budget: extraction.output_budget,
                },
                // A line no one owns keeps the others' positions.
                None => BatchMember {
                    id: ExtractionId([0; 32]),
                    source_id: String::new(),
                    content: String::new(),
                    output_budget: None,
                },
            })
            .collect())
    }

    /// Up to `limit` extractions whose answer from `provider` is staged and awaits commit,
    /// in intake order. Each provider's scheduler commits only its own.
    pub(super) async fn ready_items(&self, provider: String, limit: usize) -> Result<Vec<ReadyItem>, Error> {
        let client = self.client().await?;
        let mut out = Vec::new();
        let mut after = 0i64;
        while out.len() < limit {
            let rows = client
                .query(
                    "SELECT e.seq, e.record, s.record FROM extractions e JOIN staged s ON s.extraction_seq = e.seq \
                     WHERE e.state_code = $1 AND e.seq > $2 ORDER BY e.seq LIMIT $3",
                    &[&i16::from(StateName::Ready.code()), &after, &READY_PAGE],
                )
                .await
                .map_err(pg("cannot list ready extractions"))?;
            for row in &rows {
                after = row.get(0);
                let record = decode_record(row.get(1))?;
                if !matches!(&record.state, State::Ready { provider: p, .. } if *p == provider.as_str()) {
                    continue;
                }
                out.push(ReadyItem { record, staged: decode(row.get(2))? });
                if out.len() >= limit {
                    break;
                }
            }
            if (rows.len() as i64) < READY_PAGE {
                break;
            }
        }
        Ok(out)
    }
}
