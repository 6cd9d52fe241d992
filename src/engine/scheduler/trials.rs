//! Evaluation trials (docs/EVALUATIONS.md) go through the provider's scheduler, so they
//! obey everything its production batches obey: one driver per provider (on PostgreSQL,
//! its driver lock), its pauses and its holds. They follow the same order of persisted
//! steps: the intent is committed before the provider is called, a trial batch that may
//! have reached the provider is looked up by its key before anything is sent again, the
//! job id is stored before it is polled, and answers seen twice are written once.
//!
//! A trial is asked once. An answer the provider does not give (an error line, an expired
//! job) is recorded as a failed trial, never sent again: the report counts it.

use std::collections::{BTreeSet, HashMap};

use tokio::sync::mpsc;
use tracing::Instrument;

use super::{Scheduler, traces};
use crate::domain::batch::{BatchMember, LineResult};
use crate::domain::clock;
use crate::domain::failpoint;
use crate::domain::identity::{ExtractionId, trial_id};
use crate::domain::lifecycle::FailureClass;
use crate::domain::schema::SourceText;
use crate::providers::{BatchSpec, ErrorClass, JobPhase, Lookup, ProviderError, ResultLine};
use crate::store::evaluation::{EvaluationRecord, TrialBatchRecord, TrialFinding, TrialVerdict};
use crate::store::{self, Judged, TrialAnswer};

/// Trial answers written in one store write.
const TRIAL_CHUNK: usize = 512;
/// How often evaluations are listed again without news of one (a store other instances
/// write to may have new ones).
const RELIST_EVALUATIONS_MS: u64 = 60_000;
/// Trial batches of one evaluation a provider has open at once without a budget: enough to
/// keep a long evaluation moving, few enough not to crowd out its production work.
const MAX_OPEN_TRIAL_BATCHES: usize = 4;
/// Under a budget, the first batch a candidate is sent, before its trial cost is known.
const FIRST_BUDGETED_TRIALS: usize = 10;

impl Scheduler {
    /// Drives this provider's due trial batches and forms new ones. Returns the earliest
    /// time something falls due.
    pub(super) async fn step_trials(&mut self) -> Result<Option<u64>, store::Error> {
        let mut next: Option<u64> = None;
        let mut earliest = |at: u64| next = Some(next.map_or(at, |n: u64| n.min(at)));
        let open: Vec<TrialBatchRecord> =
            self.store.trial_batches(true).await?.into_iter().filter(|b| b.candidate == self.provider.name()).collect();
        // Per evaluation, this provider's trial batches still open after this step's drive.
        let mut busy: HashMap<String, usize> = HashMap::new();
        for batch in open {
            let now = clock::now_ms();
            let sending = batch.job_id.is_none();
            let evaluation = batch.evaluation.clone();
            let at = if let Some(paused_until) = self.health.paused_until(now, sending) {
                Some(paused_until.max(batch.next_action_at_ms))
            } else if batch.next_action_at_ms > now {
                Some(batch.next_action_at_ms)
            } else {
                self.drive_trial(batch).await?
            };
            if let Some(at) = at {
                earliest(at);
                *busy.entry(evaluation).or_default() += 1;
            }
        }
        let now = clock::now_ms();
        if self.health.paused_until(now, true).is_some() {
            // The pause's own end wakes the loop; nothing is formed meanwhile.
            return Ok(next);
        }
        let created = self.signals.evaluations_created();
        // Listing decodes every evaluation's frozen set, so it is done when one was created
        // here, a trial batch of this provider closed, or (other instances may create them
        // on a shared store) a while has passed.
        let relist_at = self.evaluations_listed.map_or(now, |(at, _)| at.saturating_add(RELIST_EVALUATIONS_MS));
        let moved = self.evaluations_listed.is_none_or(|(_, seen)| seen != created);
        if moved || now >= relist_at {
            self.evaluations_listed = Some((now, created));
            for evaluation in self.store.evaluations().await? {
                let mine = evaluation.is_running() && evaluation.has_candidate(self.provider.name());
                let open = busy.get(&evaluation.name).copied().unwrap_or(0);
                // Under a budget, one batch at a time: each sizes the next by what it cost.
                let room = if evaluation.budget_micros.is_some() { 1 } else { MAX_OPEN_TRIAL_BATCHES };
                if !mine || open >= room || self.trials_sent.contains(&sent_key(&evaluation)) {
                    continue;
                }
                if let Some(at) = self.form_trials(&evaluation, room - open).await? {
                    earliest(at);
                }
            }
        }
        if self.store.commits().is_none()
            && let Some((at, _)) = self.evaluations_listed
        {
            earliest(at.saturating_add(RELIST_EVALUATIONS_MS));
        }
        Ok(next)
    }

