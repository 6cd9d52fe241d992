//! `POST /v1/estimates`: what sources would cost at each configured provider before they
//! are sent, and whether the tenant's budget covers it (`engine::ledger::estimate` has
//! the rules).

use std::sync::{Arc, RwLock};

use super::{Error, Service, check_tenant, invalid};
use crate::engine::ledger::estimate::{self, Estimate, ProviderProfile, Sources};
use crate::engine::ledger::{CostQuery, GroupBy, PriceTable};

/// The most sources one estimate may list (a count may be larger).
pub(crate) const MAX_ESTIMATE_ITEMS: usize = 100_000;
/// How far back the tenant's own answers set the output estimate.
const HISTORY_MS: u64 = 30 * 24 * 3600 * 1000;

/// The configured providers and prices an estimate reads; prices follow `ctl reload`.
#[derive(Debug, Default)]
pub(crate) struct Estimation {
    profiles: Vec<ProviderProfile>,
    prices: RwLock<PriceTable>,
}

impl Estimation {
    pub(crate) fn new(profiles: Vec<ProviderProfile>, prices: PriceTable) -> Self {
        Self { profiles, prices: RwLock::new(prices) }
    }
}

/// The model an external worker says it calls, so its claims are reserved against the
/// tenants' budgets like batch members (at list price: a worker's call is synchronous).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkerPricing {
    /// The `provider` of a `[[prices]]` row.
    pub provider: String,
    pub model: String,
    /// The most output one answer may use: what a claimed source is reserved for.
    pub max_output_tokens: u32,
}

/// Output budgets above this are a mistake, not a model.
const MAX_WORKER_OUTPUT_TOKENS: u32 = 1_000_000;

#[derive(Debug, Clone)]
pub(crate) struct EstimateRequest {
    pub(crate) tenant: String,
    pub(crate) schema: String,
    pub(crate) provider: Option<String>,
    pub(crate) sources: Sources,
}

/// The tenant's budget for this period as an estimate weighs it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct BudgetLeft {
    pub(crate) limit_micros: u64,
    pub(crate) spent_micros: u64,
    /// Reserved for work already with a provider.
    pub(crate) reserved_micros: u64,
}

impl BudgetLeft {
    pub(crate) fn remaining_micros(&self) -> u64 {
        self.limit_micros.saturating_sub(self.spent_micros.saturating_add(self.reserved_micros))
    }

    /// Whether `cost` fits what is left (unknown costs fit nothing).
    pub(crate) fn covers(&self, cost: Option<u64>) -> Option<bool> {
        cost.map(|c| c <= self.remaining_micros())
    }
}

#[derive(Debug, Clone)]
pub(crate) struct TenantEstimate {
    pub(crate) tenant: String,
    pub(crate) schema: String,
    pub(crate) requests: u64,
    /// Where routing sends this tenant's and schema's new work, if anywhere.
    pub(crate) routed_to: Option<String>,
    pub(crate) budget: Option<BudgetLeft>,
    pub(crate) estimates: Vec<Estimate>,
}

/// The sources of a request: `items`, or `count` with `bytes`, and not both.
pub(crate) fn estimate_sources(
    items: Option<Vec<(String, u64)>>,
    count: Option<u64>,
    bytes: Option<u64>,
) -> Result<Sources, Error> {
    match (items, count, bytes) {
        (Some(items), None, None) => Ok(Sources::Items(items)),
        (None, Some(count), Some(bytes)) => Ok(Sources::Counted { count, bytes }),
        _ => Err(invalid("items", "send either items, or count and bytes")),
    }
}

impl Service {
    pub(crate) fn with_estimation(mut self, estimation: Estimation) -> Self {
        self.estimation = Arc::new(estimation);
        self
    }

    /// What one source claimed by a worker that declared `pricing` is reserved at.
    pub(crate) fn worker_estimate(&self, pricing: &WorkerPricing) -> Result<crate::store::MemberEstimate, Error> {
        if !(1..=MAX_WORKER_OUTPUT_TOKENS).contains(&pricing.max_output_tokens) {
            return Err(invalid("priced_as.max_output_tokens", format!("must be 1..={MAX_WORKER_OUTPUT_TOKENS}")));
        }
        let profile = ProviderProfile {
            name: pricing.provider.clone(),
            model: Some(pricing.model.clone()),
            batch: false,
            output_budget: pricing.max_output_tokens,
        };
        let registry = self.registry().clone();
        let instructions = move |schema: &str| registry.get(schema).map_or(0, |s| s.instructions().len() as u64);
        let prices = self.estimation.prices.read().unwrap_or_else(std::sync::PoisonError::into_inner).clone();
        estimate::member_estimate(&profile, instructions, &prices).ok_or_else(|| {
            invalid(
                "priced_as",
                format!(
                    "no [[prices]] row prices model {:?} at provider {:?}: claims cannot be reserved against budgets",
                    pricing.model, pricing.provider
                ),
            )
        })
    }

    /// The prices `ctl reload` brought.
    pub(crate) fn set_prices(&self, prices: PriceTable) {
        let mut current = self.estimation.prices.write().unwrap_or_else(std::sync::PoisonError::into_inner);
        *current = prices;
    }

    pub(crate) async fn estimate(&self, request: EstimateRequest) -> Result<TenantEstimate, Error> {
        check_tenant(&request.tenant)?;
        let schema = self.registry().get(&request.schema)?;
        match &request.sources {
            Sources::Items(items) if items.is_empty() => return Err(invalid("items", "must list at least one source")),
            Sources::Items(items) if items.len() > MAX_ESTIMATE_ITEMS => {
                return Err(invalid("items", format!("at most {MAX_ESTIMATE_ITEMS}; send count and bytes instead")));
            }
            Sources::Counted { count: 0, .. } => return Err(invalid("count", "must be at least 1")),
            _ => {}
        }
        let profiles: Vec<&ProviderProfile> = match &request.provider {
            Some(name) => match self.estimation.profiles.iter().find(|p| &p.name == name) {
                Some(profile) => vec![profile],
                None => return Err(invalid("provider", format!("no provider named {name:?} is configured"))),
            },
            None => self.estimation.profiles.iter().collect(),
        };
        let now = crate::domain::clock::now_ms();
        let history = self
            .costs(CostQuery {
                tenant: request.tenant.clone(),
                from_ms: now.saturating_sub(HISTORY_MS),
                to_ms: now + 1,
                group_by: Some(GroupBy::Provider),
            })
            .await?;
        let mean_output = |provider: &str| {
            let fresh = history.groups.as_ref()?.get(provider)?.fresh;
            (fresh.attempts > 0).then(|| fresh.output_tokens.div_ceil(fresh.attempts))
        };
        let instructions = schema.instructions().len() as u64;
        let estimates = {
            let prices = self.estimation.prices.read().unwrap_or_else(std::sync::PoisonError::into_inner);
            profiles
                .iter()
                .map(|p| estimate::estimate(p, &request.sources, instructions, mean_output(&p.name), &prices))
                .collect()
        };
        let budget =
            self.budget_status().await?.into_iter().find(|line| line.tenant == request.tenant).map(|line| BudgetLeft {
                limit_micros: line.limit_micros,
                spent_micros: line.spent_micros,
                reserved_micros: line.reserved_micros,
            });
        let routed_to = self.router().routes().target(&request.tenant, &request.schema).map(str::to_string);
        Ok(TenantEstimate {
            tenant: request.tenant,
            schema: request.schema,
            requests: request.sources.count(),
            routed_to,
            budget,
            estimates,
        })
    }
}
