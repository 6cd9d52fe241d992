//! Listings a page at a time. Positions (sequence numbers, finding keys) never leave the
//! server in the clear: each `next` is sealed with the store's cursor key and bound to
//! its listing (see `crate::domain::cursor`).

use super::{Error, Service, invalid};
use crate::domain::identity::ExtractionId;
use crate::domain::lifecycle::StateName;
use crate::store::{ExtractionRecord, FindingRecord, ListFilter};

/// The weight of a listing page's records unless `server.max_page_bytes` says otherwise:
/// a page stops early there and hands back `next`, so an answer's size does not grow with
/// `limit` times the largest records (one listing reached 1.2 GB of memory, issue 30).
pub const DEFAULT_MAX_PAGE_BYTES: usize = 4 * 1024 * 1024;
/// Records read from the store at a time while a page fills: what is held beyond the
/// page itself.
const READ_CHUNK: usize = 64;
/// What a record's JSON view carries besides its variable-length fields (ids, hashes,
/// times, counters, field names), rounded up.
const RECORD_OVERHEAD_BYTES: usize = 1024;

/// Findings per page at most, and by default (every output within the default cap of
/// findings fits one page).
pub const MAX_FINDINGS_PAGE: usize = 1000;

impl Service {
    /// A page of extractions in intake order (or newest first); `after` is a `next` this
    /// same listing returned.
    pub async fn list_page(
        &self,
        tenant: Option<String>,
        state: Option<StateName>,
        latest: bool,
        newest_first: bool,
        limit: usize,
        after: Option<&str>,
    ) -> Result<(Vec<ExtractionRecord>, Option<String>), Error> {
        // A cursor binds to its order too: a position means "past here" in one direction.
        let scope = format!(
            "extractions\0{tenant:?}\0{state:?}{}{}",
            if latest { "\0latest" } else { "" },
            if newest_first { "\0newest" } else { "" }
        );
        let after = match after.filter(|c| !c.is_empty()) {
            None => 0,
            Some(cursor) => {
                let position = self.store.cursor_key().open(&scope, cursor).ok_or(Error::InvalidCursor)?;
                u64::from_be_bytes(position.try_into().map_err(|_| Error::InvalidCursor)?)
            }
        };
        let (records, next) =
            self.list_within(ListFilter { tenant, state, limit, after, latest, newest_first }).await?;
        let next = next.map(|seq| self.store.cursor_key().seal(&scope, &seq.to_be_bytes()));
        Ok((records, next))
    }

    /// Up to `filter.limit` records, fewer once they weigh `max_page_bytes` (never fewer
    /// than one, so every page moves on), read a chunk at a time; and the position after
    /// the last one when more may follow.
    async fn list_within(&self, filter: ListFilter) -> Result<(Vec<ExtractionRecord>, Option<u64>), Error> {
        let limit = filter.limit;
        if limit == 0 || limit > super::MAX_LIST_LIMIT {
            return Err(invalid("limit", format!("must be between 1 and {}", super::MAX_LIST_LIMIT)));
        }
        let mut after = filter.after;
        let mut records = Vec::new();
        let mut bytes = 0;
        loop {
            let chunk = ListFilter { limit: (limit - records.len()).min(READ_CHUNK), after, ..filter.clone() };
            let page = self.list(chunk).await?;
            for record in page.records {
                let weight = answer_bytes(&record);
                if !records.is_empty() && bytes + weight > self.max_page_bytes {
                    return Ok((records, Some(after)));
                }
                bytes += weight;
                after = record.seq;
                records.push(record);
            }
            match page.next {
                Some(next) if records.len() < limit => after = next,
                next => return Ok((records, next)),
            }
        }
    }

    /// A page of an extraction's findings in key order.
    pub async fn findings_page(
        &self,
        id: ExtractionId,
        limit: usize,
        after: Option<&str>,
    ) -> Result<(Vec<FindingRecord>, Option<String>), Error> {
        if limit == 0 || limit > MAX_FINDINGS_PAGE {
            return Err(invalid("limit", format!("must be between 1 and {MAX_FINDINGS_PAGE}")));
        }
        let scope = format!("findings\0{}", id.to_hex());
        let after = match after.filter(|c| !c.is_empty()) {
            None => None,
            Some(cursor) => {
                let position = self.store.cursor_key().open(&scope, cursor).ok_or(Error::InvalidCursor)?;
                Some(<[u8; 32]>::try_from(position).map_err(|_| Error::InvalidCursor)?)
            }
        };
        let (findings, more) = self.store.findings_page(id, after, limit).await?.ok_or(Error::NotFound(id))?;
        let next =
            findings.last().filter(|_| more).map(|last| self.store.cursor_key().seal(&scope, last.key.as_bytes()));
        Ok((findings, next))
    }
}

/// About what a record weighs in a listing's JSON: its variable-length fields (metadata is
/// stored as the compact JSON it is shown as) plus a fixed allowance for the rest.
fn answer_bytes(record: &ExtractionRecord) -> usize {
    let failure = match &record.state {
        crate::domain::lifecycle::State::Failed { reason, .. } => reason.len(),
        crate::domain::lifecycle::State::Claimed { worker, .. } => worker.len(),
        _ => 0,
    };
    RECORD_OVERHEAD_BYTES
        + record.metadata_json.as_ref().map_or(0, String::len)
        + record.source_id.len()
        + record.tenant.len()
        + record.schema.len()
        + failure
}