    /// Up to `batches` trial batches of the members this candidate has not been sent; under
    /// a budget, one batch sized to what is left of it.
    async fn form_trials(
        &mut self,
        evaluation: &EvaluationRecord,
        batches: usize,
    ) -> Result<Option<u64>, store::Error> {
        let trials = self.store.trials(evaluation.name.clone()).await?;
        let sent: BTreeSet<u32> =
            trials.iter().filter(|t| t.candidate == self.provider.name()).map(|t| t.index).collect();
        let mut size = self.settings.batch_max_size.max(1);
        if let Some(budget) = evaluation.budget_micros {
            match budget_room(budget, &trials, self.provider.name()) {
                Some(room) => size = size.min(room),
                None => {
                    tracing::info!(evaluation = %evaluation.name, budget, "evaluation budget reached: no more trials sent");
                    return Ok(None);
                }
            }
        }
        let waiting: Vec<u32> = (0..evaluation.members.len())
            .filter(|i| !evaluation.members[*i].erased)
            .filter_map(|i| u32::try_from(i).ok())
            .filter(|i| !sent.contains(i))
            .collect();
        if waiting.is_empty() {
            // A frozen set never grows: this candidate has nothing more to send for it.
            self.trials_sent.insert(sent_key(evaluation));
            return Ok(None);
        }
        let mut next: Option<u64> = None;
        for chunk in waiting.chunks(size).take(batches) {
            let candidate = self.provider.name().to_string();
            let Some(batch) = self.store.create_trial_batch(evaluation.name.clone(), candidate, chunk.to_vec()).await?
            else {
                continue;
            };
            traces::trial_formed(&batch);
            tracing::info!(evaluation = %batch.evaluation, batch_key = %batch.batch_key, members = batch.members.len(), "trial batch formed");
            self.trials_formed_here.insert(batch.seq);
            if let Some(at) = self.drive_trial(batch).await? {
                next = Some(next.map_or(at, |n: u64| n.min(at)));
            }
        }
        Ok(next)
    }

    async fn drive_trial(&mut self, batch: TrialBatchRecord) -> Result<Option<u64>, store::Error> {
        match batch.job_id.clone() {
            None => self.submit_trial(batch).await,
            Some(job_id) => self.poll_trial(batch, &job_id).await,
        }
    }

