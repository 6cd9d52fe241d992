//! Read-only queries, each on one consistent snapshot.

use redb::ReadTransaction;

use super::codec::decode;
use super::records::{ExtractionRecord, FindingRecord, ResultRecord};
use super::tables;
use super::{Error, Store};
use crate::domain::identity::ExtractionId;
use crate::domain::lifecycle::StateName;
use crate::store::seam::{ListFilter, ListPage, StateCount};

impl Store {
    /// The extraction a webhook delivery created, if that delivery was seen before.
    pub async fn delivered(&self, endpoint: String, delivery_id: String) -> Result<Option<ExtractionRecord>, Error> {
        self.read_point(|txn| {
            let deliveries = txn.open_table(tables::WEBHOOK_DELIVERIES)?;
            let Some(seq) = deliveries.get((endpoint.as_str(), delivery_id.as_str()))?.map(|v| v.value()) else {
                return Ok(None);
            };
            let extractions = txn.open_table(tables::EXTRACTIONS)?;
            extractions.get(seq)?.map(|v| decode(v.value())).transpose()
        })
    }

    /// An extraction by its sequence number (the outbox refers to records this way).
    pub async fn get_by_seq(&self, seq: u64) -> Result<Option<ExtractionRecord>, Error> {
        self.read_point(|txn| txn.open_table(tables::EXTRACTIONS)?.get(seq)?.map(|v| decode(v.value())).transpose())
    }

    pub async fn get(&self, id: ExtractionId) -> Result<Option<ExtractionRecord>, Error> {
        self.read_point(|txn| get(txn, &id))
    }

    /// The findings of an extraction, or `None` when the extraction does not exist.
    pub async fn findings(&self, id: ExtractionId) -> Result<Option<Vec<FindingRecord>>, Error> {
        self.read(move |txn| {
            let Some(record) = get(txn, &id)? else {
                return Ok(None);
            };
            let table = txn.open_table(tables::FINDINGS)?;
            let (low, high): (&[u8; 32], &[u8; 32]) = (&[0; 32], &[0xff; 32]);
            let mut out = Vec::new();
            for entry in table.range((record.seq, low)..=(record.seq, high))? {
                out.push(decode(entry?.1.value())?);
            }
            Ok(Some(out))
        })
        .await
    }

    /// Up to `limit` findings after the key `after`, in key order, and whether more
    /// follow; `None` when the extraction does not exist.
    pub async fn findings_page(
        &self,
        id: ExtractionId,
        after: Option<[u8; 32]>,
        limit: usize,
    ) -> Result<Option<(Vec<FindingRecord>, bool)>, Error> {
        self.read(move |txn| {
            let Some(record) = get(txn, &id)? else {
                return Ok(None);
            };
            let table = txn.open_table(tables::FINDINGS)?;
            let start = after.unwrap_or([0; 32]);
            let mut out = Vec::new();
            for entry in table.range((record.seq, &start)..=(record.seq, &[0xff; 32]))? {
                let (key, value) = entry?;
                if after.is_some_and(|a| key.value().1 == &a) {
                    continue;
                }
                if out.len() == limit {
                    return Ok(Some((out, true)));
                }
                out.push(decode(value.value())?);
            }
            Ok(Some((out, false)))
        })
        .await
    }

    pub async fn result(&self, id: ExtractionId) -> Result<Option<ResultRecord>, Error> {
        self.read(move |txn| {
            let Some(record) = get(txn, &id)? else {
                return Ok(None);
            };
            let table = txn.open_table(tables::RESULTS)?;
            let value = table.get(record.seq)?;
            value.map(|v| decode(v.value())).transpose()
        })
        .await
    }

