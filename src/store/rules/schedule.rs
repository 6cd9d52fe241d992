//! The batch record through its life with the provider's job: the job id recorded (its
//! members moved under it), when the scheduler looks again and why, and a job the
//! provider says it does not know. Both backends write what these return.

use crate::domain::lifecycle::Event;
use crate::store::records::{BatchRecord, BatchState, ExtractionRecord};
use crate::store::rules::member::{Move, moved};

/// What recording a job id writes: the members' moves under the job, then the batch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(in crate::store) struct JobRecorded {
    pub moves: Vec<Move>,
    pub batch: BatchRecord,
}

/// The members recording `job_id` must load: none when nothing is to be written.
pub(in crate::store) fn to_record_job<'a>(batch: &'a BatchRecord, job_id: &str) -> &'a [u64] {
    if is_news(batch, job_id) { &batch.members } else { &[] }
}

/// Records the provider's job id for `batch`, whose `members` (those of `to_record_job`
/// that still exist) move under it. `None`: the batch stays as it is, because the job is
/// recorded already, or because the batch is closed (an intent its tenant's erasure closed
/// stays closed; the provider's job is left alone).
pub(in crate::store) fn record_job(
    batch: &BatchRecord,
    job_id: &str,
    next_poll_at_ms: u64,
    members: Vec<ExtractionRecord>,
    now_ms: u64,
) -> Option<JobRecorded> {
    if !is_news(batch, job_id) {
        return None;
    }
    let accepted = || Event::JobAccepted { batch_key: batch.batch_key.clone(), job_id: job_id.to_string() };
    let moves = members.into_iter().filter_map(|member| moved(member, accepted(), now_ms)).collect();
    let mut batch = batch.clone();
    batch.state = BatchState::Submitted { job_id: job_id.to_string() };
    batch.next_action_at_ms = next_poll_at_ms;
    batch.failures = 0;
    batch.not_found_since_ms = None;
    batch.last_error = None;
    batch.updated_at_ms = now_ms;
    Some(JobRecorded { moves, batch })
}

fn is_news(batch: &BatchRecord, job_id: &str) -> bool {
    match &batch.state {
        BatchState::Submitted { job_id: known } => known != job_id,
        BatchState::Closed { .. } => false,
        BatchState::Intent => true,
    }
}

/// When the scheduler should look at the batch again, and why. A `note` with
/// `count_failure` is one more consecutive failure (the bounded-attempt count); without it
/// (rate limits, pauses) it is only the last error. No note: the call went through, so the
/// failure count and any not-found window start over.
pub(in crate::store) fn reschedule(
    mut batch: BatchRecord,
    next_action_at_ms: u64,
    note: Option<String>,
    count_failure: bool,
    now_ms: u64,
) -> BatchRecord {
    batch.next_action_at_ms = next_action_at_ms;
    match note {
        Some(reason) => {
            batch.failures += u32::from(count_failure);
            batch.last_error = Some(reason);
        }
        None => {
            batch.failures = 0;
            batch.not_found_since_ms = None;
        }
    }
    batch.updated_at_ms = now_ms;
    batch
}

/// One more 404 for the batch's job, not counted as a failure: the window opened at
/// `since_ms` (kept if already open) decides when the job is declared gone.
pub(in crate::store) fn not_found(
    mut batch: BatchRecord,
    since_ms: u64,
    next_action_at_ms: u64,
    note: String,
    now_ms: u64,
) -> BatchRecord {
    batch.not_found_since_ms = Some(batch.not_found_since_ms.unwrap_or(since_ms));
    batch.next_action_at_ms = next_action_at_ms;
    batch.last_error = Some(note);
    batch.updated_at_ms = now_ms;
    batch
}
