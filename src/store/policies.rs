//! What the writer consults besides the data: where events go and what calls cost. Both
//! are handed in from outside at start; the store only applies them.

use std::fmt;
use std::sync::Arc;

use crate::domain::batch::Usage;
use crate::domain::budget::Budgets;
use crate::store::records::CostSource;
use crate::store::rules::fair::{Fairness, Rotations};

/// Turns one call's usage into micro-dollars.
pub trait Pricing: Send + Sync + fmt::Debug {
    /// `batch` is true for calls made through a provider's batch API (discounted).
    fn price(&self, provider: &str, usage: &Usage, batch: bool) -> (u64, CostSource);
}

/// Without a price table only costs the provider reports are known.
#[derive(Debug, Default)]
pub struct ProviderReportedOnly;

impl Pricing for ProviderReportedOnly {
    fn price(&self, _provider: &str, usage: &Usage, _batch: bool) -> (u64, CostSource) {
        usage.provider_cost_micros.map_or((0, CostSource::Unpriced), |micros| (micros, CostSource::Provider))
    }
}

/// What the writer consults besides the data: where events go, what calls cost, how
/// tenants share the work.
#[derive(Debug, Clone)]
pub struct Policies {
    pub sinks: Vec<String>,
    pub pricing: Arc<dyn Pricing>,
    pub fairness: Arc<Fairness>,
    /// Tenants' budgets: batch members are reserved against them (`rules::reserve`).
    pub budgets: Arc<Budgets>,
    /// Where each queue's fair rotation stands: the backend's, kept across reloads.
    pub(in crate::store) rotations: Arc<Rotations>,
}

impl Policies {
    pub fn new(sinks: Vec<String>, pricing: Arc<dyn Pricing>, fairness: Fairness) -> Self {
        Self { sinks, pricing, fairness: Arc::new(fairness), budgets: Arc::default(), rotations: Arc::default() }
    }

    pub fn with_budgets(mut self, budgets: Budgets) -> Self {
        self.budgets = Arc::new(budgets);
        self
    }

    /// These policies, carrying on the rotations `current` kept.
    pub(in crate::store) fn succeeding(mut self, current: &Policies) -> Self {
        self.rotations = Arc::clone(&current.rotations);
        self
    }
}

/// The policies in `cell` now.
pub(in crate::store) fn current(cell: &std::sync::RwLock<Arc<Policies>>) -> Arc<Policies> {
    match cell.read() {
        Ok(current) => Arc::clone(&current),
        Err(poisoned) => Arc::clone(&poisoned.into_inner()),
    }
}

/// Replaces the policies in `cell`; the rotations carry on.
pub(in crate::store) fn replace(cell: &std::sync::RwLock<Arc<Policies>>, next: Policies) {
    let mut current = match cell.write() {
        Ok(current) => current,
        Err(poisoned) => poisoned.into_inner(),
    };
    *current = Arc::new(next.succeeding(&current));
}

impl Default for Policies {
    fn default() -> Self {
        Self::new(Vec::new(), Arc::new(ProviderReportedOnly), Fairness::default())
    }
}
