//! What the writer consults besides the data: where events go and what calls cost. Both
//! are handed in from outside at start; the store only applies them.

use std::fmt;
use std::sync::Arc;

use crate::domain::batch::Usage;
use crate::store::records::CostSource;

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

/// What the writer consults besides the data: where events go, what calls cost.
#[derive(Debug, Clone)]
pub struct Policies {
    pub sinks: Vec<String>,
    pub pricing: Arc<dyn Pricing>,
}

impl Default for Policies {
    fn default() -> Self {
        Self { sinks: Vec::new(), pricing: Arc::new(ProviderReportedOnly) }
    }
}
