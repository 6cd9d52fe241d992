//! The job, reschedule and not-found plans, records in and records out.

use super::fixtures::{KEY, NOW, batch, in_job, member, submitted_job};
use super::schedule::{not_found, record_job, reschedule, to_record_job};
use crate::domain::lifecycle::State;
use crate::store::records::BatchState;

#[test]
fn a_new_job_moves_the_intents_members_under_it_and_clears_the_batchs_failures() {
    let mut record = batch(BatchState::Intent, &[1, 2]);
    record.not_found_since_ms = Some(3);
    assert_eq!(to_record_job(&record, "job-1"), [1, 2]);
    let intent = || State::Submitted { provider: "p".into(), batch_key: KEY.into(), job_id: None };
    let members = vec![member(1, intent()), member(2, State::Cancelled { at_ms: 2 })];
    let recorded = record_job(&record, "job-1", 9_000, members, NOW).expect("a new job is recorded");
    let [accepted] = recorded.moves.as_slice() else { panic!("{:?}", recorded.moves) };
    assert_eq!((accepted.member.seq, &accepted.next), (1, &in_job()));
    let batch = &recorded.batch;
    assert_eq!(batch.state, submitted_job());
    assert_eq!((batch.next_action_at_ms, batch.failures, batch.updated_at_ms), (9_000, 0, NOW));
    assert_eq!((&batch.last_error, batch.not_found_since_ms), (&None, None));
}

#[test]
fn a_known_job_or_a_closed_batch_is_left_as_it_is() {
    let known = batch(submitted_job(), &[1]);
    assert!(to_record_job(&known, "job-1").is_empty());
    assert_eq!(record_job(&known, "job-1", 9_000, vec![member(1, in_job())], NOW), None);
    let closed = batch(BatchState::Closed { job_id: None, outcome: "erased".into() }, &[1]);
    assert!(to_record_job(&closed, "job-1").is_empty());
    assert_eq!(record_job(&closed, "job-1", 9_000, Vec::new(), NOW), None);
    let other = to_record_job(&known, "job-2");
    assert_eq!(other, [1], "another job id for the same batch is news");
}

#[test]
fn a_note_counts_a_failure_only_when_asked_and_no_note_starts_over() {
    let mut record = batch(submitted_job(), &[1]);
    record.not_found_since_ms = Some(4);
    let counted = reschedule(record.clone(), 7_000, Some("503".into()), true, NOW);
    assert_eq!((counted.failures, counted.last_error.as_deref(), counted.next_action_at_ms), (3, Some("503"), 7_000));
    assert_eq!(counted.not_found_since_ms, Some(4), "a failure keeps the not-found window");
    let paused = reschedule(record.clone(), 7_000, Some("paused".into()), false, NOW);
    assert_eq!((paused.failures, paused.last_error.as_deref()), (2, Some("paused")));
    let fine = reschedule(record, 7_000, None, true, NOW);
    assert_eq!((fine.failures, fine.not_found_since_ms, fine.last_error.as_deref()), (0, None, Some("earlier")));
    assert_eq!(fine.updated_at_ms, NOW);
}

#[test]
fn a_not_found_window_opens_once_and_keeps_its_start() {
    let record = batch(submitted_job(), &[1]);
    let first = not_found(record, 4_000, 6_000, "404".into(), NOW);
    assert_eq!((first.not_found_since_ms, first.next_action_at_ms, first.failures), (Some(4_000), 6_000, 2));
    let again = not_found(first, 4_500, 8_000, "404 again".into(), NOW + 1);
    assert_eq!((again.not_found_since_ms, again.last_error.as_deref()), (Some(4_000), Some("404 again")));
    assert_eq!((again.next_action_at_ms, again.updated_at_ms), (8_000, NOW + 1));
}
