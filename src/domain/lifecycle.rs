//! The extraction lifecycle: one persisted state enum and one pure transition function.
//!
//! Every state change in the product goes through [`apply`], inside the redb write
//! transaction that persists its result, so an illegal transition can never be written.
//!
//! Two paths lead to `Committed`: an external worker's validated result under its current
//! lease (`Claimed`), or a built-in provider's stored result that passed validation
//! (`Submitted` → `Ready`). New variants are only ever appended, so the encodings of the
//! existing ones (and the golden fixtures) never move.

use serde::{Deserialize, Serialize};

use super::names::{BatchKey, LeaseToken, ProviderName};

/// DESIGN §3 failure classes. Only `Validation` is produced by the external-worker path;
/// the others are reserved for provider adapters. New classes are appended, so the
/// encodings of the existing ones never move.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum FailureClass {
    RateLimited,
    Transient,
    Auth,
    InvalidRequest,
    Validation,
    Gone,
    /// The model's answer was cut off at its output budget (OpenAI `finish_reason:
    /// "length"`, Anthropic `stop_reason: "max_tokens"`), even after a retry with a larger one.
    Truncated,
    /// The model declined to answer (OpenAI `message.refusal`, Anthropic `stop_reason:
    /// "refusal"` or no forced tool call).
    Refused,
    /// The extraction used every provider attempt it is allowed across requeues.
    AttemptsExhausted,
}

impl FailureClass {
    pub const ALL: [FailureClass; 9] = [
        Self::RateLimited,
        Self::Transient,
        Self::Auth,
        Self::InvalidRequest,
        Self::Validation,
        Self::Gone,
        Self::Truncated,
        Self::Refused,
        Self::AttemptsExhausted,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::RateLimited => "rate_limited",
            Self::Transient => "transient",
            Self::Auth => "auth",
            Self::InvalidRequest => "invalid_request",
            Self::Validation => "validation",
            Self::Gone => "gone",
            Self::Truncated => "truncated",
            Self::Refused => "refused",
            Self::AttemptsExhausted => "attempts_exhausted",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum State {
    Pending,
    Claimed {
        worker: String,
        lease_token: LeaseToken,
        expires_at_ms: u64,
    },
    Committed {
        at_ms: u64,
    },
    Failed {
        class: FailureClass,
        reason: String,
    },
    /// Member of a provider batch. `job_id` is `None` while only the submit intent is
    /// persisted: the provider may or may not have the job, so it must be looked up by
    /// `batch_key` before anything is resubmitted.
    Submitted {
        provider: ProviderName,
        batch_key: BatchKey,
        job_id: Option<String>,
    },
    /// The provider's raw result is stored; validation and commit come next.
    Ready {
        provider: ProviderName,
        batch_key: BatchKey,
    },
    /// Stopped by its tenant or an operator (terminal). An answer that arrives later is
    /// charged but never committed.
    Cancelled {
        at_ms: u64,
    },
}

/// State names as they appear in the API and in the state index.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum StateName {
    Pending,
    Claimed,
    Committed,
    Failed,
    Submitted,
    Ready,
    Cancelled,
}

impl StateName {
    pub const ALL: [StateName; 7] =
        [Self::Pending, Self::Claimed, Self::Committed, Self::Failed, Self::Submitted, Self::Ready, Self::Cancelled];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Pending => "pending",
            Self::Claimed => "claimed",
            Self::Committed => "committed",
            Self::Failed => "failed",
            Self::Submitted => "submitted",
            Self::Ready => "ready",
            Self::Cancelled => "cancelled",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|n| n.as_str() == s)
    }

    /// Stable one-byte code used as the state index key prefix.
    pub fn code(self) -> u8 {
        match self {
            Self::Pending => 1,
            Self::Claimed => 2,
            Self::Committed => 3,
            Self::Failed => 4,
            Self::Submitted => 5,
            Self::Ready => 6,
            Self::Cancelled => 7,
        }
    }

    /// Whether nothing moves an extraction out of this state on its own (an operator's retry
    /// aside): the rest is work waiting or in flight.
    pub fn is_terminal(self) -> bool {
        matches!(self, Self::Committed | Self::Failed | Self::Cancelled)
    }

    /// Whether the work is with a worker or a provider: what a tenant's `max_in_flight`
    /// counts.
    pub fn is_in_flight(self) -> bool {
        matches!(self, Self::Claimed | Self::Submitted | Self::Ready)
    }

    /// The state a stored code names; `None` for a code no state has.
    pub fn from_code(code: i64) -> Option<StateName> {
        Self::ALL.into_iter().find(|s| i64::from(s.code()) == code)
    }
}

