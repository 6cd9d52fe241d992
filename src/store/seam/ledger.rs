//! The ledger read back, and the one pricing of a charge both backends write.

use super::*;
use crate::domain::batch::Usage;
use async_trait::async_trait;

/// The ledger read back: budgets, cost reports, one extraction's attempts.
#[async_trait]
pub trait Ledger: Send + Sync + std::fmt::Debug {
    /// Spend per tenant from a UTC day on, from the per-day totals.
    async fn spend_since(&self, tenants: Vec<String>, from_day: u64) -> Result<Vec<(String, u64)>, Error>;
    async fn extraction_ledger(&self, id: ExtractionId) -> Result<Option<Vec<LedgerRecord>>, Error>;
    /// Every entry of `tenant` in `[from_ms, to_ms)`, oldest first, to `visit`.
    async fn visit_ledger(&self, tenant: String, from_ms: u64, to_ms: u64, visit: LedgerVisitor) -> Result<(), Error>;
    /// What erased ledger entries of `tenant` had charged in `[from_ms, to_ms)`.
    async fn erased_spend(&self, tenant: String, from_ms: u64, to_ms: u64) -> Result<u64, Error>;
    /// Open budget reservations (`rules::reserve`), per tenant.
    async fn reservations(&self) -> Result<Vec<Reserved>, Error>;
    /// Tenants the last batch formations left waiting on their budgets (this process's
    /// view: what its own schedulers found).
    fn budget_holds(&self) -> Vec<crate::store::BudgetHold>;
}

/// One tenant's open reservations.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reserved {
    pub tenant: String,
    pub micros: u64,
    /// Batch members they are for.
    pub members: u64,
}

pub(crate) const DAY_MS: u64 = crate::domain::budget::DAY_MS;

/// Spend is kept per UTC day of this many milliseconds.
pub fn store_day_ms() -> u64 {
    DAY_MS
}

/// One paid model call as its reporter describes it; the store prices and labels it.
#[derive(Debug, Clone)]
pub struct Charge {
    pub provider: String,
    pub job_id: Option<String>,
    pub usage: Usage,
    pub latency_ms: Option<u64>,
    pub batch: bool,
}

/// The ledger entry of one charge, priced at list price; a replay costs nothing. Every
/// backend writes entries made here, so a report reads the same on either.
pub(crate) fn priced_entry(
    seq: u64,
    pricing: &dyn Pricing,
    record: &ExtractionRecord,
    charge: &Charge,
    kind: ChargeKind,
    now_ms: u64,
) -> LedgerRecord {
    let (list_cost, source) = pricing.price(&charge.provider, &charge.usage, charge.batch);
    LedgerRecord {
        seq,
        tenant: record.tenant.clone(),
        extraction_id: record.id,
        extraction_seq: record.seq,
        attempt: record.attempt,
        kind,
        provider: charge.provider.clone(),
        job_id: charge.job_id.clone(),
        usage: charge.usage.clone(),
        latency_ms: charge.latency_ms,
        cost_micros: if kind == ChargeKind::Replay { 0 } else { list_cost },
        list_cost_micros: list_cost,
        cost_source: source,
        at_ms: now_ms,
    }
}
