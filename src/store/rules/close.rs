//! Members leaving a batch without an answer: at its end (the members it never answered go
//! back to the queue or fail, as the close says) or before it was ever sent (an intent
//! shrunk to what the provider takes). Both backends load the members these plans name and
//! carry out the moves, so a batch ends alike on redb and on PostgreSQL.

use crate::domain::lifecycle::{Event, FailureClass, State};
use crate::store::records::{BatchRecord, BatchState, ExtractionRecord};
use crate::store::rules::member::{Effect, MemberRules, Move, moved, release, requeue};
use crate::store::seam::{CloseReport, Leftover};

/// What a close writes: the members' moves, then the batch record, closed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(in crate::store) struct Closing {
    pub moves: Vec<Move>,
    pub batch: BatchRecord,
    pub report: CloseReport,
}

/// The members a close must load: none once the batch is closed.
pub(in crate::store) fn to_close(batch: &BatchRecord) -> &[u64] {
    if matches!(batch.state, BatchState::Closed { .. }) { &[] } else { &batch.members }
}

/// Ends `batch`; `None` when it is closed already (a second close writes nothing).
/// `members` are those of `to_close` that still exist.
pub(in crate::store) fn close(
    batch: &BatchRecord,
    members: Vec<ExtractionRecord>,
    outcome: String,
    leftover: &Leftover,
    rules: &MemberRules,
    now_ms: u64,
) -> Option<Closing> {
    if matches!(batch.state, BatchState::Closed { .. }) {
        return None;
    }
    let mut report = CloseReport::default();
    let mut moves = Vec::new();
    for mut member in members.into_iter().filter(|m| in_batch(m, batch)) {
        let key = batch.batch_key.clone();
        let (event, effect) = match leftover {
            Leftover::Requeue => {
                release(&member, key, rules, None, &format!("its batch ended ({outcome}) without an answer for it"))
            }
            Leftover::Return => (Event::Requeue { batch_key: key }, Effect::None),
            Leftover::Fail { class, reason } => {
                (Event::ProviderFailed { batch_key: key, class: *class, reason: reason.clone() }, Effect::None)
            }
        };
        requeue(&mut member, effect);
        let Some(step) = moved(member, event, now_ms) else { continue };
        match &step.next {
            State::Failed { class: FailureClass::AttemptsExhausted, .. } => report.exhausted += 1,
            State::Failed { .. } => report.failed += 1,
            State::Pending => report.requeued += 1,
            _ => {}
        }
        moves.push(step);
    }
    let job_id = match &batch.state {
        BatchState::Submitted { job_id } => Some(job_id.clone()),
        _ => None,
    };
    let mut batch = batch.clone();
    batch.state = BatchState::Closed { job_id, outcome };
    batch.updated_at_ms = now_ms;
    Some(Closing { moves, batch, report })
}

/// What shrinking an intent writes: the members past `keep` back in the queue, the batch
/// without them, and which left (PostgreSQL keeps a member table to drop them from).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(in crate::store) struct Shrinking {
    pub moves: Vec<Move>,
    pub batch: BatchRecord,
    pub dropped: Vec<u64>,
}

/// The members a shrink to `keep` must load: those past it, if the batch is an intent that
/// large. Only an intent is shrunk: the provider refused it before any job existed, so its
/// batch key was never sent.
pub(in crate::store) fn to_shrink(batch: &BatchRecord, keep: usize) -> &[u64] {
    match batch.state {
        BatchState::Intent => batch.members.get(keep.max(1)..).unwrap_or(&[]),
        _ => &[],
    }
}

/// Keeps the first `keep` members (at least one) and returns the rest to the queue as the
/// same attempt: none of them was ever sent. `None`: nothing to shrink.
pub(in crate::store) fn shrink(
    batch: &BatchRecord,
    keep: usize,
    excess: Vec<ExtractionRecord>,
    now_ms: u64,
) -> Option<Shrinking> {
    let dropped = to_shrink(batch, keep).to_vec();
    if dropped.is_empty() {
        return None;
    }
    let moves = excess
        .into_iter()
        .filter(|m| in_batch(m, batch))
        .filter_map(|m| moved(m, Event::Requeue { batch_key: batch.batch_key.clone() }, now_ms))
        .collect();
    let mut batch = batch.clone();
    batch.members.truncate(keep.max(1));
    batch.next_action_at_ms = now_ms;
    batch.updated_at_ms = now_ms;
    Some(Shrinking { moves, batch, dropped })
}

/// Still waiting on this batch: a member that has left it since (answered, cancelled,
/// erased and reused) is not this batch's to move.
fn in_batch(member: &ExtractionRecord, batch: &BatchRecord) -> bool {
    matches!(&member.state, State::Submitted { batch_key, .. } if *batch_key == batch.batch_key)
}
