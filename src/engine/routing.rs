//! Which provider new work goes to, and which tenants' work is held for budget.
//!
//! Pending work is bound to a provider only when a batch intent is formed, so routing is
//! a filter each provider's scheduler applies when it forms batches: a rule (by schema
//! and/or tenant) names the provider, else the default does. A paused provider's pending
//! work waits for it, unless `reroute_when_paused` lets the default take it. The one later
//! hand-over, of work left under a provider's minimum job size to its `min_batch_fallback`,
//! is decided where the intent is formed (`store::rules::intent::bound_to`), not here.

use std::collections::HashSet;
use std::sync::{Arc, RwLock};

use crate::engine::ledger::Budgets;
use crate::store::WorkFilter;
use crate::store::seam::Ledger;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rule {
    pub schema: Option<String>,
    pub tenant: Option<String>,
    pub provider: String,
}

#[derive(Debug, Clone, Default)]
pub struct Routes {
    /// The provider for work no rule names; `None` when no built-in provider runs.
    pub default: Option<String>,
    pub rules: Vec<Rule>,
    pub reroute_when_paused: bool,
}

impl Routes {
    /// The provider a (tenant, schema) pair is routed to by configuration.
    pub fn target(&self, tenant: &str, schema: &str) -> Option<&str> {
        self.rules
            .iter()
            .find(|r| {
                r.schema.as_deref().is_none_or(|s| s == schema) && r.tenant.as_deref().is_none_or(|t| t == tenant)
            })
            .map(|r| r.provider.as_str())
            .or(self.default.as_deref())
    }
}

/// Routing plus the live facts it depends on: paused providers and held tenants.
#[derive(Debug, Default)]
pub struct Router {
    routes: RwLock<Arc<Routes>>,
    budgets: RwLock<Arc<Budgets>>,
    /// What batch members are reserved at (`ledger::estimate::member_estimate`).
    prices: RwLock<Arc<crate::engine::ledger::PriceTable>>,
    held: RwLock<Arc<HashSet<String>>>,
    paused: RwLock<Arc<HashSet<String>>>,
}

fn read<T: ?Sized>(lock: &RwLock<Arc<T>>) -> Arc<T> {
    match lock.read() {
        Ok(v) => Arc::clone(&v),
        Err(poisoned) => Arc::clone(&poisoned.into_inner()),
    }
}

fn write<T: ?Sized>(lock: &RwLock<Arc<T>>, value: Arc<T>) {
    match lock.write() {
        Ok(mut v) => *v = value,
        Err(poisoned) => *poisoned.into_inner() = value,
    }
}

impl Router {
    pub fn new(routes: Routes, budgets: Budgets) -> Self {
        let router = Self::default();
        router.configure(routes, budgets);
        router
    }

    /// Applies new routes and budgets (start and reload).
    pub fn configure(&self, routes: Routes, budgets: Budgets) {
        write(&self.routes, Arc::new(routes));
        write(&self.budgets, Arc::new(budgets));
    }

    /// The prices reservations are estimated with (start and reload).
    pub(crate) fn set_prices(&self, prices: crate::engine::ledger::PriceTable) {
        write(&self.prices, Arc::new(prices));
    }

    pub(crate) fn prices(&self) -> Arc<crate::engine::ledger::PriceTable> {
        read(&self.prices)
    }

    pub fn routes(&self) -> Arc<Routes> {
        read(&self.routes)
    }

    pub fn budgets(&self) -> Arc<Budgets> {
        read(&self.budgets)
    }

    pub fn set_paused(&self, provider: &str, paused: bool) {
        let mut next = (*read(&self.paused)).clone();
        if paused {
            next.insert(provider.to_string());
        } else {
            next.remove(provider);
        }
        write(&self.paused, Arc::new(next));
    }

    pub fn held_tenants(&self) -> Arc<HashSet<String>> {
        read(&self.held)
    }

    /// Re-reads the spend of every budgeted tenant and updates who is held. Returns the
    /// (tenant, spend, budget) rows for status and metrics.
    pub async fn refresh_holds(
        &self,
        store: &dyn Ledger,
        now_ms: u64,
    ) -> Result<Vec<(String, u64, u64)>, crate::store::Error> {
        let budgets = self.budgets();
        if budgets.is_empty() {
            write(&self.held, Arc::new(HashSet::new()));
            return Ok(Vec::new());
        }
        let tenants: Vec<String> = budgets.limits.keys().cloned().collect();
        let spend = store.spend_since(tenants, budgets.period_start_day(now_ms)).await?;
        let held = budgets.held(&spend);
        for tenant in &held {
            if !self.held_tenants().contains(tenant) {
                tracing::warn!(%tenant, "tenant reached its budget: its new work is held until the budget is raised or the period ends");
            }
        }
        write(&self.held, Arc::new(held));
        Ok(spend
            .into_iter()
            .map(|(tenant, micros)| {
                let limit = budgets.limits.get(&tenant).copied().unwrap_or(0);
                (tenant, micros, limit)
            })
            .collect())
    }

    /// The filter `provider`'s scheduler forms batches with.
    pub fn filter_for(&self, provider: &str) -> WorkFilter {
        let routes = self.routes();
        let held = self.held_tenants();
        let paused = read(&self.paused);
        let provider = provider.to_string();
        WorkFilter(Arc::new(move |tenant: &str, schema: &str| {
            if held.contains(tenant) {
                return false;
            }
            match routes.target(tenant, schema) {
                Some(target) if target == provider => true,
                Some(target) => {
                    routes.reroute_when_paused
                        && paused.contains(target)
                        && routes.default.as_deref() == Some(provider.as_str())
                }
                // Nothing configured: whichever provider runs takes everything.
                None => true,
            }
        }))
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    fn routes(reroute: bool) -> Routes {
        Routes {
            default: Some("openai".into()),
            rules: vec![
                Rule { schema: Some("contract@1".into()), tenant: None, provider: "anthropic".into() },
                Rule { schema: None, tenant: Some("gov".into()), provider: "local".into() },
            ],
            reroute_when_paused: reroute,
        }
    }

    #[test]
    fn rules_then_default() {
        let r = routes(false);
        assert_eq!(r.target("acme", "contract@1"), Some("anthropic"));
        assert_eq!(r.target("gov", "code-review@1"), Some("local"));
        assert_eq!(r.target("acme", "code-review@1"), Some("openai"));
        assert_eq!(Routes::default().target("acme", "x"), None);
    }

    #[test]
    fn paused_work_waits_unless_rerouting_is_configured() {
        let router = Router::new(routes(false), Budgets::default());
        router.set_paused("anthropic", true);
        assert!(!(router.filter_for("openai").0)("acme", "contract@1"));
        assert!((router.filter_for("anthropic").0)("acme", "contract@1"));
        router.configure(routes(true), Budgets::default());
        assert!((router.filter_for("openai").0)("acme", "contract@1"));
        // Only the default takes over, and only while the target is paused.
        assert!(!(router.filter_for("local").0)("acme", "contract@1"));
        router.set_paused("anthropic", false);
        assert!(!(router.filter_for("openai").0)("acme", "contract@1"));
    }

    #[test]
    fn held_tenants_are_filtered_out_everywhere() {
        let budgets = Budgets { limits: HashMap::from([("acme".into(), 1)]), ..Budgets::default() };
        let router = Router::new(routes(false), budgets);
        write(&router.held, Arc::new(HashSet::from(["acme".to_string()])));
        assert!(!(router.filter_for("openai").0)("acme", "code-review@1"));
        assert!((router.filter_for("openai").0)("other", "code-review@1"));
    }
}
