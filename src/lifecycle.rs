//! The extraction lifecycle: one persisted state enum and one pure transition function.
//!
//! Every state change in the product goes through [`apply`], inside the redb write
//! transaction that persists its result, so an illegal transition can never be written.
//! Built-in providers (Submitted/Ready) extend this enum in a later format version.

use serde::{Deserialize, Serialize};

/// DESIGN §3 failure classes. Only `Validation` is produced by the external-worker path;
/// the others are reserved for provider adapters and keep their encoding stable.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum FailureClass {
    RateLimited,
    Transient,
    Auth,
    InvalidRequest,
    Validation,
    Gone,
}

impl FailureClass {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::RateLimited => "rate_limited",
            Self::Transient => "transient",
            Self::Auth => "auth",
            Self::InvalidRequest => "invalid_request",
            Self::Validation => "validation",
            Self::Gone => "gone",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum State {
    Pending,
    Claimed {
        worker: String,
        lease_token: String,
        expires_at_ms: u64,
    },
    Committed {
        at_ms: u64,
    },
    Failed {
        class: FailureClass,
        reason: String,
    },
}

/// State names as they appear in the API and in the state index.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum StateName {
    Pending,
    Claimed,
    Committed,
    Failed,
}

impl StateName {
    pub const ALL: [StateName; 4] = [Self::Pending, Self::Claimed, Self::Committed, Self::Failed];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Pending => "pending",
            Self::Claimed => "claimed",
            Self::Committed => "committed",
            Self::Failed => "failed",
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
        }
    }
}

