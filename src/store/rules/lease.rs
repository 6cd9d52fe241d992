//! What a worker's lease extension does, the same on both backends: the current token moves
//! its lease's expiry to `lease_ms` from now; any other answer writes nothing.

use crate::domain::lifecycle::{self, Event, Outcome, State};
use crate::store::records::ExtractionRecord;
use crate::store::rules::operator::Step;
use crate::store::seam::{ExtendOutcome, LeaseExtension};

/// The state to write (`Step::Move`, answered with the new expiry once written), or the
/// answer without a write. The extension goes through `lifecycle::apply`, so a stale token,
/// an extraction that holds no lease and one whose work has ended are refused there.
pub(in crate::store) fn extend(
    record: &ExtractionRecord,
    extension: &LeaseExtension,
    now_ms: u64,
) -> Step<ExtendOutcome> {
    let expires_at_ms = now_ms.saturating_add(extension.lease_ms);
    let event = Event::Extend { lease_token: extension.lease_token.clone(), expires_at_ms };
    match lifecycle::apply(&record.state, event, now_ms) {
        Ok(Outcome::Changed(next)) => Step::Move(next),
        // `apply` never answers an extension with a replay; were it to, nothing is written
        // and the lease keeps the expiry it has.
        Ok(Outcome::Replay) => Step::Answer(extended(&record.state)),
        Err(e) => Step::Answer(ExtendOutcome::Rejected(e)),
    }
}

/// The answer for a record whose lease was just written.
pub(in crate::store) fn extended(state: &State) -> ExtendOutcome {
    match state {
        State::Claimed { expires_at_ms, .. } => ExtendOutcome::Extended { expires_at_ms: *expires_at_ms },
        _ => ExtendOutcome::Rejected(lifecycle::TransitionError::StaleLease),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::lifecycle::TransitionError;
    use crate::domain::names::LeaseToken;
    use crate::store::rules::fixtures::record;

    fn claimed(token: &str, expires_at_ms: u64) -> ExtractionRecord {
        record(State::Claimed { worker: "w".into(), lease_token: LeaseToken::new(token), expires_at_ms })
    }

    fn extension(token: &str, lease_ms: u64) -> LeaseExtension {
        LeaseExtension { id: record(State::Pending).id, lease_token: LeaseToken::new(token), lease_ms }
    }

    #[test]
    fn the_current_token_moves_the_expiry_to_lease_ms_from_now_keeping_worker_and_token() {
        let step = extend(&claimed("lt-1", 1_000), &extension("lt-1", 30_000), 900);
        let Step::Move(next) = step else { panic!("an extension under the current lease writes: {step:?}") };
        let expected =
            State::Claimed { worker: "w".into(), lease_token: LeaseToken::new("lt-1"), expires_at_ms: 30_900 };
        assert_eq!(next, expected);
        assert_eq!(extended(&next), ExtendOutcome::Extended { expires_at_ms: 30_900 });
    }

    #[test]
    fn a_lease_that_ran_out_is_extended_while_nobody_took_the_work_over() {
        let step = extend(&claimed("lt-1", 1_000), &extension("lt-1", 5_000), 2_000);
        assert!(matches!(step, Step::Move(State::Claimed { expires_at_ms: 7_000, .. })), "{step:?}");
    }

    #[test]
    fn a_superseded_token_or_no_lease_is_stale_and_writes_nothing() {
        let stale = |step: Step<ExtendOutcome>| {
            matches!(step, Step::Answer(ExtendOutcome::Rejected(TransitionError::StaleLease)))
        };
        assert!(stale(extend(&claimed("lt-2", 1_000), &extension("lt-1", 5_000), 900)), "taken over");
        assert!(stale(extend(&record(State::Pending), &extension("lt-1", 5_000), 900)), "re-asked or never claimed");
    }

    #[test]
    fn an_extension_after_the_result_is_an_illegal_transition() {
        let step = extend(&record(State::Committed { at_ms: 5 }), &extension("lt-1", 5_000), 900);
        let illegal = TransitionError::Illegal { from: "committed", event: "extend the lease of" };
        assert!(matches!(step, Step::Answer(ExtendOutcome::Rejected(ref e)) if *e == illegal), "{step:?}");
    }

    #[test]
    fn a_huge_lease_saturates_instead_of_wrapping_past_the_clock() {
        let step = extend(&claimed("lt-1", 1_000), &extension("lt-1", u64::MAX), 900);
        assert!(matches!(step, Step::Move(State::Claimed { expires_at_ms: u64::MAX, .. })), "{step:?}");
    }
}
