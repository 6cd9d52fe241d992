//! The reference model: what each operation should answer and leave behind, written from
//! the lifecycle's rules (docs/ARCHITECTURE.md, the seam's documentation), not from either
//! backend's code. State is plain maps; time does not exist here beyond the order of
//! operations, which is all the stores' answers may depend on once times are dropped.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use commitpoint::domain::batch::PreviousAttempt;
use commitpoint::domain::identity::FindingKey;
use commitpoint::domain::lifecycle::{FailureClass, StateName, TransitionError};
use commitpoint::store::{ChargeKind, DiffCounts, OutboxKind, PostOutcome, Submission};

use super::ops::{AuthorityPick, Op, RulesPick, TokenPick};
use super::universe::{self, IDENTITY_COUNT, SCHEMAS, SINKS, TENANTS};

/// A claim's schema, and the one tenant its worker token is scoped to.
type ClaimScope = (Option<usize>, Option<usize>);
use super::view::*;

pub(super) struct Ext {
    pub view: ExtractionView,
    pub content: String,
    /// For a short lease: the claim op, which orders expired leases (then the sequence).
    pub expiring: Option<usize>,
    pub findings: BTreeMap<String, FindingView>,
    pub result: Option<ResultView>,
    pub ledger: Vec<LedgerView>,
    pub staged: Option<StagedView>,
}

pub(super) struct Batch {
    pub view: BatchView,
    /// The identities it was created with: whom a line naming "member n" names.
    pub created_with: Vec<usize>,
    /// Members by model sequence number (an erasure shrinks an intent's).
    pub seqs: Vec<u64>,
    pub open: bool,
}

pub(super) struct Event {
    pub view: EventView,
    pub tenant: String,
}

/// A charge before pricing: who was paid for what.
#[derive(Clone)]
pub(super) struct Paid {
    pub provider: String,
    pub job_id: Option<String>,
    pub usage: commitpoint::domain::batch::Usage,
    pub latency: bool,
    pub batch: bool,
}

/// Who reports a result.
#[derive(Clone, Copy)]
pub(super) enum Reporter {
    Lease(Option<TokenLabel>),
    Batch(Option<usize>),
}

pub struct Model {
    pub(super) rules: RulesPick,
    next_seq: u64,
    /// Live extractions by model sequence number (intake order).
    pub(super) ext: BTreeMap<u64, Ext>,
    pub(super) by_identity: [Option<u64>; IDENTITY_COUNT],
    incarnations: [u32; IDENTITY_COUNT],
    pub(super) deliveries: HashMap<(usize, usize), u64>,
    tokens: Vec<Vec<TokenLabel>>,
    last_granted: usize,
    pub(super) batches: Vec<Batch>,
    pub(super) outbox: Vec<Event>,
    pub(super) spend: BTreeMap<String, u64>,
    pub(super) erased_spend: BTreeMap<String, u64>,
    /// Where each queue's fair rotation stopped (`model_fair`).
    pub(super) rotations: HashMap<String, (String, String)>,
    /// Open budget reservations: sequence → (tenant, micro-dollars) (`model_fair`).
    pub(super) reservations: BTreeMap<u64, (String, u64)>,
}

impl Model {
    pub fn new(rules: RulesPick) -> Self {
        Model {
            rules,
            next_seq: 1,
            ext: BTreeMap::new(),
            by_identity: [None; IDENTITY_COUNT],
            incarnations: [0; IDENTITY_COUNT],
            deliveries: HashMap::new(),
            tokens: vec![Vec::new(); IDENTITY_COUNT + 1],
            last_granted: IDENTITY_COUNT,
            batches: Vec::new(),
            outbox: Vec::new(),
            spend: BTreeMap::new(),
            erased_spend: BTreeMap::new(),
            rotations: HashMap::new(),
            reservations: BTreeMap::new(),
        }
    }

