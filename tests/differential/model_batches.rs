//! The reference model's provider batches: intents, job ids, result lines, closing, and
//! the engine's commit of staged answers.

use commitpoint::domain::lifecycle::FailureClass;
use commitpoint::store::{ChargeKind, CloseReport, StageReport};

use super::model::{Batch, Ext, Model, Paid, Reporter};
use super::ops::{LeftoverPick, LineKind, LinePick};
use super::universe::{self, BUDGETED, ESTIMATE, PROVIDERS, SCHEMAS, TENANTS};
use super::view::*;

/// What a line or a batch's end asks of a member.
enum Plan {
    Stored,
    Fail(FailureClass, String),
    /// Another attempt, with a larger output budget after a truncation.
    Requeue(Option<u32>),
}

const CAP: u32 = 3000;

impl Model {
    fn default_budget(&self) -> Option<u32> {
        self.rules.default_budget.then_some(1000)
    }

    /// `providers`: the one forming the intent and the one it is bound to (the same, or
    /// the first's minimum's fallback).
    pub(super) fn create_intent(
        &mut self,
        (provider, bound): (usize, usize),
        schema: usize,
        max_size: usize,
        small_bytes: bool,
        wait: bool,
        only: Option<usize>,
    ) -> IntentView {
        let max_bytes = if small_bytes { 20 } else { u64::MAX };
        let queue = format!("intent/{}/{}", PROVIDERS[provider], SCHEMAS[schema]);
        let accepted = |e: &Ext| e.view.schema == SCHEMAS[schema] && only.is_none_or(|t| e.view.tenant == TENANTS[t]);
        let pick = self.fair_pick(&queue, accepted, max_size, max_bytes, true);
        let (members, full) = (pick.seqs.clone(), pick.full);
        if members.is_empty() {
            return IntentView::Nothing;
        }
        if !full && wait {
            return IntentView::Waiting { members: members.len() };
        }
        if let Some(stop) = pick.stopped_at {
            self.rotations.insert(queue, stop);
        }
        for &seq in &pick.reserved {
            self.reservations.insert(seq, (BUDGETED.to_string(), ESTIMATE));
        }
        let label = self.batches.len();
        let provider = PROVIDERS[bound].to_string();
        for &seq in &members {
            let state = StateView::Submitted { provider: provider.clone(), batch: label, job: None };
            self.transition(seq, state);
        }
        let view = BatchView {
            label,
            provider,
            schema: SCHEMAS[schema].into(),
            members: members.iter().map(|s| (self.ext[s].view.identity, self.ext[s].view.incarnation)).collect(),
            state: BatchStateView::Intent,
            failures: 0,
            last_error: None,
        };
        let created_with = view.members.iter().map(|(identity, _)| *identity).collect();
        self.batches.push(Batch { view: view.clone(), created_with, seqs: members, open: true });
        IntentView::Created(view)
    }

    fn pick(&self, recent: usize) -> Option<usize> {
        super::ops::batch_label(recent, self.batches.len())
    }

    pub(super) fn record_job(&mut self, n: usize, other_job: bool) -> Answer {
        let Some(label) = self.pick(n) else { return Answer::Skipped };
        let job = if other_job { "job-other".to_string() } else { format!("job-{label}") };
        let batch = &self.batches[label];
        let unchanged = match &batch.view.state {
            BatchStateView::Closed { .. } => true,
            BatchStateView::Submitted { job_id } => *job_id == job,
            BatchStateView::Intent => false,
        };
        if unchanged {
            return Answer::Batch(batch.view.clone());
        }
        for seq in batch.seqs.clone() {
            let Some(ext) = self.ext.get(&seq) else { continue };
            if let StateView::Submitted { provider, batch, job: None } = &ext.view.state
                && *batch == label
            {
                let state = StateView::Submitted { provider: provider.clone(), batch: label, job: Some(job.clone()) };
                self.transition(seq, state);
            }
        }
        let batch = &mut self.batches[label];
        batch.view.state = BatchStateView::Submitted { job_id: job };
        batch.view.failures = 0;
        batch.view.last_error = None;
        Answer::Batch(batch.view.clone())
    }

    /// Another attempt for a member, unless it has used its attempt cap.
    fn release(&self, seq: u64, raise: Option<u32>, why: &str) -> Plan {
        let attempts = self.ext[&seq].view.requeues + 1;
        let max = self.rules.max_attempts;
        if attempts >= max {
            let reason = format!("{attempts} provider attempts used (max_attempts {max}); the last: {why}");
            return Plan::Fail(FailureClass::AttemptsExhausted, reason);
        }
        Plan::Requeue(raise)
    }

