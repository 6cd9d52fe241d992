//! Provider batches through the seam: intents, job ids, staged and judged result lines,
//! closing, and what each reports.

use super::*;
use async_trait::async_trait;

/// Provider batches: intents, job ids, polling schedule, staged answers (the scheduler).
#[async_trait]
pub trait Batches: Send + Sync + std::fmt::Debug {
    /// Commits a submit intent (members → `Submitted`, a batch key) before any call.
    async fn create_intent(&self, request: IntentRequest) -> Result<IntentOutcome, Error>;
    /// Releases members past `keep` from an intent the provider found too large.
    async fn shrink_intent(&self, batch: u64, keep: usize) -> Result<u64, Error>;
    /// Persists the provider's job id before anything else is done with it.
    async fn record_job(&self, batch: u64, job_id: String, next_poll_at_ms: u64) -> Result<BatchRecord, Error>;
    async fn open_batches(&self) -> Result<Vec<BatchRecord>, Error>;
    /// One batch, whatever its state (`None`: no such sequence).
    async fn batch(&self, batch: u64) -> Result<Option<BatchRecord>, Error>;
    /// Up to `limit` batches below sequence `before` (0: from the newest), newest first,
    /// open and closed alike: the history an operator reads back.
    async fn batch_history(&self, before: u64, limit: usize) -> Result<Vec<BatchRecord>, Error>;
    async fn batch_members(&self, batch: u64) -> Result<Vec<BatchMember>, Error>;
    /// Lines without the engine's verdicts: every answer is staged, none committed here.
    /// The same on every backend, so written once.
    async fn stage_results(
        &self,
        batch: u64,
        lines: Vec<(ExtractionId, LineResult)>,
        rules: MemberRules,
    ) -> Result<StageReport, Error> {
        let unjudged = lines.into_iter().map(|(id, result)| IngestLine { id, result, judged: None }).collect();
        self.ingest_results(batch, unjudged, rules, Flush::Now).await
    }
    /// Result lines with the engine's verdicts: judged answers commit in the same
    /// transaction, flushed to disk now or with a later commit as `flush` says.
    async fn ingest_results(
        &self,
        batch: u64,
        lines: Vec<IngestLine>,
        rules: MemberRules,
        flush: Flush,
    ) -> Result<StageReport, Error>;
    /// Returns once every write committed so far, flushed or not, is on disk.
    async fn flush(&self) -> Result<(), Error>;
    async fn ready_items(&self, provider: String, limit: usize) -> Result<Vec<ReadyItem>, Error>;
    async fn close_batch(
        &self,
        batch: u64,
        outcome: String,
        leftover: Leftover,
        rules: MemberRules,
    ) -> Result<CloseReport, Error>;
    async fn reschedule_batch(
        &self,
        batch: u64,
        next_action_at_ms: u64,
        note: Option<String>,
        count_failure: bool,
    ) -> Result<(), Error>;
    async fn note_not_found(
        &self,
        batch: u64,
        since_ms: u64,
        next_action_at_ms: u64,
        note: String,
    ) -> Result<(), Error>;
    /// Job ids recorded for `provider` since a time, evaluations' trial jobs included: what
    /// an orphan lookup may skip.
    async fn recorded_jobs_since(&self, provider: String, since_ms: u64) -> Result<Vec<String>, Error>;
    async fn provider_paused(&self, provider: String) -> Result<bool, Error>;
    async fn set_provider_paused(&self, provider: String, paused: bool) -> Result<(), Error>;
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StageReport {
    pub staged: u64,
    pub refused: u64,
    pub requeued: u64,
    /// Answers cut off at their output budget: retried with a larger budget, failed
    /// `truncated`, or failed `attempts_exhausted`.
    pub truncated: u64,
    /// Of those, the ones sent back with a larger budget.
    pub budget_retries: u64,
    /// Members failed `truncated`.
    pub failed_truncated: u64,
    /// Answers the model declined (failed `refused`).
    pub model_refusals: u64,
    /// Members that would have been requeued past their attempt cap (failed `attempts_exhausted`).
    pub exhausted: u64,
    /// Lines for members that already had an answer (duplicate lines, re-fetched files).
    pub replays: u64,
    /// Lines that name no member of this batch.
    pub strangers: u64,
    /// Answers judged before staging and committed in the staging transaction.
    pub committed: u64,
    /// Of the judged answers, those that failed validation.
    pub failed_validation: u64,
    /// Of the judged answers, the invalid ones sent back to be asked again with their issues.
    pub reasked: u64,
    /// Of the judged answers to a re-ask, those that committed and those that failed.
    pub reasks_committed: u64,
    pub reasks_failed: u64,
}

impl StageReport {
    /// Adds one chunk's report, with `unnamed` lines that never reached the store.
    pub fn add(&mut self, part: &StageReport, unnamed: u64) {
        self.staged += part.staged;
        self.refused += part.refused;
        self.requeued += part.requeued;
        self.truncated += part.truncated;
        self.budget_retries += part.budget_retries;
        self.failed_truncated += part.failed_truncated;
        self.model_refusals += part.model_refusals;
        self.exhausted += part.exhausted;
        self.replays += part.replays;
        self.strangers += part.strangers + unnamed;
        self.committed += part.committed;
        self.reasked += part.reasked;
        self.reasks_committed += part.reasks_committed;
        self.reasks_failed += part.reasks_failed;
        self.failed_validation += part.failed_validation;
    }
}

/// One result line, with the engine's verdict on its answer when it could give one.
#[derive(Debug, Clone)]
pub struct IngestLine {
    pub id: ExtractionId,
    pub result: LineResult,
    /// An answer validated outside the writer against the batch's schema: it is committed
    /// (or failed) in the same transaction that takes it, instead of being staged as
    /// `Ready` and written a second time by a later commit.
    pub judged: Option<Judged>,
}

/// The line a member of a submitted batch is sent as.
pub(in crate::store) fn member_line(extraction: ExtractionRecord, content: String) -> BatchMember {
    BatchMember {
        id: extraction.id,
        source_id: extraction.source_id,
        content,
        output_budget: extraction.output_budget,
        previous_attempt: extraction.previous_attempt,
    }
}

/// A member erased after submission: a line no one owns keeps the others' positions.
pub(in crate::store) fn unowned_line() -> BatchMember {
    BatchMember {
        id: ExtractionId([0; 32]),
        source_id: String::new(),
        content: String::new(),
        output_budget: None,
        previous_attempt: None,
    }
}

/// Whether `record` is a staged answer from `provider`: each provider's scheduler commits
/// only its own, so no answer is validated twice.
pub(in crate::store) fn ready_from(record: &ExtractionRecord, provider: &str) -> bool {
    matches!(&record.state, State::Ready { provider: p, .. } if p == provider)
}

/// A `Ready` extraction with its staged raw answer.
#[derive(Debug, Clone)]
pub struct ReadyItem {
    pub record: ExtractionRecord,
    pub staged: StagedAnswer,
}

/// What happens to members a closed batch never answered.
#[derive(Debug, Clone)]
pub enum Leftover {
    /// Another attempt in a new batch, unless the member has used its attempt cap: the
    /// provider tried and did not answer.
    Requeue,
    /// Back to the queue as the same attempt, outside the attempt cap: the provider never
    /// ran them (it had no room, or failed the batch without blaming a member), so nothing
    /// was spent on them.
    Return,
    Fail {
        class: FailureClass,
        reason: String,
    },
}

/// What closing a batch did to the members it had not answered.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CloseReport {
    pub requeued: u64,
    /// Failed as the leftover said.
    pub failed: u64,
    /// Failed `attempts_exhausted` instead of a requeue.
    pub exhausted: u64,
}

/// When a write must reach the disk.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Flush {
    /// Before the caller is answered: what every acknowledgement needs.
    Now,
    /// With the next flushed commit, whoever makes it. Until then the write is visible
    /// but a crash takes it back, so only a caller that can redo it after a restart
    /// (ingestion, whose result file is read again) may ask for this.
    Later,
}