    pub fn apply(&mut self, index: usize, op: &Op) -> Answer {
        match op {
            Op::Intake { identity } => {
                let (created, seq) = self.intake(*identity);
                Answer::Intake { created, record: self.ext[&seq].view.clone() }
            }
            Op::IntakeDelivery { endpoint, delivery, identity } => {
                let key = (*endpoint, *delivery);
                if let Some(ext) = self.deliveries.get(&key).and_then(|seq| self.ext.get(seq)) {
                    return Answer::Delivery { first: None, record: ext.view.clone() };
                }
                let (created, seq) = self.intake(*identity);
                self.deliveries.insert(key, seq);
                Answer::Delivery { first: Some(created), record: self.ext[&seq].view.clone() }
            }
            Op::Claim { worker, limit, short_lease, schema, only } => {
                self.claim(index, *worker, *limit, *short_lease, (*schema, *only))
            }
            Op::Post { identity, authority, ok, findings, paid, again } => {
                let identity = &identity.unwrap_or(self.last_granted);
                let reporter = match authority {
                    AuthorityPick::Lease(pick) => Reporter::Lease(self.token(*identity, *pick)),
                    AuthorityPick::Batch(n) => Reporter::Batch(super::ops::batch_label(*n, self.batches.len())),
                };
                let mut outcomes = Vec::new();
                for request in universe::post_requests(*paid, *again) {
                    let paid = request.map(|(latency, request)| Paid {
                        provider: "worker-llm".into(),
                        job_id: None,
                        usage: universe::usage("m", 100, 20 + findings.len() as u64, format!("req-w{request}")),
                        latency,
                        batch: false,
                    });
                    let submission = universe::judge(&universe::answer_text(*ok, findings));
                    outcomes.push(match self.live(*identity) {
                        Some(seq) => self.post(seq, reporter, &submission, paid),
                        None => PostOutcome::NotFound,
                    });
                }
                Answer::Post(outcomes)
            }
            Op::CreateIntent { provider, schema, max_size, small_bytes, wait, only, submit, hand_over } => {
                // Under a minimum it never reaches, already waited out: bound to the fallback.
                let bound = if *hand_over { 1 - *provider } else { *provider };
                let intent = self.create_intent((*provider, bound), *schema, *max_size, *small_bytes, *wait, *only);
                match intent {
                    IntentView::Created(_) if *submit => match self.record_job(0, false) {
                        Answer::Batch(batch) => Answer::Intent(IntentView::Created(batch)),
                        other => other,
                    },
                    intent => Answer::Intent(intent),
                }
            }
            Op::RecordJob { batch, other_job } => self.record_job(*batch, *other_job),
            Op::Stage { batch, lines } => self.stage(*batch, lines, false),
            Op::Ingest { batch, lines, .. } => self.stage(*batch, lines, true),
            Op::CommitReady => self.commit_ready(),
            Op::Close { batch, leftover } => self.close(*batch, leftover),
            Op::Retry { identity } => Answer::Moved(match self.live(*identity) {
                None => MoveView::NotFound,
                Some(seq) => match self.retry(seq) {
                    Ok(()) => MoveView::Moved(Box::new(self.ext[&seq].view.clone())),
                    Err(e) => MoveView::Rejected(e),
                },
            }),
            Op::Cancel { identity } => Answer::Moved(match self.live(*identity) {
                None => MoveView::NotFound,
                Some(seq) => self.cancel(seq),
            }),
            Op::RetryFailed { tenant, schema, class, limit } => {
                Answer::Count(self.retry_failed(*tenant, *schema, *class, *limit))
            }
            Op::Deliver { event, report } => self.deliver(*event, *report),
            Op::Redeliver { event } => self.redeliver(*event),
            Op::Erase { tenant } => Answer::Erased(self.erase(*tenant)),
            Op::ExtendLease { identity, token, short_lease } => {
                let identity = identity.unwrap_or(self.last_granted);
                let token = self.token(identity, *token);
                Answer::Lease(self.extend_lease(index, identity, token, *short_lease))
            }
        }
    }

    pub(super) fn live(&self, identity: usize) -> Option<u64> {
        self.by_identity.get(identity).copied().flatten()
    }