    fn plan(&self, seq: u64, kind: &LineKind) -> Plan {
        let view = &self.ext[&seq].view;
        match kind {
            LineKind::Answer { .. } => Plan::Stored,
            LineKind::ProviderRefusal => Plan::Fail(FailureClass::InvalidRequest, "invalid request".into()),
            LineKind::Retry => self.release(seq, None, "batch_expired: not run"),
            LineKind::ModelRefusal { .. } => Plan::Fail(FailureClass::Refused, "the model declined".into()),
            LineKind::Truncated { output_tokens, paid } => {
                let reason = "cut off at the output budget";
                let billed = paid.then_some(*output_tokens).filter(|t| *t > 0);
                let previous = view.output_budget.or(self.default_budget()).or(billed.map(|t| t as u32));
                let raised = previous.map(|p| (p, p.saturating_mul(2).min(CAP))).filter(|(p, next)| next > p);
                match (view.truncation_retried, raised) {
                    (false, Some((_, next))) => self.release(seq, Some(next), reason),
                    (true, _) => {
                        let used = view.output_budget.map_or_else(|| "the default".to_string(), |b| b.to_string());
                        let why = format!("{reason}; already retried once with an output budget of {used} tokens");
                        Plan::Fail(FailureClass::Truncated, why)
                    }
                    (false, None) => Plan::Fail(
                        FailureClass::Truncated,
                        format!("{reason}; no larger output budget to retry with (cap {CAP} tokens)"),
                    ),
                }
            }
        }
    }

    /// The paid usage a line carries, if any.
    fn line_usage(kind: &LineKind, label: usize, identity: usize) -> Option<commitpoint::domain::batch::Usage> {
        let request = |tag| universe::line_request(label, identity, tag);
        match kind {
            LineKind::Answer { paid: true, .. } => Some(universe::usage("m", 200, 50, request('a'))),
            LineKind::Truncated { output_tokens, paid: true } => {
                Some(universe::usage("m", 200, *output_tokens, request('t')))
            }
            LineKind::ModelRefusal { paid: true } => Some(universe::usage("free", 200, 10, request('r'))),
            _ => None,
        }
    }

    /// Result lines in one go; `judged`: answers come with the engine's verdict and are
    /// committed or failed as they are taken.
    pub(super) fn stage(&mut self, n: usize, lines: &[LinePick], judged: bool) -> Answer {
        let Some(label) = self.pick(n) else { return Answer::Skipped };
        let (provider, job) = {
            let batch = &self.batches[label].view;
            let job = match &batch.state {
                BatchStateView::Submitted { job_id } => Some(job_id.clone()),
                _ => None,
            };
            (batch.provider.clone(), job)
        };
        let batch_api = self.rules.batch_api;
        let paid =
            |usage, latency| Paid { provider: provider.clone(), job_id: job.clone(), usage, latency, batch: batch_api };
        let mut report = StageReport::default();
        for line in lines {
            let identity = super::subject::line_identity(line.target, &self.batches[label].created_with);
            let Some(seq) = self.live(identity) else {
                report.strangers += 1;
                continue;
            };
            let usage = Self::line_usage(&line.kind, label, identity);
            let plan = self.plan(seq, &line.kind);
            let state = self.ext[&seq].view.state.clone();
            let ours = match &state {
                StateView::Submitted { batch, .. } | StateView::Ready { batch, .. } => *batch == label,
                _ => false,
            };
            let replay = match (&state, &plan) {
                (StateView::Committed, _) => true,
                (StateView::Ready { .. }, _) if ours => true,
                (StateView::Submitted { job: Some(_), .. }, _) if ours => false,
                (StateView::Submitted { job: None, .. }, Plan::Fail(..) | Plan::Requeue(_)) if ours => false,
                _ => {
                    report.strangers += 1;
                    // Cancelled while its batch ran: paid for, charged, never applied.
                    if let (StateView::Cancelled, Some(usage)) = (&state, usage) {
                        self.charge(seq, &paid(usage, false), ChargeKind::Fresh);
                    }
                    continue;
                }
            };
            if replay {
                report.replays += 1;
                if let Some(usage) = usage {
                    self.charge(seq, &paid(usage, false), ChargeKind::Replay);
                }
                continue;
            }
            match (&line.kind, &plan) {
                (LineKind::Answer { ok, findings, .. }, _) => {
                    let text = universe::answer_text(*ok, findings);
                    let ready = StateView::Ready { provider: provider.clone(), batch: label };
                    if judged {
                        self.transition(seq, ready);
                        let charge = usage.map(|u| paid(u, true));
                        let fence = FenceView::Batch(label);
                        let answers_reask = u64::from(self.ext[&seq].view.reasks > 0);
                        match self.settle(seq, &universe::judge(&text), charge.as_ref(), provider.clone(), fence) {
                            commitpoint::store::PostOutcome::Committed { .. } => {
                                report.committed += 1;
                                report.reasks_committed += answers_reask;
                            }
                            commitpoint::store::PostOutcome::Reasked { .. } => report.reasked += 1,
                            _ => {
                                report.failed_validation += 1;
                                report.reasks_failed += answers_reask;
                            }
                        }
                        continue;
                    }
                    let staged = StagedView {
                        provider: provider.clone(),
                        job_id: job.clone().unwrap_or_default(),
                        output_json: text,
                        usage,
                        latency: true,
                    };
                    if let Some(ext) = self.ext.get_mut(&seq) {
                        ext.staged = Some(staged);
                    }
                    report.staged += 1;
                    self.transition(seq, ready);
                    continue;
                }
                (LineKind::ProviderRefusal, _) => report.refused += 1,
                (LineKind::Truncated { .. } | LineKind::ModelRefusal { .. }, _) => {
                    if let Some(usage) = usage {
                        self.charge(seq, &paid(usage, false), ChargeKind::Unusable);
                    }
                    if matches!(line.kind, LineKind::Truncated { .. }) {
                        report.truncated += 1;
                    }
                }
                (LineKind::Retry, _) => {}
            }
            self.apply_plan(seq, plan, &mut report);
        }
        Answer::Staged(report)
    }

