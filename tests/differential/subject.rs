//! A real backend driven through the seam (`SharedStore`): each operation becomes the
//! calls the service or the engine would make, and each answer is turned into its view.
//! The same code drives redb and PostgreSQL.

use std::collections::HashMap;

use commitpoint::domain::batch::{LineResult, OutputBudget};
use commitpoint::domain::identity::ExtractionId;
use commitpoint::domain::lifecycle::{FailureClass, State};
use commitpoint::domain::names::{BatchKey, LeaseToken};
use commitpoint::store::{
    Authority, BatchRecord, BatchState, Charge, ClaimRequest, DeliveryOutcome, DeliveryReport, Error, ExtendOutcome,
    ExtractionRecord, Flush, IngestLine, IntentOutcome, IntentRequest, LeaseExtension, Leftover, MemberRules,
    OutboxFilter, OutboxRecord, PostResult, ReadyItem, RetryFilter, SharedStore, WorkFilter, WorkScope,
};

use super::ops::{AuthorityPick, DeliveryPick, LeftoverPick, LineKind, LinePick, LineTarget, Op, RulesPick, TokenPick};
use super::universe::{self, IDENTITY_COUNT, PROVIDERS, RETRY_AT_MS, SCHEMAS, TENANTS};
use super::view::*;

pub const FORGED_TOKEN: &str = "lt-1-forged";
pub const FORGED_BATCH: &str = "cpb-forged";

pub fn member_rules(pick: RulesPick) -> MemberRules {
    MemberRules {
        max_attempts: pick.max_attempts,
        budget: OutputBudget { default: pick.default_budget.then_some(1000), cap: 3000 },
        batch_api: pick.batch_api,
    }
}

/// A backend and the harness's names for what it handed out.
pub struct Subject {
    pub store: SharedStore,
    pub rules: MemberRules,
    /// Extraction sequence numbers → (identity, incarnation).
    seqs: HashMap<u64, (usize, u32)>,
    incarnations: [u32; IDENTITY_COUNT],
    tokens: HashMap<LeaseToken, TokenLabel>,
    /// Per identity, every token granted for it, oldest first.
    granted: Vec<Vec<LeaseToken>>,
    last_granted: usize,
    /// Per batch label: its sequence number, key and the identities it was created with.
    batches: Vec<(u64, BatchKey, Vec<usize>)>,
}

impl Subject {
    pub fn new(store: SharedStore, rules: RulesPick) -> Self {
        Subject {
            store,
            rules: member_rules(rules),
            seqs: HashMap::new(),
            incarnations: [0; IDENTITY_COUNT],
            tokens: HashMap::new(),
            granted: vec![Vec::new(); IDENTITY_COUNT + 1],
            last_granted: IDENTITY_COUNT,
            batches: Vec::new(),
        }
    }

