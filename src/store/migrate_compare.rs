//! The comparison after `migrate-store`'s copy, through the read APIs the layers above
//! use (the seam), on both backends: every extraction's record, findings, raw result and
//! ledger entries, the listings, counts by state, open batches and their members, the
//! outbox (pending and dead), spend per tenant, pause and sink flags, webhook delivery
//! ids, the cursor key, and every evaluation with its trials and trial batches. Equal
//! answers mean a server on the copy answers as the old one did.

use std::collections::BTreeSet;

use futures_util::{StreamExt, TryStreamExt};

use crate::domain::identity::ExtractionId;
use crate::store::seam::Backend;
use crate::store::{Error, ListFilter, OutboxFilter};

/// Reads the comparison runs at once on each side.
const IN_FLIGHT: usize = 16;
const PAGE: usize = 1_000;
/// Differences listed before the rest are only counted.
const SHOWN: usize = 20;

#[derive(Debug, Default)]
pub struct Comparison {
    pub extractions: u64,
    pub findings: u64,
    pub results: u64,
    pub ledger_entries: u64,
    pub outbox_events: u64,
    pub open_batches: u64,
    pub evaluations: u64,
    pub trials: u64,
    pub trial_batches: u64,
    pub mismatches: Vec<String>,
}

impl Comparison {
    fn differ(&mut self, what: String) {
        if self.mismatches.len() < SHOWN {
            self.mismatches.push(what);
        } else if self.mismatches.len() == SHOWN {
            self.mismatches.push("… (further differences not listed)".into());
        }
    }
}

/// What one extraction's reads found on one side, and how much of it.
#[derive(PartialEq)]
struct Detail {
    findings: Option<Vec<crate::store::FindingRecord>>,
    result: Option<crate::store::ResultRecord>,
    ledger: Option<Vec<crate::store::LedgerRecord>>,
}

async fn detail(store: &dyn Backend, id: ExtractionId) -> Result<Detail, Error> {
    let mut findings = store.findings(id).await?;
    if let Some(f) = findings.as_mut() {
        f.sort_by_key(|f| *f.key.as_bytes());
    }
    Ok(Detail { findings, result: store.result(id).await?, ledger: store.extraction_ledger(id).await? })
}

/// `paused` and `sinks`: the providers and sinks the source has a flag for. `started`
/// hears how many extractions there are to compare, `advance` how many more were.
pub(super) async fn compare(
    source: &dyn Backend,
    target: &dyn Backend,
    (paused, sinks): (Vec<String>, Vec<String>),
    started: &(dyn Fn(u64) + Send + Sync),
    advance: &(dyn Fn(u64) + Send + Sync),
) -> Result<Comparison, Error> {
    let mut out = Comparison::default();
    started(source.counts_by_state().await?.iter().map(|c| c.count).sum());
    let mut tenants = BTreeSet::new();
    let mut providers: BTreeSet<String> = paused.into_iter().collect();
    let mut after = 0;
    loop {
        let filter =
            || ListFilter { tenant: None, state: None, limit: PAGE, after, latest: false, newest_first: false };
        let (a, b) = (source.list(filter()).await?, target.list(filter()).await?);
        if a.records != b.records {
            out.differ(format!("the listing after sequence {after} differs"));
        }
        let details = futures_util::stream::iter(a.records.iter().map(|r| r.id))
            .map(|id| async move { Ok::<_, Error>((id, detail(source, id).await?, detail(target, id).await?)) })
            .buffered(IN_FLIGHT)
            .try_collect::<Vec<_>>()
            .await?;
        for (id, x, y) in details {
            out.findings += x.findings.as_ref().map_or(0, |f| f.len() as u64);
            out.results += u64::from(x.result.is_some());
            out.ledger_entries += x.ledger.as_ref().map_or(0, |l| l.len() as u64);
            if x != y {
                out.differ(format!("extraction {id}: its findings, raw result or ledger entries differ"));
            }
        }
        tenants.extend(a.records.iter().map(|r| r.tenant.clone()));
        out.extractions += a.records.len() as u64;
        advance(a.records.len() as u64);
        match a.next {
            Some(next) => after = next,
            None => break,
        }
    }
    if source.counts_by_state().await? != target.counts_by_state().await? {
        out.differ("the counts by state differ".into());
    }
    let tenants: Vec<String> = tenants.into_iter().collect();
    if source.spend_since(tenants.clone(), 0).await? != target.spend_since(tenants, 0).await? {
        out.differ("the spend per tenant differs".into());
    }
    compare_batches(source, target, &mut out, &mut providers).await?;
    compare_outbox(source, target, &mut out, sinks).await?;
    compare_evaluations(source, target, &mut out).await?;
    for provider in providers {
        if source.provider_paused(provider.clone()).await? != target.provider_paused(provider.clone()).await? {
            out.differ(format!("provider {provider:?}: the pause flag differs"));
        }
    }
    if source.cursor_key() != target.cursor_key() {
        out.differ("the cursor key differs: cursors and console sessions would not open".into());
    }
    Ok(out)
}

