//! Each tenant's work by schema and state: what the counters must hold (a recount from the
//! records, for redb's build and `verify`), and the one way both backends turn their
//! counted rows into [`TenantDepth`]s.

use std::collections::BTreeMap;

use crate::domain::lifecycle::StateName;
use crate::store::records::ExtractionRecord;
use crate::store::seam::TenantDepth;

/// (tenant, schema, state code) → count, the counters' key.
pub(crate) type Counts = BTreeMap<(String, String, u8), u64>;

/// What the counters hold for `records`: the truth they are checked against.
pub(crate) fn recount<'a>(records: impl IntoIterator<Item = &'a ExtractionRecord>) -> Counts {
    let mut counts = Counts::new();
    for record in records {
        count_one(&mut counts, record);
    }
    counts
}

/// Adds one record to a recount.
pub(crate) fn count_one(counts: &mut Counts, record: &ExtractionRecord) {
    *counts.entry((record.tenant.clone(), record.schema.clone(), record.state.name().code())).or_default() += 1;
}

/// The counted rows (any order, zeros allowed) and each (tenant, schema)'s oldest pending
/// time, as depths ordered by (tenant, schema) with non-zero counts in state order. A code
/// no state has could only come from a damaged store; it is left out, as it counts nothing.
pub(crate) fn assemble(
    rows: impl IntoIterator<Item = ((String, String, u8), u64)>,
    mut oldest_pending: BTreeMap<(String, String), u64>,
) -> Vec<TenantDepth> {
    let mut by_pair: BTreeMap<(String, String), BTreeMap<u8, u64>> = BTreeMap::new();
    for ((tenant, schema, code), count) in rows {
        if count > 0 && StateName::from_code(code.into()).is_some() {
            *by_pair.entry((tenant, schema)).or_default().entry(code).or_default() += count;
        }
    }
    by_pair
        .into_iter()
        .map(|((tenant, schema), codes)| {
            let counts =
                StateName::ALL.iter().filter_map(|state| codes.get(&state.code()).map(|n| (*state, *n))).collect();
            let oldest_pending_since_ms = oldest_pending.remove(&(tenant.clone(), schema.clone()));
            TenantDepth { tenant, schema, counts, oldest_pending_since_ms }
        })
        .collect()
}

/// Where the stored counters disagree with a recount, as `verify` reports it.
pub(crate) fn disagreements(stored: &Counts, truth: &Counts) -> Vec<String> {
    let mut problems = Vec::new();
    for key in stored.keys().chain(truth.keys().filter(|k| !stored.contains_key(*k))) {
        let (have, want) = (stored.get(key).copied().unwrap_or(0), truth.get(key).copied().unwrap_or(0));
        if have != want {
            let state =
                StateName::from_code(key.2.into()).map_or_else(|| format!("code {}", key.2), |s| s.as_str().into());
            problems.push(format!(
                "the per-tenant counter of ({}, {}, {state}) says {have}, the records {want}",
                key.0, key.1
            ));
        }
    }
    problems
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::lifecycle::State;
    use crate::store::rules::fixtures::record;

    fn in_state(tenant: &str, schema: &str, state: State) -> ExtractionRecord {
        let mut r = record(state);
        r.tenant = tenant.into();
        r.schema = schema.into();
        r
    }

    #[test]
    fn a_recount_counts_each_tenant_schema_and_state() {
        let records = [
            in_state("a", "s@1", State::Pending),
            in_state("a", "s@1", State::Pending),
            in_state("a", "t@1", State::Pending),
            in_state("b", "s@1", State::Cancelled { at_ms: 1 }),
        ];
        let counts = recount(&records);
        assert_eq!(counts.get(&("a".into(), "s@1".into(), StateName::Pending.code())), Some(&2));
        assert_eq!(counts.get(&("a".into(), "t@1".into(), StateName::Pending.code())), Some(&1));
        assert_eq!(counts.get(&("b".into(), "s@1".into(), StateName::Cancelled.code())), Some(&1));
        assert_eq!(counts.len(), 3);
    }

    #[test]
    fn rows_assemble_in_tenant_order_with_their_oldest_pending_and_no_zeros() {
        let pending = StateName::Pending.code();
        let committed = StateName::Committed.code();
        let rows = vec![
            (("b".to_string(), "s@1".to_string(), committed), 4),
            (("a".to_string(), "s@1".to_string(), committed), 1),
            (("a".to_string(), "s@1".to_string(), pending), 2),
            (("c".to_string(), "s@1".to_string(), pending), 0),
            (("a".to_string(), "s@1".to_string(), 250), 9),
        ];
        let oldest = BTreeMap::from([(("a".to_string(), "s@1".to_string()), 77)]);
        let depths = assemble(rows, oldest);
        assert_eq!(depths.len(), 2, "a pair whose counts are all zero is not listed: {depths:?}");
        assert_eq!((depths[0].tenant.as_str(), depths[1].tenant.as_str()), ("a", "b"));
        assert_eq!(depths[0].counts, vec![(StateName::Pending, 2), (StateName::Committed, 1)]);
        assert_eq!(depths[0].oldest_pending_since_ms, Some(77));
        assert_eq!((depths[1].count(StateName::Committed), depths[1].oldest_pending_since_ms), (4, None));
    }

    #[test]
    fn disagreements_name_both_sides() {
        let truth = recount(&[in_state("a", "s@1", State::Pending)]);
        assert!(disagreements(&truth, &truth).is_empty());
        let mut stored = truth.clone();
        stored.insert(("ghost".into(), "s@1".into(), StateName::Failed.code()), 2);
        let problems = disagreements(&stored, &truth);
        assert_eq!(problems, vec!["the per-tenant counter of (ghost, s@1, failed) says 2, the records 0"]);
        assert_eq!(disagreements(&Counts::new(), &truth).len(), 1, "a missing counter is found too");
    }
}
