//! The write operations of the commit point. Each runs inside a group-commit batch,
//! finishes its reads and checks before its first write, and routes every state change
//! through `lifecycle::apply`.

use super::records::FindingRecord;
use super::records::ResultRecord;
use super::tables;
use crate::domain::lifecycle::StateName;
use crate::store::seam::CancelOutcome;
use crate::store::seam::ExportFilter;
use crate::store::seam::Extractions;
use crate::store::seam::ListFilter;
use crate::store::seam::ListPage;
use crate::store::seam::RetryFilter;
use crate::store::seam::SourceContent;
use crate::store::seam::StateCount;
use crate::store::seam::TenantDepth;
use async_trait::async_trait;
use std::collections::HashMap;
use std::sync::Arc;

use redb::ReadableTable;

use super::codec::{decode, encode};
use super::ledger::record_charge;
use super::records::{ExtractionRecord, Fence, NewExtraction, StoredContent};
use super::rules::operator::{self, Step};
use super::rules::{claim, lease, post};
use super::tables::required;
use super::write_tables::WriteTables;
use super::{Error, Store};
use crate::domain::identity::{ExtractionId, IdPrefix};
use crate::domain::lifecycle::State;
use crate::store::seam::Charge;
use crate::store::seam::{
    ClaimRequest, DeliveryOutcome, ExtendOutcome, Grant, IntakeOutcome, Judged, LeaseExtension, PostOutcome,
    PostResult, RetryOutcome,
};

fn intake(
    t: &mut WriteTables<'_>,
    new: NewExtraction,
    content_len: u64,
    content: Arc<[u8]>,
) -> Result<(IntakeOutcome, bool), Error> {
    if let Some(seq) = t.identity.get(new.id.as_bytes())?.map(|v| v.value()) {
        let record = load(t, seq)?;
        return Ok((IntakeOutcome { created: false, record }, false));
    }
    let seq = t.allocate_seq();
    let record = new.pending(seq, content_len, t.now_ms);
    let record_bytes = encode(&record)?;
    t.identity.insert(record.id.as_bytes(), seq)?;
    t.extractions.insert(seq, record_bytes.as_slice())?;
    t.contents.insert(seq, &*content)?;
    super::state_counts::index(t, record.state.name().code(), seq)?;
    super::tenant_counts::moved(t, &record, None, Some(record.state.name()))?;
    t.pending_queue.insert((record.schema.as_str(), record.tenant.as_str(), seq), ())?;
    t.tenant_index.insert((record.tenant.as_str(), seq), ())?;
    super::revisions::index(t, &record)?;
    Ok((IntakeOutcome { created: true, record }, true))
}

fn claim(t: &mut WriteTables<'_>, request: &ClaimRequest) -> Result<(Vec<Grant>, bool), Error> {
    let (candidates, reserved) = claim_candidates(t, request)?;
    let mut grants = Vec::with_capacity(candidates.len());
    for (mut record, micros) in candidates.into_iter().zip(reserved) {
        // Candidates were selected as claimable in this same transaction, so a refusal
        // here would only mean a stale index entry.
        let Some((next, lease)) = claim::claim(&mut record, request, t.now_ms, rand::random()) else {
            continue;
        };
        let content = decode::<StoredContent>(&required(t.contents.get(record.seq)?, "content", record.seq)?)?.text;
        transition(t, &mut record, next)?;
        if let Some(micros) = micros.filter(|&m| m > 0) {
            super::reservations::reserve(t, &record, micros)?;
        }
        grants.push(lease.grant(record, content));
    }
    let wrote = !grants.is_empty();
    Ok((grants, wrote))
}

