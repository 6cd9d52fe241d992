use super::*;
use crate::domain::identity::SourceHash;
use crate::store::evaluation::{EvalMember, TrialFinding, TrialOutcome, TrialRecord};

fn member(seq: u64) -> EvalMember {
    EvalMember {
        seq,
        id: ExtractionId([seq as u8; 32]),
        source_hash: SourceHash([0; 32]),
        tenant: "t".into(),
        source_id: format!("s{seq}"),
        erased: false,
    }
}

fn evaluation() -> EvaluationRecord {
    EvaluationRecord {
        name: "e".into(),
        tenant: None,
        schema: "code-review@1".into(),
        candidates: vec!["a".into()],
        budget_micros: None,
        selection: "2 ids".into(),
        created_at_ms: 1,
        cancelled_at_ms: None,
        members: vec![member(10), member(11)],
    }
}

fn batch(closed: bool) -> TrialBatchRecord {
    TrialBatchRecord {
        seq: 1,
        evaluation: "e".into(),
        candidate: "a".into(),
        batch_key: "cpe-1".into(),
        members: vec![0, 1],
        created_at_ms: 1,
        job_id: Some("job".into()),
        next_action_at_ms: 1,
        failures: 0,
        note: None,
        closed: closed.then(|| "completed".to_string()),
    }
}

fn trial(index: u32, verdict: Option<TrialVerdict>, cost: u64) -> (String, Trial) {
    let outcome = verdict.map(|verdict| TrialOutcome { verdict, answered_at_ms: 5, usage: None, cost_micros: cost });
    ("e".into(), Trial { candidate: "a".into(), index, record: TrialRecord { batch: 1, sent_at_ms: 2, outcome } })
}

fn valid() -> Option<TrialVerdict> {
    Some(TrialVerdict::Valid {
        output_json: "{}".into(),
        findings: vec![TrialFinding { canonical_identity: "x".into(), body_json: "{}".into() }],
    })
}

fn sound() -> Stored {
    Stored {
        evaluations: vec![evaluation()],
        trials: vec![trial(0, valid(), 7), trial(1, Some(TrialVerdict::Failed { reason: "x".into() }), 0)],
        batches: vec![batch(true)],
        ledger: BTreeMap::from([(10, 7)]),
        promoted: vec![(10, ExtractionId([10; 32]), "a".into(), "e".into())],
    }
}

fn problems(stored: &Stored) -> Vec<String> {
    let mut report = Report::default();
    check(stored, |_| true, &mut report);
    report.problems
}

#[test]
fn a_sound_evaluation_passes() {
    assert_eq!(problems(&sound()), Vec::<String>::new());
}

#[test]
fn each_broken_part_is_named() {
    let mut orphan = sound();
    orphan.trials.push(("gone".into(), orphan.trials[0].1.clone()));
    assert!(
        problems(&orphan).iter().any(|p| p.contains("trial gone/a/0 has no evaluation")),
        "{:?}",
        problems(&orphan)
    );

    let mut stranger = sound();
    stranger.trials[0].1.candidate = "b".into();
    assert!(problems(&stranger).iter().any(|p| p.contains("not a candidate")));
    assert!(problems(&stranger).iter().any(|p| p.contains("does not list it")), "batch of candidate a");

    let mut waiting = sound();
    waiting.trials[1].1.record.outcome = None;
    assert!(problems(&waiting).iter().any(|p| p.contains("which is closed")));
    waiting.batches = vec![batch(false)];
    assert!(problems(&waiting).is_empty(), "an open batch may have trials waiting");

    let mut uncharged = sound();
    uncharged.ledger.clear();
    assert!(problems(&uncharged).iter().any(|p| p.contains("charge 0 µ$, its trials cost 7 µ$")));
    let mut report = Report::default();
    check(&uncharged, |seq| seq != 10, &mut report);
    assert!(report.problems.is_empty(), "an erased extraction's entries went with it: {:?}", report.problems);

    let mut overcharged = sound();
    overcharged.ledger.insert(11, 3);
    assert!(problems(&overcharged).iter().any(|p| p.contains("#11")));

    let mut promoted = sound();
    promoted.promoted.push((11, ExtractionId([11; 32]), "a".into(), "e".into()));
    assert!(problems(&promoted).iter().any(|p| p.contains("holds no valid answer of a")), "trial 1 failed");

    let mut erased = sound();
    erased.evaluations[0].members[1].erased = true;
    assert!(problems(&erased).iter().any(|p| p.contains("outlived its member's erasure")));
}