impl State {
    pub fn name(&self) -> StateName {
        match self {
            Self::Pending => StateName::Pending,
            Self::Claimed { .. } => StateName::Claimed,
            Self::Committed { .. } => StateName::Committed,
            Self::Failed { .. } => StateName::Failed,
            Self::Submitted { .. } => StateName::Submitted,
            Self::Ready { .. } => StateName::Ready,
            Self::Cancelled { .. } => StateName::Cancelled,
        }
    }

    /// The batch this extraction belongs to, while it belongs to one.
    pub fn batch_key(&self) -> Option<&BatchKey> {
        match self {
            Self::Submitted { batch_key, .. } | Self::Ready { batch_key, .. } => Some(batch_key),
            _ => None,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// A worker asks for the work under a new fencing token.
    Claim { worker: String, lease_token: LeaseToken, expires_at_ms: u64 },
    /// A worker holding the current lease asks for more time: the lease now runs until
    /// `expires_at_ms` under the same fencing token.
    Extend { lease_token: LeaseToken, expires_at_ms: u64 },
    /// A worker posted output that passed schema validation.
    ValidResult { lease_token: LeaseToken },
    /// A worker posted output that failed schema validation (or grounding). `reask`: the
    /// extraction has re-asks left, so it goes back to the queue to be asked again with
    /// the issues instead of failing.
    InvalidResult { lease_token: LeaseToken, reason: String, reask: bool },
    /// An operator asks to try a failed extraction again.
    Retry,
    /// The batcher put the extraction into a submit intent for `provider`.
    Enqueue { provider: ProviderName, batch_key: BatchKey },
    /// The provider accepted the batch and its job id is being persisted.
    JobAccepted { batch_key: BatchKey, job_id: String },
    /// The provider's answer for this member is stored raw.
    ResultStored { batch_key: BatchKey },
    /// The stored result passed schema validation.
    ReadyValid { batch_key: BatchKey },
    /// The stored result failed schema validation (or grounding); `reask` as for
    /// `InvalidResult`.
    ReadyInvalid { batch_key: BatchKey, reason: String, reask: bool },
    /// The provider refused this member for good (invalid request, non-retryable error).
    ProviderFailed { batch_key: BatchKey, class: FailureClass, reason: String },
    /// The batch ended without an answer for this member (expired, cancelled, lost):
    /// it goes back to the queue as a new attempt of the same identity.
    Requeue { batch_key: BatchKey },
    /// The tenant or an operator stops the work for good.
    Cancel,
    /// An operator promotes an evaluation candidate's valid answer (docs/EVALUATIONS.md):
    /// it commits work no one else is answering, and only that.
    Promote,
}

impl Event {
    fn name(&self) -> &'static str {
        match self {
            Self::Claim { .. } => "claim",
            Self::Extend { .. } => "extend the lease of",
            Self::ValidResult { .. } | Self::InvalidResult { .. } => "result",
            Self::Retry => "retry",
            Self::Enqueue { .. } => "enqueue",
            Self::JobAccepted { .. } => "accept a job for",
            Self::ResultStored { .. } => "store a result for",
            Self::ReadyValid { .. } | Self::ReadyInvalid { .. } => "commit",
            Self::ProviderFailed { .. } => "fail",
            Self::Requeue { .. } => "requeue",
            Self::Cancel => "cancel",
            Self::Promote => "promote",
        }
    }

    fn batch_key(&self) -> Option<&BatchKey> {
        match self {
            Self::Enqueue { batch_key, .. }
            | Self::JobAccepted { batch_key, .. }
            | Self::ResultStored { batch_key }
            | Self::ReadyValid { batch_key }
            | Self::ReadyInvalid { batch_key, .. }
            | Self::ProviderFailed { batch_key, .. }
            | Self::Requeue { batch_key } => Some(batch_key),
            Self::Claim { .. }
            | Self::Extend { .. }
            | Self::ValidResult { .. }
            | Self::InvalidResult { .. }
            | Self::Retry
            | Self::Cancel
            | Self::Promote => None,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// Persist this new state.
    Changed(State),
    /// The event was already applied; nothing may be written.
    Replay,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TransitionError {
    #[error("the lease token is not the current lease of this extraction (another worker holds or took over the work)")]
    StaleLease,
    #[error("the extraction is claimed by another worker until its lease expires")]
    LeaseHeld { expires_at_ms: u64 },
    #[error("the extraction belongs to another batch than the one reporting on it")]
    StaleBatch,
    #[error("cannot {event} an extraction that is {from}")]
    Illegal { from: &'static str, event: &'static str },
}

/// The single transition function. Pure: no I/O, no clock (time comes in as `now_ms`).
pub fn apply(state: &State, event: Event, now_ms: u64) -> Result<Outcome, TransitionError> {
    if event.batch_key().is_some() && !matches!(event, Event::Enqueue { .. }) {
        return apply_batch_event(state, event, now_ms);
    }
    use Event as E;
    use State as S;
    let illegal = |event: &Event| TransitionError::Illegal { from: state.name().as_str(), event: event.name() };
    match (state, event) {
        (S::Pending, E::Claim { worker, lease_token, expires_at_ms }) => {
            Ok(claimed(worker, lease_token, expires_at_ms))
        }
        (S::Claimed { expires_at_ms: held, .. }, E::Claim { worker, lease_token, expires_at_ms }) => {
            if *held > now_ms {
                Err(TransitionError::LeaseHeld { expires_at_ms: *held })
            } else {
                Ok(claimed(worker, lease_token, expires_at_ms))
            }
        }
        // The fencing token decides, not the clock: a worker whose lease ran out may still
        // finish as long as nobody took the work over (its token is still current).
        (S::Claimed { lease_token: current, .. }, E::ValidResult { lease_token }) => {
            fenced(current, &lease_token)?;
            Ok(Outcome::Changed(S::Committed { at_ms: now_ms }))
        }
        (S::Claimed { lease_token: current, .. }, E::InvalidResult { lease_token, reason, reask }) => {
            fenced(current, &lease_token)?;
            Ok(Outcome::Changed(invalid(reason, reask)))
        }
        (S::Committed { .. }, E::ValidResult { .. } | E::InvalidResult { .. }) => Ok(Outcome::Replay),
        // Like a result, an extension is fenced by the token, not the clock: a lease that ran
        // out may still be extended while nobody took the work over. The new expiry is the
        // worker's to choose (it may also shorten the lease).
        (S::Claimed { worker, lease_token: current, .. }, E::Extend { lease_token, expires_at_ms }) => {
            fenced(current, &lease_token)?;
            Ok(claimed(worker.clone(), lease_token, expires_at_ms))
        }
        // No lease to extend (never claimed, re-asked, or the work went to a provider batch).
        (S::Pending | S::Submitted { .. } | S::Ready { .. }, E::Extend { .. }) => Err(TransitionError::StaleLease),
        // A worker holding no lease (never claimed, or the work went to a provider batch).
        (S::Pending | S::Submitted { .. } | S::Ready { .. }, E::ValidResult { .. } | E::InvalidResult { .. }) => {
            Err(TransitionError::StaleLease)
        }
        (S::Failed { .. }, E::Retry) => Ok(Outcome::Changed(S::Pending)),
        (S::Pending, E::Enqueue { provider, batch_key }) => {
            Ok(Outcome::Changed(S::Submitted { provider, batch_key, job_id: None }))
        }
        // A worker's or a batch's later answer finds the extraction cancelled and is refused
        // (stale lease or batch), so nothing is ever committed for it. `Ready` is not
        // cancelled: its answer is already in and is being committed.
        (S::Pending | S::Failed { .. } | S::Claimed { .. } | S::Submitted { .. }, E::Cancel) => {
            Ok(Outcome::Changed(S::Cancelled { at_ms: now_ms }))
        }
        (S::Cancelled { .. }, E::Cancel) => Ok(Outcome::Replay),
        // A worker or a batch may be answering the claimed, submitted or ready ones: their
        // own answer decides, so those are illegal here, as a cancelled one is.
        (S::Pending | S::Failed { .. }, E::Promote) => Ok(Outcome::Changed(S::Committed { at_ms: now_ms })),
        (S::Committed { .. }, E::Promote) => Ok(Outcome::Replay),
        (_, event) => Err(illegal(&event)),
    }
}

/// Where an invalid answer leads: back to the queue for a re-ask while re-asks are left,
/// else a validation failure.
fn invalid(reason: String, reask: bool) -> State {
    if reask { State::Pending } else { State::Failed { class: FailureClass::Validation, reason } }
}

/// Events reported by a provider batch. Each carries the batch key, which fences it the
/// way a lease token fences a worker: a late report from an older batch changes nothing.
fn apply_batch_event(state: &State, event: Event, now_ms: u64) -> Result<Outcome, TransitionError> {
    use Event as E;
    use State as S;
    let Some(current_key) = state.batch_key() else {
        // Terminal or worker-owned states: a duplicate or late provider report.
        return match (state, &event) {
            (S::Committed { .. }, _) => Ok(Outcome::Replay),
            _ => Err(TransitionError::StaleBatch),
        };
    };
    if event.batch_key() != Some(current_key) {
        return Err(TransitionError::StaleBatch);
    }
    let illegal = |event: &Event| TransitionError::Illegal { from: state.name().as_str(), event: event.name() };
    match (state, event) {
        (S::Submitted { provider, batch_key, job_id: None }, E::JobAccepted { job_id, .. }) => {
            Ok(Outcome::Changed(S::Submitted {
                provider: provider.clone(),
                batch_key: batch_key.clone(),
                job_id: Some(job_id),
            }))
        }
        (S::Submitted { job_id: Some(known), .. }, E::JobAccepted { job_id, .. }) if *known == job_id => {
            Ok(Outcome::Replay)
        }
        (S::Submitted { provider, batch_key, job_id: Some(_) }, E::ResultStored { .. }) => {
            Ok(Outcome::Changed(S::Ready { provider: provider.clone(), batch_key: batch_key.clone() }))
        }
        // Duplicate result lines: the first stored answer wins.
        (S::Ready { .. }, E::ResultStored { .. }) => Ok(Outcome::Replay),
        (S::Ready { .. }, E::ReadyValid { .. }) => Ok(Outcome::Changed(S::Committed { at_ms: now_ms })),
        (S::Ready { .. }, E::ReadyInvalid { reason, reask, .. }) => Ok(Outcome::Changed(invalid(reason, reask))),
        (S::Submitted { .. }, E::ProviderFailed { class, reason, .. }) => {
            Ok(Outcome::Changed(S::Failed { class, reason }))
        }
        (S::Submitted { .. }, E::Requeue { .. }) => Ok(Outcome::Changed(S::Pending)),
        (S::Ready { .. }, E::ProviderFailed { .. } | E::Requeue { .. }) => Ok(Outcome::Replay),
        (_, event) => Err(illegal(&event)),
    }
}

fn claimed(worker: String, lease_token: LeaseToken, expires_at_ms: u64) -> Outcome {
    Outcome::Changed(State::Claimed { worker, lease_token, expires_at_ms })
}

fn fenced(current: &LeaseToken, presented: &LeaseToken) -> Result<(), TransitionError> {
    if current == presented { Ok(()) } else { Err(TransitionError::StaleLease) }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn claimed_by(token: &str, expires: u64) -> State {
        State::Claimed { worker: "w".into(), lease_token: token.into(), expires_at_ms: expires }
    }
    fn claim(token: &str, expires: u64) -> Event {
        Event::Claim { worker: "w".into(), lease_token: token.into(), expires_at_ms: expires }
    }
    fn extend(token: &str, expires: u64) -> Event {
        Event::Extend { lease_token: token.into(), expires_at_ms: expires }
    }
    fn valid(token: &str) -> Event {
        Event::ValidResult { lease_token: token.into() }
    }
    fn invalid(token: &str) -> Event {
        Event::InvalidResult { lease_token: token.into(), reason: "bad".into(), reask: false }
    }
    fn failed() -> State {
        State::Failed { class: FailureClass::Validation, reason: "bad".into() }
    }

    fn submitted(key: &str, job: Option<&str>) -> State {
        State::Submitted { provider: "p".into(), batch_key: key.into(), job_id: job.map(str::to_string) }
    }
    fn ready(key: &str) -> State {
        State::Ready { provider: "p".into(), batch_key: key.into() }
    }

    /// An invalid answer with re-asks left sends the work back to the queue, from a
    /// worker's lease or a batch's staged answer alike; the fence still decides first.
    #[test]
    fn an_invalid_answer_with_reasks_left_goes_back_to_the_queue() {
        let claimed = State::Claimed { worker: "w".into(), lease_token: "lt-1".into(), expires_at_ms: 50 };
        let reask = |token: &str| Event::InvalidResult { lease_token: token.into(), reason: "bad".into(), reask: true };
        assert_eq!(apply(&claimed, reask("lt-1"), 10), Ok(Outcome::Changed(State::Pending)));
        assert_eq!(apply(&claimed, reask("lt-0"), 10), Err(TransitionError::StaleLease));
        assert_eq!(apply(&claimed, invalid("lt-1"), 10), Ok(Outcome::Changed(failed())));
        let ready_reask = Event::ReadyInvalid { batch_key: "k".into(), reason: "bad".into(), reask: true };
        assert_eq!(apply(&ready("k"), ready_reask.clone(), 10), Ok(Outcome::Changed(State::Pending)));
        assert_eq!(apply(&ready("old"), ready_reask, 10), Err(TransitionError::StaleBatch));
    }

    /// An extension keeps the worker and the token and moves only the expiry, also after the
    /// lease ran out while nobody took the work over; any other token, or an extraction
    /// that holds no lease, is a stale lease; after the work ended it is illegal.
    #[test]
    fn only_the_current_lease_is_extended() {
        let changed = |s: State| Ok(Outcome::Changed(s));
        assert_eq!(apply(&claimed_by("a", 50), extend("a", 500), 10), changed(claimed_by("a", 500)));
        assert_eq!(
            apply(&claimed_by("a", 50), extend("a", 900), 400),
            changed(claimed_by("a", 900)),
            "expired, not taken over"
        );
        assert_eq!(apply(&claimed_by("b", 50), extend("a", 500), 10), Err(TransitionError::StaleLease));
        for holds_no_lease in [State::Pending, submitted("k", None), ready("k")] {
            assert_eq!(apply(&holds_no_lease, extend("a", 500), 10), Err(TransitionError::StaleLease));
        }
        let ended = [
            (State::Committed { at_ms: 5 }, "committed"),
            (failed(), "failed"),
            (State::Cancelled { at_ms: 5 }, "cancelled"),
        ];
        for (state, from) in ended {
            let refused = Err(TransitionError::Illegal { from, event: "extend the lease of" });
            assert_eq!(apply(&state, extend("a", 500), 10), refused);
        }
    }

    #[test]
    fn batch_transition_table() {
        let now = 100;
        let enqueue = |k: &str| Event::Enqueue { provider: "p".into(), batch_key: k.into() };
        let accepted = |k: &str, j: &str| Event::JobAccepted { batch_key: k.into(), job_id: j.into() };
        let stored = |k: &str| Event::ResultStored { batch_key: k.into() };
        let valid = |k: &str| Event::ReadyValid { batch_key: k.into() };
        let invalid = |k: &str| Event::ReadyInvalid { batch_key: k.into(), reason: "bad".into(), reask: false };
        let requeue = |k: &str| Event::Requeue { batch_key: k.into() };
        let refused = |k: &str| Event::ProviderFailed {
            batch_key: k.into(),
            class: FailureClass::InvalidRequest,
            reason: "400".into(),
        };
        let changed = |s: State| Ok(Outcome::Changed(s));
        let rows: Vec<(State, Event, Result<Outcome, TransitionError>)> = vec![
            (State::Pending, enqueue("k"), changed(submitted("k", None))),
            (
                submitted("k", None),
                enqueue("k2"),
                Err(TransitionError::Illegal { from: "submitted", event: "enqueue" }),
            ),
            (submitted("k", None), accepted("k", "job1"), changed(submitted("k", Some("job1")))),
            (submitted("k", Some("job1")), accepted("k", "job1"), Ok(Outcome::Replay)),
            (submitted("k", None), accepted("old", "job0"), Err(TransitionError::StaleBatch)),
            (submitted("k", Some("job1")), stored("k"), changed(ready("k"))),
            (
                submitted("k", None),
                stored("k"),
                Err(TransitionError::Illegal { from: "submitted", event: "store a result for" }),
            ),
            (ready("k"), stored("k"), Ok(Outcome::Replay)),
            (ready("k"), valid("k"), changed(State::Committed { at_ms: now })),
            (ready("k"), invalid("k"), changed(failed())),
            (
                submitted("k", Some("j")),
                valid("k"),
                Err(TransitionError::Illegal { from: "submitted", event: "commit" }),
            ),
            (submitted("k", Some("j")), requeue("k"), changed(State::Pending)),
            (submitted("k", Some("j")), requeue("other"), Err(TransitionError::StaleBatch)),
            (
                submitted("k", Some("j")),
                refused("k"),
                changed(State::Failed { class: FailureClass::InvalidRequest, reason: "400".into() }),
            ),
            (ready("k"), requeue("k"), Ok(Outcome::Replay)),
            (State::Committed { at_ms: 1 }, stored("k"), Ok(Outcome::Replay)),
            (State::Committed { at_ms: 1 }, valid("k"), Ok(Outcome::Replay)),
            (State::Pending, stored("k"), Err(TransitionError::StaleBatch)),
            (
                submitted("k", None),
                claim("a", 200),
                Err(TransitionError::Illegal { from: "submitted", event: "claim" }),
            ),
            (ready("k"), Event::ValidResult { lease_token: "a".into() }, Err(TransitionError::StaleLease)),
        ];
        for (state, event, expected) in rows {
            let label = format!("{state:?} + {event:?}");
            assert_eq!(apply(&state, event, now), expected, "{label}");
        }
    }

    #[test]
    fn transition_table() {
        let now = 100;
        let illegal = |from, event| Err(TransitionError::Illegal { from, event });
        let rows: Vec<(State, Event, Result<Outcome, TransitionError>)> = vec![
            (State::Pending, claim("a", 200), Ok(Outcome::Changed(claimed_by("a", 200)))),
            (State::Pending, valid("a"), Err(TransitionError::StaleLease)),
            (State::Pending, invalid("a"), Err(TransitionError::StaleLease)),
            (State::Pending, Event::Retry, illegal("pending", "retry")),
            (claimed_by("a", 200), claim("b", 300), Err(TransitionError::LeaseHeld { expires_at_ms: 200 })),
            (claimed_by("a", 50), claim("b", 300), Ok(Outcome::Changed(claimed_by("b", 300)))),
            (claimed_by("a", 200), valid("a"), Ok(Outcome::Changed(State::Committed { at_ms: now }))),
            (claimed_by("a", 50), valid("a"), Ok(Outcome::Changed(State::Committed { at_ms: now }))),
            (claimed_by("a", 200), valid("b"), Err(TransitionError::StaleLease)),
            (claimed_by("a", 200), invalid("a"), Ok(Outcome::Changed(failed()))),
            (claimed_by("a", 200), invalid("b"), Err(TransitionError::StaleLease)),
            (claimed_by("a", 200), Event::Retry, illegal("claimed", "retry")),
            (State::Committed { at_ms: 1 }, valid("a"), Ok(Outcome::Replay)),
            (State::Committed { at_ms: 1 }, invalid("z"), Ok(Outcome::Replay)),
            (State::Committed { at_ms: 1 }, claim("b", 300), illegal("committed", "claim")),
            (State::Committed { at_ms: 1 }, Event::Retry, illegal("committed", "retry")),
            (failed(), Event::Retry, Ok(Outcome::Changed(State::Pending))),
            (failed(), claim("b", 300), illegal("failed", "claim")),
            (failed(), valid("a"), illegal("failed", "result")),
        ];
        for (state, event, expected) in rows {
            let label = format!("{state:?} + {event:?}");
            assert_eq!(apply(&state, event, now), expected, "{label}");
        }
    }

    #[test]
    fn cancel_is_terminal_and_fences_late_answers() {
        let now = 100;
        let cancelled = State::Cancelled { at_ms: 7 };
        let changed = Ok(Outcome::Changed(State::Cancelled { at_ms: now }));
        let rows: Vec<(State, Event, Result<Outcome, TransitionError>)> = vec![
            (State::Pending, Event::Cancel, changed.clone()),
            (failed(), Event::Cancel, changed.clone()),
            (claimed_by("a", 200), Event::Cancel, changed.clone()),
            (submitted("k", Some("j")), Event::Cancel, changed),
            (ready("k"), Event::Cancel, Err(TransitionError::Illegal { from: "ready", event: "cancel" })),
            (
                State::Committed { at_ms: 1 },
                Event::Cancel,
                Err(TransitionError::Illegal { from: "committed", event: "cancel" }),
            ),
            (cancelled.clone(), Event::Cancel, Ok(Outcome::Replay)),
            (cancelled.clone(), Event::Retry, Err(TransitionError::Illegal { from: "cancelled", event: "retry" })),
            (cancelled.clone(), claim("b", 300), Err(TransitionError::Illegal { from: "cancelled", event: "claim" })),
            (cancelled.clone(), valid("a"), Err(TransitionError::Illegal { from: "cancelled", event: "result" })),
            (cancelled.clone(), Event::ResultStored { batch_key: "k".into() }, Err(TransitionError::StaleBatch)),
            (cancelled, Event::ReadyValid { batch_key: "k".into() }, Err(TransitionError::StaleBatch)),
        ];
        for (state, event, expected) in rows {
            let label = format!("{state:?} + {event:?}");
            assert_eq!(apply(&state, event, now), expected, "{label}");
        }
    }

    fn arb_event() -> impl Strategy<Value = Event> {
        let token = prop::sample::select(vec!["a", "b", "c"]);
        let key = prop::sample::select(vec!["k1", "k2"]).prop_map(BatchKey::from);
        prop_oneof![
            (token.clone(), 0u64..400).prop_map(|(t, e)| claim(t, e)),
            (token.clone(), 0u64..400).prop_map(|(t, e)| extend(t, e)),
            token.clone().prop_map(valid),
            token.prop_map(invalid),
            Just(Event::Retry),
            key.clone().prop_map(|batch_key| Event::Enqueue { provider: "p".into(), batch_key }),
            key.clone().prop_map(|batch_key| Event::JobAccepted { batch_key, job_id: "j".into() }),
            key.clone().prop_map(|batch_key| Event::ResultStored { batch_key }),
            key.clone().prop_map(|batch_key| Event::ReadyValid { batch_key }),
            key.clone().prop_map(|batch_key| Event::ReadyInvalid { batch_key, reason: "r".into(), reask: false }),
            key.prop_map(|batch_key| Event::Requeue { batch_key }),
            Just(Event::Cancel),
        ]
    }

    proptest! {
        /// Whatever events arrive, in any order and at any time, an extraction enters
        /// Committed at most once, only through a validated result under the current lease
        /// or a validated stored result of its current batch.
        #[test]
        fn committed_is_reached_once_and_only_through_validation(
            events in prop::collection::vec((arb_event(), 0u64..400), 0..60)
        ) {
            let mut state = State::Pending;
            let mut commits = 0;
            for (event, now) in events {
                let before = state.clone();
                let was_valid_under_lease = matches!(
                    (&before, &event),
                    (State::Claimed { lease_token: cur, .. }, Event::ValidResult { lease_token })
                        if cur == lease_token
                ) || matches!(
                    (&before, &event),
                    (State::Ready { batch_key: cur, .. }, Event::ReadyValid { batch_key }) if cur == batch_key
                );
                if let Ok(Outcome::Changed(next)) = apply(&before, event, now) {
                    if matches!(next, State::Committed { .. }) {
                        commits += 1;
                        prop_assert!(was_valid_under_lease, "committed without validation from {before:?}");
                    }
                    prop_assert!(!matches!(before, State::Committed { .. }), "left Committed");
                    prop_assert!(!matches!(before, State::Cancelled { .. }), "left Cancelled");
                    state = next;
                }
            }
            prop_assert!(commits <= 1);
        }
    }
}
