//! The close and shrink plans, records in and moves out: no store is opened.

use super::close::{close, shrink, to_close, to_shrink};
use super::fixtures::{KEY, NOW, RULES, batch, in_job, member, submitted_job};
use super::member::MemberRules;
use crate::domain::lifecycle::{FailureClass, State};
use crate::store::records::BatchState;
use crate::store::seam::{CloseReport, Leftover};

fn intent_state() -> State {
    State::Submitted { provider: "p".into(), batch_key: KEY.into(), job_id: None }
}

#[test]
fn a_closed_batch_loads_no_member_and_closes_no_more() {
    let closed = batch(BatchState::Closed { job_id: None, outcome: "done".into() }, &[1]);
    assert!(to_close(&closed).is_empty());
    assert_eq!(close(&closed, vec![member(1, in_job())], "again".into(), &Leftover::Requeue, &RULES, NOW), None);
}

#[test]
fn a_requeue_close_returns_members_within_their_cap_and_fails_the_rest() {
    let record = batch(submitted_job(), &[1, 2, 3]);
    assert_eq!(to_close(&record), [1, 2, 3]);
    let fresh = member(1, in_job());
    let mut spent = member(2, in_job());
    spent.requeues = 2;
    let answered = member(3, State::Committed { at_ms: 3 });
    let closing = close(&record, vec![fresh, spent, answered], "expired".into(), &Leftover::Requeue, &RULES, NOW)
        .expect("an open batch closes");
    assert_eq!(closing.report, CloseReport { requeued: 1, exhausted: 1, failed: 0 });
    let [back, failed] = closing.moves.as_slice() else { panic!("{:?}", closing.moves) };
    assert_eq!((back.member.seq, &back.next), (1, &State::Pending));
    assert_eq!((back.member.attempt, back.member.requeues), (2, 1), "a new attempt of the same identity");
    let State::Failed { class, reason } = &failed.next else { panic!("{:?}", failed.next) };
    assert_eq!(*class, FailureClass::AttemptsExhausted);
    assert!(reason.contains("its batch ended (expired)"), "{reason}");
    assert_eq!(closing.batch.state, BatchState::Closed { job_id: Some("job-1".into()), outcome: "expired".into() });
    assert_eq!(closing.batch.updated_at_ms, NOW);
}

#[test]
fn a_returned_member_keeps_its_attempt_and_a_failed_close_fails_each_member() {
    let record = batch(BatchState::Intent, &[1]);
    let one = MemberRules { max_attempts: 1, ..RULES };
    let returned = close(&record, vec![member(1, intent_state())], "no room".into(), &Leftover::Return, &one, NOW)
        .expect("an intent closes");
    assert_eq!(returned.report, CloseReport { requeued: 1, ..CloseReport::default() });
    assert_eq!((returned.moves[0].member.attempt, &returned.moves[0].next), (1, &State::Pending), "outside the cap");
    assert_eq!(returned.batch.state, BatchState::Closed { job_id: None, outcome: "no room".into() });

    let fail = Leftover::Fail { class: FailureClass::Auth, reason: "key revoked".into() };
    let failed = close(&record, vec![member(1, intent_state())], "failed".into(), &fail, &RULES, NOW).expect("closes");
    assert_eq!(failed.report, CloseReport { failed: 1, ..CloseReport::default() });
    assert_eq!(failed.moves[0].next, State::Failed { class: FailureClass::Auth, reason: "key revoked".into() });
}

#[test]
fn a_member_that_left_the_batch_is_not_moved() {
    let record = batch(submitted_job(), &[1, 2]);
    let elsewhere = member(1, State::Submitted { provider: "p".into(), batch_key: "b-2".into(), job_id: None });
    let pending = member(2, State::Pending);
    let closing =
        close(&record, vec![elsewhere, pending], "done".into(), &Leftover::Return, &RULES, NOW).expect("closes");
    assert!(closing.moves.is_empty(), "{:?}", closing.moves);
    assert_eq!(closing.report, CloseReport::default());
}

#[test]
fn an_intent_shrinks_to_its_first_members_and_returns_the_rest_as_the_same_attempt() {
    let record = batch(BatchState::Intent, &[1, 2, 3]);
    assert_eq!(to_shrink(&record, 1), [2, 3]);
    assert_eq!(to_shrink(&record, 0), [2, 3], "at least one member stays");
    let excess = vec![member(2, intent_state()), member(3, State::Cancelled { at_ms: 1 })];
    let shrinking = shrink(&record, 0, excess, NOW).expect("an intent of three shrinks");
    assert_eq!(shrinking.batch.members, [1]);
    assert_eq!(shrinking.dropped, [2, 3], "every member past keep leaves the batch, moved or not");
    assert_eq!((shrinking.batch.next_action_at_ms, shrinking.batch.updated_at_ms), (NOW, NOW));
    let [back] = shrinking.moves.as_slice() else { panic!("{:?}", shrinking.moves) };
    assert_eq!((back.member.seq, back.member.attempt, &back.next), (2, 1, &State::Pending));
}

#[test]
fn only_an_intent_larger_than_keep_shrinks() {
    let small = batch(BatchState::Intent, &[1, 2]);
    assert!(to_shrink(&small, 2).is_empty());
    assert_eq!(shrink(&small, 2, Vec::new(), NOW), None);
    let sent = batch(submitted_job(), &[1, 2, 3]);
    assert!(to_shrink(&sent, 1).is_empty(), "a batch the provider has is never shrunk");
    assert_eq!(shrink(&sent, 1, vec![member(2, in_job())], NOW), None);
}
