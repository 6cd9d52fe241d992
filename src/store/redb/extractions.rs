//! The write operations of the commit point. Each runs inside a group-commit batch,
//! finishes its reads and checks before its first write, and routes every state change
//! through `lifecycle::apply`.

use std::sync::Arc;

use redb::ReadableTable;

use super::codec::{decode, encode};
use super::ledger::record_charge;
use super::records::{ChargeKind, ExtractionRecord, Fence, FindingRecord, NewExtraction, ResultRecord, StoredContent};
use super::tables::required;
use super::write_tables::WriteTables;
use super::{Error, Store};
use crate::domain::identity::{ExtractionId, FindingKey};
use crate::domain::lifecycle::{self, Event, Outcome, State};
use crate::domain::names::LeaseToken;
use crate::store::seam::Charge;
use crate::store::seam::{
    ClaimRequest, DeliveryOutcome, EncodedFinding, Grant, IntakeOutcome, Judged, PostOutcome, PostResult, RetryOutcome,
    producer_of,
};

impl Store {
    /// Creates the extraction unless its identity exists. Durable before it returns.
    /// The single writer is the throughput limit, so everything that can happen before
    /// it does: a redelivery of a known identity is answered from a read snapshot (a commit
    /// is visible to readers only once it is durable), and the content is encoded on the
    /// caller's task. The writer still re-checks, for two first deliveries racing.
    pub async fn intake(&self, mut new: NewExtraction) -> Result<IntakeOutcome, Error> {
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
    pub async fn intake_delivery(
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

    pub async fn claim(&self, request: ClaimRequest) -> Result<Vec<Grant>, Error> {
        self.writer.write(move |t| claim(t, &request)).await
    }

    pub async fn post_result(&self, post: PostResult) -> Result<PostOutcome, Error> {
        self.writer.write(move |t| post_result(t, post)).await
    }

    /// Persists an operator's pause (or resume) of submissions to a provider.
    pub async fn set_provider_paused(&self, provider: String, paused: bool) -> Result<(), Error> {
        self.writer
            .write(move |t| {
                t.meta.insert(format!("{}{provider}", super::tables::META_PAUSE_PREFIX).as_str(), u64::from(paused))?;
                Ok(((), true))
            })
            .await
    }

    /// Round-trips an empty job through the writer thread: proof that it still commits.
    pub async fn ping_writer(&self) -> Result<(), Error> {
        self.writer.write(|_| Ok(((), false))).await
    }

    pub async fn retry(&self, id: ExtractionId) -> Result<RetryOutcome, Error> {
        self.writer.write(move |t| retry(t, &id)).await
    }
}

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
    t.pending_queue.insert((record.schema.as_str(), record.tenant.as_str(), seq), ())?;
    t.tenant_index.insert((record.tenant.as_str(), seq), ())?;
    Ok((IntakeOutcome { created: true, record }, true))
}

fn claim(t: &mut WriteTables<'_>, request: &ClaimRequest) -> Result<(Vec<Grant>, bool), Error> {
    let candidates = claim_candidates(t, request)?;
    let mut grants = Vec::with_capacity(candidates.len());
    for mut record in candidates {
        let lease_token = new_lease_token(record.claims + 1);
        let expires_at_ms = t.now_ms.saturating_add(request.lease_ms);
        let event = Event::Claim { worker: request.worker.clone(), lease_token: lease_token.clone(), expires_at_ms };
        // Candidates were selected as claimable in this same transaction, so a refusal
        // here would only mean a stale index entry: skip it rather than fail the batch.
        let Ok(Outcome::Changed(next)) = lifecycle::apply(&record.state, event, t.now_ms) else {
            continue;
        };
        let content = decode::<StoredContent>(&required(t.contents.get(record.seq)?, "content", record.seq)?)?.text;
        record.claims += 1;
        transition(t, &mut record, next)?;
        grants.push(Grant { record, content, lease_token, lease_expires_at_ms: expires_at_ms });
    }
    let wrote = !grants.is_empty();
    Ok((grants, wrote))
}

/// Expired leases first (their work has waited longest), then pending work in intake order.
fn claim_candidates(t: &WriteTables<'_>, request: &ClaimRequest) -> Result<Vec<ExtractionRecord>, Error> {
    let mut picked = Vec::new();
    let wanted = |r: &ExtractionRecord| request.schema.as_ref().is_none_or(|s| *s == r.schema);
    for entry in t.lease_index.range((0, 0)..(t.now_ms.saturating_add(1), 0))? {
        if picked.len() >= request.limit {
            return Ok(picked);
        }
        let record = load(t, entry?.0.value().1)?;
        if wanted(&record) {
            picked.push(record);
        }
    }
    let want = request.limit.saturating_sub(picked.len());
    let seqs = match &request.schema {
        // Only that schema's queue: work of other schemas is never read.
        Some(schema) => super::pending_queue::oldest(&t.pending_queue, schema, &|_| true, want)?,
        None => {
            let pending = lifecycle::StateName::Pending.code();
            let range = t.state_index.range((pending, 0)..=(pending, u64::MAX))?;
            range.take(want).map(|e| Ok(e?.0.value().1)).collect::<Result<_, Error>>()?
        }
    };
    for seq in seqs {
        picked.push(load(t, seq)?);
    }
    Ok(picked)
}

fn post_result(t: &mut WriteTables<'_>, post: PostResult) -> Result<(PostOutcome, bool), Error> {
    let Some(seq) = t.identity.get(post.id.as_bytes())?.map(|v| v.value()) else {
        return Ok((PostOutcome::NotFound, false));
    };
    let mut record = load(t, seq)?;
    let producer = producer_of(&record.state);
    let (event, fence) = post.event_and_fence();
    let next = match lifecycle::apply(&record.state, event, t.now_ms) {
        Ok(Outcome::Changed(next)) => next,
        Ok(Outcome::Replay) => {
            let findings = count_findings(t, seq)?;
            // The same answer again: counted, never charged.
            if let Some(charge) = &post.charge {
                record_charge(t, &record, charge, ChargeKind::Replay)?;
            }
            return Ok((PostOutcome::Replay { findings }, post.charge.is_some()));
        }
        Err(e) => {
            // A stale reporter's call was still paid for; its answer is just not used.
            if let Some(charge) = &post.charge {
                record_charge(t, &record, charge, ChargeKind::Fresh)?;
            }
            return Ok((PostOutcome::Rejected(e), post.charge.is_some()));
        }
    };
    // A provider's staged raw answer has served its purpose once the extraction leaves Ready.
    t.staged.remove(seq)?;
    let outcome = settle(t, &mut record, next, &Judged::from(&post.submission), post.charge.as_ref(), producer, fence)?;
    Ok((outcome, true))
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
    if let Some(charge) = charge {
        let kind = if matches!(next, State::Failed { .. }) { ChargeKind::FailedValidation } else { ChargeKind::Fresh };
        record_charge(t, record, charge, kind)?;
    }
    let outcome = match (&next, answer) {
        (State::Committed { .. }, Judged::Valid { output_json, findings }) => {
            let result = ResultRecord {
                output_json: output_json.clone(),
                producer,
                fence,
                usage: charge.map(|c| c.usage.clone()),
                latency_ms: charge.and_then(|c| c.latency_ms),
                received_at_ms: t.now_ms,
            };
            let written = write_findings(t, record, findings)?;
            t.results.insert(record.seq, encode(&result)?.as_slice())?;
            PostOutcome::Committed { findings: written }
        }
        (State::Failed { reason, .. }, _) => PostOutcome::Failed { reason: reason.clone() },
        _ => {
            return Err(Error::Corrupt {
                kind: "lifecycle",
                reason: format!("result produced unexpected state {:?}", next.name()),
            });
        }
    };
    transition(t, record, next)?;
    Ok(outcome)
}

/// Upserts by finding key, so an output that repeats a finding stores it once.
fn write_findings(
    t: &mut WriteTables<'_>,
    record: &ExtractionRecord,
    findings: &[EncodedFinding],
) -> Result<u64, Error> {
    for finding in findings {
        let key = FindingKey::compute(&record.id, &finding.canonical_identity);
        let stored = FindingRecord {
            key,
            canonical_identity: finding.canonical_identity.clone(),
            body_json: finding.body_json.clone(),
            committed_at_ms: t.now_ms,
        };
        t.findings.insert((record.seq, key.as_bytes()), encode(&stored)?.as_slice())?;
    }
    count_findings(t, record.seq)
}

fn retry(t: &mut WriteTables<'_>, id: &ExtractionId) -> Result<(RetryOutcome, bool), Error> {
    let Some(seq) = t.identity.get(id.as_bytes())?.map(|v| v.value()) else {
        return Ok((RetryOutcome::NotFound, false));
    };
    let mut record = load(t, seq)?;
    match lifecycle::apply(&record.state, Event::Retry, t.now_ms) {
        Ok(Outcome::Changed(next)) => {
            // An operator's retry starts the automatic policies over: a fresh allowance of
            // provider attempts and of truncation retries. A raised output budget is kept.
            record.attempt += 1;
            record.requeues = 0;
            record.truncation_retried = false;
            transition(t, &mut record, next)?;
            Ok((RetryOutcome::Retried(Box::new(record)), true))
        }
        Ok(Outcome::Replay) => Ok((RetryOutcome::Retried(Box::new(record)), false)),
        Err(e) => Ok((RetryOutcome::Rejected(e), false)),
    }
}

/// Persists a new state with its index entries. The only place a record's state changes.
pub(super) fn transition(t: &mut WriteTables<'_>, record: &mut ExtractionRecord, next: State) -> Result<(), Error> {
    let seq = record.seq;
    super::state_counts::unindex(t, record.state.name().code(), seq)?;
    if let State::Claimed { expires_at_ms, .. } = record.state {
        t.lease_index.remove((expires_at_ms, seq))?;
    }
    if let State::Claimed { expires_at_ms, .. } = next {
        t.lease_index.insert((expires_at_ms, seq), ())?;
    }
    super::state_counts::index(t, next.name().code(), seq)?;
    super::pending_queue::follow(t, record, &next)?;
    if let State::Committed { at_ms } = next {
        t.commit_index.insert((record.tenant.as_str(), at_ms, seq), ())?;
    }
    super::outbox::enqueue_events(t, record, &next)?;
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

/// Fencing tokens: the claim number makes them ordered for humans, the random part
/// makes them unguessable for other workers.
fn new_lease_token(claim_number: u32) -> LeaseToken {
    LeaseToken::new(format!("lt-{claim_number}-{:032x}", rand::random::<u128>()))
}
