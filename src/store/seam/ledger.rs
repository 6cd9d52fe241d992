//! The ledger read back, and the one pricing of a charge both backends write.

use super::*;
use crate::domain::batch::Usage;

seam! {
    /// The ledger read back: budgets, cost reports, one extraction's attempts.
    pub trait Ledger {
        /// Spend per tenant from a UTC day on, from the per-day totals.
        fn spend_since(&self, tenants: Vec<String>, from_day: u64) -> Vec<(String, u64)>;
        fn extraction_ledger(&self, id: ExtractionId) -> Option<Vec<LedgerRecord>>;
        /// Every entry of `tenant` in `[from_ms, to_ms)`, oldest first, to `visit`.
        fn visit_ledger(&self, tenant: String, from_ms: u64, to_ms: u64, visit: LedgerVisitor) -> ();
        /// What erased ledger entries of `tenant` had charged in `[from_ms, to_ms)`.
        fn erased_spend(&self, tenant: String, from_ms: u64, to_ms: u64) -> u64;
    }
}

pub(crate) const DAY_MS: u64 = 86_400_000;

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
