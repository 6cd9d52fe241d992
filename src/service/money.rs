//! Cost reports and budget status, read from the ledger.

/// One budgeted tenant's period so far.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BudgetLine {
    pub tenant: String,
    pub spent_micros: u64,
    /// Reserved for batch members with a provider, not yet charged.
    pub reserved_micros: u64,
    pub reserved_members: u64,
    pub limit_micros: u64,
    /// Spend reached the budget: no new work goes out until it is raised or the period ends.
    pub held: bool,
    /// Work waiting because its next source's estimate does not fit what is left.
    pub waiting: Option<crate::store::BudgetHold>,
}

impl BudgetLine {
    /// The budget less spend and reservations.
    pub fn left_micros(&self) -> u64 {
        self.limit_micros.saturating_sub(self.spent_micros.saturating_add(self.reserved_micros))
    }
}

use std::sync::{Arc, Mutex};

use super::{Error, Service, check_tenant, invalid};
use crate::domain::identity::ExtractionId;
use crate::engine::ledger::{CostQuery, CostReport};
use crate::store::LedgerRecord;

impl Service {
    pub async fn costs(&self, query: CostQuery) -> Result<CostReport, Error> {
        check_tenant(&query.tenant)?;
        if query.from_ms >= query.to_ms {
            return Err(invalid("from", "must be before `to`"));
        }
        let report = Arc::new(Mutex::new(CostReport::new(&query)));
        let adder = Arc::clone(&report);
        let visit = Box::new(move |entry: LedgerRecord| {
            if let Ok(mut report) = adder.lock() {
                report.add(&entry);
            }
        });
        self.store.visit_ledger(query.tenant.clone(), query.from_ms, query.to_ms, visit).await?;
        // The visitor is dropped once the visit ends, so the report has one owner again.
        let report = Arc::into_inner(report).and_then(|cell| cell.into_inner().ok());
        let mut report = report.ok_or_else(|| {
            Error::Store(crate::store::Error::Conflict {
                reason: "the cost report's visit did not end".to_string(),
                cause: None,
            })
        })?;
        report.erased_micros = self.store.erased_spend(query.tenant, query.from_ms, query.to_ms).await?;
        Ok(report)
    }

    /// Every ledger entry of one extraction (with its tenant, for access checks).
    pub async fn extraction_costs(&self, id: ExtractionId) -> Result<(String, Vec<LedgerRecord>), Error> {
        let record = self.get(id).await?;
        let entries = self.store.extraction_ledger(id).await?.ok_or(Error::NotFound(id))?;
        Ok((record.tenant, entries))
    }

    /// Budgeted tenants: spend this period, open reservations, budget, and what holds
    /// their work; refreshes who is held.
    pub async fn budget_status(&self) -> Result<Vec<BudgetLine>, Error> {
        let rows = self.router.refresh_holds(self.store.as_ref(), crate::domain::clock::now_ms()).await?;
        let held = self.router.held_tenants();
        let reserved = self.store.reservations().await?;
        let waiting = self.store.budget_holds();
        Ok(rows
            .into_iter()
            .map(|(tenant, spent_micros, limit_micros)| {
                let open = reserved.iter().find(|r| r.tenant == tenant);
                BudgetLine {
                    held: held.contains(&tenant),
                    reserved_micros: open.map_or(0, |r| r.micros),
                    reserved_members: open.map_or(0, |r| r.members),
                    waiting: waiting.iter().find(|h| h.tenant == tenant).cloned(),
                    tenant,
                    spent_micros,
                    limit_micros,
                }
            })
            .collect())
    }
}
