//! Provider batches in the store: submit intents, job ids, staged results, closing.
//!
//! The order of durable facts is what makes submission exactly-once: the intent (with
//! its deterministic batch key, members moved to `Submitted{job_id: None}`) is committed
//! before the provider is called; the job id is committed before anything else happens
//! to the members; results are staged (`Ready`) before they are validated and committed.

use std::sync::Arc;

use redb::ReadableTable;

use super::codec::{decode, encode};
use super::extractions::{load, settle, transition};
use super::ledger::record_charge;
use super::records::{BatchRecord, BatchState, ChargeKind, Fence, StoredContent};
use super::rules::intent::{self, Filling, IntentOutcome, IntentRequest};
use super::rules::member::{Effect, MemberRules, plan_line, release, requeue};
use super::staged::StagedAnswer;
use super::tables;
use super::tables::required;
use super::write_tables::WriteTables;
use super::{Error, ExtractionRecord, Flush, Store};
use crate::domain::batch::{BatchMember, LineResult, Usage};
use crate::domain::identity::ExtractionId;
use crate::domain::lifecycle::{self, Event, FailureClass, Outcome, State, StateName};
use crate::store::seam::Charge;
use crate::store::seam::{CloseReport, IngestLine, Leftover, ReadyItem, StageReport};
use crate::store::seam::{Judged, PostOutcome};

impl Store {
    /// Persists a submit intent for up to `max_size` pending extractions of one schema,
    /// unless there is not yet enough (or old enough) work.
    pub async fn create_intent(&self, request: IntentRequest) -> Result<IntentOutcome, Error> {
        self.writer.write(move |t| create_intent(t, &request)).await
    }

    pub async fn record_job(&self, batch: u64, job_id: String, next_poll_at_ms: u64) -> Result<BatchRecord, Error> {
        self.writer.write(move |t| record_job(t, batch, &job_id, next_poll_at_ms)).await
    }

    /// Persists when the scheduler should look at the batch again, and why. A `note` with
    /// `count_failure` set is one more consecutive failure (the bounded-attempt count);
    /// without it (rate limits, pauses) it is only recorded as the last error.
    pub async fn reschedule_batch(
        &self,
        batch: u64,
        next_action_at_ms: u64,
        note: Option<String>,
        count_failure: bool,
    ) -> Result<(), Error> {
        self.writer
            .write(move |t| {
                let mut record = load_batch(t, batch)?;
                record.next_action_at_ms = next_action_at_ms;
                match note {
                    Some(reason) => {
                        if count_failure {
                            record.failures += 1;
                        }
                        record.last_error = Some(reason);
                    }
                    None => {
                        record.failures = 0;
                        record.not_found_since_ms = None;
                    }
                }
                record.updated_at_ms = t.now_ms;
                save_batch(t, &record)?;
                Ok(((), true))
            })
            .await
    }

    /// Records one more 404 for the batch's job without counting a failure: the window
    /// opened at `since_ms` (kept if already open) decides when the job is declared gone.
    pub async fn note_not_found(
        &self,
        batch: u64,
        since_ms: u64,
        next_action_at_ms: u64,
        note: String,
    ) -> Result<(), Error> {
        self.writer
            .write(move |t| {
                let mut record = load_batch(t, batch)?;
                record.not_found_since_ms = Some(record.not_found_since_ms.unwrap_or(since_ms));
                record.next_action_at_ms = next_action_at_ms;
                record.last_error = Some(note);
                record.updated_at_ms = t.now_ms;
                save_batch(t, &record)?;
                Ok(((), true))
            })
            .await
    }

    /// Stores one chunk of result lines. Safe to call again with the same lines.
    pub async fn stage_results(
        &self,
        batch: u64,
        lines: Vec<(ExtractionId, LineResult)>,
        rules: MemberRules,
    ) -> Result<StageReport, Error> {
        let lines = lines.into_iter().map(|(id, result)| IngestLine { id, result, judged: None }).collect();
        self.ingest_results(batch, lines, rules, Flush::Now).await
    }

