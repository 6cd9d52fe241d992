use std::collections::{BTreeSet, HashMap};

use super::*;
use crate::domain::lifecycle::{FailureClass, StateName};
use crate::domain::names::LeaseToken;
use crate::store::evaluation::TrialFinding;
use crate::store::rules::fixtures::{SCHEMA, record};

fn numbered(seq: u64, tenant: &str, state: State) -> ExtractionRecord {
    let mut r = record(state);
    r.seq = seq;
    r.id = ExtractionId([seq as u8; 32]);
    r.tenant = tenant.into();
    r
}

fn new(select: Selection, tenant: Option<&str>) -> NewEvaluation {
    NewEvaluation {
        name: "e".into(),
        tenant: tenant.map(str::to_string),
        schema: SCHEMA.into(),
        candidates: vec!["a".into(), "b".into()],
        budget_micros: None,
        select,
    }
}

fn pool() -> Vec<ExtractionRecord> {
    (1..=40)
        .map(|seq| {
            let state = if seq % 2 == 0 { State::Committed { at_ms: 1 } } else { State::Pending };
            numbered(seq, if seq % 5 == 0 { "other" } else { "t" }, state)
        })
        .collect()
}

#[test]
fn a_seeded_sample_is_the_same_whatever_order_it_is_read_in_and_keeps_to_its_tenant_and_states() {
    let sample = |seed, reversed: bool| {
        let mut found = pool();
        if reversed {
            found.reverse();
        }
        let select = Selection::Sample { count: 6, states: vec![StateName::Committed], seed };
        choose(&new(select, Some("t")), found, &[]).unwrap()
    };
    let first = sample(7, false);
    assert_eq!(first, sample(7, true), "the draw does not depend on read order");
    assert_eq!(first.len(), 6);
    assert!(first.iter().all(|m| m.seq % 2 == 0 && m.tenant == "t"), "{first:?}");
    assert!(first.windows(2).all(|w| w[0].seq < w[1].seq), "members are kept in intake order");
    assert_ne!(first, sample(8, false), "another seed draws another set");
}

#[test]
fn asked_ids_must_all_exist_and_fit_the_schema_and_tenant() {
    let found = pool();
    let ids: Vec<ExtractionId> = found[..3].iter().map(|r| r.id).collect();
    let members = choose(&new(Selection::Ids(ids.clone()), None), found[..3].to_vec(), &[]).unwrap();
    assert_eq!(members.iter().map(|m| m.seq).collect::<Vec<_>>(), vec![1, 2, 3]);

    let unknown = choose(&new(Selection::Ids(ids.clone()), None), found[..2].to_vec(), &[ids[2]]).unwrap_err();
    assert!(unknown.contains("1 of the ids are unknown"), "{unknown}");

    let ids: Vec<ExtractionId> = found[3..5].iter().map(|r| r.id).collect();
    let wrong = choose(&new(Selection::Ids(ids), Some("t")), found[3..5].to_vec(), &[]).unwrap_err();
    assert!(wrong.contains("\"other\""), "seq 5 belongs to another tenant: {wrong}");

    let empty = Selection::Sample { count: 5, states: vec![StateName::Failed], seed: 1 };
    assert!(choose(&new(empty, None), pool(), &[]).unwrap_err().contains("holds no extraction"));
}

fn evaluation(members: usize) -> EvaluationRecord {
    let found: Vec<ExtractionRecord> = (1..=members as u64).map(|s| numbered(s, "t", State::Pending)).collect();
    let ids = found.iter().map(|r| r.id).collect();
    let new = new(Selection::Ids(ids), None);
    super::record(&new, choose(&new, found, &[]).unwrap(), 10)
}

#[test]
fn an_intent_takes_each_unsent_member_once_and_only_for_a_running_evaluation_and_its_own_candidates() {
    let e = evaluation(5);
    let sent: BTreeSet<u32> = [1].into();
    let (batch, trials) = intent(&e, "a", &sent, &[3, 1, 9, 0, 3], 4, 20).unwrap();
    assert_eq!(batch.members, vec![0, 3], "1 was sent before, 9 is out of range, 3 is asked twice");
    assert!(batch.batch_key.starts_with("cpe-"), "{}", batch.batch_key);
    assert_eq!(
        trials.iter().map(|(i, t)| (*i, t.batch, t.outcome.is_none())).collect::<Vec<_>>(),
        vec![(0, 4, true), (3, 4, true)]
    );
    assert_ne!(batch.batch_key, intent(&e, "b", &sent, &[0], 4, 20).unwrap().0.batch_key, "keys differ by candidate");
    assert!(intent(&e, "c", &sent, &[0], 4, 20).is_none(), "not a candidate");
    assert!(intent(&e, "a", &[0, 3].into(), &[0, 3], 4, 20).is_none(), "nothing left to send");
    let cancelled = EvaluationRecord { cancelled_at_ms: Some(30), ..e };
    assert!(intent(&cancelled, "a", &sent, &[0], 4, 40).is_none(), "a cancelled evaluation sends nothing");
}

