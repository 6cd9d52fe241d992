//! Per-tenant budgets. When a tenant's charged spend in the current period reaches its
//! budget, its pending work is held: not submitted, not lost. It moves again when the
//! budget is raised (a config reload) or the period rolls over. Below the budget, each
//! batch member is reserved against it when its batch is formed (`store::rules::fair`),
//! so the money a batch may spend is held before the batch is sent.

use std::collections::{HashMap, HashSet};

/// The ledger's day: spend is summed per tenant and UTC day.
pub const DAY_MS: u64 = 86_400_000;

fn store_day_ms() -> u64 {
    DAY_MS
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Deserialize, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum BudgetPeriod {
    Day,
    #[default]
    Month,
}

#[derive(Debug, Clone, Default)]
pub struct Budgets {
    pub period: BudgetPeriod,
    /// tenant → micro-dollars per period.
    pub limits: HashMap<String, u64>,
}

impl Budgets {
    pub fn is_empty(&self) -> bool {
        self.limits.is_empty()
    }

    /// The UTC day number the current period began on.
    pub fn period_start_day(&self, now_ms: u64) -> u64 {
        let today = now_ms / store_day_ms();
        match self.period {
            BudgetPeriod::Day => today,
            BudgetPeriod::Month => {
                let (year, month, _) = civil_from_days(today as i64);
                days_from_civil(year, month, 1) as u64
            }
        }
    }

    /// The budget of `tenant` per period, if it has one.
    pub fn limit(&self, tenant: &str) -> Option<u64> {
        self.limits.get(tenant).copied()
    }

    /// Tenants whose spend this period reached their budget.
    pub fn held(&self, spend: &[(String, u64)]) -> HashSet<String> {
        spend
            .iter()
            .filter(|(tenant, micros)| self.limits.get(tenant).is_some_and(|limit| micros >= limit))
            .map(|(tenant, _)| tenant.clone())
            .collect()
    }
}

// Days since 1970-01-01 to and from the proleptic Gregorian calendar (Howard Hinnant's
// well-known algorithms, written out here).
fn days_from_civil(year: i64, month: u32, day: u32) -> i64 {
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let m = i64::from(month);
    let doy = (153 * (if m > 2 { m - 3 } else { m + 9 }) + 2) / 5 + i64::from(day) - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let month = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let year = yoe + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn calendar_round_trips_and_month_starts() {
        assert_eq!(days_from_civil(1970, 1, 1), 0);
        assert_eq!(days_from_civil(2026, 11, 30), 20_787);
        for days in [0, 59, 60, 11_016, 20_787, 40_000] {
            let (y, m, d) = civil_from_days(days);
            assert_eq!(days_from_civil(y, m, d), days);
        }
        let budgets = Budgets { period: BudgetPeriod::Month, ..Budgets::default() };
        let nov_30_noon = 20_787 * store_day_ms() + 12 * 3_600_000;
        assert_eq!(budgets.period_start_day(nov_30_noon), days_from_civil(2026, 11, 1) as u64);
        let daily = Budgets { period: BudgetPeriod::Day, ..Budgets::default() };
        assert_eq!(daily.period_start_day(nov_30_noon), 20_787);
    }

    #[test]
    fn only_tenants_at_or_over_their_budget_are_held() {
        let budgets =
            Budgets { limits: HashMap::from([("acme".into(), 100), ("beta".into(), 100)]), ..Budgets::default() };
        let held = budgets.held(&[("acme".into(), 100), ("beta".into(), 99), ("free".into(), 10_000)]);
        assert_eq!(held, HashSet::from(["acme".to_string()]));
    }
}