    async fn submit_trial(&mut self, batch: TrialBatchRecord) -> Result<Option<u64>, store::Error> {
        let fresh = self.trials_formed_here.remove(&batch.seq) && batch.failures == 0;
        let Some(evaluation) = self.store.evaluation(batch.evaluation.clone()).await? else {
            self.store.close_trial_batch(batch.seq, "evaluation gone".into(), "its evaluation is gone".into()).await?;
            return Ok(None);
        };
        if !fresh {
            // Under every custom id it was formed with, whether or not its source is still
            // stored: a job created before a crash holds them all.
            let ids: Vec<ExtractionId> = trial_ids(&evaluation, &batch).into_iter().map(|(_, id)| id).collect();
            let span = traces::lookup(&traces::trial_key(&batch), &batch.candidate, ids.len());
            let answer =
                self.look_up(batch.batch_key.as_str(), batch.created_at_ms, &ids).instrument(span.clone()).await;
            traces::looked_up(&span, answer.as_ref().ok());
            match answer? {
                Ok(Lookup::Found(job_id)) => {
                    tracing::info!(batch_key = %batch.batch_key, %job_id, "found the job of an unresolved trial batch; polling it instead of resubmitting");
                    return self.accept_trial(&batch, job_id).await;
                }
                Ok(Lookup::Absent) => {}
                Ok(Lookup::Undecided { recheck_after, reason }) => {
                    let at = self.recheck_at(recheck_after);
                    self.store.reschedule_trial_batch(batch.seq, at, Some(reason), false).await?;
                    return Ok(Some(at));
                }
                Err(e) => return self.on_trial_error(&batch, &e, true).await,
            }
        }
        // Nothing of this batch is at the provider: what is sent is decided now.
        if !evaluation.is_running() {
            let reason = "the evaluation was cancelled before this batch was sent";
            self.store.close_trial_batch(batch.seq, "cancelled".into(), reason.into()).await?;
            return Ok(None);
        }
        let lines = self.store.trial_batch_members(batch.seq).await?;
        let (members, gone): (Vec<_>, Vec<_>) = lines.into_iter().partition(|(_, member)| member.is_some());
        if !gone.is_empty() {
            let answers = gone
                .iter()
                .map(|(index, _)| TrialAnswer {
                    index: *index,
                    verdict: TrialVerdict::Failed { reason: "the source is no longer stored".into() },
                    usage: None,
                })
                .collect();
            self.store.record_trials(batch.seq, answers, self.provider.batch_api()).await?;
        }
        let members: Vec<BatchMember> = members.into_iter().filter_map(|(_, member)| member).collect();
        if members.is_empty() {
            self.store.close_trial_batch(batch.seq, "nothing to send".into(), "nothing to send".into()).await?;
            return Ok(None);
        }
        let Ok(schema) = self.registry.get(&evaluation.schema) else {
            let reason = format!("schema {} is no longer registered", evaluation.schema);
            self.store.close_trial_batch(batch.seq, "schema missing".into(), reason).await?;
            return Ok(None);
        };
        let spec = BatchSpec { batch_key: batch.batch_key.as_str(), schema: &schema, members: &members };
        let span = traces::trial_submit(&batch, members.len());
        let sent = self.provider.submit(&spec).instrument(span.clone()).await;
        span.record("outcome", if sent.is_ok() { "submitted" } else { "error" });
        match sent {
            Ok(job_id) => {
                span.record("job_id", job_id.as_str());
                failpoint::hit("after-trial-submit-before-job-id");
                tracing::info!(batch_key = %batch.batch_key, %job_id, members = members.len(), "trial batch submitted");
                self.accept_trial(&batch, job_id).await
            }
            Err(e) => self.on_trial_error(&batch, &e, true).await,
        }
    }

    async fn accept_trial(&self, batch: &TrialBatchRecord, job_id: String) -> Result<Option<u64>, store::Error> {
        let next_poll = clock::now_ms() + self.settings.poll_interval.as_millis() as u64;
        self.store.record_trial_job(batch.seq, job_id, next_poll).await?;
        Ok(Some(next_poll))
    }

    async fn poll_trial(&mut self, batch: TrialBatchRecord, job_id: &str) -> Result<Option<u64>, store::Error> {
        let key = traces::trial_key(&batch);
        let span = traces::poll(&key, &batch.candidate, job_id);
        let status = match self.provider.poll(job_id).instrument(span.clone()).await {
            Ok(status) => status,
            Err(e) => return self.on_trial_error(&batch, &e, false).await,
        };
        span.record("phase", traces::phase(&status.phase));
        drop(span);
        let note = self.note_stall(&batch.batch_key, batch.note.as_deref(), &status.phase);
        if !status.phase.is_terminal() {
            let next = clock::now_ms() + self.settings.poll_interval.as_millis() as u64;
            self.store.reschedule_trial_batch(batch.seq, next, note, false).await?;
            return Ok(Some(next));
        }
        let ingested =
            self.ingest_trials(&batch, &status).instrument(traces::results(&key, &batch.candidate, job_id)).await?;
        if let Err(e) = ingested {
            return self.on_trial_error(&batch, &e, false).await;
        }
        failpoint::hit("after-trial-answers-before-close");
        let (outcome, unanswered) = match &status.phase {
            JobPhase::Failed { reason, .. } => (format!("failed: {reason}"), format!("the job failed: {reason}")),
            phase => {
                let phase = format!("{phase:?}").to_lowercase();
                (phase.clone(), format!("no answer in the provider's results (the job ended {phase})"))
            }
        };
        let failed = self.store.close_trial_batch(batch.seq, outcome.clone(), unanswered).await?;
        // A budgeted evaluation sends its next batch once this one's cost is known.
        self.evaluations_listed = None;
        if self.settings.delete_provider_files {
            self.delete_files_later(status.clone());
        }
        tracing::info!(evaluation = %batch.evaluation, batch_key = %batch.batch_key, %outcome, unanswered = failed, "trial batch closed");
        Ok(None)
    }

