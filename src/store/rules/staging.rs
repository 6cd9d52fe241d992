//! What one chunk of a batch's result lines writes: for each line the charge of a paid call,
//! the answer staged or (judged already) committed, and the member's state change, with the
//! report the scheduler counts. Both backends stage by this plan, so a line leaves its
//! member in the same state on redb and on PostgreSQL, and a re-fetched file writes
//! nothing but replay charges on either.

use std::collections::{HashMap, HashSet};

use crate::domain::batch::{LineResult, Usage};
use crate::domain::identity::ExtractionId;
use crate::domain::lifecycle::{self, Event, FailureClass, Outcome, State};
use crate::store::Error;
use crate::store::records::{BatchRecord, BatchState, ChargeKind, ExtractionRecord, Fence};
use crate::store::rules::member::{Effect, MemberRules, Move, plan_line, requeue};
use crate::store::seam::{Charge, IngestLine, Judged, StageReport};
use crate::store::staged::StagedAnswer;

/// One write of a staging transaction, in the order the plan lists them.
#[derive(Debug, Clone)]
pub(in crate::store) enum StageWrite<'a> {
    /// A paid call, charged to the attempt that paid for it (before any requeue).
    Charge {
        member: ExtractionRecord,
        charge: Charge,
        kind: ChargeKind,
    },
    /// The raw answer kept for the committer, which validates it later (the member is `Ready`).
    Stage {
        seq: u64,
        answer: StagedAnswer,
    },
    Move(Move),
    /// An answer judged before staging, committed or failed right away.
    Settle(Settle<'a>),
}

/// A judged answer as a commit applies it: `Ready` was only a step of this plan, so the
/// member goes from the state it is stored in to `next` with the answer written once.
#[derive(Debug, Clone)]
pub(in crate::store) struct Settle<'a> {
    pub member: ExtractionRecord,
    /// `Committed`, or `Failed` validation.
    pub next: State,
    pub answer: &'a Judged,
    /// The call's charge, latency included; the settling backend picks its kind.
    pub charge: Option<Charge>,
    pub producer: String,
    pub fence: Fence,
}

#[derive(Debug, Default)]
pub(in crate::store) struct Staging<'a> {
    pub writes: Vec<StageWrite<'a>>,
    pub report: StageReport,
}

/// The extractions `lines` name, each once, in the order they first appear: what a backend
/// loads (and on PostgreSQL locks, in that order) before it asks for the plan.
pub(in crate::store) fn named(lines: &[IngestLine]) -> impl Iterator<Item = ExtractionId> + '_ {
    let mut seen = HashSet::with_capacity(lines.len());
    lines.iter().map(|line| line.id).filter(move |id| seen.insert(*id))
}

