//! What a tenant erasure decides, the same on both backends: what an erased ledger entry
//! leaves in the erased-spend totals, which days a cost report's window reads of them, and
//! what becomes of a provider batch some of whose members are erased. The redb store
//! (`erase.rs`) and the PostgreSQL store (`postgres/erase.rs`) only apply these.

use std::collections::{BTreeMap, HashSet};

use crate::store::records::{BatchRecord, BatchState, LedgerRecord};
use crate::store::seam::DAY_MS;

/// The outcome an intent closed by an erasure carries.
const INTENT_EMPTIED: &str = "erased: every member's tenant was erased";

/// The (tenant, UTC day) total an erased ledger entry adds to, and by how much; `None`
/// when it charged nothing (replays, unpriced calls). Budgets and invoices keep adding up:
/// the per-day spend stays, and this says how much of it no longer has entries.
pub(in crate::store) fn erased_charge(entry: &LedgerRecord) -> Option<((&str, u64), u64)> {
    (entry.cost_micros > 0).then_some(((entry.tenant.as_str(), entry.at_ms / DAY_MS), entry.cost_micros))
}

/// The UTC days (first, last, both included) whose erased totals a window
/// `from_ms..to_ms` reads: every day it overlaps.
pub(in crate::store) fn erased_days(from_ms: u64, to_ms: u64) -> (u64, u64) {
    (from_ms / DAY_MS, to_ms.saturating_sub(1) / DAY_MS)
}

/// What an erasure did to one batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(in crate::store) enum BatchAfterErasure {
    /// Nothing to change: no erased member, or the batch is past its intent.
    Kept,
    /// An intent lost its erased members and keeps the others.
    Shrunk,
    /// An intent lost every member and is closed before reaching the provider.
    Closed,
}

/// An intent drops its erased members (their content must never be sent) and is closed
/// once none remain. Submitted and closed batches keep their member lists as they are:
/// positions name the lines of a file the provider already has, and an answer for an
/// erased member finds no extraction (a stranger, neither committed nor charged).
pub(in crate::store) fn release_intent(
    batch: &mut BatchRecord,
    erased: impl Fn(u64) -> bool,
    now_ms: u64,
) -> BatchAfterErasure {
    if !matches!(batch.state, BatchState::Intent) || !batch.members.iter().any(|&m| erased(m)) {
        return BatchAfterErasure::Kept;
    }
    batch.members.retain(|&m| !erased(m));
    batch.updated_at_ms = now_ms;
    if !batch.members.is_empty() {
        return BatchAfterErasure::Shrunk;
    }
    batch.state = BatchState::Closed { job_id: None, outcome: INTENT_EMPTIED.into() };
    BatchAfterErasure::Closed
}

/// The erased-spend totals an erasure adds to, per (tenant, UTC day), summed over the
/// ledger entries it removes.
#[derive(Debug, Default)]
pub(in crate::store) struct ErasedSpend(BTreeMap<(String, u64), u64>);

impl ErasedSpend {
    pub(in crate::store) fn add(&mut self, entry: &LedgerRecord) {
        if let Some(((tenant, day), micros)) = erased_charge(entry) {
            let total = self.0.entry((tenant.to_string(), day)).or_default();
            *total = total.saturating_add(micros);
        }
    }

    /// Each (tenant, day) and the micro-dollars to add to its erased total.
    pub(in crate::store) fn totals(&self) -> impl Iterator<Item = ((&str, u64), u64)> {
        self.0.iter().map(|((tenant, day), micros)| ((tenant.as_str(), *day), *micros))
    }
}