    pub fn backend(&self) -> &'static str {
        self.store.backend_name()
    }

    pub async fn apply(&mut self, index: usize, op: &Op) -> Result<Answer, Error> {
        let store = self.store.clone();
        Ok(match op {
            Op::Intake { identity } => {
                let outcome = store.intake(universe::new_extraction(*identity)).await?;
                self.learn(&outcome.record, outcome.created);
                Answer::Intake { created: outcome.created, record: self.extraction(&outcome.record) }
            }
            Op::IntakeDelivery { endpoint, delivery, identity } => {
                let (endpoint, delivery) = (format!("hook-{endpoint}"), format!("dlv-{delivery}"));
                let new = universe::new_extraction(*identity);
                match store.intake_delivery(endpoint, delivery, new).await? {
                    DeliveryOutcome::First(outcome) => {
                        self.learn(&outcome.record, outcome.created);
                        Answer::Delivery { first: Some(outcome.created), record: self.extraction(&outcome.record) }
                    }
                    DeliveryOutcome::Redelivery(record) => {
                        Answer::Delivery { first: None, record: self.extraction(&record) }
                    }
                }
            }
            Op::Claim { worker, limit, short_lease, schema, only } => {
                let request = ClaimRequest {
                    worker: format!("w{worker}"),
                    limit: *limit,
                    lease_ms: if *short_lease { 0 } else { 3_600_000 },
                    schema: schema.map(|s| SCHEMAS[s].to_string()),
                    estimate: None,
                    scope: WorkScope { tenants: only.map(|t| vec![TENANTS[t].to_string()]), schemas: None },
                };
                let grants = store.claim(request).await?;
                let mut out = Vec::new();
                for grant in grants {
                    let identity = self.identity_of(grant.record.seq);
                    let claim_number =
                        grant.lease_token.as_str().split('-').nth(1).and_then(|n| n.parse().ok()).unwrap_or(0);
                    self.tokens
                        .insert(grant.lease_token.clone(), TokenLabel { claim_op: index, identity, claim_number });
                    self.granted[identity.min(IDENTITY_COUNT)].push(grant.lease_token.clone());
                    self.last_granted = identity.min(IDENTITY_COUNT);
                    out.push((self.extraction(&grant.record), grant.content));
                }
                Answer::Grants(out)
            }
            Op::Post { identity, authority, ok, findings, paid, again } => {
                let identity = &identity.unwrap_or(self.last_granted);
                let authority = match authority {
                    AuthorityPick::Lease(pick) => Authority::Lease(self.token(*identity, *pick)),
                    AuthorityPick::Batch(n) => Authority::Batch(
                        self.batch(*n).map_or_else(|| BatchKey::from(FORGED_BATCH), |(_, key, _)| key.clone()),
                    ),
                };
                let mut outcomes = Vec::new();
                for request in universe::post_requests(*paid, *again) {
                    let charge = request.map(|(latency, request)| Charge {
                        provider: "worker-llm".into(),
                        job_id: None,
                        usage: universe::usage("m", 100, 20 + findings.len() as u64, format!("req-w{request}")),
                        latency_ms: latency.then_some(1500),
                        batch: false,
                    });
                    let submission = universe::judge(&universe::answer_text(*ok, findings));
                    let authority = authority.clone();
                    let post = PostResult { id: universe::id_of(*identity), authority, submission, charge };
                    outcomes.push(store.post_result(post).await?);
                }
                Answer::Post(outcomes)
            }
            Op::CreateIntent { provider, schema, max_size, small_bytes, wait, only, submit, hand_over } => {
                let only = only.map(|t| TENANTS[t]);
                let request = IntentRequest {
                    provider: PROVIDERS[*provider].into(),
                    schema: SCHEMAS[*schema].into(),
                    accept: WorkFilter(std::sync::Arc::new(move |tenant: &str, _: &str| {
                        only.is_none_or(|t| t == tenant)
                    })),
                    max_size: *max_size,
                    max_content_bytes: if *small_bytes { 20 } else { u64::MAX },
                    max_wait_ms: if *wait { 3_600_000 } else { 0 },
                    minimum: hand_over.then(|| commitpoint::store::Minimum {
                        size: *max_size + 1,
                        wait_ms: 0,
                        fallback: Some(PROVIDERS[1 - *provider].into()),
                    }),
                    estimate: Some(commitpoint::store::MemberEstimate(std::sync::Arc::new(|_| {
                        super::universe::ESTIMATE
                    }))),
                };
                Answer::Intent(match store.create_intent(request).await? {
                    IntentOutcome::Created(batch) => {
                        let identities = batch.members.iter().map(|s| self.identity_of(*s)).collect();
                        self.batches.push((batch.seq, batch.batch_key.clone(), identities));
                        let batch = if *submit {
                            let job = format!("job-{}", self.batches.len() - 1);
                            store.record_job(batch.seq, job, 0).await?
                        } else {
                            *batch
                        };
                        IntentView::Created(self.batch_view(&batch))
                    }
                    IntentOutcome::Waiting { members, .. } => IntentView::Waiting { members },
                    IntentOutcome::Nothing => IntentView::Nothing,
                })
            }
            Op::RecordJob { batch, other_job } => {
                let Some((seq, _, _)) = self.batch(*batch).cloned() else { return Ok(Answer::Skipped) };
                let label = self.batch_label(seq);
                let job = if *other_job { "job-other".to_string() } else { format!("job-{label}") };
                let record = store.record_job(seq, job, 0).await?;
                Answer::Batch(self.batch_view(&record))
            }
            Op::Stage { batch, lines } => {
                let Some((seq, _, members)) = self.batch(*batch).cloned() else { return Ok(Answer::Skipped) };
                let label = self.batch_label(seq);
                let lines = lines.iter().map(|l| line(l, label, &members)).collect();
                Answer::Staged(store.stage_results(seq, lines, self.rules).await?)
            }
            Op::Ingest { batch, lines, later } => {
                let Some((seq, _, members)) = self.batch(*batch).cloned() else { return Ok(Answer::Skipped) };
                let label = self.batch_label(seq);
                let lines: Vec<IngestLine> = lines
                    .iter()
                    .map(|l| {
                        let (id, result) = line(l, label, &members);
                        let judged = match &result {
                            LineResult::Answer { output, .. } => Some(universe::judged(output)),
                            _ => None,
                        };
                        IngestLine { id, result, judged }
                    })
                    .collect();
                let flush = if *later { Flush::Later } else { Flush::Now };
                let report = store.ingest_results(seq, lines, self.rules, flush).await?;
                if *later {
                    store.flush().await?;
                }
                Answer::Staged(report)
            }
            Op::CommitReady => {
                let mut out = Vec::new();
                for provider in PROVIDERS {
                    for item in store.ready_items(provider.into(), 100).await? {
                        let identity = self.identity_of(item.record.seq);
                        out.push((identity, self.commit_ready(item).await?));
                    }
                }
                out.sort_by_key(|(identity, _)| *identity);
                Answer::Committed(out)
            }
            Op::Close { batch, leftover } => {
                let Some((seq, _, _)) = self.batch(*batch).cloned() else { return Ok(Answer::Skipped) };
                let (outcome, leftover) = match leftover {
                    LeftoverPick::Requeue => ("expired".to_string(), Leftover::Requeue),
                    LeftoverPick::Return => ("failed: no capacity".to_string(), Leftover::Return),
                    LeftoverPick::Fail(class) => (
                        "failed: refused".to_string(),
                        Leftover::Fail { class: *class, reason: format!("{class:?} batch") },
                    ),
                };
                Answer::Closed(store.close_batch(seq, outcome, leftover, self.rules).await?)
            }
            Op::Retry { identity } => Answer::Moved(match store.retry(universe::id_of(*identity)).await? {
                commitpoint::store::RetryOutcome::Retried(r) => MoveView::Moved(Box::new(self.extraction(&r))),
                commitpoint::store::RetryOutcome::NotFound => MoveView::NotFound,
                commitpoint::store::RetryOutcome::Rejected(e) => MoveView::Rejected(e),
            }),
            Op::Cancel { identity } => Answer::Moved(match store.cancel(universe::id_of(*identity)).await? {
                commitpoint::store::CancelOutcome::Cancelled(r) => MoveView::Moved(Box::new(self.extraction(&r))),
                commitpoint::store::CancelOutcome::NotFound => MoveView::NotFound,
                commitpoint::store::CancelOutcome::Rejected(e) => MoveView::Rejected(e),
            }),
            Op::RetryFailed { tenant, schema, class, limit } => {
                let filter = RetryFilter {
                    tenant: tenant.map(|t| TENANTS[t].to_string()),
                    schema: schema.map(|s| SCHEMAS[s].to_string()),
                    failure_class: *class,
                };
                Answer::Count(store.retry_failed(filter, *limit).await?)
            }
            Op::Deliver { event, report } => {
                let Some(seq) = self.pick_event(OutboxFilter::Pending, *event).await? else {
                    return Ok(Answer::Skipped);
                };
                let report = match report {
                    DeliveryPick::Delivered => DeliveryReport::Delivered { status: 204 },
                    DeliveryPick::Retry => DeliveryReport::Retry { at_ms: RETRY_AT_MS, error: "HTTP 503".into() },
                    DeliveryPick::Dead => DeliveryReport::Dead { reason: "HTTP 410".into() },
                };
                let event = store.record_delivery(seq, report).await?;
                Answer::Event(event.map(|e| self.event(&e)))
            }
            Op::Redeliver { event } => {
                let Some(seq) = self.pick_event(OutboxFilter::Dead, *event).await? else { return Ok(Answer::Skipped) };
                let event = store.redeliver(seq).await?;
                Answer::Event(event.map(|e| self.event(&e)))
            }
            Op::Erase { tenant } => Answer::Erased(store.erase_tenant(TENANTS[*tenant].into()).await?),
            Op::ExtendLease { identity, token, short_lease } => {
                let identity = identity.unwrap_or(self.last_granted);
                let extension = LeaseExtension {
                    id: universe::id_of(identity),
                    lease_token: self.token(identity, *token),
                    lease_ms: if *short_lease { 0 } else { 3_600_000 },
                };
                Answer::Lease(match store.extend_lease(extension).await? {
                    ExtendOutcome::Extended { .. } => LeaseView::Extended,
                    ExtendOutcome::NotFound => LeaseView::NotFound,
                    ExtendOutcome::Rejected(e) => LeaseView::Rejected(e),
                })
            }
        })
    }

    /// The engine's commit of one staged answer (`engine::commit::Committer::commit_ready`).
    pub async fn commit_ready(&self, item: ReadyItem) -> Result<commitpoint::store::PostOutcome, Error> {
        let Some(key) = item.record.state.batch_key().cloned() else {
            return Ok(commitpoint::store::PostOutcome::NotFound);
        };
        let charge = item.staged.usage.clone().map(|usage| Charge {
            provider: item.staged.provider.clone(),
            job_id: Some(item.staged.job_id.clone()).filter(|j| !j.is_empty()),
            usage,
            latency_ms: item.staged.latency_ms,
            batch: self.rules.batch_api,
        });
        let submission = universe::judge(&item.staged.output_json);
        self.store
            .post_result(PostResult { id: item.record.id, authority: Authority::Batch(key), submission, charge })
            .await
    }

    fn learn(&mut self, record: &ExtractionRecord, created: bool) {
        if created {
            let identity = universe::label_of(&record.id).unwrap_or(IDENTITY_COUNT);
            let slot = identity.min(IDENTITY_COUNT - 1);
            self.incarnations[slot] += 1;
            self.seqs.insert(record.seq, (identity, self.incarnations[slot]));
        }
    }

    fn identity_of(&self, seq: u64) -> usize {
        self.seqs.get(&seq).map_or(usize::MAX, |(identity, _)| *identity)
    }

    fn token(&self, identity: usize, pick: TokenPick) -> LeaseToken {
        let history = &self.granted[identity.min(IDENTITY_COUNT)];
        let chosen = match pick {
            TokenPick::Latest => history.last(),
            TokenPick::Previous => history.len().checked_sub(2).and_then(|i| history.get(i)),
            TokenPick::Forged => None,
        };
        chosen.cloned().unwrap_or_else(|| LeaseToken::from(FORGED_TOKEN))
    }

    fn batch(&self, recent: usize) -> Option<&(u64, BatchKey, Vec<usize>)> {
        super::ops::batch_label(recent, self.batches.len()).map(|label| &self.batches[label])
    }

    fn batch_label(&self, seq: u64) -> usize {
        self.batches.iter().position(|(s, _, _)| *s == seq).unwrap_or(UNKNOWN_BATCH)
    }

    fn key_label(&self, key: &BatchKey) -> usize {
        self.batches.iter().position(|(_, k, _)| k == key).unwrap_or(UNKNOWN_BATCH)
    }

    /// The `n`-th listed event (in the order of [`EventView::sort_key`]) of `filter`.
    async fn pick_event(&self, filter: OutboxFilter, n: usize) -> Result<Option<u64>, Error> {
        let mut events: Vec<(String, u64)> =
            self.store.list_outbox(filter, 0, 1000).await?.iter().map(|e| (self.event(e).sort_key(), e.seq)).collect();
        events.sort();
        Ok((!events.is_empty()).then(|| events[n % events.len()].1))
    }

    pub fn extraction(&self, record: &ExtractionRecord) -> ExtractionView {
        let (identity, incarnation) = self.seqs.get(&record.seq).copied().unwrap_or((usize::MAX, 0));
        ExtractionView {
            identity,
            incarnation,
            tenant: record.tenant.clone(),
            source_id: record.source_id.clone(),
            schema: record.schema.clone(),
            metadata_json: record.metadata_json.clone(),
            state: self.state(&record.state),
            attempt: record.attempt,
            claims: record.claims,
            content_bytes: record.content_bytes,
            requeues: record.requeues,
            output_budget: record.output_budget,
            truncation_retried: record.truncation_retried,
            reasks: record.reasks,
            previous_attempt: record.previous_attempt.clone(),
            superseded_by: record.superseded_by.map(|id| super::universe::label_of(&id).unwrap_or(usize::MAX)),
        }
    }

    fn state(&self, state: &State) -> StateView {
        match state {
            State::Pending => StateView::Pending,
            State::Claimed { worker, lease_token, .. } => StateView::Claimed {
                worker: worker.clone(),
                token: self.tokens.get(lease_token).copied().unwrap_or(UNKNOWN_TOKEN),
            },
            State::Committed { .. } => StateView::Committed,
            State::Failed { class, reason } => StateView::Failed { class: *class, reason: reason.clone() },
            State::Submitted { provider, batch_key, job_id } => StateView::Submitted {
                provider: provider.to_string(),
                batch: self.key_label(batch_key),
                job: job_id.clone(),
            },
            State::Ready { provider, batch_key } => {
                StateView::Ready { provider: provider.to_string(), batch: self.key_label(batch_key) }
            }
            State::Cancelled { .. } => StateView::Cancelled,
        }
    }

    pub fn batch_view(&self, batch: &BatchRecord) -> BatchView {
        BatchView {
            label: self.batch_label(batch.seq),
            provider: batch.provider.to_string(),
            schema: batch.schema.clone(),
            members: batch.members.iter().map(|s| self.seqs.get(s).copied().unwrap_or((usize::MAX, 0))).collect(),
            state: match &batch.state {
                BatchState::Intent => BatchStateView::Intent,
                BatchState::Submitted { job_id } => BatchStateView::Submitted { job_id: job_id.clone() },
                BatchState::Closed { job_id, outcome } => {
                    BatchStateView::Closed { job_id: job_id.clone(), outcome: outcome.clone() }
                }
            },
            failures: batch.failures,
            last_error: batch.last_error.clone(),
        }
    }

    pub fn event(&self, event: &OutboxRecord) -> EventView {
        let (identity, incarnation) = self.seqs.get(&event.extraction_seq).copied().unwrap_or((usize::MAX, 0));
        EventView {
            identity,
            incarnation,
            attempt: event.attempt,
            kind: event.kind.clone(),
            sink: event.sink.clone(),
            state: match &event.state {
                commitpoint::store::DeliveryState::Pending => DeliveryView::Pending,
                commitpoint::store::DeliveryState::Delivered { status, .. } => {
                    DeliveryView::Delivered { status: *status }
                }
                commitpoint::store::DeliveryState::Dead { reason } => DeliveryView::Dead { reason: reason.clone() },
            },
            deliveries: event.deliveries,
            retry_at_ms: (event.next_attempt_at_ms == RETRY_AT_MS).then_some(RETRY_AT_MS),
            last_error: event.last_error.clone(),
        }
    }

    pub fn fence(&self, fence: &commitpoint::store::Fence) -> FenceView {
        match fence {
            commitpoint::store::Fence::Lease(token) => {
                FenceView::Lease(self.tokens.get(token).copied().unwrap_or(UNKNOWN_TOKEN))
            }
            commitpoint::store::Fence::Batch(key) => FenceView::Batch(self.key_label(key)),
            commitpoint::store::Fence::Evaluation(name) => FenceView::Evaluation(name.clone()),
        }
    }

    pub fn batch_keys(&self) -> Vec<(usize, String)> {
        self.batches.iter().enumerate().map(|(label, (_, key, _))| (label, key.to_string())).collect()
    }
}

