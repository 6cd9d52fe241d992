//! Provider batches in the store: submit intents, job ids, the polling schedule, closing
//! (staging result lines is `staging`, the reads `batch_reads`).
//!
//! The order of durable facts is what makes submission exactly-once: the intent (with
//! its deterministic batch key, members moved to `Submitted{job_id: None}`) is committed
//! before the provider is called; the job id is committed before anything else happens
//! to the members; results are staged (`Ready`) before they are validated and committed.
//! What each step writes is decided in `rules` (`intent`, `schedule`, `close`); here it
//! is only loaded and written.

use redb::ReadableTable;

use super::codec::{decode, encode};
use super::extractions::{load, transition};
use super::records::BatchRecord;
use super::rules::close;
use super::rules::intent::{self, Filling, IntentOutcome, IntentRequest};
use super::rules::member::{MemberRules, Move};
use super::rules::schedule;
use super::tables::required;
use super::write_tables::WriteTables;
use super::{Error, ExtractionRecord, Store};
use crate::domain::lifecycle::{self, Outcome};
use crate::store::seam::{CloseReport, Leftover};

impl Store {
    /// Persists a submit intent for up to `max_size` pending extractions of one schema,
    /// unless there is not yet enough (or old enough) work.
    pub async fn create_intent(&self, request: IntentRequest) -> Result<IntentOutcome, Error> {
        self.writer.write(move |t| create_intent(t, &request)).await
    }

    pub async fn record_job(&self, batch: u64, job_id: String, next_poll_at_ms: u64) -> Result<BatchRecord, Error> {
        self.writer
            .write(move |t| {
                let record = load_batch(t, batch)?;
                let members = load_members(t, schedule::to_record_job(&record, &job_id))?;
                let Some(recorded) = schedule::record_job(&record, &job_id, next_poll_at_ms, members, t.now_ms) else {
                    return Ok((record, false));
                };
                apply_moves(t, recorded.moves)?;
                save_batch(t, &recorded.batch)?;
                Ok((recorded.batch, true))
            })
            .await
    }

    /// Persists when the scheduler should look at the batch again, and why
    /// (`rules::schedule::reschedule`).
    pub async fn reschedule_batch(
        &self,
        batch: u64,
        next_action_at_ms: u64,
        note: Option<String>,
        count_failure: bool,
    ) -> Result<(), Error> {
        self.writer
            .write(move |t| {
                let record = load_batch(t, batch)?;
                save_batch(t, &schedule::reschedule(record, next_action_at_ms, note, count_failure, t.now_ms))?;
                Ok(((), true))
            })
            .await
    }

    /// Records one more 404 for the batch's job without counting a failure.
    pub async fn note_not_found(
        &self,
        batch: u64,
        since_ms: u64,
        next_action_at_ms: u64,
        note: String,
    ) -> Result<(), Error> {
        self.writer
            .write(move |t| {
                let record = load_batch(t, batch)?;
                save_batch(t, &schedule::not_found(record, since_ms, next_action_at_ms, note, t.now_ms))?;
                Ok(((), true))
            })
            .await
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
        self.writer
            .write(move |t| {
                let record = load_batch(t, batch)?;
                let members = load_members(t, close::to_close(&record))?;
                let Some(closing) = close::close(&record, members, outcome, &leftover, &rules, t.now_ms) else {
                    return Ok((CloseReport::default(), false));
                };
                apply_moves(t, closing.moves)?;
                save_batch(t, &closing.batch)?;
                t.open_batches.remove(batch)?;
                Ok((closing.report, true))
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

/// A member whose tenant was erased is gone; its sequence stays in the list (see `erase`).
pub(super) fn load_member(t: &WriteTables<'_>, seq: u64) -> Result<Option<ExtractionRecord>, Error> {
    if t.extractions.get(seq)?.is_none() {
        return Ok(None);
    }
    load(t, seq).map(Some)
}

/// The members of `seqs` that still exist, in that order.
pub(super) fn load_members(t: &WriteTables<'_>, seqs: &[u64]) -> Result<Vec<ExtractionRecord>, Error> {
    let mut members = Vec::with_capacity(seqs.len());
    for &seq in seqs {
        members.extend(load_member(t, seq)?);
    }
    Ok(members)
}

pub(super) fn apply_moves(t: &mut WriteTables<'_>, moves: Vec<Move>) -> Result<(), Error> {
    for Move { mut member, next } in moves {
        transition(t, &mut member, next)?;
    }
    Ok(())
}

pub(super) fn load_batch(t: &WriteTables<'_>, batch: u64) -> Result<BatchRecord, Error> {
    decode(&required(t.batches.get(batch)?, "batch", batch)?)
}

pub(super) fn save_batch(t: &mut WriteTables<'_>, record: &BatchRecord) -> Result<(), Error> {
    t.batches.insert(record.seq, encode(record)?.as_slice())?;
    Ok(())
}
