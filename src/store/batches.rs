//! Provider batches in the store: submit intents, job ids, staged results, closing.
//!
//! The order of durable facts is what makes submission exactly-once: the intent (with
//! its deterministic batch key, members moved to `Submitted{job_id: None}`) is committed
//! before the provider is called; the job id is committed before anything else happens
//! to the members; results are staged (`Ready`) before they are validated and committed.

use std::sync::Arc;

use redb::ReadableTable;

use super::codec::{decode, encode};
use super::ledger::{Charge, record_charge};
use super::ops::{load, required, transition};
use super::records::{BatchRecord, BatchState, ChargeKind, ResultRecord, StoredContent, Usage};
use super::tables;
use super::writer::WriteTables;
use super::{Error, ExtractionRecord, Store};
use crate::identity::{ExtractionId, batch_key};
use crate::lifecycle::{self, Event, FailureClass, Outcome, State, StateName};

/// Decides, by (tenant, schema), whether pending work may join a batch for this provider:
/// routing and budget holds, decided outside the store.
#[derive(Clone)]
pub struct WorkFilter(pub Arc<AcceptFn>);

/// `(tenant, schema) -> may this provider take it`.
pub type AcceptFn = dyn Fn(&str, &str) -> bool + Send + Sync;

impl std::fmt::Debug for WorkFilter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("WorkFilter")
    }
}

#[derive(Debug, Clone)]
pub struct IntentRequest {
    pub provider: String,
    pub schema: String,
    pub accept: WorkFilter,
    pub max_size: usize,
    /// Most content bytes in one batch (providers cap the input file's size).
    pub max_content_bytes: u64,
    /// Form a batch smaller than `max_size` only once its oldest member waited this long.
    pub max_wait_ms: u64,
}

/// One member as the provider adapter needs it.
#[derive(Debug, Clone)]
pub struct BatchMember {
    pub id: ExtractionId,
    pub source_id: String,
    pub content: String,
}

/// A provider's answer for one member, as parsed by its adapter.
#[derive(Debug, Clone)]
pub enum LineResult {
    Answer {
        output: String,
        usage: Option<Usage>,
    },
    /// The provider will never answer this member (invalid request and the like).
    Refused {
        class: FailureClass,
        reason: String,
    },
    /// No answer this time (expired, cancelled, transient): try again in a new batch.
    Retry {
        reason: String,
    },
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StageReport {
    pub staged: u64,
    pub refused: u64,
    pub requeued: u64,
    /// Lines for members that already had an answer (duplicate lines, re-fetched files).
    pub replays: u64,
    /// Lines that name no member of this batch.
    pub strangers: u64,
}

/// A `Ready` extraction with its staged raw answer.
#[derive(Debug, Clone)]
pub struct ReadyItem {
    pub record: ExtractionRecord,
    pub staged: ResultRecord,
}

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
    ) -> Result<StageReport, Error> {
        self.writer.write(move |t| stage_results(t, batch, lines)).await
    }

    /// Ends a batch: members still without an answer are requeued (a new attempt of the
    /// same identity) or failed, and the batch leaves the scheduler's open set.
    pub async fn close_batch(&self, batch: u64, outcome: String, leftover: Leftover) -> Result<u64, Error> {
        self.writer.write(move |t| close_batch(t, batch, outcome, &leftover)).await
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
                if record.provider == provider {
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
                let extraction: ExtractionRecord =
                    decode(extractions.get(seq)?.ok_or_else(|| missing("extraction"))?.value())?;
                let content: StoredContent = decode(contents.get(seq)?.ok_or_else(|| missing("content"))?.value())?;
                members.push(BatchMember { id: extraction.id, source_id: extraction.source_id, content: content.text });
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
                if !matches!(&record.state, State::Ready { provider: p, .. } if *p == provider) {
                    continue;
                }
                let staged = decode(staged.get(seq)?.ok_or_else(|| missing("staged result"))?.value())?;
                out.push(ReadyItem { record, staged });
            }
            Ok(out)
        })
        .await
    }
}

#[derive(Debug, Clone)]
pub enum IntentOutcome {
    Created(Box<BatchRecord>),
    /// Some work is waiting; a batch is due at this time unless it fills up first.
    Waiting {
        due_at_ms: u64,
        /// How many extractions of this schema are waiting now.
        members: usize,
    },
    Nothing,
}

/// What happens to members a closed batch never answered.
#[derive(Debug, Clone)]
pub enum Leftover {
    /// Back to the queue as a new attempt: the provider tried and did not answer.
    Requeue,
    /// Back to the queue as the same attempt: the provider never ran them (it had no room,
    /// or failed the batch without blaming a member), so nothing was spent on them.
    Return,
    Fail {
        class: FailureClass,
        reason: String,
    },
}