    /// Reads the job's result lines, judges each against the evaluation's schema, and
    /// stores them in chunks. The outer error is the store's; the inner one the provider's.
    async fn ingest_trials(
        &self,
        batch: &TrialBatchRecord,
        status: &crate::providers::JobStatus,
    ) -> Result<Result<(), ProviderError>, store::Error> {
        let Some(evaluation) = self.store.evaluation(batch.evaluation.clone()).await? else { return Ok(Ok(())) };
        // The custom id each trial went out under, back to its member index, with its source
        // where it is still stored (grounding needs it; an answer is paid for either way).
        let mut sources: HashMap<u32, BatchMember> = HashMap::new();
        for (index, member) in self.store.trial_batch_members(batch.seq).await? {
            sources.extend(member.map(|m| (index, m)));
        }
        let by_custom_id: HashMap<String, (u32, Option<BatchMember>)> = trial_ids(&evaluation, batch)
            .into_iter()
            .map(|(index, id)| (id.to_hex(), (index, sources.remove(&index))))
            .collect();
        let schema = self.registry.get(&evaluation.schema).ok();
        let judge = self.committer.judge().clone();
        let (sender, mut incoming) = mpsc::channel::<ResultLine>(TRIAL_CHUNK);
        let provider = self.provider.clone();
        let download = async move {
            let counts = provider.stream_results(status, &sender).await;
            drop(sender);
            counts
        };
        let store = &self.store;
        let batch_api = self.provider.batch_api();
        let write = async move {
            let mut chunk = Vec::with_capacity(TRIAL_CHUNK);
            while incoming.recv_many(&mut chunk, TRIAL_CHUNK).await > 0 {
                let answers: Vec<TrialAnswer> = chunk
                    .drain(..)
                    .filter_map(|(custom_id, result)| {
                        let (index, member) = by_custom_id.get(&custom_id)?;
                        let source = member.as_ref().map(|m| SourceText { id: &m.source_id, text: &m.content });
                        let (verdict, usage) = judge_trial(&judge, schema.as_deref(), source, result);
                        Some(TrialAnswer { index: *index, verdict, usage })
                    })
                    .collect();
                if !answers.is_empty() {
                    store.record_trials(batch.seq, answers, batch_api).await?;
                }
            }
            Ok::<(), store::Error>(())
        };
        let (counts, written) = tokio::join!(download, write);
        written?;
        Ok(counts.map(|_| ()))
    }

    /// What a failed provider call means for a trial batch: waits as the production path
    /// waits, and gives up (the trials fail) where that path would fail its members.
    async fn on_trial_error(
        &mut self,
        batch: &TrialBatchRecord,
        error: &ProviderError,
        submitting: bool,
    ) -> Result<Option<u64>, store::Error> {
        let now = clock::now_ms();
        tracing::warn!(batch_key = %batch.batch_key, class = ?error.class, error = %error, "provider call for a trial batch failed");
        let give_up = match error.class {
            ErrorClass::InvalidRequest | ErrorClass::TooLarge | ErrorClass::Protocol => submitting,
            // Providers answer 404 for live jobs now and then: only a run of them, spread by
            // the backoff over about as long as production waits (`job_gone_after`), ends it.
            ErrorClass::Gone => !submitting && batch.failures + 1 >= self.settings.max_submit_failures,
            ErrorClass::RateLimited | ErrorClass::Auth | ErrorClass::Budget => false,
            ErrorClass::Transient => submitting && batch.failures + 1 >= self.settings.max_submit_failures,
        };
        if give_up {
            let reason = format!("the provider refused the trial batch: {error}");
            self.store.close_trial_batch(batch.seq, "rejected by the provider".into(), reason).await?;
            return Ok(None);
        }
        let delay = error
            .retry_after
            .unwrap_or_else(|| crate::domain::backoff::backoff_delay(batch.failures + 1, super::BACKOFF_CAP));
        let at = now.saturating_add(delay.min(super::MAX_PROVIDER_DELAY).as_millis() as u64);
        let counted = !matches!(error.class, ErrorClass::RateLimited);
        self.store.reschedule_trial_batch(batch.seq, at, Some(error.to_string()), counted).await?;
        Ok(Some(at))
    }
}