/// Expired leases first (their work has waited longest; a reservation they hold stays),
/// then pending work by the fair pick (`rules::fair`), with what each is reserved at.
fn claim_candidates(
    t: &WriteTables<'_>,
    request: &ClaimRequest,
) -> Result<(Vec<ExtractionRecord>, Vec<Option<u64>>), Error> {
    let mut picked = Vec::new();
    for entry in t.lease_index.range((0, 0)..(t.now_ms.saturating_add(1), 0))? {
        if picked.len() >= request.limit {
            let none = vec![None; picked.len()];
            return Ok((picked, none));
        }
        let record = load(t, entry?.0.value().1)?;
        if claim::wanted(request, &record) {
            picked.push(record);
        }
    }
    let limits = claim::limits(request, picked.len());
    let queue = claim::queue(request);
    let mut rotation = t.policies.rotations.take(&queue);
    // Only the asked schema's queue (or every schema's, tenant by tenant): work the pick
    // does not reach is never read.
    let (schema, accepted, estimate) = (request.schema.as_deref(), claim::accepted(request), request.estimate.as_ref());
    let mut pending = super::pending_queue::pick(t, schema, &accepted, estimate, limits, &rotation);
    if let Ok(pending) = &mut pending {
        rotation.keep(pending);
    }
    t.policies.rotations.put(&queue, rotation);
    let pending = pending?;
    let mut reserved = vec![None; picked.len()];
    picked.extend(pending.items);
    reserved.extend(pending.reserved);
    Ok((picked, reserved))
}

fn post_result(t: &mut WriteTables<'_>, post: PostResult) -> Result<(PostOutcome, bool), Error> {
    let Some(seq) = t.identity.get(post.id.as_bytes())?.map(|v| v.value()) else {
        return Ok((PostOutcome::NotFound, false));
    };
    let mut record = load(t, seq)?;
    let plan = post::plan_post(&record, &post, t.now_ms)?;
    let wrote = plan.writes();
    Ok((carry_out(t, &mut record, plan)?, wrote))
}

/// Applies a result's outcome (`next`: committed or failed) to a record whose lifecycle
/// check passed: the charge, the result and its findings, the state change. Shared by a
/// post and by ingestion, which commits a provider's judged answer as it stages it.
pub(super) fn settle(
    t: &mut WriteTables<'_>,
    record: &mut ExtractionRecord,
    next: State,
    answer: &Judged,
    charge: Option<&Charge>,
    producer: String,
    fence: Fence,
) -> Result<PostOutcome, Error> {
    let plan = post::plan_settle(record, next, answer, charge, producer, fence, t.now_ms)?;
    carry_out(t, record, plan)
}

/// Makes a result's writes (`rules::post`) in this transaction.
fn carry_out(
    t: &mut WriteTables<'_>,
    record: &mut ExtractionRecord,
    plan: post::Plan<'_>,
) -> Result<PostOutcome, Error> {
    if let Some((charge, kind)) = plan.charge {
        record_charge(t, record, charge, kind)?;
    }
    if plan.drop_staged {
        t.staged.remove(record.seq)?;
    }
    for finding in &plan.findings {
        t.findings.insert((record.seq, finding.key.as_bytes()), encode(finding)?.as_slice())?;
    }
    if let Some(result) = &plan.result {
        t.results.insert(record.seq, encode(result)?.as_slice())?;
    }
    plan.change.apply(record);
    if let Some(next) = plan.next {
        // A commit also settles the links among its source's revisions (`rules::revision`).
        let commits = matches!(next, State::Committed { .. });
        let revision = if commits { Some(super::revisions::plan(t, record, &plan.findings)?) } else { None };
        revision.iter().for_each(|r| r.link(record));
        transition_as(t, record, next, revision.as_ref().map(|r| &r.committed_kind))?;
        if let Some(revision) = revision {
            super::revisions::carry_out(t, record, revision)?;
        }
    }
    let findings = if plan.answer.counts_findings() { count_findings(t, record.seq)? } else { 0 };
    Ok(plan.answer.outcome(findings))
}

fn retry(t: &mut WriteTables<'_>, id: &ExtractionId) -> Result<(RetryOutcome, bool), Error> {
    let Some(seq) = t.identity.get(id.as_bytes())?.map(|v| v.value()) else {
        return Ok((RetryOutcome::NotFound, false));
    };
    let mut record = load(t, seq)?;
    match operator::retry(&mut record, t.now_ms) {
        Step::Move(next) => {
            transition(t, &mut record, next)?;
            Ok((RetryOutcome::Retried(Box::new(record)), true))
        }
        Step::Answer(outcome) => Ok((outcome, false)),
    }
}

