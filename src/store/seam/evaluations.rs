//! Evaluations through the seam: a frozen set, its trial batches and trial answers, and
//! the promotion of one candidate's answers into the extractions they were asked about.

use super::*;
use crate::domain::batch::Usage;
use crate::store::evaluation::{EvalMember, EvaluationRecord, Trial, TrialBatchRecord, TrialVerdict};
use async_trait::async_trait;

/// Evaluations (the service creates, reads, cancels and promotes; the engine's evaluation
/// driver sends the trials).
#[async_trait]
pub trait Evaluations: Send + Sync + std::fmt::Debug {
    /// Freezes the set the request selects, in one write; a name is never reused. The pool
    /// is read first, outside the write (`store::evaluation_steps`); the write then checks the name again (two
    /// creations of one name cannot both win) and that no member was erased meanwhile.
    async fn create_evaluation(&self, new: NewEvaluation) -> Result<EvaluationCreated, Error>;
    /// The records a selection is made from: the asked ids that exist and those that do
    /// not, or every extraction in the sampled states (`choose` filters again).
    async fn selection_pool(&self, new: NewEvaluation) -> Result<(Vec<ExtractionRecord>, Vec<ExtractionId>), Error>;
    /// Writes the evaluation of `members` unless the name is taken or a member is gone.
    async fn freeze_evaluation(&self, new: NewEvaluation, members: Vec<EvalMember>)
    -> Result<EvaluationCreated, Error>;
    async fn evaluation(&self, name: String) -> Result<Option<EvaluationRecord>, Error>;
    /// Every evaluation, oldest first.
    async fn evaluations(&self) -> Result<Vec<EvaluationRecord>, Error>;
    /// Stops sending new trial batches; jobs already at a provider are still read, since
    /// they are paid for. `None` for an unknown name.
    async fn cancel_evaluation(&self, name: String) -> Result<Option<EvaluationRecord>, Error>;
    async fn trials(&self, name: String) -> Result<Vec<Trial>, Error>;
    /// Commits a trial batch intent for members of the evaluation that `candidate` has not
    /// been sent yet (the others are left out); `None` when none is left.
    async fn create_trial_batch(
        &self,
        evaluation: String,
        candidate: String,
        members: Vec<u32>,
    ) -> Result<Option<TrialBatchRecord>, Error>;
    async fn trial_batches(&self, open_only: bool) -> Result<Vec<TrialBatchRecord>, Error>;
    /// What each member of a trial batch is sent as (its custom id is the trial's id,
    /// `rules::evaluation::trial_id`); `None` where the source is no longer stored.
    async fn trial_batch_members(&self, batch: u64) -> Result<Vec<(u32, Option<BatchMember>)>, Error>;
    /// Persists the provider's job id before anything else is done with it.
    async fn record_trial_job(&self, batch: u64, job_id: String, next_action_at_ms: u64) -> Result<(), Error>;
    async fn reschedule_trial_batch(
        &self,
        batch: u64,
        next_action_at_ms: u64,
        note: Option<String>,
        count_failure: bool,
    ) -> Result<(), Error>;
    /// Stores judged trial answers with their `evaluation` ledger charges, in one write;
    /// an answer seen before (a result file read again after a crash) writes nothing.
    async fn record_trials(
        &self,
        batch: u64,
        answers: Vec<TrialAnswer>,
        batch_api: bool,
    ) -> Result<TrialsWritten, Error>;
    /// Ends a trial batch: members still without an answer fail with `unanswered`.
    async fn close_trial_batch(&self, batch: u64, outcome: String, unanswered: String) -> Result<u64, Error>;
    /// Commits `candidate`'s valid answers for the members not committed yet, through the
    /// normal commit (findings, result, outbox events), charging nothing more: the trial
    /// was charged when it was answered. Running it again commits nothing new. In chunks
    /// (`rules::evaluation::promote_chunks`), each one write: a crash midway leaves whole
    /// chunks committed, and the next run finds them committed and goes on.
    async fn promote(&self, evaluation: String, candidate: String) -> Result<Option<Promotion>, Error>;
    /// One chunk of a promotion, in one write (`rules::evaluation::promote_chunk`).
    async fn promote_chunk(
        &self,
        evaluation: Arc<EvaluationRecord>,
        candidate: String,
        chunk: Vec<u32>,
    ) -> Result<Promotion, Error>;
}

/// An evaluation as the service asks for it, checked except against the store.
#[derive(Debug, Clone)]
pub struct NewEvaluation {
    pub name: String,
    pub tenant: Option<String>,
    pub schema: String,
    pub candidates: Vec<String>,
    pub budget_micros: Option<u64>,
    pub select: Selection,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Selection {
    Ids(Vec<ExtractionId>),
    /// Up to `count` extractions in one of `states`, drawn by `seed` (the same seed over
    /// the same store draws the same set).
    Sample {
        count: u32,
        states: Vec<StateName>,
        seed: u64,
    },
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EvaluationCreated {
    Created(EvaluationRecord),
    /// The name is taken (by this very request, if it is a retry).
    Exists(EvaluationRecord),
    /// The selection cannot be made: the reason, for the caller.
    Refused(String),
}

/// One judged answer of a trial batch, by member index.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TrialAnswer {
    pub index: u32,
    pub verdict: TrialVerdict,
    pub usage: Option<Usage>,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TrialsWritten {
    pub written: u64,
    /// Answers already stored: nothing written, nothing charged.
    pub seen: u64,
}

/// What a promotion did, member by member.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Promotion {
    pub committed: u64,
    /// Committed before (by production, or by an earlier promotion).
    pub already_committed: u64,
    /// Claimed by a worker or in a production batch: its own answer is on the way.
    pub in_flight: u64,
    /// Cancelled, or gone (erased).
    pub skipped: u64,
    /// The candidate has no valid answer for it.
    pub no_valid_answer: u64,
}

impl Promotion {
    pub fn add(&mut self, part: Promotion) {
        self.committed += part.committed;
        self.already_committed += part.already_committed;
        self.in_flight += part.in_flight;
        self.skipped += part.skipped;
        self.no_valid_answer += part.no_valid_answer;
    }
}
