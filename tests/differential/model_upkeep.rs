//! The reference model's outbox deliveries, tenant erasure and the snapshot it shows.

use commitpoint::domain::lifecycle::StateName;
use commitpoint::store::ErasureReport;

use super::model::Model;
use super::ops::DeliveryPick;
use super::universe::{IDENTITY_COUNT, PROVIDERS, RETRY_AT_MS, TENANTS};
use super::view::*;

/// The outcome an intent emptied by an erasure is closed with.
const INTENT_EMPTIED: &str = "erased: every member's tenant was erased";

impl Model {
    /// Index into `outbox` of the `n`-th event in `state` (in sort-key order).
    fn pick_event(&self, dead: bool, n: usize) -> Option<usize> {
        let mut found: Vec<(String, usize)> = self
            .outbox
            .iter()
            .enumerate()
            .filter(|(_, e)| match e.view.state {
                DeliveryView::Pending => !dead,
                DeliveryView::Dead { .. } => dead,
                DeliveryView::Delivered { .. } => false,
            })
            .map(|(i, e)| (e.view.sort_key(), i))
            .collect();
        found.sort();
        (!found.is_empty()).then(|| found[n % found.len()].1)
    }

    pub(super) fn deliver(&mut self, n: usize, report: DeliveryPick) -> Answer {
        let Some(i) = self.pick_event(false, n) else { return Answer::Skipped };
        let event = &mut self.outbox[i].view;
        event.deliveries += 1;
        match report {
            DeliveryPick::Delivered => event.state = DeliveryView::Delivered { status: 204 },
            DeliveryPick::Retry => {
                event.retry_at_ms = Some(RETRY_AT_MS);
                event.last_error = Some("HTTP 503".into());
            }
            DeliveryPick::Dead => {
                event.last_error = Some("HTTP 410".into());
                event.state = DeliveryView::Dead { reason: "HTTP 410".into() };
            }
        }
        Answer::Event(Some(event.clone()))
    }

    pub(super) fn redeliver(&mut self, n: usize) -> Answer {
        let Some(i) = self.pick_event(true, n) else { return Answer::Skipped };
        let event = &mut self.outbox[i].view;
        event.state = DeliveryView::Pending;
        event.retry_at_ms = None;
        Answer::Event(Some(event.clone()))
    }

    /// Everything of the tenant but its spend totals; intents lose the erased members.
    pub(super) fn erase(&mut self, tenant: usize) -> ErasureReport {
        let tenant = TENANTS[tenant];
        let mut report = ErasureReport::default();
        let before = self.outbox.len();
        self.outbox.retain(|e| e.tenant != tenant);
        report.outbox_events = (before - self.outbox.len()) as u64;
        let ext = &self.ext;
        let before = self.deliveries.len();
        self.deliveries.retain(|_, seq| ext.get(seq).is_some_and(|e| e.view.tenant != tenant));
        report.webhook_deliveries = (before - self.deliveries.len()) as u64;
        let erased: Vec<u64> = self.ext.iter().filter(|(_, e)| e.view.tenant == tenant).map(|(s, _)| *s).collect();
        for seq in &erased {
            let Some(ext) = self.ext.remove(seq) else { continue };
            self.reservations.remove(seq);
            self.by_identity[ext.view.identity] = None;
            report.extractions += 1;
            report.contents += 1;
            report.findings += ext.findings.len() as u64;
            report.raw_results += u64::from(ext.result.is_some());
            report.staged_answers += u64::from(ext.staged.is_some());
            report.ledger_entries += ext.ledger.len() as u64;
            let charged: u64 = ext.ledger.iter().map(|l| l.cost_micros).sum();
            if charged > 0 {
                *self.erased_spend.entry(tenant.to_string()).or_default() += charged;
            }
        }
        if erased.is_empty() {
            return report;
        }
        for batch in self.batches.iter_mut().filter(|b| b.open && b.view.state == BatchStateView::Intent) {
            let kept: Vec<usize> = (0..batch.seqs.len()).filter(|&i| !erased.contains(&batch.seqs[i])).collect();
            if kept.len() == batch.seqs.len() {
                continue;
            }
            batch.view.members = kept.iter().map(|&i| batch.view.members[i]).collect();
            batch.seqs = kept.iter().map(|&i| batch.seqs[i]).collect();
            if batch.seqs.is_empty() {
                batch.view.state = BatchStateView::Closed { job_id: None, outcome: INTENT_EMPTIED.into() };
                batch.open = false;
                report.intents_closed += 1;
            }
        }
        report
    }

    pub fn snapshot(&self) -> Snapshot {
        let extractions = (0..IDENTITY_COUNT)
            .map(|identity| {
                let ext = self.ext.get(&self.live(identity)?)?;
                Some(Detail {
                    record: ext.view.clone(),
                    findings: ext.findings.values().cloned().collect(),
                    result: ext.result.clone(),
                    ledger: ext.ledger.clone(),
                })
            })
            .collect();
        let open_batches = self.batches.iter().filter(|b| b.open).map(|b| b.view.clone()).collect();
        let mut counts: Vec<(StateName, u64)> = Vec::new();
        for name in StateName::ALL {
            let n = self.ext.values().filter(|e| e.view.state.name() == name).count() as u64;
            if n > 0 {
                counts.push((name, n));
            }
        }
        counts.sort();
        let mut by_tenant: std::collections::BTreeMap<(String, String, StateName), u64> = Default::default();
        for ext in self.ext.values() {
            *by_tenant.entry((ext.view.tenant.clone(), ext.view.schema.clone(), ext.view.state.name())).or_default() +=
                1;
        }
        let tenant_counts = by_tenant.into_iter().map(|((t, s, state), n)| (t, s, state, n)).collect();
        let mut ready = Vec::new();
        for provider in PROVIDERS {
            for ext in self.ext.values() {
                if let (StateView::Ready { provider: p, .. }, Some(staged)) = (&ext.view.state, &ext.staged)
                    && p == provider
                {
                    ready.push((provider.to_string(), ext.view.identity, staged.clone()));
                }
            }
        }
        ready.sort_by_key(|(provider, identity, _)| (provider.clone(), *identity));
        let mut outbox: Vec<EventView> = self
            .outbox
            .iter()
            .filter(|e| !matches!(e.view.state, DeliveryView::Delivered { .. }))
            .map(|e| e.view.clone())
            .collect();
        sort_events(&mut outbox);
        let pending = outbox.iter().filter(|e| e.state == DeliveryView::Pending).count() as u64;
        let dead = outbox.len() as u64 - pending;
        let positive = |m: &std::collections::BTreeMap<String, u64>| {
            m.iter().filter(|(_, v)| **v > 0).map(|(k, v)| (k.clone(), *v)).collect::<Vec<_>>()
        };
        Snapshot {
            extractions,
            open_batches,
            counts,
            tenant_counts,
            ready,
            outbox,
            outbox_counts: (pending, dead),
            spend: positive(&self.spend),
            erased_spend: positive(&self.erased_spend),
            reservations: self.reservation_totals(),
        }
    }
}
