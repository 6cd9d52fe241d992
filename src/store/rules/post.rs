//! What a posted result does to its extraction, the same on both backends: whether it is
//! a replay, a stale reporter's (charged, not used), a commit or a validation failure;
//! which charge it leaves, which findings and raw result it writes, and the state it
//! moves to. Ingestion settles a provider's judged answer through the same plan.

use crate::domain::batch::PreviousAttempt;
use crate::domain::identity::FindingKey;
use crate::domain::lifecycle::{self, Outcome, State, TransitionError};
use crate::store::Error;
use crate::store::records::{ChargeKind, ExtractionRecord, Fence, FindingRecord, ResultRecord};
use crate::store::seam::{Charge, Judged, PostOutcome, PostResult, producer_of};

/// The writes a result makes, in the order an executor makes them, and its answer.
#[derive(Debug)]
pub(in crate::store) struct Plan<'a> {
    /// The ledger entry of the call that produced the answer, when its usage is known.
    pub charge: Option<(&'a Charge, ChargeKind)>,
    /// A provider's staged raw answer has served its purpose once the extraction leaves Ready.
    pub drop_staged: bool,
    /// Upserted by key, so an output that repeats a finding stores it once.
    pub findings: Vec<FindingRecord>,
    pub result: Option<ResultRecord>,
    pub next: Option<State>,
    /// What the answer changes on the record besides its state; applied just before it.
    pub change: Change,
    pub answer: Answer,
}

/// What a settled answer changes on its record besides the state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(in crate::store) enum Change {
    None,
    /// A re-ask: one more used, a new attempt, and the refused answer kept to show the model.
    Reask(PreviousAttempt),
    /// A commit: the re-ask's previous answer has served its purpose.
    Committed,
    /// An invalid answer with no re-ask left: it is kept with its issues, to be read (and
    /// shown to the model again if an operator retries).
    Rejected(PreviousAttempt),
}

impl Change {
    pub(in crate::store) fn apply(self, record: &mut ExtractionRecord) {
        match self {
            Change::None => {}
            Change::Reask(previous) => {
                record.reasks += 1;
                record.attempt += 1;
                record.previous_attempt = Some(previous);
            }
            Change::Committed => record.previous_attempt = None,
            Change::Rejected(previous) => record.previous_attempt = Some(previous),
        }
    }
}

/// What the poster is told once the writes are made.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(in crate::store) enum Answer {
    Replay,
    Rejected(TransitionError),
    Committed,
    Failed { reason: String },
    Reasked { reason: String, reask: u32 },
}

impl Plan<'_> {
    /// Whether the plan writes anything at all (a replay without usage writes nothing).
    pub(in crate::store) fn writes(&self) -> bool {
        self.charge.is_some() || self.next.is_some()
    }
}

impl Answer {
    /// Whether the answer reports the findings stored once the writes are made.
    pub(in crate::store) fn counts_findings(&self) -> bool {
        matches!(self, Answer::Replay | Answer::Committed)
    }

    pub(in crate::store) fn outcome(self, findings: u64) -> PostOutcome {
        match self {
            Answer::Replay => PostOutcome::Replay { findings },
            Answer::Rejected(e) => PostOutcome::Rejected(e),
            Answer::Committed => PostOutcome::Committed { findings },
            Answer::Failed { reason } => PostOutcome::Failed { reason },
            Answer::Reasked { reason, reask } => PostOutcome::Reasked { reason, reask },
        }
    }
}

/// A worker's or a batch's post, judged against the extraction as it stands (loaded or
/// locked in the executor's transaction).
pub(in crate::store) fn plan_post<'a>(
    record: &ExtractionRecord,
    post: &'a PostResult,
    now_ms: u64,
) -> Result<Plan<'a>, Error> {
    let (event, fence) = post.event_and_fence(record);
    let charge = |kind| post.charge.as_ref().map(|c| (c, kind));
    let unsettled = |kind, answer| Plan {
        charge: charge(kind),
        drop_staged: false,
        findings: Vec::new(),
        result: None,
        next: None,
        change: Change::None,
        answer,
    };
    match lifecycle::apply(&record.state, event, now_ms) {
        Ok(Outcome::Changed(next)) => {
            let producer = producer_of(&record.state);
            let mut plan = plan_settle(
                record,
                next,
                &Judged::from(&post.submission),
                post.charge.as_ref(),
                producer,
                fence,
                now_ms,
            )?;
            plan.drop_staged = matches!(record.state, State::Ready { .. });
            Ok(plan)
        }
        // The same answer again: counted, never charged.
        Ok(Outcome::Replay) => Ok(unsettled(ChargeKind::Replay, Answer::Replay)),
        // A stale reporter's call was still paid for; its answer is just not used.
        Err(e) => Ok(unsettled(ChargeKind::Fresh, Answer::Rejected(e))),
    }
}

