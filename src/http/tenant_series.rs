//! Which tenants get series of their own on `/metrics` (`[metrics] tenant_series`): the
//! ones with the most unfinished work, the rest summed under one label, so a deployment
//! with many tenants does not grow every scrape without bound.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use crate::domain::lifecycle::StateName;
use crate::domain::metric_names as names;
use crate::store::TenantDepth;

/// The label of the tenants past the cap. Parentheses are not in any tenant name
/// (`[A-Za-z0-9._-]`), so it cannot be mistaken for one.
pub(super) const OTHER: &str = "(other)";

/// One tenant's series: a count per state (all schemas together) and the oldest pending
/// time of any of its schemas.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(super) struct TenantSeries {
    pub counts: BTreeMap<StateName, u64>,
    pub oldest_pending_since_ms: Option<u64>,
}

impl TenantSeries {
    fn add(&mut self, counts: &[(StateName, u64)], oldest: Option<u64>) {
        for (state, n) in counts {
            *self.counts.entry(*state).or_default() += n;
        }
        self.oldest_pending_since_ms = match (self.oldest_pending_since_ms, oldest) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
    }

    fn unfinished(&self) -> u64 {
        self.counts.iter().filter(|(s, _)| !s.is_terminal()).map(|(_, n)| n).sum()
    }
}

/// The labelled series: at most `cap` tenants by name (most unfinished work first, then by
/// name), and every other tenant summed under [`OTHER`]; nothing when `cap` is 0.
pub(super) fn choose(depths: &[TenantDepth], cap: usize) -> Vec<(String, TenantSeries)> {
    if cap == 0 {
        return Vec::new();
    }
    let mut by_tenant: BTreeMap<&str, TenantSeries> = BTreeMap::new();
    for d in depths {
        by_tenant.entry(d.tenant.as_str()).or_default().add(&d.counts, d.oldest_pending_since_ms);
    }
    let mut tenants: Vec<(&str, TenantSeries)> = by_tenant.into_iter().collect();
    tenants.sort_by(|(a_name, a), (b_name, b)| b.unfinished().cmp(&a.unfinished()).then(a_name.cmp(b_name)));
    let mut out: Vec<(String, TenantSeries)> = Vec::with_capacity(cap.min(tenants.len()) + 1);
    let mut other: Option<TenantSeries> = None;
    for (i, (name, series)) in tenants.into_iter().enumerate() {
        if i < cap {
            out.push((name.to_string(), series));
        } else {
            let counts: Vec<(StateName, u64)> = series.counts.into_iter().collect();
            other.get_or_insert_with(TenantSeries::default).add(&counts, series.oldest_pending_since_ms);
        }
    }
    if let Some(other) = other {
        out.push((OTHER.to_string(), other));
    }
    out
}

/// The two per-tenant families as exposition text, written per scrape rather than kept
/// in the recorder: a tenant that leaves the chosen set (or is erased) is simply absent
/// from the next scrape, never a stale or zero series kept until restart. Tenant names
/// (`[A-Za-z0-9._-]`) and [`OTHER`] need no escaping in a label value.
pub(super) fn render(depths: &[TenantDepth], cap: usize, now_ms: u64) -> String {
    let chosen = choose(depths, cap);
    if chosen.is_empty() {
        return String::new();
    }
    let mut out = String::new();
    let _ = writeln!(out, "# HELP {} {}", names::TENANT_EXTRACTIONS, EXTRACTIONS_HELP);
    let _ = writeln!(out, "# TYPE {} gauge", names::TENANT_EXTRACTIONS);
    for (tenant, series) in &chosen {
        for state in StateName::ALL {
            let n = series.counts.get(&state).copied().unwrap_or(0);
            let _ =
                writeln!(out, "{}{{tenant=\"{tenant}\",state=\"{}\"}} {n}", names::TENANT_EXTRACTIONS, state.as_str());
        }
    }
    let _ = writeln!(out, "# HELP {} {}", names::TENANT_OLDEST_PENDING_AGE_SECONDS, AGE_HELP);
    let _ = writeln!(out, "# TYPE {} gauge", names::TENANT_OLDEST_PENDING_AGE_SECONDS);
    for (tenant, series) in &chosen {
        let age = series.oldest_pending_since_ms.map_or(0.0, |since| now_ms.saturating_sub(since) as f64 / 1000.0);
        let _ = writeln!(out, "{}{{tenant=\"{tenant}\"}} {age}", names::TENANT_OLDEST_PENDING_AGE_SECONDS);
    }
    out
}

const EXTRACTIONS_HELP: &str = "Extractions by tenant and state: the tenants with the most unfinished work \
    ([metrics] tenant_series), the rest summed as tenant=\"(other)\".";
const AGE_HELP: &str =
    "Age of each tenant's oldest pending extraction (its next in intake order); 0 without pending work.";

#[cfg(test)]
mod tests {
    use super::*;

    fn depth(tenant: &str, schema: &str, pending: u64, committed: u64, oldest: Option<u64>) -> TenantDepth {
        let counts = [(StateName::Pending, pending), (StateName::Committed, committed)]
            .into_iter()
            .filter(|(_, n)| *n > 0)
            .collect();
        TenantDepth { tenant: tenant.into(), schema: schema.into(), counts, oldest_pending_since_ms: oldest }
    }

    #[test]
    fn the_busiest_tenants_get_series_and_the_rest_are_summed() {
        let depths = vec![
            depth("a", "s@1", 1, 100, Some(50)),
            depth("b", "s@1", 500, 0, Some(40)),
            depth("b", "t@1", 10, 3, Some(30)),
            depth("c", "s@1", 2, 0, Some(20)),
            depth("d", "s@1", 0, 7, None),
        ];
        let chosen = choose(&depths, 2);
        let names: Vec<&str> = chosen.iter().map(|(t, _)| t.as_str()).collect();
        assert_eq!(names, vec!["b", "c", OTHER], "most unfinished first; a and d summed");
        let b = &chosen[0].1;
        assert_eq!((b.counts[&StateName::Pending], b.counts[&StateName::Committed]), (510, 3), "schemas together");
        assert_eq!(b.oldest_pending_since_ms, Some(30), "the oldest of its schemas");
        let other = &chosen[2].1;
        assert_eq!((other.counts[&StateName::Pending], other.counts[&StateName::Committed]), (1, 107));
        assert_eq!(other.oldest_pending_since_ms, Some(50));
        assert!(choose(&depths, 0).is_empty(), "0 turns the series off");
        assert_eq!(choose(&depths, 10).len(), 4, "under the cap, no (other)");
    }

    #[test]
    fn the_text_has_each_family_once_and_only_the_chosen_tenants() {
        let depths = vec![depth("a", "s@1", 3, 0, Some(1_000)), depth("b", "s@1", 1, 0, None)];
        let text = render(&depths, 1, 3_500);
        assert_eq!(text.matches("# TYPE commitpoint_tenant_extractions gauge").count(), 1, "{text}");
        assert!(text.contains("commitpoint_tenant_extractions{tenant=\"a\",state=\"pending\"} 3\n"), "{text}");
        assert!(text.contains("commitpoint_tenant_extractions{tenant=\"(other)\",state=\"pending\"} 1\n"), "{text}");
        assert!(text.contains("commitpoint_tenant_oldest_pending_age_seconds{tenant=\"a\"} 2.5\n"), "{text}");
        assert!(!text.contains("tenant=\"b\""), "b is past the cap: {text}");
        assert_eq!(render(&depths, 0, 0), "", "off");
    }
}