/// Plans one chunk of `batch`'s lines. `members` are the extractions the lines name, as the
/// backend loaded (and on PostgreSQL locked) them; a line naming no one is a stranger. A
/// member named twice sees the first line's effect, as a second transaction would.
pub(in crate::store) fn plan<'a>(
    batch: &BatchRecord,
    mut members: HashMap<ExtractionId, ExtractionRecord>,
    lines: &'a [IngestLine],
    rules: &MemberRules,
    now_ms: u64,
) -> Result<Staging<'a>, Error> {
    let job_id = match &batch.state {
        BatchState::Submitted { job_id } => job_id.as_str(),
        _ => "",
    };
    let latency_ms = now_ms.saturating_sub(batch.created_at_ms);
    let charge = |usage: &Usage, latency_ms| Charge {
        provider: batch.provider.to_string(),
        job_id: Some(job_id.to_string()).filter(|j| !j.is_empty()),
        usage: usage.clone(),
        latency_ms,
        batch: rules.batch_api,
    };
    let mut plan = Staging::default();
    let (writes, report) = (&mut plan.writes, &mut plan.report);
    for IngestLine { id, result: line, judged } in lines {
        let Some(member) = members.get_mut(id) else {
            report.strangers += 1;
            continue;
        };
        let (event, effect) = plan_line(member, line, batch.batch_key.clone(), rules);
        let next = match lifecycle::apply(&member.state, event, now_ms) {
            Ok(Outcome::Changed(next)) => next,
            Ok(Outcome::Replay) => {
                report.replays += 1;
                // A re-fetched result file: the call is counted again, never charged again.
                if let Some(usage) = paid(line) {
                    writes.push(StageWrite::Charge {
                        member: member.clone(),
                        charge: charge(usage, None),
                        kind: ChargeKind::Replay,
                    });
                }
                continue;
            }
            Err(_) => {
                report.strangers += 1;
                // Cancelled while its batch ran: the answer was paid for, so it is charged
                // to the attempt that paid, and never applied.
                if let (State::Cancelled { .. }, Some(usage)) = (&member.state, paid(line)) {
                    let charge = charge(usage, None);
                    writes.push(StageWrite::Charge { member: member.clone(), charge, kind: ChargeKind::Fresh });
                }
                continue;
            }
        };
        match line {
            LineResult::Answer { output, usage } => {
                // Judged against the batch's schema outside the store: written once, as its result.
                if let Some(answer) = judged.as_ref().filter(|_| member.schema == batch.schema) {
                    let settle = settle(
                        batch,
                        member,
                        &next,
                        answer,
                        usage.as_ref().map(|u| charge(u, Some(latency_ms))),
                        now_ms,
                    )?;
                    let answers_reask = member.reasks > 0;
                    match settle.next {
                        State::Committed { .. } => {
                            report.committed += 1;
                            report.reasks_committed += u64::from(answers_reask);
                        }
                        State::Pending => report.reasked += 1,
                        _ => {
                            report.failed_validation += 1;
                            report.reasks_failed += u64::from(answers_reask);
                        }
                    }
                    advance(member, &settle.next, now_ms);
                    writes.push(StageWrite::Settle(settle));
                    continue;
                }
                let answer = StagedAnswer {
                    provider: batch.provider.to_string(),
                    job_id: job_id.to_string(),
                    output_json: output.clone(),
                    usage: usage.clone(),
                    latency_ms: Some(latency_ms),
                    received_at_ms: now_ms,
                };
                writes.push(StageWrite::Stage { seq: member.seq, answer });
                report.staged += 1;
            }
            LineResult::Refused { .. } => report.refused += 1,
            LineResult::Retry { .. } => {}
            LineResult::Unusable { class, usage, .. } => {
                // Paid for, and charged to the attempt that paid, before any requeue.
                if let Some(usage) = usage {
                    let charge = charge(usage, None);
                    writes.push(StageWrite::Charge { member: member.clone(), charge, kind: ChargeKind::Unusable });
                }
                if *class == FailureClass::Truncated {
                    report.truncated += 1;
                }
            }
        }
        count(report, &next, effect);
        requeue(member, effect);
        writes.push(StageWrite::Move(Move { member: member.clone(), next: next.clone() }));
        advance(member, &next, now_ms);
    }
    Ok(plan)
}

/// The usage of a line that was paid for.
fn paid(line: &LineResult) -> Option<&Usage> {
    match line {
        LineResult::Answer { usage, .. } | LineResult::Unusable { usage, .. } => usage.as_ref(),
        LineResult::Refused { .. } | LineResult::Retry { .. } => None,
    }
}

/// Takes a judged answer on from `ready` as a later commit of the staged answer would
/// have, under the batch's authority.
fn settle<'a>(
    batch: &BatchRecord,
    member: &ExtractionRecord,
    ready: &State,
    answer: &'a Judged,
    charge: Option<Charge>,
    now_ms: u64,
) -> Result<Settle<'a>, Error> {
    let batch_key = batch.batch_key.clone();
    let event = match answer {
        Judged::Valid { .. } => Event::ReadyValid { batch_key: batch_key.clone() },
        Judged::Invalid { reason, .. } => Event::ReadyInvalid {
            batch_key: batch_key.clone(),
            reason: reason.clone(),
            reask: answer.reasks_left(member),
        },
    };
    let Ok(Outcome::Changed(next)) = lifecycle::apply(ready, event, now_ms) else {
        return Err(Error::Corrupt {
            kind: "lifecycle",
            reason: format!("a ready answer of extraction #{} could not be committed", member.seq),
        });
    };
    let producer = batch.provider.to_string();
    Ok(Settle { member: member.clone(), next, answer, charge, producer, fence: Fence::Batch(batch_key) })
}

fn count(report: &mut StageReport, next: &State, effect: Effect) {
    match (next, effect) {
        (State::Failed { class: FailureClass::Truncated, .. }, _) => report.failed_truncated += 1,
        (State::Failed { class: FailureClass::Refused, .. }, _) => report.model_refusals += 1,
        (State::Failed { class: FailureClass::AttemptsExhausted, .. }, _) => report.exhausted += 1,
        (_, Effect::Requeue { raise_to }) => {
            report.requeued += 1;
            report.budget_retries += u64::from(raise_to.is_some());
        }
        _ => {}
    }
}

/// The member as the planned write leaves it, for a later line of the same chunk.
fn advance(member: &mut ExtractionRecord, next: &State, now_ms: u64) {
    member.state = next.clone();
    member.updated_at_ms = now_ms;
}