/// An answer whose lifecycle check passed (`next`: committed or failed): the charge, the
/// result and its findings, the state change.
pub(in crate::store) fn plan_settle<'a>(
    record: &ExtractionRecord,
    next: State,
    answer: &Judged,
    charge: Option<&'a Charge>,
    producer: String,
    fence: Fence,
    now_ms: u64,
) -> Result<Plan<'a>, Error> {
    let kind = if matches!(next, State::Committed { .. }) { ChargeKind::Fresh } else { ChargeKind::FailedValidation };
    let mut plan = Plan {
        charge: charge.map(|c| (c, kind)),
        drop_staged: false,
        findings: Vec::new(),
        result: None,
        next: None,
        change: Change::None,
        answer: Answer::Committed,
    };
    match (&next, answer) {
        (State::Committed { .. }, Judged::Valid { output_json, findings }) => {
            plan.findings = findings
                .iter()
                .map(|f| FindingRecord {
                    key: FindingKey::compute(&record.id, &f.canonical_identity),
                    canonical_identity: f.canonical_identity.clone(),
                    body_json: f.body_json.clone(),
                    committed_at_ms: now_ms,
                })
                .collect();
            plan.result = Some(ResultRecord {
                output_json: output_json.clone(),
                producer,
                fence,
                usage: charge.map(|c| c.usage.clone()),
                latency_ms: charge.and_then(|c| c.latency_ms),
                received_at_ms: now_ms,
            });
            plan.change = Change::Committed;
        }
        (State::Failed { reason, .. }, judged) => {
            if let Judged::Invalid { issues, output, .. } = judged {
                plan.change = Change::Rejected(PreviousAttempt::new(output, issues.clone()));
            }
            plan.answer = Answer::Failed { reason: reason.clone() };
        }
        // Only an invalid answer with re-asks left leads back to the queue (`lifecycle`).
        (State::Pending, Judged::Invalid { reason, issues, output, .. }) => {
            plan.change = Change::Reask(PreviousAttempt::new(output, issues.clone()));
            plan.answer = Answer::Reasked { reason: reason.clone(), reask: record.reasks + 1 };
        }
        _ => {
            return Err(Error::Corrupt {
                kind: "lifecycle",
                reason: format!("result produced unexpected state {:?}", next.name()),
            });
        }
    }
    plan.next = Some(next);
    Ok(plan)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::batch::Usage;
    use crate::domain::lifecycle::FailureClass;
    use crate::domain::names::{BatchKey, LeaseToken};
    use crate::domain::schema::ValidationIssue;
    use crate::store::rules::fixtures::record;
    use crate::store::seam::{Authority, EncodedFinding, Submission};

    fn claimed(token: &str) -> ExtractionRecord {
        record(State::Claimed { worker: "w".into(), lease_token: LeaseToken::new(token), expires_at_ms: 1_000 })
    }

    fn post(token: &str, submission: Submission, charge: Option<Charge>) -> PostResult {
        PostResult {
            id: record(State::Pending).id,
            authority: Authority::Lease(LeaseToken::new(token)),
            submission,
            charge,
        }
    }

    fn charge() -> Charge {
        let usage = Usage { model: "m".into(), output_tokens: 7, request_id: Some("r1".into()), ..Usage::default() };
        Charge { provider: "openai".into(), job_id: None, usage, latency_ms: Some(40), batch: false }
    }

    fn valid(findings: &[&str]) -> Submission {
        let findings = findings
            .iter()
            .map(|i| crate::domain::schema::ValidatedFinding {
                canonical_identity: i.to_string(),
                body: serde_json::json!({"id": i}),
            })
            .collect();
        Submission::Valid { findings, output: serde_json::json!({"ok": true}) }
    }

    #[test]
    fn a_valid_answer_under_the_current_lease_commits_its_findings_and_result_and_is_charged_fresh() {
        let record = claimed("lt-1");
        let post = post("lt-1", valid(&["a", "b"]), Some(charge()));
        let plan = plan_post(&record, &post, 2_000).unwrap();
        assert!(matches!(plan.next, Some(State::Committed { at_ms: 2_000 })));
        assert_eq!(plan.charge.map(|(_, kind)| kind), Some(ChargeKind::Fresh));
        let keys: Vec<_> = plan.findings.iter().map(|f| f.key).collect();
        assert_eq!(keys, vec![FindingKey::compute(&record.id, "a"), FindingKey::compute(&record.id, "b")]);
        let result = plan.result.as_ref().unwrap();
        assert_eq!((result.producer.as_str(), result.latency_ms, result.received_at_ms), ("w", Some(40), 2_000));
        assert_eq!(result.fence, Fence::Lease(LeaseToken::new("lt-1")));
        assert!(!plan.drop_staged, "a worker's lease has nothing staged");
        assert_eq!(plan.answer.outcome(2), PostOutcome::Committed { findings: 2 });
    }

    #[test]
    fn an_invalid_answer_fails_the_extraction_and_is_charged_as_failed_validation() {
        let post = post(
            "lt-1",
            Submission::Invalid {
                reason: "missing field".into(),
                issues: vec![ValidationIssue { path: "/findings".into(), message: "missing field".into() }],
                output: r#"{"finding": []}"#.into(),
                reask_limit: 0,
            },
            Some(charge()),
        );
        let plan = plan_post(&claimed("lt-1"), &post, 2_000).unwrap();
        assert!(matches!(&plan.next, Some(State::Failed { class: FailureClass::Validation, .. })));
        let mut failed = claimed("lt-1");
        plan.change.clone().apply(&mut failed);
        let kept = failed.previous_attempt.expect("the rejected answer is kept");
        assert_eq!((kept.output.as_str(), kept.issues.len()), (r#"{"finding": []}"#, 1), "with its issues");
        assert_eq!((failed.attempt, failed.reasks), (1, 0), "and no new attempt is counted");
        assert_eq!(plan.charge.map(|(_, kind)| kind), Some(ChargeKind::FailedValidation));
        assert!(plan.findings.is_empty() && plan.result.is_none());
        assert!(matches!(plan.answer, Answer::Failed { ref reason } if reason.contains("missing field")));
        assert!(!plan.answer.counts_findings());
    }

    #[test]
    fn a_stale_lease_is_charged_but_changes_nothing_and_a_replay_is_never_charged() {
        let late = post("lt-1", valid(&["a"]), Some(charge()));
        let stale = plan_post(&claimed("lt-2"), &late, 2_000).unwrap();
        assert!(stale.next.is_none() && stale.findings.is_empty());
        assert_eq!(stale.charge.map(|(_, kind)| kind), Some(ChargeKind::Fresh));
        assert!(matches!(stale.answer, Answer::Rejected(TransitionError::StaleLease)));
        let token = LeaseToken::new("lt-1");
        let mut done = claimed("lt-1");
        done.state = State::Committed { at_ms: 1_500 };
        let again = post(token.as_str(), valid(&["a"]), None);
        let replay = plan_post(&done, &again, 2_000).unwrap();
        assert!(matches!(replay.answer, Answer::Replay), "{:?}", replay.answer);
        assert!(!replay.writes(), "a replay without usage writes nothing");
    }

    #[test]
    fn a_batch_answer_leaves_ready_and_drops_its_staged_copy() {
        let key = BatchKey::new("cpb-1");
        let ready = record(State::Ready { provider: "openai".to_string().into(), batch_key: key.clone() });
        let post =
            PostResult { id: ready.id, authority: Authority::Batch(key.clone()), submission: valid(&[]), charge: None };
        let plan = plan_post(&ready, &post, 5).unwrap();
        assert!(plan.drop_staged);
        assert_eq!(plan.result.as_ref().map(|r| r.producer.as_str()), Some("openai"));
        assert_eq!(plan.result.map(|r| r.fence), Some(Fence::Batch(key)));
    }

    #[test]
    fn settling_into_any_state_but_committed_or_failed_is_refused_as_corruption() {
        let answer = Judged::Valid {
            output_json: "{}".into(),
            findings: vec![EncodedFinding { canonical_identity: "a".into(), body_json: "{}".into() }],
        };
        let lease = Fence::Lease(LeaseToken::new("lt-1"));
        let err = plan_settle(&claimed("lt-1"), State::Pending, &answer, None, "w".into(), lease, 1).unwrap_err();
        assert!(matches!(err, Error::Corrupt { kind: "lifecycle", .. }), "{err}");
    }
}
