//! Cancelling one extraction, retrying failed ones in bulk, and checking an export's
//! filter before its stream starts (once the first byte is out, an error can only cut
//! the stream).

use super::{Error, Service, check_tenant, invalid};
use crate::domain::identity::ExtractionId;
use crate::store::{CancelOutcome, ExportFilter, ExtractionRecord, RetryFilter};

impl Service {
    /// Stops an extraction for good. Cancelling a cancelled one answers the same record.
    pub async fn cancel(&self, id: ExtractionId) -> Result<ExtractionRecord, Error> {
        match self.store.cancel(id).await? {
            CancelOutcome::Cancelled(record) => Ok(*record),
            CancelOutcome::NotFound => Err(Error::NotFound(id)),
            CancelOutcome::Rejected(e) => Err(Error::Transition(e)),
        }
    }

    /// Moves up to `limit` matching failed extractions back to pending; returns how many.
    pub async fn retry_failed(&self, filter: RetryFilter, limit: Option<u64>) -> Result<u64, Error> {
        if let Some(tenant) = &filter.tenant {
            check_tenant(tenant)?;
        }
        if let Some(schema) = &filter.schema {
            self.judge.registry().get(schema)?;
        }
        if limit == Some(0) {
            return Err(invalid("limit", "must be at least 1 (leave it out to retry every match)"));
        }
        let retried = self.store.retry_failed(filter, limit.unwrap_or(u64::MAX)).await?;
        if retried > 0 {
            metrics::counter!(crate::domain::metric_names::RETRIES_TOTAL).increment(retried);
            self.signals.arrived_many(retried);
        }
        Ok(retried)
    }

    /// The checks an export's filter must pass before anything is streamed.
    pub fn check_export(&self, filter: &ExportFilter) -> Result<(), Error> {
        check_tenant(&filter.tenant)?;
        if let Some(schema) = &filter.schema {
            self.judge.registry().get(schema)?;
        }
        if filter.since_ms >= filter.until_ms {
            return Err(invalid("until", "must be after `since`"));
        }
        Ok(())
    }
}