impl State {
    pub fn name(&self) -> StateName {
        match self {
            Self::Pending => StateName::Pending,
            Self::Claimed { .. } => StateName::Claimed,
            Self::Committed { .. } => StateName::Committed,
            Self::Failed { .. } => StateName::Failed,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// A worker asks for the work under a new fencing token.
    Claim {
        worker: String,
        lease_token: String,
        expires_at_ms: u64,
    },
    /// A worker posted output that passed schema validation.
    ValidResult { lease_token: String },
    /// A worker posted output that failed schema validation.
    InvalidResult { lease_token: String, reason: String },
    /// An operator asks to try a failed extraction again.
    Retry,
}

impl Event {
    fn name(&self) -> &'static str {
        match self {
            Self::Claim { .. } => "claim",
            Self::ValidResult { .. } | Self::InvalidResult { .. } => "result",
            Self::Retry => "retry",
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
    #[error(
        "the lease token is not the current lease of this extraction (another worker holds or took over the work)"
    )]
    StaleLease,
    #[error("the extraction is claimed by another worker until its lease expires")]
    LeaseHeld { expires_at_ms: u64 },
    #[error("cannot {event} an extraction that is {from}")]
    Illegal {
        from: &'static str,
        event: &'static str,
    },
}

/// The single transition function. Pure: no I/O, no clock (time comes in as `now_ms`).
pub fn apply(state: &State, event: Event, now_ms: u64) -> Result<Outcome, TransitionError> {
    use Event as E;
    use State as S;
    let illegal = |event: &Event| TransitionError::Illegal {
        from: state.name().as_str(),
        event: event.name(),
    };
    match (state, event) {
        (
            S::Pending,
            E::Claim {
                worker,
                lease_token,
                expires_at_ms,
            },
        ) => Ok(claimed(worker, lease_token, expires_at_ms)),
        (
            S::Claimed {
                expires_at_ms: held,
                ..
            },
            E::Claim {
                worker,
                lease_token,
                expires_at_ms,
            },
        ) => {
            if *held > now_ms {
                Err(TransitionError::LeaseHeld {
                    expires_at_ms: *held,
                })
            } else {
                Ok(claimed(worker, lease_token, expires_at_ms))
            }
        }
        // The fencing token decides, not the clock: a worker whose lease ran out may still
        // finish as long as nobody took the work over (its token is still current).
        (
            S::Claimed {
                lease_token: current,
                ..
            },
            E::ValidResult { lease_token },
        ) => {
            fenced(current, &lease_token)?;
            Ok(Outcome::Changed(S::Committed { at_ms: now_ms }))
        }
        (
            S::Claimed {
                lease_token: current,
                ..
            },
            E::InvalidResult {
                lease_token,
                reason,
            },
        ) => {
            fenced(current, &lease_token)?;
            Ok(Outcome::Changed(S::Failed {
                class: FailureClass::Validation,
                reason,
            }))
        }
        (S::Committed { .. }, E::ValidResult { .. } | E::InvalidResult { .. }) => {
            Ok(Outcome::Replay)
        }
        (S::Pending, E::ValidResult { .. } | E::InvalidResult { .. }) => {
            Err(TransitionError::StaleLease)
        }
        (S::Failed { .. }, E::Retry) => Ok(Outcome::Changed(S::Pending)),
        (_, event) => Err(illegal(&event)),
    }
}

fn claimed(worker: String, lease_token: String, expires_at_ms: u64) -> Outcome {
    Outcome::Changed(State::Claimed {
        worker,
        lease_token,
        expires_at_ms,
    })
}

fn fenced(current: &str, presented: &str) -> Result<(), TransitionError> {
    if current == presented {
        Ok(())
    } else {
        Err(TransitionError::StaleLease)
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn claimed_by(token: &str, expires: u64) -> State {
        State::Claimed {
            worker: "w".into(),
            lease_token: token.into(),
            expires_at_ms: expires,
        }
    }
    fn claim(token: &str, expires: u64) -> Event {
        Event::Claim {
            worker: "w".into(),
            lease_token: token.into(),
            expires_at_ms: expires,
        }
    }
    fn valid(token: &str) -> Event {
        Event::ValidResult {
            lease_token: token.into(),
        }
    }
    fn invalid(token: &str) -> Event {
        Event::InvalidResult {
            lease_token: token.into(),
            reason: "bad".into(),
        }
    }
    fn failed() -> State {
        State::Failed {
            class: FailureClass::Validation,
            reason: "bad".into(),
        }
    }

    #[test]
    fn transition_table() {
        let now = 100;
        let illegal = |from, event| Err(TransitionError::Illegal { from, event });
        let rows: Vec<(State, Event, Result<Outcome, TransitionError>)> = vec![
            (
                State::Pending,
                claim("a", 200),
                Ok(Outcome::Changed(claimed_by("a", 200))),
            ),
            (State::Pending, valid("a"), Err(TransitionError::StaleLease)),
            (
                State::Pending,
                invalid("a"),
                Err(TransitionError::StaleLease),
            ),
            (State::Pending, Event::Retry, illegal("pending", "retry")),
            (
                claimed_by("a", 200),
                claim("b", 300),
                Err(TransitionError::LeaseHeld { expires_at_ms: 200 }),
            ),
            (
                claimed_by("a", 50),
                claim("b", 300),
                Ok(Outcome::Changed(claimed_by("b", 300))),
            ),
            (
                claimed_by("a", 200),
                valid("a"),
                Ok(Outcome::Changed(State::Committed { at_ms: now })),
            ),
            (
                claimed_by("a", 50),
                valid("a"),
                Ok(Outcome::Changed(State::Committed { at_ms: now })),
            ),
            (
                claimed_by("a", 200),
                valid("b"),
                Err(TransitionError::StaleLease),
            ),
            (
                claimed_by("a", 200),
                invalid("a"),
                Ok(Outcome::Changed(failed())),
            ),
            (
                claimed_by("a", 200),
                invalid("b"),
                Err(TransitionError::StaleLease),
            ),
            (
                claimed_by("a", 200),
                Event::Retry,
                illegal("claimed", "retry"),
            ),
            (
                State::Committed { at_ms: 1 },
                valid("a"),
                Ok(Outcome::Replay),
            ),
            (
                State::Committed { at_ms: 1 },
                invalid("z"),
                Ok(Outcome::Replay),
            ),
            (
                State::Committed { at_ms: 1 },
                claim("b", 300),
                illegal("committed", "claim"),
            ),
            (
                State::Committed { at_ms: 1 },
                Event::Retry,
                illegal("committed", "retry"),
            ),
            (failed(), Event::Retry, Ok(Outcome::Changed(State::Pending))),
            (failed(), claim("b", 300), illegal("failed", "claim")),
            (failed(), valid("a"), illegal("failed", "result")),
        ];
        for (state, event, expected) in rows {
            let label = format!("{state:?} + {event:?}");
            assert_eq!(apply(&state, event, now), expected, "{label}");
        }
    }

    fn arb_event() -> impl Strategy<Value = Event> {
        let token = prop::sample::select(vec!["a", "b", "c"]);
        prop_oneof![
            (token.clone(), 0u64..400).prop_map(|(t, e)| claim(t, e)),
            token.clone().prop_map(valid),
            token.prop_map(invalid),
            Just(Event::Retry),
        ]
    }

    proptest! {
        /// Whatever events arrive, in any order and at any time, an extraction enters
        /// Committed at most once, only through a validated result under the current lease.
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
                );
                if let Ok(Outcome::Changed(next)) = apply(&before, event, now) {
                    if matches!(next, State::Committed { .. }) {
                        commits += 1;
                        prop_assert!(was_valid_under_lease, "committed without validation from {before:?}");
                    }
                    prop_assert!(!matches!(before, State::Committed { .. }), "left Committed");
                    state = next;
                }
            }
            prop_assert!(commits <= 1);
        }
    }
}