fn create_intent(t: &mut WriteTables<'_>, request: &IntentRequest) -> Result<(IntentOutcome, bool), Error> {
    let pending = StateName::Pending.code();
    let mut members: Vec<ExtractionRecord> = Vec::new();
    let mut bytes = 0u64;
    let mut full = false;
    for entry in t.state_index.range((pending, 0)..=(pending, u64::MAX))? {
        let record = load(t, entry?.0.value().1)?;
        if record.schema != request.schema || !(request.accept.0)(&record.tenant, &record.schema) {
            continue;
        }
        // One oversized source still goes alone: a batch always makes progress.
        if !members.is_empty() && bytes + record.content_bytes > request.max_content_bytes {
            full = true;
            break;
        }
        bytes += record.content_bytes;
        members.push(record);
        if members.len() >= request.max_size {
            full = true;
            break;
        }
    }
    let oldest = members.iter().map(|m| m.updated_at_ms).min();
    let due = full || oldest.is_some_and(|at| t.now_ms.saturating_sub(at) >= request.max_wait_ms);
    match oldest {
        None => return Ok((IntentOutcome::Nothing, false)),
        Some(at) if !due => {
            let waiting =
                IntentOutcome::Waiting { due_at_ms: at.saturating_add(request.max_wait_ms), members: members.len() };
            return Ok((waiting, false));
        }
        Some(_) => {}
    }
    let identities: Vec<(ExtractionId, u32)> = members.iter().map(|m| (m.id, m.attempt)).collect();
    let seq = t.allocate_batch_seq();
    let key = batch_key(&request.provider, &request.schema, seq, &identities);
    let batch = BatchRecord {
        seq,
        batch_key: key.clone(),
        provider: request.provider.clone(),
        schema: request.schema.clone(),
        members: members.iter().map(|m| m.seq).collect(),
        state: BatchState::Intent,
        next_action_at_ms: t.now_ms,
        failures: 0,
        last_error: None,
        created_at_ms: t.now_ms,
        updated_at_ms: t.now_ms,
        not_found_since_ms: None,
    };
    for mut member in members {
        let event = Event::Enqueue { provider: request.provider.clone(), batch_key: key.clone() };
        if let Ok(Outcome::Changed(next)) = lifecycle::apply(&member.state, event, t.now_ms) {
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
    for seq in record.members.clone() {
        let mut member = load(t, seq)?;
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
    lines: Vec<(ExtractionId, LineResult)>,
) -> Result<(StageReport, bool), Error> {
    let record = load_batch(t, batch)?;
    let job_id = match &record.state {
        BatchState::Submitted { job_id } => job_id.clone(),
        _ => String::new(),
    };
    let mut report = StageReport::default();
    let mut replay_charged = false;
    for (id, line) in lines {
        let Some(seq) = t.identity.get(id.as_bytes())?.map(|v| v.value()) else {
            report.strangers += 1;
            continue;
        };
        let mut member = load(t, seq)?;
        let key = record.batch_key.clone();
        let event = match &line {
            LineResult::Answer { .. } => Event::ResultStored { batch_key: key },
            LineResult::Refused { class, reason } => {
                Event::ProviderFailed { batch_key: key, class: *class, reason: reason.clone() }
            }
            LineResult::Retry { .. } => Event::Requeue { batch_key: key },
        };
        let next = match lifecycle::apply(&member.state, event, t.now_ms) {
            Ok(Outcome::Changed(next)) => next,
            Ok(Outcome::Replay) => {
                report.replays += 1;
                // A re-fetched result file: the call is counted again, never charged again.
                if let LineResult::Answer { usage: Some(usage), .. } = line {
                    let charge = Charge {
                        provider: record.provider.clone(),
                        job_id: Some(job_id.clone()).filter(|j| !j.is_empty()),
                        usage,
                        latency_ms: None,
                        batch: true,
                    };
                    record_charge(t, &member, &charge, ChargeKind::Replay)?;
                    replay_charged = true;
                }
                continue;
            }
            Err(_) => {
                report.strangers += 1;
                continue;
            }
        };
        match line {
            LineResult::Answer { output, usage } => {
                let staged = ResultRecord {
                    output_json: output,
                    worker: record.provider.clone(),
                    lease_token: job_id.clone(),
                    usage,
                    latency_ms: Some(t.now_ms.saturating_sub(record.created_at_ms)),
                    received_at_ms: t.now_ms,
                };
                t.staged.insert(seq, encode(&staged)?.as_slice())?;
                report.staged += 1;
            }
            LineResult::Refused { .. } => report.refused += 1,
            LineResult::Retry { .. } => {
                member.attempt += 1;
                report.requeued += 1;
            }
        }
        transition(t, &mut member, next)?;
    }
    let wrote = replay_charged || report.staged + report.refused + report.requeued > 0;
    Ok((report, wrote))
}

fn close_batch(
    t: &mut WriteTables<'_>,
    batch: u64,
    outcome: String,
    leftover: &Leftover,
) -> Result<(u64, bool), Error> {
    let mut record = load_batch(t, batch)?;
    if matches!(record.state, BatchState::Closed { .. }) {
        return Ok((0, false));
    }
    let mut unanswered = 0;
    for seq in record.members.clone() {
        let mut member = load(t, seq)?;
        if !matches!(&member.state, State::Submitted { batch_key, .. } if *batch_key == record.batch_key) {
            continue;
        }
        let key = record.batch_key.clone();
        let event = match leftover {
            Leftover::Requeue | Leftover::Return => Event::Requeue { batch_key: key },
            Leftover::Fail { class, reason } => {
                Event::ProviderFailed { batch_key: key, class: *class, reason: reason.clone() }
            }
        };
        if let Ok(Outcome::Changed(next)) = lifecycle::apply(&member.state, event, t.now_ms) {
            if matches!(leftover, Leftover::Requeue) {
                member.attempt += 1;
            }
            transition(t, &mut member, next)?;
            unanswered += 1;
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
    Ok((unanswered, true))
}

pub(super) fn load_batch(t: &WriteTables<'_>, batch: u64) -> Result<BatchRecord, Error> {
    decode(&required(t.batches.get(batch)?, "batch", batch)?)
}

pub(super) fn save_batch(t: &mut WriteTables<'_>, record: &BatchRecord) -> Result<(), Error> {
    t.batches.insert(record.seq, encode(record)?.as_slice())?;
    Ok(())
}