fn valid() -> TrialVerdict {
    TrialVerdict::Valid {
        output_json: "{\"findings\":[]}".into(),
        findings: vec![TrialFinding { canonical_identity: "[\"a.rs\",1]".into(), body_json: "{}".into() }],
    }
}

#[test]
fn an_answer_is_written_once_and_charged_only_when_the_provider_answered_with_usage() {
    let e = evaluation(2);
    let (batch, trials) = intent(&e, "a", &BTreeSet::new(), &[0, 1], 4, 20).unwrap();
    let usage = Some(crate::domain::batch::Usage { output_tokens: 5, ..Default::default() });
    let answered = TrialAnswer { index: 0, verdict: valid(), usage: usage.clone() };
    let write = answer(&batch, Some(&trials[0].1), &answered, 30).unwrap();
    assert!(write.charge);
    assert_eq!(write.record.outcome.as_ref().map(|o| o.answered_at_ms), Some(30));
    assert!(answer(&batch, Some(&write.record), &answered, 31).is_none(), "a second reading writes nothing");
    let other_batch = TrialBatchRecord { seq: 5, ..batch.clone() };
    assert!(answer(&other_batch, Some(&trials[0].1), &answered, 31).is_none(), "another batch's trial");
    let failed = TrialAnswer { index: 1, verdict: TrialVerdict::Failed { reason: "refused".into() }, usage };
    assert!(!answer(&batch, Some(&trials[1].1), &failed, 30).unwrap().charge, "no answer, no charge");
}

#[test]
fn closing_fails_only_the_members_still_waiting_and_closes_once() {
    let e = evaluation(3);
    let (batch, trials) = intent(&e, "a", &BTreeSet::new(), &[0, 1, 2], 4, 20).unwrap();
    let mut trials: HashMap<u32, TrialRecord> = trials.into_iter().collect();
    let done = answer(&batch, trials.get(&1), &TrialAnswer { index: 1, verdict: valid(), usage: None }, 25).unwrap();
    trials.insert(1, done.record);
    let (closed, failed) = close(&batch, &trials, "completed".into(), "no answer in the results", 30).unwrap();
    assert_eq!(closed.closed.as_deref(), Some("completed"));
    assert_eq!(failed.iter().map(|(i, _)| *i).collect::<Vec<_>>(), vec![0, 2]);
    assert!(failed.iter().all(|(_, t)| matches!(
        t.outcome.as_ref().map(|o| &o.verdict),
        Some(TrialVerdict::Failed { reason }) if reason == "no answer in the results"
    )));
    assert!(close(&closed, &trials, "again".into(), "x", 40).is_none());
}

#[test]
fn a_set_whose_members_were_erased_meanwhile_is_refused() {
    assert_eq!(gone_meanwhile(3, 3), None);
    assert!(gone_meanwhile(3, 1).is_some_and(|r| r.starts_with("2 of the selected")));
}

#[test]
fn a_promotion_commits_only_pending_or_failed_work_with_a_valid_answer() {
    let e = evaluation(1);
    let member = &e.members[0];
    let (batch, trials) = intent(&e, "a", &BTreeSet::new(), &[0], 4, 20).unwrap();
    let answered = answer(&batch, Some(&trials[0].1), &TrialAnswer { index: 0, verdict: valid(), usage: None }, 25)
        .unwrap()
        .record;
    let at = |state| numbered(1, "t", state);
    let step = |state, trial: Option<&TrialRecord>| promote(member, Some(&at(state)), trial, 50);
    assert!(
        matches!(step(State::Pending, Some(&answered)), PromoteStep::Commit { next: State::Committed { at_ms: 50 }, answer: Judged::Valid { findings, .. } } if findings.len() == 1)
    );
    let failed = State::Failed { class: FailureClass::Validation, reason: "x".into() };
    assert!(matches!(step(failed, Some(&answered)), PromoteStep::Commit { .. }));
    assert_eq!(step(State::Committed { at_ms: 1 }, Some(&answered)), PromoteStep::Already);
    let claimed = State::Claimed { worker: "w".into(), lease_token: LeaseToken::new("l"), expires_at_ms: 9 };
    assert_eq!(step(claimed, Some(&answered)), PromoteStep::InFlight);
    assert_eq!(step(State::Cancelled { at_ms: 2 }, Some(&answered)), PromoteStep::Skipped);
    assert_eq!(step(State::Pending, Some(&trials[0].1)), PromoteStep::NoValidAnswer, "sent, not answered");
    assert_eq!(step(State::Pending, None), PromoteStep::NoValidAnswer);
    assert_eq!(promote(member, None, Some(&answered), 50), PromoteStep::Skipped, "erased");
}