    /// Stores one chunk of result lines in one transaction, committing every judged
    /// answer there and then. Safe to call again with the same lines: an answer already
    /// taken is a replay. With `Flush::Later` the chunk reaches the disk with the next
    /// flushed commit (a file's last chunk asks for `Now`).
    pub async fn ingest_results(
        &self,
        batch: u64,
        lines: Vec<IngestLine>,
        rules: MemberRules,
        flush: Flush,
    ) -> Result<StageReport, Error> {
        // Shared, not copied: the writer clones a job each time it applies it.
        let lines: Arc<[IngestLine]> = lines.into();
        self.writer.write_flushed(flush, move |t| stage_results(t, batch, &lines, &rules)).await
    }

    /// A flushed commit that writes nothing: it puts every `Flush::Later` commit before it
    /// on disk.
    pub async fn flush(&self) -> Result<(), Error> {
        self.writer.write(|_| Ok(((), true))).await
    }

    /// Ends a batch: members still without an answer are requeued (a new attempt of the
    /// same identity, within their attempt cap) or failed, and the batch leaves the
    /// scheduler's open set.
    pub async fn close_batch(
        &self,
        batch: u64,
        outcome: String,
        leftover: Leftover,
        rules: MemberRules,
    ) -> Result<CloseReport, Error> {
        self.writer.write(move |t| close_batch(t, batch, outcome, &leftover, &rules)).await
    }

    pub async fn open_batches(&self) -> Result<Vec<BatchRecord>, Error> {
        self.read(|txn| {
            let open = txn.open_table(tables::OPEN_BATCHES)?;
            let batches = txn.open_table(tables::BATCHES)?;
            let mut out = Vec::new();
            for entry in open.iter()? {
                let seq = entry?.0.value();
                let value = batches.get(seq)?.ok_or_else(|| Error::Corrupt {
                    kind: "batch",
                    reason: format!("open batch #{seq} has no record"),
                })?;
                out.push(decode(value.value())?);
            }
            Ok(out)
        })
        .await
    }

    /// Job ids of `provider`'s batches created at or after `since_ms`, newest first.
    pub async fn recorded_jobs_since(&self, provider: String, since_ms: u64) -> Result<Vec<String>, Error> {
        self.read(move |txn| {
            let batches = txn.open_table(tables::BATCHES)?;
            let mut jobs = Vec::new();
            // Batch sequences grow with time: walk back until the window is passed.
            for entry in batches.iter()?.rev() {
                let record: BatchRecord = decode(entry?.1.value())?;
                if record.created_at_ms < since_ms {
                    break;
                }
                let job = match record.state {
                    BatchState::Submitted { job_id } | BatchState::Closed { job_id: Some(job_id), .. } => job_id,
                    _ => continue,
                };
                if record.provider == provider.as_str() {
                    jobs.push(job);
                }
            }
            Ok(jobs)
        })
        .await
    }

    pub async fn batch_members(&self, batch: u64) -> Result<Vec<BatchMember>, Error> {
        self.read(move |txn| {
            let batches = txn.open_table(tables::BATCHES)?;
            let extractions = txn.open_table(tables::EXTRACTIONS)?;
            let contents = txn.open_table(tables::CONTENTS)?;
            let record: BatchRecord = match batches.get(batch)? {
                Some(v) => decode(v.value())?,
                None => return Ok(Vec::new()),
            };
            let mut members = Vec::with_capacity(record.members.len());
            for seq in record.members {
                let missing = |kind| Error::Corrupt { kind, reason: format!("batch member #{seq} is missing") };
                let Some(value) = extractions.get(seq)? else {
                    // Erased after submission: a line no one owns keeps the others' positions.
                    members.push(BatchMember {
                        id: ExtractionId([0; 32]),
                        source_id: String::new(),
                        content: String::new(),
                        output_budget: None,
                    });
                    continue;
                };
                let extraction: ExtractionRecord = decode(value.value())?;
                let content: StoredContent = decode(contents.get(seq)?.ok_or_else(|| missing("content"))?.value())?;
                members.push(BatchMember {
                    id: extraction.id,
                    source_id: extraction.source_id,
                    content: content.text,
                    output_budget: extraction.output_budget,
                });
            }
            Ok(members)
        })
        .await
    }