/// An evaluation as `trials_sent` knows it: a name freed by an erasure and taken again is
/// another evaluation.
fn sent_key(evaluation: &EvaluationRecord) -> (String, u64) {
    (evaluation.name.clone(), evaluation.created_at_ms)
}

/// Under a budget, how many more trials this candidate's next batch may hold: what is left
/// once the spend so far and the trials still waiting (at the mean trial cost) are taken
/// off, at this candidate's mean trial cost; a candidate with no priced answer yet gets a
/// first batch of a few. `None` once nothing is left. Other candidates sending at the same
/// moment see each other's trials only once they are written, so spend can pass the budget
/// by about one batch per candidate.
fn budget_room(budget: u64, trials: &[crate::store::evaluation::Trial], candidate: &str) -> Option<usize> {
    let costs = |mine: bool| -> Vec<u64> {
        trials
            .iter()
            .filter(|t| !mine || t.candidate == candidate)
            .filter_map(|t| t.record.outcome.as_ref())
            .map(|o| o.cost_micros)
            .filter(|c| *c > 0)
            .collect()
    };
    let mean = |costs: Vec<u64>| costs.iter().sum::<u64>().checked_div(costs.len() as u64).filter(|m| *m > 0);
    let spent: u64 = trials.iter().filter_map(|t| t.record.outcome.as_ref()).map(|o| o.cost_micros).sum();
    let waiting = trials.iter().filter(|t| t.record.outcome.is_none()).count() as u64;
    let committed = spent.saturating_add(waiting.saturating_mul(mean(costs(false)).unwrap_or(0)));
    if committed >= budget {
        return None;
    }
    match mean(costs(true)) {
        Some(each) => Some(usize::try_from((budget - committed) / each).unwrap_or(usize::MAX).max(1)),
        None => Some(FIRST_BUDGETED_TRIALS),
    }
}

/// The custom id each member of a trial batch goes out under, with its member index.
fn trial_ids(evaluation: &EvaluationRecord, batch: &TrialBatchRecord) -> Vec<(u32, ExtractionId)> {
    batch
        .members
        .iter()
        .filter_map(|i| Some((*i, evaluation.members.get(usize::try_from(*i).ok()?)?)))
        .map(|(i, m)| (i, trial_id(&batch.evaluation, &batch.candidate, &m.id)))
        .collect()
}

/// One result line as a trial verdict, with what the call used.
fn judge_trial(
    judge: &crate::engine::commit::Judge,
    schema: Option<&crate::domain::schema::Schema>,
    source: Option<SourceText<'_>>,
    result: LineResult,
) -> (TrialVerdict, Option<crate::domain::batch::Usage>) {
    match result {
        LineResult::Answer { output, usage } => {
            let verdict = match schema {
                Some(schema) => match Judged::from(&judge.judge_answer(schema, &output, source)) {
                    Judged::Valid { output_json, findings } => TrialVerdict::Valid {
                        output_json,
                        findings: findings
                            .into_iter()
                            .map(|f| TrialFinding { canonical_identity: f.canonical_identity, body_json: f.body_json })
                            .collect(),
                    },
                    Judged::Invalid { reason, .. } => TrialVerdict::Invalid { reason },
                },
                None => TrialVerdict::Invalid { reason: "the evaluation's schema is no longer registered".into() },
            };
            (verdict, usage)
        }
        LineResult::Unusable { class: FailureClass::Truncated, reason, usage } => {
            (TrialVerdict::Truncated { reason }, usage)
        }
        LineResult::Unusable { reason, usage, .. } => (TrialVerdict::Refused { reason }, usage),
        LineResult::Refused { reason, .. } => (TrialVerdict::Failed { reason }, None),
        LineResult::Retry { reason } => (TrialVerdict::Failed { reason: format!("no answer: {reason}") }, None),
    }
}
