//! Cost reports and budget status, read from the ledger.

use super::{Error, Service, check_tenant, invalid};
use crate::identity::ExtractionId;
use crate::ledger::{CostQuery, CostReport};
use crate::store::LedgerRecord;

impl Service {
    pub async fn costs(&self, query: CostQuery) -> Result<CostReport, Error> {
        check_tenant(&query.tenant)?;
        if query.from_ms >= query.to_ms {
            return Err(invalid("from", "must be before `to`"));
        }
        let report = CostReport::new(&query);
        let mut folded = self
            .store
            .fold_ledger(query.tenant.clone(), query.from_ms, query.to_ms, report, |report, entry| report.add(&entry))
            .await?;
        folded.erased_micros = self.store.erased_spend(query.tenant, query.from_ms, query.to_ms).await?;
        Ok(folded)
    }

    /// Every ledger entry of one extraction (with its tenant, for access checks).
    pub async fn extraction_costs(&self, id: ExtractionId) -> Result<(String, Vec<LedgerRecord>), Error> {
        let record = self.get(id).await?;
        let entries = self.store.extraction_ledger(id).await?.ok_or(Error::NotFound(id))?;
        Ok((record.tenant, entries))
    }

    /// Budgeted tenants with (spend this period, budget), refreshing who is held.
    pub async fn budget_status(&self) -> Result<Vec<(String, u64, u64, bool)>, Error> {
        let rows = self.router.refresh_holds(&self.store, crate::clock::now_ms()).await?;
        let held = self.router.held_tenants();
        Ok(rows.into_iter().map(|(t, spent, limit)| (t.clone(), spent, limit, held.contains(&t))).collect())
    }
}
