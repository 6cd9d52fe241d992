//! Provider batches in the store: submit intents, job ids, the polling schedule, closing
//! (staging result lines is `staging`, the reads `batch_reads`).
//!
//! The order of durable facts is what makes submission exactly-once: the intent (with
//! its deterministic batch key, members moved to `Submitted{job_id: None}`) is committed
//! before the provider is called; the job id is committed before anything else happens
//! to the members; results are staged (`Ready`) before they are validated and committed.
//! What each step writes is decided in `rules` (`intent`, `schedule`, `close`); here it
//! is only loaded and written.

use super::Flush;
use super::records::BatchState;
use super::records::StoredContent;
use super::tables;
use crate::domain::batch::BatchMember;
use crate::domain::lifecycle::StateName;
use crate::store::seam::Batches;
use crate::store::seam::IngestLine;
use crate::store::seam::ReadyItem;
use crate::store::seam::StageReport;
use crate::store::seam::{member_line, ready_from, unowned_line};
use async_trait::async_trait;
use redb::ReadableTable;
use std::sync::Arc;

use super::codec::{decode, encode};
use super::extractions::{load, transition};
use super::records::BatchRecord;
use super::rules::close;
use super::rules::intent::{self, Filling, IntentOutcome, IntentRequest};
use super::rules::member::{MemberRules, Move};
use super::rules::reserve;
use super::rules::schedule;
use super::tables::required;
use super::write_tables::WriteTables;
use super::{Error, ExtractionRecord, Store};
use crate::domain::lifecycle::{self, Outcome};
use crate::store::seam::{CloseReport, Leftover};