    /// Up to `limit` extractions whose answer from `provider` is staged and awaits commit.
    /// Each provider's scheduler commits only its own, so no answer is validated twice.
    pub async fn ready_items(&self, provider: String, limit: usize) -> Result<Vec<ReadyItem>, Error> {
        self.read(move |txn| {
            let index = txn.open_table(tables::STATE_INDEX)?;
            let extractions = txn.open_table(tables::EXTRACTIONS)?;
            let staged = txn.open_table(tables::STAGED)?;
            let code = StateName::Ready.code();
            let mut out = Vec::new();
            for entry in index.range((code, 0)..=(code, u64::MAX))? {
                if out.len() >= limit {
                    break;
                }
                let seq = entry?.0.value().1;
                let missing = |kind| Error::Corrupt { kind, reason: format!("ready extraction #{seq} has no {kind}") };
                let record: ExtractionRecord =
                    decode(extractions.get(seq)?.ok_or_else(|| missing("extraction"))?.value())?;
                if !matches!(&record.state, State::Ready { provider: p, .. } if *p == provider.as_str()) {
                    continue;
                }
                let staged = decode(staged.get(seq)?.ok_or_else(|| missing("staged answer"))?.value())?;
                out.push(ReadyItem { record, staged });
            }
            Ok(out)
        })
        .await
    }
}

fn create_intent(t: &mut WriteTables<'_>, request: &IntentRequest) -> Result<(IntentOutcome, bool), Error> {
    let accept = |tenant: &str| (request.accept.0)(tenant, &request.schema);
    // Only the work this provider may take, oldest first: no other schema's or held
    // tenant's work is read, so forming a batch costs the batch, not the backlog.
    let seqs = super::pending_queue::oldest(&t.pending_queue, &request.schema, &accept, request.max_size)?;
    let now_ms = t.now_ms;
    // Loaded one by one as `fill` asks: it stops at the batch's byte or count limit.
    let candidates = seqs.into_iter().map(|seq| load(t, seq));
    let members = match intent::fill(candidates, request, now_ms)? {
        Filling::NotYet(outcome) => return Ok((outcome, false)),
        Filling::Due(members) => members,
    };
    let seq = t.allocate_batch_seq();
    let (batch, enqueue) = intent::intent(request, seq, &members, t.now_ms);
    for mut member in members {
        if let Ok(Outcome::Changed(next)) = lifecycle::apply(&member.state, enqueue.clone(), t.now_ms) {
            transition(t, &mut member, next)?;
        }
    }
    save_batch(t, &batch)?;
    t.open_batches.insert(seq, ())?;
    Ok((IntentOutcome::Created(Box::new(batch)), true))
}

fn record_job(
    t: &mut WriteTables<'_>,
    batch: u64,
    job_id: &str,
    next_poll_at_ms: u64,
) -> Result<(BatchRecord, bool), Error> {
    let mut record = load_batch(t, batch)?;
    if let BatchState::Submitted { job_id: known } = &record.state
        && known == job_id
    {
        return Ok((record, false));
    }
    // An intent its tenant erasure closed stays closed; the provider's job is left alone.
    if matches!(record.state, BatchState::Closed { .. }) {
        return Ok((record, false));
    }
    for seq in record.members.clone() {
        let Some(mut member) = load_member(t, seq)? else { continue };
        let event = Event::JobAccepted { batch_key: record.batch_key.clone(), job_id: job_id.to_string() };
        if let Ok(Outcome::Changed(next)) = lifecycle::apply(&member.state, event, t.now_ms) {
            transition(t, &mut member, next)?;
        }
    }
    record.state = BatchState::Submitted { job_id: job_id.to_string() };
    record.next_action_at_ms = next_poll_at_ms;
    record.failures = 0;
    record.not_found_since_ms = None;
    record.last_error = None;
    record.updated_at_ms = t.now_ms;
    save_batch(t, &record)?;
    Ok((record, true))
}

