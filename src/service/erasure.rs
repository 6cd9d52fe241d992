//! Tenant erasure and what retention dropped, as the API asks for them.

use std::collections::HashMap;

use super::intake::check_tenant;
use super::{Error, Service};
use crate::store::ErasureReport;

impl Service {
    /// Erases every stored trace of `tenant` except its per-day spend totals.
    pub async fn erase_tenant(&self, tenant: String) -> Result<ErasureReport, Error> {
        check_tenant(&tenant)?;
        let report = self.store.erase_tenant(tenant.clone()).await?;
        // After the commit: an export whose snapshot predates the erasure took its permit
        // before that snapshot, so it is among those ended here. Exports on other
        // instances sharing a PostgreSQL database are not (docs/OPERATIONS.md).
        let exports_ended = self.end_exports(&tenant);
        tracing::warn!(
            %tenant, extractions = report.extractions, findings = report.findings,
            ledger_entries = report.ledger_entries, outbox_events = report.outbox_events, exports_ended,
            "tenant erased"
        );
        Ok(report)
    }

    /// What retention dropped of each of `seqs` (`store::tables` `RETIRED_*` bits).
    pub async fn retired(&self, seqs: Vec<u64>) -> Result<HashMap<u64, u8>, Error> {
        Ok(self.store.retired(seqs).await?)
    }
}