/// Applies `release_intent` to each batch that lists erased work: the ones that changed,
/// to save, each with whether it closed.
pub(in crate::store) fn release_intents(
    batches: impl IntoIterator<Item = BatchRecord>,
    erased: &HashSet<u64>,
    now_ms: u64,
) -> Vec<(BatchRecord, bool)> {
    let mut changed = Vec::new();
    for mut batch in batches {
        match release_intent(&mut batch, |m| erased.contains(&m), now_ms) {
            BatchAfterErasure::Kept => {}
            BatchAfterErasure::Shrunk => changed.push((batch, false)),
            BatchAfterErasure::Closed => changed.push((batch, true)),
        }
    }
    changed
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::batch::Usage;
    use crate::domain::identity::batch_key;
    use crate::domain::lifecycle::State;
    use crate::store::ProviderReportedOnly;
    use crate::store::records::ChargeKind;
    use crate::store::rules::fixtures::record;
    use crate::store::rules::ledger::plan_charge;
    use crate::store::seam::Charge;

    fn batch(state: BatchState, members: Vec<u64>) -> BatchRecord {
        BatchRecord {
            seq: 1,
            batch_key: batch_key("p", "s", 1, &[]),
            provider: "p".to_string().into(),
            schema: "s".into(),
            members,
            state,
            next_action_at_ms: 0,
            failures: 0,
            last_error: None,
            created_at_ms: 0,
            updated_at_ms: 0,
            not_found_since_ms: None,
        }
    }

    #[test]
    fn an_intent_sheds_erased_members_and_closes_when_empty_but_a_submitted_batch_keeps_its_list() {
        let erased = |m: u64| m.is_multiple_of(2);
        let mut intent = batch(BatchState::Intent, vec![1, 2, 3]);
        assert_eq!(release_intent(&mut intent, erased, 7), BatchAfterErasure::Shrunk);
        assert_eq!((intent.members.clone(), intent.updated_at_ms), (vec![1, 3], 7));
        let mut emptied = batch(BatchState::Intent, vec![2, 4]);
        assert_eq!(release_intent(&mut emptied, erased, 7), BatchAfterErasure::Closed);
        assert!(matches!(emptied.state, BatchState::Closed { job_id: None, .. }));
        let mut untouched = batch(BatchState::Intent, vec![1, 3]);
        assert_eq!(release_intent(&mut untouched, erased, 7), BatchAfterErasure::Kept);
        assert_eq!(untouched.updated_at_ms, 0);
        let mut submitted = batch(BatchState::Submitted { job_id: "j".into() }, vec![2, 4]);
        assert_eq!(release_intent(&mut submitted, erased, 7), BatchAfterErasure::Kept);
        assert_eq!(submitted.members, vec![2, 4], "positions name file lines");
    }

    #[test]
    fn only_charged_entries_leave_an_erased_total_and_windows_read_every_day_they_touch() {
        assert_eq!(erased_days(0, DAY_MS), (0, 0));
        assert_eq!(erased_days(DAY_MS - 1, DAY_MS + 1), (0, 1));
        assert_eq!(erased_days(5, 5), (0, 0));
    }

    #[test]
    fn erased_spend_sums_charged_entries_per_tenant_and_day() {
        let record = record(State::Pending);
        let charge =
            Charge { provider: "p".into(), job_id: None, usage: Usage::default(), latency_ms: None, batch: false };
        let entry = |tenant: &str, at_ms, cost_micros| {
            let mut e = plan_charge(1, &ProviderReportedOnly, &record, &charge, ChargeKind::Fresh, false, at_ms).entry;
            (e.tenant, e.cost_micros) = (tenant.to_string(), cost_micros);
            e
        };
        let mut spend = ErasedSpend::default();
        for e in [entry("a", 5, 10), entry("a", DAY_MS - 1, 5), entry("a", DAY_MS, 7), entry("b", 0, 0)] {
            spend.add(&e);
        }
        let totals: Vec<_> = spend.totals().collect();
        assert_eq!(totals, vec![(("a", 0), 15), (("a", 1), 7)], "an entry that charged nothing leaves nothing");
    }

    #[test]
    fn only_the_intents_that_changed_are_saved_and_the_emptied_ones_closed() {
        let erased: HashSet<u64> = [2, 4].into_iter().collect();
        let batches = [
            batch(BatchState::Intent, vec![1, 2]),
            batch(BatchState::Intent, vec![2, 4]),
            batch(BatchState::Intent, vec![1, 3]),
            batch(BatchState::Submitted { job_id: "j".into() }, vec![2]),
        ];
        let changed = release_intents(batches, &erased, 9);
        let summary: Vec<_> = changed.iter().map(|(b, closed)| (b.members.clone(), *closed)).collect();
        assert_eq!(summary, vec![(vec![1], false), (vec![], true)]);
    }
}