fn stage_results(
    t: &mut WriteTables<'_>,
    batch: u64,
    lines: &[IngestLine],
    rules: &MemberRules,
) -> Result<(StageReport, bool), Error> {
    let record = load_batch(t, batch)?;
    let job_id = match &record.state {
        BatchState::Submitted { job_id } => job_id.clone(),
        _ => String::new(),
    };
    let latency_ms = t.now_ms.saturating_sub(record.created_at_ms);
    let charge = |usage: &Usage, latency_ms: Option<u64>| Charge {
        provider: record.provider.to_string(),
        job_id: Some(job_id.clone()).filter(|j| !j.is_empty()),
        usage: usage.clone(),
        latency_ms,
        batch: rules.batch_api,
    };
    let mut report = StageReport::default();
    let mut wrote = false;
    for IngestLine { id, result: line, judged } in lines {
        let Some(seq) = t.identity.get(id.as_bytes())?.map(|v| v.value()) else {
            report.strangers += 1;
            continue;
        };
        let mut member = load(t, seq)?;
        let (event, effect) = plan_line(&member, line, record.batch_key.clone(), rules);
        let next = match lifecycle::apply(&member.state, event, t.now_ms) {
            Ok(Outcome::Changed(next)) => next,
            Ok(Outcome::Replay) => {
                report.replays += 1;
                // A re-fetched result file: the call is counted again, never charged again.
                if let LineResult::Answer { usage: Some(usage), .. } | LineResult::Unusable { usage: Some(usage), .. } =
                    line
                {
                    record_charge(t, &member, &charge(usage, None), ChargeKind::Replay)?;
                    wrote = true;
                }
                continue;
            }
            Err(_) => {
                report.strangers += 1;
                // Cancelled while its batch ran: the answer was paid for, so it is charged
                // to the attempt that paid, and never applied.
                if let (State::Cancelled { .. }, LineResult::Answer { usage: Some(usage), .. })
                | (State::Cancelled { .. }, LineResult::Unusable { usage: Some(usage), .. }) = (&member.state, line)
                {
                    record_charge(t, &member, &charge(usage, None), ChargeKind::Fresh)?;
                    wrote = true;
                }
                continue;
            }
        };
        match line {
            LineResult::Answer { output, usage } => {
                // Judged against this schema outside the writer: Ready is only a step of
                // this transaction, and the answer is written once, as its result.
                if let Some(submission) = judged.as_ref().filter(|_| member.schema == record.schema) {
                    let outcome = commit_judged(
                        t,
                        &mut member,
                        next,
                        &record,
                        submission,
                        usage.as_ref().map(|u| charge(u, Some(latency_ms))),
                    )?;
                    match outcome {
                        PostOutcome::Committed { .. } => report.committed += 1,
                        PostOutcome::Failed { .. } => report.failed_validation += 1,
                        _ => {}
                    }
                    wrote = true;
                    continue;
                }
                let staged = StagedAnswer {
                    provider: record.provider.to_string(),
                    job_id: job_id.clone(),
                    output_json: output.clone(),
                    usage: usage.clone(),
                    latency_ms: Some(latency_ms),
                    received_at_ms: t.now_ms,
                };
                t.staged.insert(seq, encode(&staged)?.as_slice())?;
                report.staged += 1;
            }
            LineResult::Refused { .. } => report.refused += 1,
            LineResult::Retry { .. } => {}
            LineResult::Unusable { class, usage, .. } => {
                // Paid for, and charged to the attempt that paid, before any requeue.
                if let Some(usage) = usage {
                    record_charge(t, &member, &charge(usage, None), ChargeKind::Unusable)?;
                }
                if *class == FailureClass::Truncated {
                    report.truncated += 1;
                }
            }
        }
        match (&next, effect) {
            (State::Failed { class: FailureClass::Truncated, .. }, _) => report.failed_truncated += 1,
            (State::Failed { class: FailureClass::Refused, .. }, _) => report.model_refusals += 1,
            (State::Failed { class: FailureClass::AttemptsExhausted, .. }, _) => report.exhausted += 1,
            (_, Effect::Requeue { raise_to }) => {
                report.requeued += 1;
                report.budget_retries += u64::from(raise_to.is_some());
            }
            _ => {}
        }
        requeue(&mut member, effect);
        transition(t, &mut member, next)?;
        wrote = true;
    }
    Ok((report, wrote))
}