fn create_intent(t: &mut WriteTables<'_>, request: &IntentRequest) -> Result<(IntentOutcome, bool), Error> {
    let queue = intent::queue(request);
    let rotations = Arc::clone(&t.policies.rotations);
    let mut rotation = rotations.take(&queue);
    // Only the work this provider may take, tenant by tenant as the fair pick reaches
    // it: no other schema's or held tenant's work is read, so forming a batch costs the
    // batch, not the backlog.
    let picked = super::pending_queue::pick(
        t,
        Some(&request.schema),
        &request.accept,
        request.estimate.as_ref(),
        intent::limits(request),
        &rotation,
    );
    let decided = picked.map(|picked| intent::decide(picked, request, t.now_ms, &mut rotation));
    rotations.put(&queue, rotation);
    let (filling, reserved) = decided?;
    let members = match filling {
        Filling::NotYet(outcome) => return Ok((outcome, false)),
        Filling::Due(members) => members,
    };
    let seq = t.allocate_batch_seq();
    let (batch, enqueue) = intent::intent(request, seq, &members, t.now_ms);
    for (member, micros) in reserve::to_write(&members, &reserved) {
        super::reservations::reserve(t, member, micros)?;
    }
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

#[async_trait]
impl Batches for Store {
    async fn open_batches(&self) -> Result<Vec<BatchRecord>, Error> {
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

    async fn batch(&self, batch: u64) -> Result<Option<BatchRecord>, Error> {
        self.read(move |txn| {
            let batches = txn.open_table(tables::BATCHES)?;
            let found = batches.get(batch)?;
            found.map(|value| decode(value.value())).transpose()
        })
        .await
    }

    async fn batch_history(&self, before: u64, limit: usize) -> Result<Vec<BatchRecord>, Error> {
        self.read(move |txn| {
            let batches = txn.open_table(tables::BATCHES)?;
            let below = if before == 0 { u64::MAX } else { before };
            batches.range(..below)?.rev().take(limit).map(|entry| decode(entry?.1.value())).collect()
        })
        .await
    }

    /// Job ids of `provider`'s batches created at or after `since_ms`, newest first.
    async fn recorded_jobs_since(&self, provider: String, since_ms: u64) -> Result<Vec<String>, Error> {
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
            // Evaluations' trial jobs at the same provider are as surely not this intent's.
            for entry in txn.open_table(tables::TRIAL_BATCHES)?.iter()?.rev() {
                let trial: crate::store::evaluation::TrialBatchRecord = decode(entry?.1.value())?;
                if trial.candidate == provider && trial.created_at_ms >= since_ms {
                    jobs.extend(trial.job_id);
                }
            }
            Ok(jobs)
        })
        .await
    }

    async fn batch_members(&self, batch: u64) -> Result<Vec<BatchMember>, Error> {
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
                    members.push(unowned_line());
                    continue;
                };
                let extraction: ExtractionRecord = decode(value.value())?;
                let content: StoredContent = decode(contents.get(seq)?.ok_or_else(|| missing("content"))?.value())?;
                members.push(member_line(extraction, content.text));
            }
            Ok(members)
        })
        .await
    }

    /// Up to `limit` extractions whose answer from `provider` is staged and awaits commit.
    /// Each provider's scheduler commits only its own, so no answer is validated twice.
    async fn ready_items(&self, provider: String, limit: usize) -> Result<Vec<ReadyItem>, Error> {
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
                if !ready_from(&record, &provider) {
                    continue;
                }
                let staged = decode(staged.get(seq)?.ok_or_else(|| missing("staged answer"))?.value())?;
                out.push(ReadyItem { record, staged });
            }
            Ok(out)
        })
        .await
    }

    /// Persists a submit intent for up to `max_size` pending extractions of one schema,
    /// unless there is not yet enough (or old enough) work.
    async fn create_intent(&self, request: IntentRequest) -> Result<IntentOutcome, Error> {
        self.writer.write(move |t| create_intent(t, &request)).await
    }

    async fn record_job(&self, batch: u64, job_id: String, next_poll_at_ms: u64) -> Result<BatchRecord, Error> {
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
    async fn reschedule_batch(
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
    async fn note_not_found(
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
    async fn close_batch(
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

    /// Persists an operator's pause (or resume) of submissions to a provider.
    async fn set_provider_paused(&self, provider: String, paused: bool) -> Result<(), Error> {
        self.writer
            .write(move |t| {
                t.meta.insert(format!("{}{provider}", super::tables::META_PAUSE_PREFIX).as_str(), u64::from(paused))?;
                Ok(((), true))
            })
            .await
    }

    /// Whether an operator paused submissions to this provider (survives restarts).
    async fn provider_paused(&self, provider: String) -> Result<bool, Error> {
        let key = format!("{}{provider}", tables::META_PAUSE_PREFIX);
        self.read(move |txn| {
            let meta = txn.open_table(tables::META)?;
            Ok(meta.get(key.as_str())?.is_some_and(|v| v.value() == 1))
        })
        .await
    }

    /// Keeps the first `keep` members of an intent (at least one) and returns the rest to
    /// the queue as the same attempt: none of them was ever sent. Returns how many went back.
    async fn shrink_intent(&self, batch: u64, keep: usize) -> Result<u64, Error> {
        self.writer
            .write(move |t| {
                let record = load_batch(t, batch)?;
                let excess = load_members(t, close::to_shrink(&record, keep))?;
                let Some(shrinking) = close::shrink(&record, keep, excess, t.now_ms) else {
                    return Ok((0, false));
                };
                let returned = shrinking.moves.len() as u64;
                apply_moves(t, shrinking.moves)?;
                save_batch(t, &shrinking.batch)?;
                Ok((returned, true))
            })
            .await
    }

    /// Stores one chunk of result lines in one transaction, committing every judged
    /// answer there and then. Safe to call again with the same lines: an answer already
    /// taken is a replay. With `Flush::Later` the chunk reaches the disk with the next
    /// flushed commit (a file's last chunk asks for `Now`).
    async fn ingest_results(
        &self,
        batch: u64,
        lines: Vec<IngestLine>,
        rules: MemberRules,
        flush: Flush,
    ) -> Result<StageReport, Error> {
        // Shared, not copied: the writer clones a job each time it applies it.
        let lines: Arc<[IngestLine]> = lines.into();
        self.writer.write_flushed(flush, move |t| super::staging::stage(t, batch, &lines, &rules)).await
    }

    /// A flushed commit that writes nothing: it puts every `Flush::Later` commit before it
    /// on disk.
    async fn flush(&self) -> Result<(), Error> {
        self.writer.write(|_| Ok(((), true))).await
    }
}