    fn intake(&mut self, identity: usize) -> (bool, u64) {
        let identity = identity % IDENTITY_COUNT;
        if let Some(seq) = self.by_identity[identity] {
            return (false, seq);
        }
        let new = universe::new_extraction(identity);
        let seq = self.next_seq;
        self.next_seq += 1;
        self.incarnations[identity] += 1;
        let view = ExtractionView {
            identity,
            incarnation: self.incarnations[identity],
            tenant: new.tenant,
            source_id: new.source_id,
            schema: new.schema,
            metadata_json: new.metadata_json,
            state: StateView::Pending,
            attempt: 1,
            claims: 0,
            content_bytes: new.content.len() as u64,
            requeues: 0,
            output_budget: None,
            truncation_retried: false,
            reasks: 0,
            previous_attempt: None,
            superseded_by: None,
        };
        let ext = Ext {
            view,
            content: new.content,
            expiring: None,
            findings: BTreeMap::new(),
            result: None,
            ledger: Vec::new(),
            staged: None,
        };
        self.ext.insert(seq, ext);
        self.by_identity[identity] = Some(seq);
        (true, seq)
    }

    /// Leases that ran out first (oldest first), then pending work by the fair pick.
    /// `scope`: the schema asked for, and the one tenant the worker's token is scoped to.
    fn claim(&mut self, index: usize, worker: usize, limit: usize, short: bool, scope: ClaimScope) -> Answer {
        let (schema, only) = scope;
        let wanted = |e: &Ext| {
            schema.is_none_or(|s| e.view.schema == SCHEMAS[s]) && only.is_none_or(|t| e.view.tenant == TENANTS[t])
        };
        let mut expired: Vec<(usize, u64)> = self
            .ext
            .iter()
            .filter(|(_, e)| matches!(e.view.state, StateView::Claimed { .. }) && wanted(e))
            .filter_map(|(seq, e)| e.expiring.map(|op| (op, *seq)))
            .collect();
        expired.sort();
        let mut picked: Vec<u64> = expired.into_iter().take(limit).map(|(_, seq)| seq).collect();
        let queue = format!("claim/{}", schema.map_or("*", |s| SCHEMAS[s]));
        let pick = self.fair_pick(&queue, wanted, limit - picked.len(), u64::MAX, false);
        if let Some(stop) = pick.stopped_at {
            self.rotations.insert(queue, stop);
        }
        picked.extend(pick.seqs);
        let mut grants = Vec::new();
        for seq in picked {
            let Some(ext) = self.ext.get_mut(&seq) else { continue };
            ext.view.claims += 1;
            let token = TokenLabel { claim_op: index, identity: ext.view.identity, claim_number: ext.view.claims };
            self.tokens[ext.view.identity].push(token);
            self.last_granted = ext.view.identity;
            ext.expiring = short.then_some(index);
            self.transition(seq, StateView::Claimed { worker: format!("w{worker}"), token });
            grants.push((self.ext[&seq].view.clone(), self.ext[&seq].content.clone()));
        }
        Answer::Grants(grants)
    }

    /// The current token moves its lease's expiry (expired at once, ordered by this op, or
    /// an hour away); any other token, or no lease, is stale; an ended extraction is illegal.
    fn extend_lease(&mut self, index: usize, identity: usize, token: Option<TokenLabel>, short: bool) -> LeaseView {
        let Some(ext) = self.live(identity).and_then(|seq| self.ext.get_mut(&seq)) else { return LeaseView::NotFound };
        match &ext.view.state {
            StateView::Claimed { token: current, .. } if Some(*current) == token => {
                ext.expiring = short.then_some(index);
                LeaseView::Extended
            }
            StateView::Claimed { .. } | StateView::Pending | StateView::Submitted { .. } | StateView::Ready { .. } => {
                LeaseView::Rejected(TransitionError::StaleLease)
            }
            ended => LeaseView::Rejected(TransitionError::Illegal {
                from: ended.name().as_str(),
                event: "extend the lease of",
            }),
        }
    }