/// Takes a judged answer from `Submitted` through `ready` to committed or failed, as a
/// later commit of the staged answer would have, under the batch's authority.
fn commit_judged(
    t: &mut WriteTables<'_>,
    member: &mut ExtractionRecord,
    ready: State,
    batch: &BatchRecord,
    answer: &Judged,
    charge: Option<Charge>,
) -> Result<PostOutcome, Error> {
    let batch_key = batch.batch_key.clone();
    let event = match answer {
        Judged::Valid { .. } => Event::ReadyValid { batch_key: batch_key.clone() },
        Judged::Invalid { reason } => Event::ReadyInvalid { batch_key: batch_key.clone(), reason: reason.clone() },
    };
    let Ok(Outcome::Changed(next)) = lifecycle::apply(&ready, event, t.now_ms) else {
        return Err(Error::Corrupt {
            kind: "lifecycle",
            reason: format!("a ready answer of extraction #{} could not be committed", member.seq),
        });
    };
    let producer = batch.provider.to_string();
    settle(t, member, next, answer, charge.as_ref(), producer, Fence::Batch(batch_key))
}

fn close_batch(
    t: &mut WriteTables<'_>,
    batch: u64,
    outcome: String,
    leftover: &Leftover,
    rules: &MemberRules,
) -> Result<(CloseReport, bool), Error> {
    let mut record = load_batch(t, batch)?;
    if matches!(record.state, BatchState::Closed { .. }) {
        return Ok((CloseReport::default(), false));
    }
    let mut report = CloseReport::default();
    for seq in record.members.clone() {
        let Some(mut member) = load_member(t, seq)? else { continue };
        if !matches!(&member.state, State::Submitted { batch_key, .. } if *batch_key == record.batch_key) {
            continue;
        }
        let key = record.batch_key.clone();
        let (event, effect) = match leftover {
            Leftover::Requeue => {
                release(&member, key, rules, None, &format!("its batch ended ({outcome}) without an answer for it"))
            }
            Leftover::Return => (Event::Requeue { batch_key: key }, Effect::None),
            Leftover::Fail { class, reason } => {
                (Event::ProviderFailed { batch_key: key, class: *class, reason: reason.clone() }, Effect::None)
            }
        };
        if let Ok(Outcome::Changed(next)) = lifecycle::apply(&member.state, event, t.now_ms) {
            match (&next, effect) {
                (State::Failed { class: FailureClass::AttemptsExhausted, .. }, _) => report.exhausted += 1,
                (State::Failed { .. }, _) => report.failed += 1,
                (_, Effect::Requeue { .. }) => report.requeued += 1,
                (State::Pending, Effect::None) => report.requeued += 1,
                _ => {}
            }
            requeue(&mut member, effect);
            transition(t, &mut member, next)?;
        }
    }
    let job_id = match &record.state {
        BatchState::Submitted { job_id } => Some(job_id.clone()),
        _ => None,
    };
    record.state = BatchState::Closed { job_id, outcome };
    record.updated_at_ms = t.now_ms;
    save_batch(t, &record)?;
    t.open_batches.remove(batch)?;
    Ok((report, true))
}

/// A member whose tenant was erased is gone; its sequence stays in the list (see `erase`).
pub(super) fn load_member(t: &WriteTables<'_>, seq: u64) -> Result<Option<ExtractionRecord>, Error> {
    if t.extractions.get(seq)?.is_none() {
        return Ok(None);
    }
    load(t, seq).map(Some)
}