fn extend_lease(t: &mut WriteTables<'_>, extension: &LeaseExtension) -> Result<(ExtendOutcome, bool), Error> {
    let Some(seq) = t.identity.get(extension.id.as_bytes())?.map(|v| v.value()) else {
        return Ok((ExtendOutcome::NotFound, false));
    };
    let mut record = load(t, seq)?;
    match lease::extend(&record, extension, t.now_ms) {
        Step::Move(next) => {
            transition(t, &mut record, next)?;
            Ok((lease::extended(&record.state), true))
        }
        Step::Answer(outcome) => Ok((outcome, false)),
    }
}

/// Persists a new state with its index entries. The only place a record's state changes.
pub(super) fn transition(t: &mut WriteTables<'_>, record: &mut ExtractionRecord, next: State) -> Result<(), Error> {
    transition_as(t, record, next, None)
}

/// [`transition`], with the kind of a commit's events (`rules::revision` decides it).
fn transition_as(
    t: &mut WriteTables<'_>,
    record: &mut ExtractionRecord,
    next: State,
    committed: Option<&super::records::OutboxKind>,
) -> Result<(), Error> {
    let seq = record.seq;
    super::state_counts::unindex(t, record.state.name().code(), seq)?;
    if let State::Claimed { expires_at_ms, .. } = record.state {
        t.lease_index.remove((expires_at_ms, seq))?;
    }
    if let State::Claimed { expires_at_ms, .. } = next {
        t.lease_index.insert((expires_at_ms, seq), ())?;
    }
    super::state_counts::index(t, next.name().code(), seq)?;
    super::tenant_counts::moved(t, record, Some(record.state.name()), Some(next.name()))?;
    super::pending_queue::follow(t, record, &next)?;
    super::reservations::follow(t, record, record.state.name(), next.name())?;
    if let State::Committed { at_ms } = next {
        t.commit_index.insert((record.tenant.as_str(), at_ms, seq), ())?;
    }
    super::outbox::enqueue_events(t, record, &next, committed)?;
    record.state = next;
    record.updated_at_ms = t.now_ms;
    t.extractions.insert(seq, encode(&*record)?.as_slice())?;
    Ok(())
}

pub(super) fn load(t: &WriteTables<'_>, seq: u64) -> Result<ExtractionRecord, Error> {
    decode(&required(t.extractions.get(seq)?, "extraction", seq)?)
}

fn count_findings(t: &WriteTables<'_>, seq: u64) -> Result<u64, Error> {
    let low: &[u8; 32] = &[0; 32];
    let high: &[u8; 32] = &[0xff; 32];
    Ok(t.findings.range((seq, low)..=(seq, high))?.count() as u64)
}

#[async_trait]
impl Extractions for Store {
    async fn cancel(&self, id: ExtractionId) -> Result<CancelOutcome, Error> {
        self.writer.write(move |t| super::cancel::cancel(t, &id)).await
    }

    /// Moves up to `limit` failed extractions matching `filter` back to pending, in intake
    /// order, `RETRY_CHUNK` per transaction. Returns how many moved. Extractions that fail
    /// while it runs may or may not be taken, as with any retry issued a moment later.
    async fn retry_failed(&self, filter: RetryFilter, limit: u64) -> Result<u64, Error> {
        let mut walk = operator::RetryWalk::new(limit);
        while let Some((after, want)) = walk.next_chunk() {
            let f = filter.clone();
            let (moved, next) = self.writer.write(move |t| super::cancel::retry_chunk(t, &f, after, want)).await?;
            walk.advance(moved, next);
        }
        Ok(walk.retried())
    }

    /// [`Store::export`] for a sink that keeps its own state (the seam's form): `sink`
    /// gets `Some` per extraction and `None` once the walk is complete.
    async fn export_to(&self, filter: ExportFilter, mut sink: super::seam::ExportSink) -> Result<(), Error> {
        self.read(move |txn| {
            super::export::walk(txn, &filter, |item| sink(Some(item)))?;
            sink(None);
            Ok(())
        })
        .await
    }

    /// Creates the extraction unless its identity exists. Durable before it returns.
    /// The single writer is the throughput limit, so everything that can happen before
    /// it does: a redelivery of a known identity is answered from a read snapshot (a commit
    /// is visible to readers only once it is durable), and the content is encoded on the
    /// caller's task. The writer still re-checks, for two first deliveries racing.
    async fn intake(&self, mut new: NewExtraction) -> Result<IntakeOutcome, Error> {
        if let Some(record) = self.get(new.id).await? {
            return Ok(IntakeOutcome { created: false, record });
        }
        let content_len = new.content.len() as u64;
        // Shared, not copied: the writer clones a job each time it applies it.
        let content: Arc<[u8]> = encode(&StoredContent { text: std::mem::take(&mut new.content) })?.into();
        self.writer.write(move |t| intake(t, new, content_len, content)).await
    }