    fn token(&self, identity: usize, pick: TokenPick) -> Option<TokenLabel> {
        let history = &self.tokens[identity.min(IDENTITY_COUNT)];
        match pick {
            TokenPick::Latest => history.last().copied(),
            TokenPick::Previous => history.len().checked_sub(2).and_then(|i| history.get(i)).copied(),
            TokenPick::Forged => None,
        }
    }

    /// A result under a lease or a batch's authority: committed, failed, a replay, or
    /// refused (and still charged: the call was paid for).
    pub(super) fn post(
        &mut self,
        seq: u64,
        reporter: Reporter,
        submission: &Submission,
        paid: Option<Paid>,
    ) -> PostOutcome {
        let state = self.ext[&seq].view.state.clone();
        let from = state.name().as_str();
        let refused = match (&reporter, &state) {
            (_, StateView::Committed) => {
                if let Some(paid) = &paid {
                    self.charge(seq, paid, ChargeKind::Replay);
                }
                return PostOutcome::Replay { findings: self.ext[&seq].findings.len() as u64 };
            }
            (Reporter::Lease(token), StateView::Claimed { token: current, .. }) if *token == Some(*current) => None,
            (
                Reporter::Lease(_),
                StateView::Claimed { .. } | StateView::Pending | StateView::Submitted { .. } | StateView::Ready { .. },
            ) => Some(TransitionError::StaleLease),
            (Reporter::Lease(_), _) => Some(TransitionError::Illegal { from, event: "result" }),
            (Reporter::Batch(b), StateView::Submitted { batch, .. } | StateView::Ready { batch, .. })
                if *b != Some(*batch) =>
            {
                Some(TransitionError::StaleBatch)
            }
            (Reporter::Batch(_), StateView::Submitted { .. }) => {
                Some(TransitionError::Illegal { from, event: "commit" })
            }
            (Reporter::Batch(_), StateView::Ready { .. }) => None,
            (Reporter::Batch(_), _) => Some(TransitionError::StaleBatch),
        };
        if let Some(e) = refused {
            if let Some(paid) = &paid {
                self.charge(seq, paid, ChargeKind::Fresh);
            }
            return PostOutcome::Rejected(e);
        }
        let (producer, fence) = match (&state, reporter) {
            (StateView::Claimed { worker, token }, _) => (worker.clone(), FenceView::Lease(*token)),
            (StateView::Ready { provider, batch }, _) => (provider.clone(), FenceView::Batch(*batch)),
            _ => (String::new(), FenceView::Batch(UNKNOWN_BATCH)),
        };
        self.settle(seq, submission, paid.as_ref(), producer, fence)
    }

    /// Commits or fails an answer whose reporter was entitled to it.
    pub(super) fn settle(
        &mut self,
        seq: u64,
        submission: &Submission,
        paid: Option<&Paid>,
        producer: String,
        fence: FenceView,
    ) -> PostOutcome {
        let kind = if matches!(submission, Submission::Invalid { .. }) {
            ChargeKind::FailedValidation
        } else {
            ChargeKind::Fresh
        };
        if let Some(paid) = paid {
            self.charge(seq, paid, kind);
        }
        let Some(ext) = self.ext.get_mut(&seq) else { return PostOutcome::NotFound };
        ext.staged = None;
        match submission {
            Submission::Valid { findings, output } => {
                let id = universe::id_of(ext.view.identity);
                for f in findings {
                    let key = FindingKey::compute(&id, &f.canonical_identity).to_hex();
                    let view = FindingView {
                        key: key.clone(),
                        canonical_identity: f.canonical_identity.clone(),
                        body_json: f.body.to_string(),
                    };
                    ext.findings.insert(key, view);
                }
                ext.result = Some(ResultView {
                    output_json: output.to_string(),
                    producer,
                    fence,
                    usage: paid.map(|p| p.usage.clone()),
                    latency: paid.is_some_and(|p| p.latency),
                });
                let findings = ext.findings.len() as u64;
                ext.view.previous_attempt = None;
                self.transition(seq, StateView::Committed);
                PostOutcome::Committed { findings }
            }
            Submission::Invalid { reason, issues, output, reask_limit } if ext.view.reasks < *reask_limit => {
                ext.view.reasks += 1;
                ext.view.attempt += 1;
                ext.view.previous_attempt = Some(PreviousAttempt::new(output, issues.clone()));
                let reask = ext.view.reasks;
                self.transition(seq, StateView::Pending);
                PostOutcome::Reasked { reason: reason.clone(), reask }
            }
            Submission::Invalid { reason, .. } => {
                self.transition(seq, StateView::Failed { class: FailureClass::Validation, reason: reason.clone() });
                PostOutcome::Failed { reason: reason.clone() }
            }
        }
    }