    fn apply_plan(&mut self, seq: u64, plan: Plan, report: &mut StageReport) {
        match plan {
            Plan::Stored => {}
            Plan::Fail(class, reason) => {
                match class {
                    FailureClass::Truncated => report.failed_truncated += 1,
                    FailureClass::Refused => report.model_refusals += 1,
                    FailureClass::AttemptsExhausted => report.exhausted += 1,
                    _ => {}
                }
                self.transition(seq, StateView::Failed { class, reason });
            }
            Plan::Requeue(raise) => {
                report.requeued += 1;
                report.budget_retries += u64::from(raise.is_some());
                self.requeue(seq, raise, true);
            }
        }
    }

    /// Back to the queue; `new_attempt`: one more of the allowance used.
    fn requeue(&mut self, seq: u64, raise: Option<u32>, new_attempt: bool) {
        if let Some(view) = self.ext.get_mut(&seq).map(|e| &mut e.view) {
            if new_attempt {
                view.attempt += 1;
                view.requeues += 1;
            }
            if let Some(budget) = raise {
                view.output_budget = Some(budget);
                view.truncation_retried = true;
            }
        }
        self.transition(seq, StateView::Pending);
    }

    pub(super) fn close(&mut self, n: usize, leftover: &LeftoverPick) -> Answer {
        let Some(label) = self.pick(n) else { return Answer::Skipped };
        let mut report = CloseReport::default();
        if !self.batches[label].open {
            return Answer::Closed(report);
        }
        let outcome = match leftover {
            LeftoverPick::Requeue => "expired",
            LeftoverPick::Return => "failed: no capacity",
            LeftoverPick::Fail(_) => "failed: refused",
        };
        for seq in self.batches[label].seqs.clone() {
            let Some(ext) = self.ext.get(&seq) else { continue };
            if !matches!(&ext.view.state, StateView::Submitted { batch, .. } if *batch == label) {
                continue;
            }
            let plan = match leftover {
                LeftoverPick::Requeue => {
                    self.release(seq, None, &format!("its batch ended ({outcome}) without an answer for it"))
                }
                LeftoverPick::Return => {
                    report.requeued += 1;
                    self.requeue(seq, None, false);
                    continue;
                }
                LeftoverPick::Fail(class) => Plan::Fail(*class, format!("{class:?} batch")),
            };
            match plan {
                Plan::Fail(class, reason) => {
                    if class == FailureClass::AttemptsExhausted {
                        report.exhausted += 1;
                    } else {
                        report.failed += 1;
                    }
                    self.transition(seq, StateView::Failed { class, reason });
                }
                Plan::Requeue(raise) => {
                    report.requeued += 1;
                    self.requeue(seq, raise, true);
                }
                Plan::Stored => {}
            }
        }
        let batch = &mut self.batches[label];
        let job_id = match &batch.view.state {
            BatchStateView::Submitted { job_id } => Some(job_id.clone()),
            _ => None,
        };
        batch.view.state = BatchStateView::Closed { job_id, outcome: outcome.into() };
        batch.open = false;
        Answer::Closed(report)
    }

    /// The engine's commit of every answer staged for `provider`.
    pub(super) fn commit_ready(&mut self) -> Answer {
        let ready: Vec<u64> = PROVIDERS
            .iter()
            .flat_map(|provider| {
                self.ext
                    .iter()
                    .filter(
                        move |(_, e)| matches!(&e.view.state, StateView::Ready { provider: p, .. } if p == provider),
                    )
                    .map(|(seq, _)| *seq)
            })
            .collect();
        let mut out = Vec::new();
        for seq in ready {
            let Some(staged) = self.ext[&seq].staged.clone() else { continue };
            let StateView::Ready { batch, .. } = self.ext[&seq].view.state else { continue };
            let paid = staged.usage.clone().map(|usage| Paid {
                provider: staged.provider.clone(),
                job_id: Some(staged.job_id.clone()).filter(|j| !j.is_empty()),
                usage,
                latency: staged.latency,
                batch: self.rules.batch_api,
            });
            let submission = universe::judge(&staged.output_json);
            let outcome = self.post(seq, Reporter::Batch(Some(batch)), &submission, paid);
            out.push((self.ext[&seq].view.identity, outcome));
        }
        out.sort_by_key(|(identity, _)| *identity);
        Answer::Committed(out)
    }
}