    /// How many extractions are in each state, and when the longest-waiting one entered it.
    pub async fn counts_by_state(&self) -> Result<Vec<StateCount>, Error> {
        self.read(|txn| {
            let index = txn.open_table(tables::STATE_INDEX)?;
            let mut counts = Vec::with_capacity(StateName::ALL.len());
            for (state, count) in super::state_counts::read(txn)? {
                let code = state.code();
                // Intake order approximates waiting order: the first entry is the oldest.
                let first = index.range((code, 0)..=(code, u64::MAX))?.next().transpose()?;
                let oldest_since_ms = match first {
                    Some((key, _)) => Some(by_seq(txn, key.value().1)?.updated_at_ms),
                    None => None,
                };
                counts.push(StateCount { state, count, oldest_since_ms });
            }
            Ok(counts)
        })
        .await
    }

    /// Unix ms of the last successful online backup, if any was ever taken.
    pub async fn last_backup_ms(&self) -> Result<Option<u64>, Error> {
        self.read(|txn| {
            let meta = txn.open_table(tables::META)?;
            Ok(meta.get(tables::META_LAST_BACKUP)?.map(|v| v.value()))
        })
        .await
    }

    /// Whether an operator paused submissions to this provider (survives restarts).
    pub async fn provider_paused(&self, provider: String) -> Result<bool, Error> {
        let key = format!("{}{provider}", tables::META_PAUSE_PREFIX);
        self.read(move |txn| {
            let meta = txn.open_table(tables::META)?;
            Ok(meta.get(key.as_str())?.is_some_and(|v| v.value() == 1))
        })
        .await
    }

    /// Size of the database file on disk.
    pub fn file_size(&self) -> Option<u64> {
        std::fs::metadata(&self.path).ok().map(|m| m.len())
    }

    pub async fn list(&self, filter: ListFilter) -> Result<ListPage, Error> {
        self.read(move |txn| list(txn, &filter)).await
    }
}

fn get(txn: &ReadTransaction, id: &ExtractionId) -> Result<Option<ExtractionRecord>, Error> {
    let identity = txn.open_table(tables::IDENTITY)?;
    let Some(seq) = identity.get(id.as_bytes())?.map(|v| v.value()) else {
        return Ok(None);
    };
    by_seq(txn, seq).map(Some)
}

fn by_seq(txn: &ReadTransaction, seq: u64) -> Result<ExtractionRecord, Error> {
    let extractions = txn.open_table(tables::EXTRACTIONS)?;
    let value = extractions.get(seq)?.ok_or_else(|| Error::Corrupt {
        kind: "extraction",
        reason: format!("identity index points at missing sequence {seq}"),
    })?;
    decode(value.value())
}

/// Walks the narrowest index for the filter, in sequence (intake) order.
fn list(txn: &ReadTransaction, filter: &ListFilter) -> Result<ListPage, Error> {
    let start = filter.after.saturating_add(1);
    let seqs: Box<dyn Iterator<Item = Result<u64, Error>>> = match (&filter.tenant, filter.state) {
        (Some(tenant), _) => {
            let table = txn.open_table(tables::TENANT_INDEX)?;
            let range = table.range((tenant.as_str(), start)..=(tenant.as_str(), u64::MAX))?;
            Box::new(range.map(|e| Ok(e?.0.value().1)))
        }
        (None, Some(state)) => {
            let table = txn.open_table(tables::STATE_INDEX)?;
            let code = state.code();
            Box::new(table.range((code, start)..=(code, u64::MAX))?.map(|e| Ok(e?.0.value().1)))
        }
        (None, None) => {
            let table = txn.open_table(tables::EXTRACTIONS)?;
            Box::new(table.range(start..)?.map(|e| Ok(e?.0.value())))
        }
    };
    let mut records = Vec::new();
    let mut next = None;
    for seq in seqs {
        let record = by_seq(txn, seq?)?;
        if filter.state.is_some_and(|s| record.state.name() != s) {
            continue;
        }
        if records.len() == filter.limit {
            next = records.last().map(|r: &ExtractionRecord| r.seq);
            break;
        }
        records.push(record);
    }
    Ok(ListPage { records, next })
}
