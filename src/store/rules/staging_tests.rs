//! The staging plan, records in and writes out: no store is opened.

use std::collections::HashMap;

use super::fixtures::{CREATED, KEY, NOW, RULES, batch, in_job, member, submitted_job};
use super::staging::{StageWrite, Staging, plan};
use crate::domain::batch::{LineResult, Usage};
use crate::domain::lifecycle::{FailureClass, State};
use crate::store::records::{ChargeKind, ExtractionRecord, Fence};
use crate::store::seam::{EncodedFinding, IngestLine, Judged, StageReport};

fn usage(request: &str) -> Usage {
    Usage { model: "m".into(), output_tokens: 9, request_id: Some(request.into()), ..Usage::default() }
}

fn answer() -> LineResult {
    LineResult::Answer { output: r#"{"findings":[]}"#.into(), usage: Some(usage("r1")) }
}

fn valid() -> Judged {
    let finding = EncodedFinding { canonical_identity: "[1]".into(), body_json: r#"{"k":1}"#.into() };
    Judged::Valid { output_json: r#"{"findings":[{"k":1}]}"#.into(), findings: vec![finding] }
}

fn line(member: &ExtractionRecord, result: LineResult, judged: Option<Judged>) -> IngestLine {
    IngestLine { id: member.id, result, judged }
}

fn loaded(members: &[&ExtractionRecord]) -> HashMap<crate::domain::identity::ExtractionId, ExtractionRecord> {
    members.iter().map(|m| (m.id, (*m).clone())).collect()
}

fn staged<'a>(members: &[&ExtractionRecord], lines: &'a [IngestLine]) -> Staging<'a> {
    let record = batch(submitted_job(), &members.iter().map(|m| m.seq).collect::<Vec<_>>());
    plan(&record, loaded(members), lines, &RULES, NOW).expect("a plan")
}

/// The kinds of the writes, in order, for a compact comparison.
fn kinds(plan: &Staging<'_>) -> Vec<&'static str> {
    let kind = |w: &StageWrite<'_>| match w {
        StageWrite::Charge { .. } => "charge",
        StageWrite::Stage { .. } => "stage",
        StageWrite::Move(_) => "move",
        StageWrite::Settle(_) => "settle",
    };
    plan.writes.iter().map(kind).collect()
}

#[test]
fn a_judged_answer_is_settled_with_its_latency_and_never_staged() {
    let m = member(1, in_job());
    let lines = [line(&m, answer(), Some(valid()))];
    let plan = staged(&[&m], &lines);
    assert_eq!(plan.report, StageReport { committed: 1, ..StageReport::default() });
    let [StageWrite::Settle(settle)] = plan.writes.as_slice() else { panic!("{:?}", kinds(&plan)) };
    assert_eq!(settle.next, State::Committed { at_ms: NOW });
    assert_eq!(settle.member.state, in_job(), "the stored state: Ready was only a step of the plan");
    assert_eq!(settle.answer, &valid());
    assert_eq!((settle.producer.as_str(), &settle.fence), ("p", &Fence::Batch(KEY.into())));
    let charge = settle.charge.as_ref().expect("a paid answer is charged");
    assert_eq!(charge.latency_ms, Some(NOW - CREATED), "the batch's latency, as the staged answer would carry");
    assert_eq!((charge.job_id.as_deref(), charge.batch, charge.usage.output_tokens), (Some("job-1"), true, 9));
}

#[test]
fn a_judged_invalid_answer_fails_validation() {
    let m = member(1, in_job());
    let lines = [line(
        &m,
        answer(),
        Some(Judged::Invalid {
            reason: "/: findings is required".into(),
            issues: Vec::new(),
            output: String::new(),
            reask_limit: 0,
        }),
    )];
    let plan = staged(&[&m], &lines);
    assert_eq!(plan.report, StageReport { failed_validation: 1, ..StageReport::default() });
    let [StageWrite::Settle(settle)] = plan.writes.as_slice() else { panic!("{:?}", kinds(&plan)) };
    assert_eq!(
        settle.next,
        State::Failed { class: FailureClass::Validation, reason: "/: findings is required".into() }
    );
}

#[test]
fn an_unjudged_answer_or_one_of_another_schema_is_staged_ready() {
    let plain = member(1, in_job());
    let mut moved_on = member(2, in_job());
    moved_on.schema = "code-review@2".into();
    let lines = [line(&plain, answer(), None), line(&moved_on, answer(), Some(valid()))];
    let plan = staged(&[&plain, &moved_on], &lines);
    assert_eq!(plan.report, StageReport { staged: 2, ..StageReport::default() });
    assert_eq!(kinds(&plan), ["stage", "move", "stage", "move"]);
    let StageWrite::Stage { seq, answer } = &plan.writes[0] else { panic!() };
    assert_eq!((*seq, answer.job_id.as_str(), answer.latency_ms, answer.received_at_ms), (1, "job-1", Some(4000), NOW));
    let StageWrite::Move(step) = &plan.writes[1] else { panic!() };
    assert_eq!(step.next, State::Ready { provider: "p".into(), batch_key: KEY.into() });
}

#[test]
fn a_member_named_twice_in_one_chunk_is_taken_once_and_replayed_once() {
    let m = member(1, in_job());
    let lines = [line(&m, answer(), Some(valid())), line(&m, answer(), Some(valid()))];
    let plan = staged(&[&m], &lines);
    assert_eq!(plan.report, StageReport { committed: 1, replays: 1, ..StageReport::default() });
    assert_eq!(kinds(&plan), ["settle", "charge"]);
    let StageWrite::Charge { member, kind, charge } = &plan.writes[1] else { panic!() };
    assert_eq!(*kind, ChargeKind::Replay, "counted again, never charged again");
    assert_eq!(member.state, State::Committed { at_ms: NOW }, "the second line sees the first one's commit");
    assert_eq!(charge.latency_ms, None);
}

#[test]
fn strangers_are_counted_and_a_cancelled_members_paid_answer_is_charged_only() {
    let cancelled = member(1, State::Cancelled { at_ms: 10 });
    let other_batch =
        member(2, State::Submitted { provider: "p".into(), batch_key: "b-0".into(), job_id: Some("j".into()) });
    let unknown = member(3, in_job());
    let lines = [line(&cancelled, answer(), None), line(&other_batch, answer(), None), line(&unknown, answer(), None)];
    let plan = staged(&[&cancelled, &other_batch], &lines);
    assert_eq!(plan.report, StageReport { strangers: 3, ..StageReport::default() });
    assert_eq!(kinds(&plan), ["charge"]);
    let StageWrite::Charge { member, kind, .. } = &plan.writes[0] else { panic!() };
    assert_eq!((member.seq, *kind), (1, ChargeKind::Fresh));
}

#[test]
fn a_truncated_answer_is_charged_to_its_attempt_then_requeued_with_a_larger_budget() {
    let m = member(1, in_job());
    let cut = LineResult::Unusable {
        class: FailureClass::Truncated,
        reason: "cut off".into(),
        usage: Some(Usage { output_tokens: 1000, ..usage("r1") }),
    };
    let lines = [line(&m, cut, None)];
    let plan = staged(&[&m], &lines);
    let report = StageReport { truncated: 1, budget_retries: 1, requeued: 1, ..StageReport::default() };
    assert_eq!(plan.report, report);
    assert_eq!(kinds(&plan), ["charge", "move"]);
    let StageWrite::Charge { member: charged, kind, .. } = &plan.writes[0] else { panic!() };
    assert_eq!((charged.attempt, *kind), (1, ChargeKind::Unusable), "the attempt that paid");
    let StageWrite::Move(step) = &plan.writes[1] else { panic!() };
    assert_eq!(step.next, State::Pending);
    let requeued = &step.member;
    assert_eq!((requeued.attempt, requeued.requeues, requeued.output_budget), (2, 1, Some(2000)));
    assert!(requeued.truncation_retried);
}

#[test]
fn a_retry_at_the_attempt_cap_fails_the_member_instead() {
    let mut m = member(1, in_job());
    m.requeues = 2;
    let lines = [line(&m, LineResult::Retry { reason: "expired".into() }, None)];
    let plan = staged(&[&m], &lines);
    assert_eq!(plan.report, StageReport { exhausted: 1, ..StageReport::default() });
    let [StageWrite::Move(step)] = plan.writes.as_slice() else { panic!("{:?}", kinds(&plan)) };
    assert!(matches!(step.next, State::Failed { class: FailureClass::AttemptsExhausted, .. }), "{:?}", step.next);
    assert_eq!(step.member.attempt, 1, "no new attempt was made");
}

#[test]
fn a_refused_line_fails_its_member_uncharged() {
    let m = member(1, in_job());
    let refused = LineResult::Refused { class: FailureClass::InvalidRequest, reason: "bad".into() };
    let lines = [line(&m, refused, None)];
    let plan = staged(&[&m], &lines);
    assert_eq!(plan.report, StageReport { refused: 1, ..StageReport::default() });
    assert_eq!(kinds(&plan), ["move"]);
}

#[test]
fn each_named_extraction_is_loaded_once_in_the_order_lines_first_name_it() {
    let (a, b) = (member(1, in_job()), member(2, in_job()));
    let retry = || LineResult::Retry { reason: "again".into() };
    let lines = [line(&b, retry(), None), line(&a, retry(), None), line(&b, retry(), None)];
    assert_eq!(super::staging::named(&lines).collect::<Vec<_>>(), [b.id, a.id]);
}