    /// An operator's retry: a new attempt with a fresh allowance of requeues and truncation
    /// retries; a raised output budget is kept.
    fn retry(&mut self, seq: u64) -> Result<(), TransitionError> {
        let ext = &self.ext[&seq];
        if !matches!(ext.view.state, StateView::Failed { .. }) {
            return Err(TransitionError::Illegal { from: ext.view.state.name().as_str(), event: "retry" });
        }
        let ext = self.ext.get_mut(&seq).map(|e| &mut e.view);
        if let Some(view) = ext {
            view.attempt += 1;
            view.requeues = 0;
            view.truncation_retried = false;
            view.reasks = 0;
        }
        self.transition(seq, StateView::Pending);
        Ok(())
    }

    fn cancel(&mut self, seq: u64) -> MoveView {
        match self.ext[&seq].view.state.name() {
            StateName::Cancelled => {}
            StateName::Pending | StateName::Failed | StateName::Claimed | StateName::Submitted => {
                self.transition(seq, StateView::Cancelled)
            }
            from => return MoveView::Rejected(TransitionError::Illegal { from: from.as_str(), event: "cancel" }),
        }
        MoveView::Moved(Box::new(self.ext[&seq].view.clone()))
    }

    fn retry_failed(
        &mut self,
        tenant: Option<usize>,
        schema: Option<usize>,
        class: Option<FailureClass>,
        limit: u64,
    ) -> u64 {
        let matching: Vec<u64> = self
            .ext
            .iter()
            .filter(|(_, e)| match &e.view.state {
                StateView::Failed { class: c, .. } => {
                    tenant.is_none_or(|t| e.view.tenant == universe::TENANTS[t])
                        && schema.is_none_or(|s| e.view.schema == SCHEMAS[s])
                        && class.is_none_or(|k| k == *c)
                }
                _ => false,
            })
            .map(|(seq, _)| *seq)
            .take(usize::try_from(limit).unwrap_or(usize::MAX))
            .collect();
        for &seq in &matching {
            let _ = self.retry(seq);
        }
        matching.len() as u64
    }

    /// A commit among its source's revisions (tenant, source id, schema name without its
    /// version): the newest intake committed is current; a newer commit supersedes the
    /// current one, an older one is superseded at once. Returns the commit's event kind.
    fn supersede(&mut self, seq: u64) -> OutboxKind {
        let name = |schema: &str| schema.split('@').next().unwrap_or_default().to_string();
        let me = &self.ext[&seq];
        let (tenant, source, family) = (me.view.tenant.clone(), me.view.source_id.clone(), name(&me.view.schema));
        let current = self
            .ext
            .iter()
            .filter(|(s, e)| {
                **s != seq
                    && e.view.tenant == tenant
                    && e.view.source_id == source
                    && name(&e.view.schema) == family
                    && e.view.state == StateView::Committed
                    && e.view.superseded_by.is_none()
            })
            .map(|(s, _)| *s)
            .max();
        let Some(current) = current else { return OutboxKind::Committed };
        let (older, newer) = if current < seq { (current, seq) } else { (seq, current) };
        let by = self.ext[&newer].view.identity;
        self.ext.get_mut(&older).expect("live").view.superseded_by = Some(by);
        self.superseded_events(older, by);
        if current > seq {
            return OutboxKind::Committed;
        }
        let (old, new) = (&self.ext[&current], &self.ext[&seq]);
        let identities = |e: &Ext| e.findings.values().map(|f| f.canonical_identity.clone()).collect::<BTreeSet<_>>();
        let diff = (old.view.schema == new.view.schema).then(|| {
            let (a, b) = (identities(old), identities(new));
            DiffCounts {
                introduced: b.difference(&a).count() as u64,
                resolved: a.difference(&b).count() as u64,
                unchanged: a.intersection(&b).count() as u64,
            }
        });
        OutboxKind::Revision { supersedes: universe::id_of(old.view.identity), diff }
    }