    /// Intake on behalf of a signed webhook delivery. The delivery id is recorded in the
    /// same transaction, so a redelivery (even one whose content changed) is answered with
    /// the extraction the first delivery created and writes nothing.
    async fn intake_delivery(
        &self,
        endpoint: String,
        delivery_id: String,
        mut new: NewExtraction,
    ) -> Result<DeliveryOutcome, Error> {
        if let Some(record) = self.delivered(endpoint.clone(), delivery_id.clone()).await? {
            return Ok(DeliveryOutcome::Redelivery(record));
        }
        let content_len = new.content.len() as u64;
        // Shared, not copied: the writer clones a job each time it applies it.
        let content: Arc<[u8]> = encode(&StoredContent { text: std::mem::take(&mut new.content) })?.into();
        self.writer
            .write(move |t| {
                if let Some(seq) =
                    t.webhook_deliveries.get((endpoint.as_str(), delivery_id.as_str()))?.map(|v| v.value())
                {
                    return Ok((DeliveryOutcome::Redelivery(load(t, seq)?), false));
                }
                let (outcome, _) = intake(t, new, content_len, content)?;
                t.webhook_deliveries.insert((endpoint.as_str(), delivery_id.as_str()), outcome.record.seq)?;
                Ok((DeliveryOutcome::First(outcome), true))
            })
            .await
    }

    async fn claim(&self, request: ClaimRequest) -> Result<Vec<Grant>, Error> {
        self.writer.write(move |t| claim(t, &request)).await
    }

    async fn post_result(&self, post: PostResult) -> Result<PostOutcome, Error> {
        self.writer.write(move |t| post_result(t, post)).await
    }

    async fn retry(&self, id: ExtractionId) -> Result<RetryOutcome, Error> {
        self.writer.write(move |t| retry(t, &id)).await
    }

    async fn extend_lease(&self, extension: LeaseExtension) -> Result<ExtendOutcome, Error> {
        self.writer.write(move |t| extend_lease(t, &extension)).await
    }

    /// The extraction a webhook delivery created, if that delivery was seen before.
    async fn delivered(&self, endpoint: String, delivery_id: String) -> Result<Option<ExtractionRecord>, Error> {
        self.read_point(|txn| {
            let deliveries = txn.open_table(tables::WEBHOOK_DELIVERIES)?;
            let Some(seq) = deliveries.get((endpoint.as_str(), delivery_id.as_str()))?.map(|v| v.value()) else {
                return Ok(None);
            };
            let extractions = txn.open_table(tables::EXTRACTIONS)?;
            extractions.get(seq)?.map(|v| decode(v.value())).transpose()
        })
    }

    /// An extraction by its sequence number (the outbox refers to records this way).
    async fn get_by_seq(&self, seq: u64) -> Result<Option<ExtractionRecord>, Error> {
        self.read_point(|txn| txn.open_table(tables::EXTRACTIONS)?.get(seq)?.map(|v| decode(v.value())).transpose())
    }

    async fn get(&self, id: ExtractionId) -> Result<Option<ExtractionRecord>, Error> {
        self.read_point(|txn| super::reads::get(txn, &id))
    }

    async fn with_id_prefix(
        &self,
        prefix: IdPrefix,
        tenant: Option<String>,
        limit: usize,
    ) -> Result<Vec<ExtractionRecord>, Error> {
        self.read(move |txn| {
            let (low, high) = prefix.bounds();
            let identity = txn.open_table(tables::IDENTITY)?;
            let records =
                identity.range::<&[u8; 32]>(&low..=&high)?.map(|entry| super::reads::by_seq(txn, entry?.1.value()));
            let theirs = |r: &Result<ExtractionRecord, Error>| {
                r.as_ref().map_or(true, |r| tenant.as_ref().is_none_or(|t| *t == r.tenant))
            };
            records.filter(theirs).take(limit).collect()
        })
        .await
    }

