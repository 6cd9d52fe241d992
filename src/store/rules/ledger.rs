//! What a charge writes to the ledger, the same on both backends: the priced entry, and
//! whether the call was charged before (then it is a replay, costing nothing), and what
//! it adds to its tenant's spend of the day.

use crate::store::Pricing;
use crate::store::records::{ChargeKind, ExtractionRecord, LedgerRecord};
use crate::store::seam::{Charge, DAY_MS, priced_entry};

/// The request id whose earlier entries decide whether `charge` was charged before;
/// `None` when nothing can have charged it (a replay anyway, or a call without an id).
pub(in crate::store) fn request_to_look_up(charge: &Charge, kind: ChargeKind) -> Option<&str> {
    if kind == ChargeKind::Replay {
        return None;
    }
    charge.usage.request_id.as_deref()
}

/// A reporter that resends (its answer was lost, or it was refused) reports the same
/// call again: one provider request id is charged once per extraction.
pub(in crate::store) fn charged_before(earlier: &LedgerRecord, charge: &Charge) -> bool {
    earlier.kind != ChargeKind::Replay
        && earlier.provider == charge.provider
        && earlier.usage.request_id.is_some()
        && earlier.usage.request_id == charge.usage.request_id
}

/// The entry to write and what it adds to its tenant's spend on its UTC day.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(in crate::store) struct Entry {
    pub entry: LedgerRecord,
    pub day: u64,
    /// Micro-dollars added to the day's spend; zero adds nothing (no spend row is made).
    pub spend: u64,
}

pub(in crate::store) fn plan_charge(
    seq: u64,
    pricing: &dyn Pricing,
    record: &ExtractionRecord,
    charge: &Charge,
    kind: ChargeKind,
    charged: bool,
    now_ms: u64,
) -> Entry {
    let kind = if charged { ChargeKind::Replay } else { kind };
    let entry = priced_entry(seq, pricing, record, charge, kind, now_ms);
    Entry { spend: entry.cost_micros, day: now_ms / DAY_MS, entry }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::batch::Usage;
    use crate::domain::lifecycle::State;
    use crate::store::records::CostSource;
    use crate::store::rules::fixtures::record;

    /// A price of one micro-dollar per output token.
    #[derive(Debug)]
    struct PerToken;
    impl Pricing for PerToken {
        fn price(&self, _provider: &str, usage: &Usage, _batch: bool) -> (u64, CostSource) {
            (usage.output_tokens, CostSource::PriceTable)
        }
    }

    fn charge(provider: &str, request_id: Option<&str>) -> Charge {
        let usage = Usage { output_tokens: 30, request_id: request_id.map(str::to_string), ..Usage::default() };
        Charge { provider: provider.into(), job_id: None, usage, latency_ms: None, batch: false }
    }

    #[test]
    fn a_fresh_charge_costs_its_price_on_its_day_and_one_charged_before_costs_nothing() {
        let r = record(State::Pending);
        let now = 3 * DAY_MS + 5;
        let fresh = plan_charge(9, &PerToken, &r, &charge("p", Some("r1")), ChargeKind::Fresh, false, now);
        assert_eq!((fresh.entry.seq, fresh.entry.kind, fresh.spend, fresh.day), (9, ChargeKind::Fresh, 30, 3));
        let again = plan_charge(10, &PerToken, &r, &charge("p", Some("r1")), ChargeKind::Fresh, true, now);
        assert_eq!((again.entry.kind, again.spend, again.entry.list_cost_micros), (ChargeKind::Replay, 0, 30));
    }

    #[test]
    fn only_an_earlier_paid_entry_of_the_same_provider_and_request_counts_as_charged() {
        let r = record(State::Pending);
        let earlier = |provider, id, kind| plan_charge(1, &PerToken, &r, &charge(provider, id), kind, false, 0).entry;
        let call = charge("p", Some("r1"));
        assert!(charged_before(&earlier("p", Some("r1"), ChargeKind::Fresh), &call));
        assert!(charged_before(&earlier("p", Some("r1"), ChargeKind::Unusable), &call));
        assert!(!charged_before(&earlier("p", Some("r1"), ChargeKind::Replay), &call), "a replay paid nothing");
        assert!(!charged_before(&earlier("q", Some("r1"), ChargeKind::Fresh), &call), "another provider's id");
        assert!(!charged_before(&earlier("p", Some("r2"), ChargeKind::Fresh), &call));
        let anonymous = charge("p", None);
        assert!(!charged_before(&earlier("p", None, ChargeKind::Fresh), &anonymous), "no id, no match");
        assert_eq!(request_to_look_up(&anonymous, ChargeKind::Fresh), None);
        assert_eq!(request_to_look_up(&call, ChargeKind::Replay), None);
        assert_eq!(request_to_look_up(&call, ChargeKind::FailedValidation), Some("r1"));
    }
}