async fn compare_batches(
    source: &dyn Backend,
    target: &dyn Backend,
    out: &mut Comparison,
    providers: &mut BTreeSet<String>,
) -> Result<(), Error> {
    let (a, b) = (source.open_batches().await?, target.open_batches().await?);
    if a != b {
        out.differ("the open batches differ".into());
    }
    for batch in &a {
        providers.insert(batch.provider.to_string());
        let (x, y) = (source.batch_members(batch.seq).await?, target.batch_members(batch.seq).await?);
        let same = x.len() == y.len()
            && x.iter().zip(&y).all(|(m, n)| {
                (m.id, &m.source_id, &m.content, m.output_budget) == (n.id, &n.source_id, &n.content, n.output_budget)
            });
        if !same {
            out.differ(format!("batch #{}: its members (or their contents) differ", batch.seq));
        }
    }
    out.open_batches = a.len() as u64;
    Ok(())
}

async fn compare_outbox(
    source: &dyn Backend,
    target: &dyn Backend,
    out: &mut Comparison,
    sinks: Vec<String>,
) -> Result<(), Error> {
    let mut sinks: BTreeSet<String> = sinks.into_iter().collect();
    for filter in [OutboxFilter::Pending, OutboxFilter::Dead] {
        let mut after = 0;
        loop {
            let a = source.list_outbox(filter, after, PAGE).await?;
            if a != target.list_outbox(filter, after, PAGE).await? {
                out.differ(format!("the {filter:?} outbox events after #{after} differ"));
            }
            out.outbox_events += a.len() as u64;
            sinks.extend(a.iter().map(|e| e.sink.clone()));
            match a.last() {
                Some(last) if a.len() == PAGE => after = last.seq,
                _ => break,
            }
        }
    }
    let (a, b) = (source.outbox_counts().await?, target.outbox_counts().await?);
    if a != b {
        out.differ(format!("the outbox counts differ: {a:?} before, {b:?} after"));
    }
    for sink in sinks {
        if source.sink_disabled(sink.clone()).await? != target.sink_disabled(sink.clone()).await? {
            out.differ(format!("sink {sink:?}: the disabled flag differs"));
        }
    }
    Ok(())
}

/// Every evaluation record, each one's trials, and every trial batch, as the read APIs
/// return them (in the same order on both backends).
async fn compare_evaluations(source: &dyn Backend, target: &dyn Backend, out: &mut Comparison) -> Result<(), Error> {
    let (a, b) = (source.evaluations().await?, target.evaluations().await?);
    if a != b {
        out.differ("the evaluations differ".into());
    }
    for evaluation in &a {
        let name = evaluation.name.clone();
        let (x, y) = (source.trials(name.clone()).await?, target.trials(name).await?);
        if x != y {
            out.differ(format!("evaluation {:?}: its trials differ", evaluation.name));
        }
        out.trials += x.len() as u64;
    }
    out.evaluations = a.len() as u64;
    let (a, b) = (source.trial_batches(false).await?, target.trial_batches(false).await?);
    if a != b {
        out.differ("the trial batches differ".into());
    }
    out.trial_batches = a.len() as u64;
    Ok(())
}