    /// The findings of an extraction, or `None` when the extraction does not exist.
    async fn findings(&self, id: ExtractionId) -> Result<Option<Vec<FindingRecord>>, Error> {
        self.read(move |txn| {
            let Some(record) = super::reads::get(txn, &id)? else {
                return Ok(None);
            };
            let table = txn.open_table(tables::FINDINGS)?;
            let (low, high): (&[u8; 32], &[u8; 32]) = (&[0; 32], &[0xff; 32]);
            let mut out = Vec::new();
            for entry in table.range((record.seq, low)..=(record.seq, high))? {
                out.push(decode(entry?.1.value())?);
            }
            Ok(Some(out))
        })
        .await
    }

    /// Up to `limit` findings after the key `after`, in key order, and whether more
    /// follow; `None` when the extraction does not exist.
    async fn findings_page(
        &self,
        id: ExtractionId,
        after: Option<[u8; 32]>,
        limit: usize,
    ) -> Result<Option<(Vec<FindingRecord>, bool)>, Error> {
        self.read(move |txn| {
            let Some(record) = super::reads::get(txn, &id)? else {
                return Ok(None);
            };
            let table = txn.open_table(tables::FINDINGS)?;
            let start = after.unwrap_or([0; 32]);
            let mut out = Vec::new();
            for entry in table.range((record.seq, &start)..=(record.seq, &[0xff; 32]))? {
                let (key, value) = entry?;
                if after.is_some_and(|a| key.value().1 == &a) {
                    continue;
                }
                if out.len() == limit {
                    return Ok(Some((out, true)));
                }
                out.push(decode(value.value())?);
            }
            Ok(Some((out, false)))
        })
        .await
    }

    async fn result(&self, id: ExtractionId) -> Result<Option<ResultRecord>, Error> {
        self.read(move |txn| {
            let Some(record) = super::reads::get(txn, &id)? else {
                return Ok(None);
            };
            let table = txn.open_table(tables::RESULTS)?;
            let value = table.get(record.seq)?;
            value.map(|v| decode(v.value())).transpose()
        })
        .await
    }

    /// How many extractions are in each state, and when the longest-waiting one entered it.
    async fn counts_by_state(&self) -> Result<Vec<StateCount>, Error> {
        self.read(|txn| {
            let index = txn.open_table(tables::STATE_INDEX)?;
            let mut counts = Vec::with_capacity(StateName::ALL.len());
            for (state, count) in super::state_counts::read(txn)? {
                let code = state.code();
                // Intake order approximates waiting order: the first entry is the oldest.
                let first = index.range((code, 0)..=(code, u64::MAX))?.next().transpose()?;
                let oldest_since_ms = match first {
                    Some((key, _)) => Some(super::reads::by_seq(txn, key.value().1)?.updated_at_ms),
                    None => None,
                };
                counts.push(StateCount { state, count, oldest_since_ms });
            }
            Ok(counts)
        })
        .await
    }

    async fn depth_by_tenant(&self) -> Result<Vec<TenantDepth>, Error> {
        self.read(super::tenant_counts::read).await
    }

    async fn list(&self, filter: ListFilter) -> Result<ListPage, Error> {
        self.read(move |txn| super::reads::list(txn, &filter)).await
    }

    /// The `RETIRED_*` bits of each of `seqs` that retention touched (absent: nothing dropped).
    async fn retired(&self, seqs: Vec<u64>) -> Result<HashMap<u64, u8>, Error> {
        self.read(move |txn| {
            let retired = txn.open_table(tables::RETIRED)?;
            let mut out = HashMap::new();
            for seq in seqs {
                if let Some(bits) = retired.get(seq)? {
                    out.insert(seq, bits.value());
                }
            }
            Ok(out)
        })
        .await
    }

    async fn sources(&self, ids: Vec<ExtractionId>) -> Result<HashMap<ExtractionId, SourceContent>, Error> {
        self.read(move |txn| {
            let contents = txn.open_table(tables::CONTENTS)?;
            let mut out = HashMap::with_capacity(ids.len());
            for id in ids {
                let Some(record) = super::reads::get(txn, &id)? else { continue };
                let Some(value) = contents.get(record.seq)? else { continue };
                let content = decode::<StoredContent>(value.value())?.text;
                out.insert(id, SourceContent { source_id: record.source_id, content });
            }
            Ok(out)
        })
        .await
    }
}
