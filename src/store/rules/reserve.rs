//! Budget reservations. When a batch is formed, each member of a tenant with a budget is
//! reserved at its estimate (`IntentRequest::estimate`: input from its bytes, output at
//! the provider's output budget, the batch discount applied) in the same transaction,
//! and only while the tenant's budget less its spend this period and its open
//! reservations covers it (`rules::fair`, which leaves the rest waiting); a worker's
//! claim reserves the same way when the worker declares its model
//! (`ClaimRequest::estimate`). A reservation lives while its extraction is with the
//! provider or the worker (submitted, ready, claimed) and ends in the write that moves it
//! on: an answer's commit, which charges the real cost in that same transaction, or a
//! failure, a cancellation or a return to the queue. Spend plus open reservations
//! therefore never passes a budget by more than the members' estimate errors (a member's
//! estimate is an upper bound on its output), and what a provider bills for a member
//! cancelled while it had it (docs/OPERATIONS.md, "Budgets").

use crate::domain::budget::Budgets;
use crate::domain::lifecycle::StateName;
use crate::store::ExtractionRecord;

/// The states in which an extraction keeps its reservation: while a provider (or a worker
/// that declared its model) has it.
pub(in crate::store) const KEEPING: [StateName; 3] = [StateName::Claimed, StateName::Submitted, StateName::Ready];

pub(in crate::store) fn keeps(state: StateName) -> bool {
    KEEPING.contains(&state)
}

/// Whether moving from `from` to `to` ends a reservation the extraction may hold.
pub(in crate::store) fn ends(from: StateName, to: StateName) -> bool {
    keeps(from) && !keeps(to)
}

/// What `tenant` may still reserve: `None` when it has no budget.
pub(in crate::store) fn headroom(budgets: &Budgets, tenant: &str, spent: u64, reserved: u64) -> Option<u64> {
    budgets.limit(tenant).map(|limit| limit.saturating_sub(spent.saturating_add(reserved)))
}

/// Estimates what one member of a batch will cost at its provider, in micro-dollars.
#[derive(Clone)]
pub struct MemberEstimate(pub std::sync::Arc<dyn Fn(&ExtractionRecord) -> u64 + Send + Sync>);

impl std::fmt::Debug for MemberEstimate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("MemberEstimate")
    }
}

/// The reservations a pick makes: (member, micro-dollars) for each budgeted member with
/// a cost.
pub(in crate::store) fn to_write<'a>(
    members: &'a [ExtractionRecord],
    reserved: &'a [Option<u64>],
) -> impl Iterator<Item = (&'a ExtractionRecord, u64)> + 'a {
    members.iter().zip(reserved).filter_map(|(m, r)| r.filter(|&micros| micros > 0).map(|micros| (m, micros)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    #[test]
    fn a_reservation_lives_while_the_provider_has_the_work() {
        assert!(keeps(StateName::Submitted) && keeps(StateName::Ready));
        assert!(ends(StateName::Ready, StateName::Committed));
        assert!(ends(StateName::Submitted, StateName::Pending), "a member returned to the queue");
        assert!(ends(StateName::Submitted, StateName::Cancelled));
        assert!(!ends(StateName::Submitted, StateName::Ready), "staged: still to be committed and charged");
        assert!(!ends(StateName::Pending, StateName::Claimed));
        assert!(!ends(StateName::Claimed, StateName::Claimed), "a lease taken over keeps it");
        assert!(ends(StateName::Claimed, StateName::Committed), "a worker's answer charged");
    }

    #[test]
    fn headroom_is_the_budget_less_spend_and_reservations_and_never_negative() {
        let budgets = Budgets { limits: HashMap::from([("acme".to_string(), 1_000)]), ..Budgets::default() };
        assert_eq!(headroom(&budgets, "acme", 300, 200), Some(500));
        assert_eq!(headroom(&budgets, "acme", 900, 200), Some(0));
        assert_eq!(headroom(&budgets, "other", 900, 200), None);
    }
}
