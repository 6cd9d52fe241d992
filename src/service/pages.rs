//! Listings a page at a time. Positions (sequence numbers, finding keys) never leave the
//! server in the clear: each `next` is sealed with the store's cursor key and bound to
//! its listing (see `crate::domain::cursor`).

use super::{Error, Service, invalid};
use crate::domain::identity::ExtractionId;
use crate::domain::lifecycle::StateName;
use crate::store::{ExtractionRecord, FindingRecord, ListFilter};

/// Findings per page at most, and by default (every output within the default cap of
/// findings fits one page).
pub const MAX_FINDINGS_PAGE: usize = 1000;

impl Service {
    /// A page of extractions in intake order; `after` is a `next` this same listing
    /// returned.
    pub async fn list_page(
        &self,
        tenant: Option<String>,
        state: Option<StateName>,
        limit: usize,
        after: Option<&str>,
    ) -> Result<(Vec<ExtractionRecord>, Option<String>), Error> {
        let scope = format!("extractions\0{tenant:?}\0{state:?}");
        let after = match after.filter(|c| !c.is_empty()) {
            None => 0,
            Some(cursor) => {
                let position = self.store.cursor_key().open(&scope, cursor).ok_or(Error::InvalidCursor)?;
                u64::from_be_bytes(position.try_into().map_err(|_| Error::InvalidCursor)?)
            }
        };
        let page = self.list(ListFilter { tenant, state, limit, after }).await?;
        let next = page.next.map(|seq| self.store.cursor_key().seal(&scope, &seq.to_be_bytes()));
        Ok((page.records, next))
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