    fn superseded_events(&mut self, seq: u64, by: usize) {
        let ext = &self.ext[&seq];
        for sink in SINKS {
            let view = EventView {
                identity: ext.view.identity,
                incarnation: ext.view.incarnation,
                attempt: ext.view.attempt,
                kind: OutboxKind::Superseded { by: universe::id_of(by) },
                sink: sink.to_string(),
                state: DeliveryView::Pending,
                deliveries: 0,
                retry_at_ms: None,
                last_error: None,
            };
            self.outbox.push(Event { view, tenant: ext.view.tenant.clone() });
        }
    }

    /// The one place a state changes: a terminal state gets one event per sink.
    pub(super) fn transition(&mut self, seq: u64, next: StateView) {
        if !self.ext.contains_key(&seq) {
            return;
        }
        let committed = (next == StateView::Committed).then(|| self.supersede(seq));
        let Some(ext) = self.ext.get_mut(&seq) else { return };
        // A reservation lives while the provider or a worker has the work.
        let with_someone = |s: &StateView| {
            matches!(s, StateView::Claimed { .. } | StateView::Submitted { .. } | StateView::Ready { .. })
        };
        if with_someone(&ext.view.state) && !with_someone(&next) {
            self.reservations.remove(&seq);
        }
        if !matches!(next, StateView::Claimed { .. }) {
            ext.expiring = None;
        }
        let kind = match &next {
            StateView::Committed => committed,
            StateView::Failed { class, reason } => Some(OutboxKind::Failed { class: *class, reason: reason.clone() }),
            StateView::Cancelled => Some(OutboxKind::Cancelled),
            _ => None,
        };
        ext.view.state = next;
        let Some(kind) = kind else { return };
        for sink in SINKS {
            let view = EventView {
                identity: ext.view.identity,
                incarnation: ext.view.incarnation,
                attempt: ext.view.attempt,
                kind: kind.clone(),
                sink: sink.to_string(),
                state: DeliveryView::Pending,
                deliveries: 0,
                retry_at_ms: None,
                last_error: None,
            };
            self.outbox.push(Event { view, tenant: ext.view.tenant.clone() });
        }
    }

    /// A ledger entry at list price, to the attempt that paid; a replay costs nothing.
    pub(super) fn charge(&mut self, seq: u64, paid: &Paid, kind: ChargeKind) {
        let Some(ext) = self.ext.get_mut(&seq) else { return };
        // One request id is charged once per extraction: a resent call is a replay.
        let resent = ext.ledger.iter().any(|l| {
            l.kind != ChargeKind::Replay && l.provider == paid.provider && l.usage.request_id == paid.usage.request_id
        });
        let kind = if kind != ChargeKind::Replay && resent && paid.usage.request_id.is_some() {
            ChargeKind::Replay
        } else {
            kind
        };
        let (list, source) = universe::price(&paid.usage, paid.batch);
        let cost = if kind == ChargeKind::Replay { 0 } else { list };
        ext.ledger.push(LedgerView {
            attempt: ext.view.attempt,
            kind,
            provider: paid.provider.clone(),
            job_id: paid.job_id.clone(),
            usage: paid.usage.clone(),
            latency: paid.latency,
            cost_micros: cost,
            list_cost_micros: list,
            cost_source: source,
        });
        *self.spend.entry(ext.view.tenant.clone()).or_default() += cost;
    }
}
