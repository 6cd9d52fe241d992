//! Read-only queries, each on one consistent snapshot.

use redb::ReadTransaction;

use super::codec::decode;
use super::records::ExtractionRecord;
use super::tables;
use super::{Error, Store};
use crate::domain::identity::ExtractionId;
use crate::store::seam::{ListFilter, ListPage};

impl Store {
    /// Size of the database file on disk.
    pub fn file_size(&self) -> Option<u64> {
        std::fs::metadata(&self.path).ok().map(|m| m.len())
    }
}

pub(super) fn get(txn: &ReadTransaction, id: &ExtractionId) -> Result<Option<ExtractionRecord>, Error> {
    let identity = txn.open_table(tables::IDENTITY)?;
    let Some(seq) = identity.get(id.as_bytes())?.map(|v| v.value()) else {
        return Ok(None);
    };
    by_seq(txn, seq).map(Some)
}

pub(super) fn by_seq(txn: &ReadTransaction, seq: u64) -> Result<ExtractionRecord, Error> {
    let extractions = txn.open_table(tables::EXTRACTIONS)?;
    let value = extractions.get(seq)?.ok_or_else(|| Error::Corrupt {
        kind: "extraction",
        reason: format!("identity index points at missing sequence {seq}"),
    })?;
    decode(value.value())
}

/// Walks the narrowest index for the filter, in sequence (intake) order or backwards.
pub(super) fn list(txn: &ReadTransaction, filter: &ListFilter) -> Result<ListPage, Error> {
    let (lo, hi) = filter.seq_bounds();
    let seqs: Box<dyn Iterator<Item = Result<u64, Error>>> = match (&filter.tenant, filter.state) {
        (Some(tenant), _) => {
            let table = txn.open_table(tables::TENANT_INDEX)?;
            let range = table.range((tenant.as_str(), lo)..=(tenant.as_str(), hi))?;
            ordered(range.map(|e| Ok(e?.0.value().1)), filter.newest_first)
        }
        (None, Some(state)) => {
            let table = txn.open_table(tables::STATE_INDEX)?;
            let code = state.code();
            ordered(table.range((code, lo)..=(code, hi))?.map(|e| Ok(e?.0.value().1)), filter.newest_first)
        }
        (None, None) => {
            let table = txn.open_table(tables::EXTRACTIONS)?;
            ordered(table.range(lo..=hi)?.map(|e| Ok(e?.0.value())), filter.newest_first)
        }
    };
    let mut records = Vec::new();
    let mut next = None;
    for seq in seqs {
        let record = by_seq(txn, seq?)?;
        if filter.state.is_some_and(|s| record.state.name() != s)
            || filter.latest && super::revisions::newer_exists(txn, &record)?
        {
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

fn ordered<'a, I>(seqs: I, backwards: bool) -> Box<dyn Iterator<Item = Result<u64, Error>> + 'a>
where
    I: DoubleEndedIterator<Item = Result<u64, Error>> + 'a,
{
    if backwards { Box::new(seqs.rev()) } else { Box::new(seqs) }
}