pub(super) fn load_batch(t: &WriteTables<'_>, batch: u64) -> Result<BatchRecord, Error> {
    decode(&required(t.batches.get(batch)?, "batch", batch)?)
}

pub(super) fn save_batch(t: &mut WriteTables<'_>, record: &BatchRecord) -> Result<(), Error> {
    t.batches.insert(record.seq, encode(record)?.as_slice())?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::batch::OutputBudget;
    use crate::domain::identity::SourceHash;
    use crate::store::{NewExtraction, RetryOutcome, Submission, WorkFilter};

    #[test]
    fn a_raised_budget_doubles_the_last_one_up_to_the_cap() {
        let budget = OutputBudget { default: Some(1000), cap: 3000 };
        assert_eq!(budget.raised(None, Some(1000)), Some(2000), "the default was used");
        assert_eq!(budget.raised(Some(2000), None), Some(3000), "a member's own budget, capped");
        assert_eq!(budget.raised(Some(3000), None), None, "nothing larger is allowed");
        let unset = OutputBudget { default: None, cap: 16_384 };
        assert_eq!(unset.raised(None, Some(700)), Some(1400), "where the cut-off answer stopped");
        assert_eq!(unset.raised(None, Some(16_384)), None, "cut off at the model's own limit");
        assert_eq!(unset.raised(None, None), None, "no budget known: no claim that a larger one helps");
        assert_eq!(unset.raised(None, Some(0)), None);
    }

    const RULES: MemberRules =
        MemberRules { max_attempts: 3, budget: OutputBudget { default: Some(1000), cap: 3000 }, batch_api: true };

    struct Rig {
        store: Store,
        _guard: crate::store::WriterGuard,
        _dir: tempfile::TempDir,
        id: ExtractionId,
    }

    async fn rig() -> Rig {
        let dir = tempfile::tempdir().unwrap();
        let (store, guard) = Store::open(dir.path(), 1 << 20).unwrap();
        let schema = "code-review@1";
        let hash = SourceHash::compute(b"x", schema);
        let id = ExtractionId::compute("t", "s", &hash, schema);
        let new = NewExtraction {
            id,
            tenant: "t".into(),
            source_id: "s".into(),
            source_hash: hash,
            schema: schema.into(),
            metadata_json: None,
            content: "x".into(),
        };
        store.intake(new).await.unwrap();
        Rig { store, _guard: guard, _dir: dir, id }
    }

    impl Rig {
        /// Puts the extraction into a submitted batch with a job; returns the batch.
        async fn submitted(&self) -> u64 {
            let request = IntentRequest {
                provider: "p".into(),
                schema: "code-review@1".into(),
                accept: WorkFilter(Arc::new(|_: &str, _: &str| true)),
                max_size: 1,
                max_content_bytes: u64::MAX,
                max_wait_ms: 0,
            };
            let IntentOutcome::Created(batch) = self.store.create_intent(request).await.unwrap() else { panic!() };
            self.store.record_job(batch.seq, format!("job-{}", batch.seq), 0).await.unwrap();
            assert_eq!(self.store.batch_members(batch.seq).await.unwrap().len(), 1);
            batch.seq
        }

        async fn stage(&self, line: LineResult) -> StageReport {
            let batch = self.submitted().await;
            self.store.stage_results(batch, vec![(self.id, line)], RULES).await.unwrap()
        }

        async fn record(&self) -> ExtractionRecord {
            self.store.get(self.id).await.unwrap().unwrap()
        }
    }

    fn truncated(output_tokens: u64) -> LineResult {
        let usage = Usage { model: "m".into(), output_tokens, request_id: None, ..Usage::default() };
        LineResult::Unusable { class: FailureClass::Truncated, reason: "cut off".into(), usage: Some(usage) }
    }

    fn failure(record: &ExtractionRecord) -> (FailureClass, String) {
        let State::Failed { class, reason } = &record.state else { panic!("{:?}", record.state) };
        (*class, reason.clone())
    }

    #[tokio::test]
    async fn a_truncated_answer_is_retried_once_with_a_larger_budget_and_charged_each_time() {
        let rig = rig().await;
        let report = rig.stage(truncated(1000)).await;
        assert_eq!((report.truncated, report.budget_retries, report.requeued), (1, 1, 1), "{report:?}");
        let record = rig.record().await;
        assert_eq!(record.state, State::Pending);
        assert_eq!((record.attempt, record.requeues, record.output_budget), (2, 1, Some(2000)));
        assert!(record.truncation_retried);
        // The raised budget travels to the adapter with the member.
        let batch = rig.submitted().await;
        assert_eq!(rig.store.batch_members(batch).await.unwrap()[0].output_budget, Some(2000));
        let report = rig.store.stage_results(batch, vec![(rig.id, truncated(2000))], RULES).await.unwrap();
        assert_eq!((report.truncated, report.failed_truncated, report.requeued), (1, 1, 0), "{report:?}");
        let record = rig.record().await;
        let (class, reason) = failure(&record);
        assert_eq!(class, FailureClass::Truncated);
        assert!(reason.contains("already retried once with an output budget of 2000"), "{reason}");
        let ledger = rig.store.extraction_ledger(rig.id).await.unwrap().unwrap();
        let charged: Vec<(ChargeKind, u32, u64)> =
            ledger.iter().map(|e| (e.kind, e.attempt, e.usage.output_tokens)).collect();
        assert_eq!(charged, [(ChargeKind::Unusable, 1, 1000), (ChargeKind::Unusable, 2, 2000)]);
        // An operator's retry allows one more truncation retry, with the budget kept.
        let RetryOutcome::Retried(retried) = rig.store.retry(rig.id).await.unwrap() else { panic!() };
        assert_eq!((retried.requeues, retried.truncation_retried, retried.output_budget), (0, false, Some(2000)));
        rig.stage(truncated(2000)).await;
        assert_eq!(rig.record().await.output_budget, Some(3000), "doubled up to the cap");
    }

    #[tokio::test]
    async fn truncation_at_the_cap_fails_at_once() {
        let rig = rig().await;
        let rules = MemberRules { budget: OutputBudget { default: Some(3000), cap: 3000 }, ..RULES };
        let batch = rig.submitted().await;
        rig.store.stage_results(batch, vec![(rig.id, truncated(3000))], rules).await.unwrap();
        let (class, reason) = failure(&rig.record().await);
        assert_eq!(class, FailureClass::Truncated);
        assert!(reason.contains("no larger output budget"), "{reason}");
    }

    #[tokio::test]
    async fn a_judged_answer_commits_as_it_is_staged_and_a_refetch_changes_nothing() {
        let rig = rig().await;
        let batch = rig.submitted().await;
        let usage = Usage { model: "m".into(), output_tokens: 9, request_id: Some("r1".into()), ..Usage::default() };
        let output = serde_json::json!({"findings": [{"k": 1}]});
        let finding = crate::domain::schema::ValidatedFinding {
            canonical_identity: "[1]".into(),
            body: output["findings"][0].clone(),
        };
        let line = IngestLine {
            id: rig.id,
            result: LineResult::Answer { output: output.to_string(), usage: Some(usage) },
            judged: Some(Judged::from(&Submission::Valid { findings: vec![finding], output })),
        };
        let report = rig.store.ingest_results(batch, vec![line.clone()], RULES, Flush::Now).await.unwrap();
        assert_eq!((report.committed, report.staged, report.failed_validation), (1, 0, 0), "{report:?}");
        assert!(matches!(rig.record().await.state, State::Committed { .. }));
        assert!(rig.store.ready_items("p".into(), 10).await.unwrap().is_empty(), "nothing was staged");
        assert_eq!(rig.store.findings(rig.id).await.unwrap().unwrap().len(), 1);
        let result = rig.store.result(rig.id).await.unwrap().unwrap();
        assert_eq!(result.usage.as_ref().map(|u| u.output_tokens), Some(9));
        // The same file read again after a crash: a replay, counted and never charged again.
        let again = rig.store.ingest_results(batch, vec![line], RULES, Flush::Now).await.unwrap();
        assert_eq!((again.committed, again.replays), (0, 1), "{again:?}");
        assert_eq!(rig.store.findings(rig.id).await.unwrap().unwrap().len(), 1);
        let ledger = rig.store.extraction_ledger(rig.id).await.unwrap().unwrap();
        assert_eq!(ledger.iter().map(|e| e.kind).collect::<Vec<_>>(), [ChargeKind::Fresh, ChargeKind::Replay]);
    }

    #[tokio::test]
    async fn a_judged_invalid_answer_fails_validation_and_is_charged() {
        let rig = rig().await;
        let batch = rig.submitted().await;
        let usage = Usage { model: "m".into(), output_tokens: 9, ..Usage::default() };
        let line = IngestLine {
            id: rig.id,
            result: LineResult::Answer { output: "{}".into(), usage: Some(usage) },
            judged: Some(Judged::Invalid { reason: "/: findings is required".into() }),
        };
        let report = rig.store.ingest_results(batch, vec![line], RULES, Flush::Now).await.unwrap();
        assert_eq!((report.committed, report.failed_validation), (0, 1), "{report:?}");
        assert_eq!(failure(&rig.record().await).0, FailureClass::Validation);
        let ledger = rig.store.extraction_ledger(rig.id).await.unwrap().unwrap();
        assert_eq!(ledger.iter().map(|e| e.kind).collect::<Vec<_>>(), [ChargeKind::FailedValidation]);
    }

    #[tokio::test]
    async fn a_refusal_fails_refused_and_is_charged() {
        let rig = rig().await;
        let usage = Usage { model: "m".into(), output_tokens: 9, ..Usage::default() };
        let line = LineResult::Unusable { class: FailureClass::Refused, reason: "no".into(), usage: Some(usage) };
        let report = rig.stage(line).await;
        assert_eq!(report.model_refusals, 1);
        assert_eq!(failure(&rig.record().await).0, FailureClass::Refused);
        let ledger = rig.store.extraction_ledger(rig.id).await.unwrap().unwrap();
        assert_eq!(ledger.iter().map(|e| e.kind).collect::<Vec<_>>(), [ChargeKind::Unusable]);
    }

    #[tokio::test]
    async fn requeues_stop_at_the_attempt_cap_and_a_retry_grants_a_new_allowance() {
        let rig = rig().await;
        let retry = || LineResult::Retry { reason: "batch_expired: not run".into() };
        rig.stage(retry()).await;
        let batch = rig.submitted().await;
        let closed = rig.store.close_batch(batch, "expired".into(), Leftover::Requeue, RULES).await.unwrap();
        assert_eq!(closed, CloseReport { requeued: 1, ..CloseReport::default() });
        assert_eq!((rig.record().await.attempt, rig.record().await.requeues), (3, 2));
        let report = rig.stage(retry()).await;
        assert_eq!((report.exhausted, report.requeued), (1, 0), "the third attempt is the last of 3");
        let (class, reason) = failure(&rig.record().await);
        assert_eq!(class, FailureClass::AttemptsExhausted);
        assert!(reason.contains("3 provider attempts used") && reason.contains("batch_expired"), "{reason}");

        rig.store.retry(rig.id).await.unwrap();
        let batch = rig.submitted().await;
        let closed = rig.store.close_batch(batch, "expired".into(), Leftover::Requeue, RULES).await.unwrap();
        assert_eq!(closed.requeued, 1, "a fresh allowance after the operator's retry");
        let one = MemberRules { max_attempts: 1, ..RULES };
        let batch = rig.submitted().await;
        let closed = rig.store.close_batch(batch, "expired".into(), Leftover::Requeue, one).await.unwrap();
        assert_eq!(closed, CloseReport { exhausted: 1, ..CloseReport::default() });
        assert_eq!(failure(&rig.record().await).0, FailureClass::AttemptsExhausted);
    }
}
