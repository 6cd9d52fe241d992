//! What a provider's answer, or its batch's end, means for one member: the lifecycle event,
//! and whether the member goes back to the queue as a new attempt (with a larger output
//! budget after a truncation) or fails at its attempt cap. Both backends apply these
//! rules, so a batch ends the same way on redb and on PostgreSQL.

use crate::domain::batch::{LineResult, OutputBudget};
use crate::domain::lifecycle::{self, Event, FailureClass, Outcome, State};
use crate::domain::names::BatchKey;
use crate::store::records::ExtractionRecord;

/// How a provider's scheduler treats the members it releases and the answers it stages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemberRules {
    /// Provider attempts one extraction may use across requeues (at least 1).
    pub max_attempts: u32,
    pub budget: OutputBudget,
    /// Calls go through a batch API, billed at its discount (false: a synchronous API).
    pub batch_api: bool,
}

/// What a state change does to the record besides its state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(in crate::store) enum Effect {
    None,
    /// Back to the queue as a new attempt; `raise_to` is a larger output budget after a truncation.
    Requeue {
        raise_to: Option<u32>,
    },
}

/// The event one result line means for its member, and what else it changes.
pub(in crate::store) fn plan_line(
    member: &ExtractionRecord,
    line: &LineResult,
    batch_key: BatchKey,
    rules: &MemberRules,
) -> (Event, Effect) {
    let failed = |class, reason| (Event::ProviderFailed { batch_key: batch_key.clone(), class, reason }, Effect::None);
    match line {
        LineResult::Answer { .. } => (Event::ResultStored { batch_key }, Effect::None),
        LineResult::Refused { class, reason } => failed(*class, reason.clone()),
        LineResult::Retry { reason } => release(member, batch_key, rules, None, reason),
        LineResult::Unusable { class: FailureClass::Truncated, reason, usage } => {
            let billed = usage.as_ref().map(|u| u.output_tokens);
            let raised = rules.budget.raised(member.output_budget, billed);
            match (member.truncation_retried, raised) {
                (false, Some(budget)) => release(member, batch_key, rules, Some(budget), reason),
                (true, _) => {
                    let used = member.output_budget.map_or_else(|| "the default".to_string(), |b| b.to_string());
                    failed(
                        FailureClass::Truncated,
                        format!("{reason}; already retried once with an output budget of {used} tokens"),
                    )
                }
                (false, None) => failed(
                    FailureClass::Truncated,
                    format!("{reason}; no larger output budget to retry with (cap {} tokens)", rules.budget.cap),
                ),
            }
        }
        LineResult::Unusable { class, reason, .. } => failed(*class, reason.clone()),
    }
}

/// Another attempt for a member its batch did not answer usably, or — once it has used
/// `max_attempts` provider attempts — a permanent failure instead of a requeue for ever.
pub(in crate::store) fn release(
    member: &ExtractionRecord,
    batch_key: BatchKey,
    rules: &MemberRules,
    raise_to: Option<u32>,
    why: &str,
) -> (Event, Effect) {
    let attempts = member.requeues.saturating_add(1);
    if attempts >= rules.max_attempts {
        let reason =
            format!("{attempts} provider attempts used (max_attempts {}); the last: {why}", rules.max_attempts);
        let event = Event::ProviderFailed { batch_key, class: FailureClass::AttemptsExhausted, reason };
        return (event, Effect::None);
    }
    (Event::Requeue { batch_key }, Effect::Requeue { raise_to })
}

/// One member's state change as a backend's `transition` takes it: the record as it stands
/// (a requeue already counted in it) and the state it moves to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(in crate::store) struct Move {
    pub member: ExtractionRecord,
    pub next: State,
}

/// The move `event` makes of `member`, if it changes anything: a replay or a refused
/// event (a member that left the batch since) writes nothing.
pub(in crate::store) fn moved(member: ExtractionRecord, event: Event, now_ms: u64) -> Option<Move> {
    match lifecycle::apply(&member.state, event, now_ms) {
        Ok(Outcome::Changed(next)) => Some(Move { member, next }),
        _ => None,
    }
}

/// A requeue is a new attempt of the same identity, one more used of its allowance.
pub(in crate::store) fn requeue(member: &mut ExtractionRecord, effect: Effect) {
    if let Effect::Requeue { raise_to } = effect {
        member.attempt += 1;
        member.requeues += 1;
        if let Some(budget) = raise_to {
            member.output_budget = Some(budget);
            member.truncation_retried = true;
        }
    }
}
