//! Reads everything a backend shows through the seam into a [`Snapshot`].

use commitpoint::domain::lifecycle::StateName;
use commitpoint::store::{Error, LedgerRecord, OutboxFilter};

use super::subject::Subject;
use super::universe::{self, IDENTITY_COUNT, PROVIDERS, TENANTS};
use super::view::*;

impl Subject {
    pub async fn snapshot(&self) -> Result<Snapshot, Error> {
        let mut extractions = Vec::with_capacity(IDENTITY_COUNT);
        for identity in 0..IDENTITY_COUNT {
            extractions.push(self.detail(identity).await?);
        }
        let mut open_batches: Vec<BatchView> =
            self.store.open_batches().await?.iter().map(|b| self.batch_view(b)).collect();
        open_batches.sort_by_key(|b| b.label);
        let mut counts: Vec<(StateName, u64)> =
            self.store.counts_by_state().await?.iter().filter(|c| c.count > 0).map(|c| (c.state, c.count)).collect();
        counts.sort();
        let mut tenant_counts = Vec::new();
        for depth in self.store.depth_by_tenant().await? {
            for (state, n) in &depth.counts {
                tenant_counts.push((depth.tenant.clone(), depth.schema.clone(), *state, *n));
            }
        }
        tenant_counts.sort();
        let mut ready = Vec::new();
        for provider in PROVIDERS {
            for item in self.store.ready_items(provider.into(), 1000).await? {
                let staged = StagedView {
                    provider: item.staged.provider.clone(),
                    job_id: item.staged.job_id.clone(),
                    output_json: item.staged.output_json.clone(),
                    usage: item.staged.usage.clone(),
                    latency: item.staged.latency_ms.is_some(),
                };
                ready.push((provider.to_string(), self.extraction(&item.record).identity, staged));
            }
        }
        ready.sort_by_key(|(provider, identity, _)| (provider.clone(), *identity));
        let (pending, dead, _) = self.store.outbox_counts().await?;
        let mut spend: Vec<(String, u64)> = self
            .store
            .spend_since(TENANTS.iter().map(|t| t.to_string()).collect(), 0)
            .await?
            .into_iter()
            .filter(|(_, micros)| *micros > 0)
            .collect();
        spend.sort();
        let mut erased_spend = Vec::new();
        for tenant in TENANTS {
            let micros = self.store.erased_spend(tenant.into(), 0, u64::MAX).await?;
            if micros > 0 {
                erased_spend.push((tenant.to_string(), micros));
            }
        }
        Ok(Snapshot {
            extractions,
            open_batches,
            counts,
            tenant_counts,
            ready,
            outbox: self.events().await?,
            outbox_counts: (pending, dead),
            spend,
            erased_spend,
            reservations: self
                .store
                .reservations()
                .await?
                .into_iter()
                .map(|r| (r.tenant, r.micros, r.members))
                .collect(),
        })
    }

    async fn detail(&self, identity: usize) -> Result<Option<Detail>, Error> {
        let id = universe::id_of(identity);
        let Some(record) = self.store.get(id).await? else { return Ok(None) };
        let mut findings: Vec<FindingView> = self
            .store
            .findings(id)
            .await?
            .unwrap_or_default()
            .into_iter()
            .map(|f| FindingView {
                key: f.key.to_hex(),
                canonical_identity: f.canonical_identity,
                body_json: f.body_json,
            })
            .collect();
        findings.sort_by(|a, b| a.key.cmp(&b.key));
        let result = self.store.result(id).await?.map(|r| ResultView {
            output_json: r.output_json,
            producer: r.producer,
            fence: self.fence(&r.fence),
            usage: r.usage,
            latency: r.latency_ms.is_some(),
        });
        let ledger = self.store.extraction_ledger(id).await?.unwrap_or_default().iter().map(ledger_view).collect();
        Ok(Some(Detail { record: self.extraction(&record), findings, result, ledger }))
    }

    /// Pending and dead events (delivered ones are seen in the answers that delivered them).
    async fn events(&self) -> Result<Vec<EventView>, Error> {
        let mut events = Vec::new();
        for filter in [OutboxFilter::Pending, OutboxFilter::Dead] {
            events.extend(self.store.list_outbox(filter, 0, 1000).await?.iter().map(|e| self.event(e)));
        }
        sort_events(&mut events);
        Ok(events)
    }

    /// Raw event ids and batch keys, after checking that an event id names one event of
    /// one attempt (the same for every sink, different for anything else).
    pub async fn identifiers(&self) -> Result<Identifiers, Error> {
        let mut event_ids: Vec<(String, String)> = Vec::new();
        for filter in [OutboxFilter::Pending, OutboxFilter::Dead] {
            for event in self.store.list_outbox(filter, 0, 1000).await? {
                let view = self.event(&event);
                let what = format!("{:?}", (view.identity, view.incarnation, view.attempt, kind_tag(&view)));
                event_ids.push((what, event.event_id));
            }
        }
        event_ids.sort();
        event_ids.dedup();
        for (i, (what, id)) in event_ids.iter().enumerate() {
            for (other, other_id) in &event_ids[i + 1..] {
                assert!(
                    (what == other) == (id == other_id),
                    "{}: event ids do not name events one to one: {what} has {id}, {other} has {other_id}",
                    self.backend()
                );
            }
        }
        Ok(Identifiers { event_ids, batch_keys: self.batch_keys() })
    }
}

fn kind_tag(view: &EventView) -> &'static str {
    match view.kind {
        commitpoint::store::OutboxKind::Committed | commitpoint::store::OutboxKind::Revision { .. } => "committed",
        commitpoint::store::OutboxKind::Superseded { .. } => "superseded",
        commitpoint::store::OutboxKind::Failed { .. } => "failed",
        commitpoint::store::OutboxKind::Cancelled => "cancelled",
    }
}

fn ledger_view(entry: &LedgerRecord) -> LedgerView {
    LedgerView {
        attempt: entry.attempt,
        kind: entry.kind,
        provider: entry.provider.clone(),
        job_id: entry.job_id.clone(),
        usage: entry.usage.clone(),
        latency: entry.latency_ms.is_some(),
        cost_micros: entry.cost_micros,
        list_cost_micros: entry.list_cost_micros,
        cost_source: entry.cost_source,
    }
}
