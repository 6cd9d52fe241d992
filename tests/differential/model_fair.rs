//! The fair pick as the model states it: pending work goes by (schema, tenant) in
//! rotation order, starting after the pair the queue's previous pick stopped at; each
//! pair gives its oldest work first; a pick of n reaches at most n pairs. The model's
//! sources are a few bytes each, so one quantum (4 KiB) covers a pair's whole queue: a
//! pair reached gives everything the pick has room for. (What a quantum does with larger
//! sources, weights, classes and in-flight limits is the rule's own unit tests.)
//!
//! Budgets: a pair of a budgeted tenant gives its work only while the budget less its
//! spend and open reservations covers one more estimate; the first that does not fit
//! ends that pair's turn (the pick goes on with the next pair).

use std::collections::BTreeMap;

use super::model::{Ext, Model};
use super::universe::{BUDGET_MICROS, BUDGETED, ESTIMATE};
use super::view::StateView;

/// What one pick takes, whether it stopped at a limit, and where it stopped.
pub(super) struct Pick {
    pub seqs: Vec<u64>,
    /// The members reserved against their tenant's budget.
    pub reserved: Vec<u64>,
    pub full: bool,
    pub stopped_at: Option<(String, String)>,
}

impl Model {
    /// `reserving`: a batch's pick, whose budgeted members are reserved; a claim (no
    /// model declared) only skips a budget with nothing left.
    pub(super) fn fair_pick(
        &self,
        queue: &str,
        eligible: impl Fn(&Ext) -> bool,
        limit: usize,
        max_bytes: u64,
        reserving: bool,
    ) -> Pick {
        let mut pairs: BTreeMap<(String, String), Vec<u64>> = BTreeMap::new();
        for (seq, e) in &self.ext {
            if e.view.state == StateView::Pending && eligible(e) {
                pairs.entry((e.view.schema.clone(), e.view.tenant.clone())).or_default().push(*seq);
            }
        }
        let mut order: Vec<(String, String)> = pairs.keys().cloned().collect();
        if let Some(after) = self.rotations.get(queue) {
            let split = order.partition_point(|p| p <= after);
            order.rotate_left(split);
        }
        let mut pick = Pick { seqs: Vec::new(), reserved: Vec::new(), full: false, stopped_at: None };
        let cost = if reserving { ESTIMATE } else { 0 };
        let reserved: u64 = self.reservations.values().filter(|(t, _)| t == BUDGETED).map(|(_, m)| m).sum();
        let spent = self.spend.get(BUDGETED).copied().unwrap_or(0);
        let mut left = BUDGET_MICROS.saturating_sub(spent + reserved);
        if limit == 0 {
            return pick;
        }
        let mut bytes = 0u64;
        for (reached, pair) in order.iter().enumerate() {
            if reached == limit {
                pick.full = true;
                break;
            }
            pick.stopped_at = Some(pair.clone());
            for &seq in &pairs[pair] {
                let budgeted = pair.1 == BUDGETED;
                if budgeted && (cost > left || left == 0) {
                    break;
                }
                let size = self.ext[&seq].view.content_bytes;
                if !pick.seqs.is_empty() && bytes + size > max_bytes {
                    pick.full = true;
                    return pick;
                }
                bytes += size;
                pick.seqs.push(seq);
                if budgeted {
                    left -= cost;
                    pick.reserved.push(seq);
                }
                if pick.seqs.len() >= limit {
                    pick.full = true;
                    return pick;
                }
            }
        }
        pick
    }
}

impl Model {
    /// (tenant, micro-dollars, members) of the open reservations, by tenant.
    pub(super) fn reservation_totals(&self) -> Vec<(String, u64, u64)> {
        let mut totals: BTreeMap<String, (u64, u64)> = BTreeMap::new();
        for (tenant, micros) in self.reservations.values() {
            let t = totals.entry(tenant.clone()).or_default();
            t.0 += micros;
            t.1 += 1;
        }
        totals.into_iter().map(|(tenant, (micros, members))| (tenant, micros, members)).collect()
    }
}