/// Whom a line of batch `label` names: a member by position, or any identity.
pub fn line_identity(target: LineTarget, members: &[usize]) -> usize {
    match target {
        LineTarget::Member(n) if !members.is_empty() => members[n % members.len()],
        LineTarget::Member(_) => IDENTITY_COUNT,
        LineTarget::Identity(identity) => identity,
    }
}

/// The id a line names, and what it says.
pub fn line(pick: &LinePick, label: usize, members: &[usize]) -> (ExtractionId, LineResult) {
    let identity = line_identity(pick.target, members);
    (universe::id_of(identity), line_result(&pick.kind, label, identity))
}

pub fn line_result(kind: &LineKind, label: usize, identity: usize) -> LineResult {
    let paid = |paid: bool, model: &str, output_tokens, tag| {
        paid.then(|| universe::usage(model, 200, output_tokens, universe::line_request(label, identity, tag)))
    };
    match kind {
        LineKind::Answer { ok, findings, paid: p } => {
            LineResult::Answer { output: universe::answer_text(*ok, findings), usage: paid(*p, "m", 50, 'a') }
        }
        LineKind::Truncated { output_tokens, paid: p } => LineResult::Unusable {
            class: FailureClass::Truncated,
            reason: "cut off at the output budget".into(),
            usage: paid(*p, "m", *output_tokens, 't'),
        },
        LineKind::ModelRefusal { paid: p } => LineResult::Unusable {
            class: FailureClass::Refused,
            reason: "the model declined".into(),
            usage: paid(*p, "free", 10, 'r'),
        },
        LineKind::ProviderRefusal => {
            LineResult::Refused { class: FailureClass::InvalidRequest, reason: "invalid request".into() }
        }
        LineKind::Retry => LineResult::Retry { reason: "batch_expired: not run".into() },
    }
}
