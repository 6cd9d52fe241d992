//! Staging and closing through the redb store: what a line or a batch's end does to its
//! member, its ledger and its budget, end to end through the writer.

use crate::store::seam::{Batches, Extractions, Ledger};
use std::sync::Arc;

use super::Store;
use super::records::ChargeKind;
use super::rules::intent::{IntentOutcome, IntentRequest};
use super::rules::member::MemberRules;
use crate::domain::batch::{LineResult, OutputBudget, Usage};
use crate::domain::identity::{ExtractionId, SourceHash};
use crate::domain::lifecycle::{FailureClass, State};
use crate::store::seam::{CloseReport, IngestLine, Judged, Leftover, StageReport};
use crate::store::{ExtractionRecord, Flush, NewExtraction, RetryOutcome, Submission, WorkFilter};

#[test]
fn a_raised_budget_doubles_the_last_one_up_to_the_cap() {
    let budget = OutputBudget { default: Some(1000), cap: 3000 };
    assert_eq!(budget.raised(None, Some(1000)), Some(2000), "the default was used");
    assert_eq!(budget.raised(Some(2000), None), Some(3000), "a member's own budget, capped");
    assert_eq!(budget.raised(Some(3000), None), None, "nothing larger is allowed");
    let unset = OutputBudget { default: None, cap: 16_384 };
    assert_eq!(unset.raised(None, Some(700)), Some(1400), "where the cut-off answer stopped");
    assert_eq!(unset.raised(None, Some(16_384)), None, "cut off at the model's own limit");
    assert_eq!(unset.raised(None, None), None, "no budget known: no claim that a larger one helps");
    assert_eq!(unset.raised(None, Some(0)), None);
}

const RULES: MemberRules =
    MemberRules { max_attempts: 3, budget: OutputBudget { default: Some(1000), cap: 3000 }, batch_api: true };

struct Rig {
    store: Store,
    _guard: crate::store::WriterGuard,
    _dir: tempfile::TempDir,
    id: ExtractionId,
}

async fn rig() -> Rig {
    let dir = tempfile::tempdir().unwrap();
    let (store, guard) = Store::open(dir.path(), 1 << 20).unwrap();
    let schema = "code-review@1";
    let hash = SourceHash::compute(b"x", schema);
    let id = ExtractionId::compute("t", "s", &hash, schema);
    let new = NewExtraction {
        id,
        tenant: "t".into(),
        source_id: "s".into(),
        source_hash: hash,
        schema: schema.into(),
        metadata_json: None,
        content: "x".into(),
    };
    store.intake(new).await.unwrap();
    Rig { store, _guard: guard, _dir: dir, id }
}

impl Rig {
    /// Puts the extraction into a submitted batch with a job; returns the batch.
    async fn submitted(&self) -> u64 {
        let request = IntentRequest {
            provider: "p".into(),
            schema: "code-review@1".into(),
            accept: WorkFilter(Arc::new(|_: &str, _: &str| true)),
            max_size: 1,
            max_content_bytes: u64::MAX,
            max_wait_ms: 0,
            minimum: None,
            estimate: None,
        };
        let IntentOutcome::Created(batch) = self.store.create_intent(request).await.unwrap() else { panic!() };
        self.store.record_job(batch.seq, format!("job-{}", batch.seq), 0).await.unwrap();
        assert_eq!(self.store.batch_members(batch.seq).await.unwrap().len(), 1);
        batch.seq
    }

    async fn stage(&self, line: LineResult) -> StageReport {
        let batch = self.submitted().await;
        self.store.stage_results(batch, vec![(self.id, line)], RULES).await.unwrap()
    }

    async fn record(&self) -> ExtractionRecord {
        self.store.get(self.id).await.unwrap().unwrap()
    }
}

fn truncated(output_tokens: u64) -> LineResult {
    let usage = Usage { model: "m".into(), output_tokens, request_id: None, ..Usage::default() };
    LineResult::Unusable { class: FailureClass::Truncated, reason: "cut off".into(), usage: Some(usage) }
}

fn failure(record: &ExtractionRecord) -> (FailureClass, String) {
    let State::Failed { class, reason } = &record.state else { panic!("{:?}", record.state) };
    (*class, reason.clone())
}

#[tokio::test]
async fn a_truncated_answer_is_retried_once_with_a_larger_budget_and_charged_each_time() {
    let rig = rig().await;
    let report = rig.stage(truncated(1000)).await;
    assert_eq!((report.truncated, report.budget_retries, report.requeued), (1, 1, 1), "{report:?}");
    let record = rig.record().await;
    assert_eq!(record.state, State::Pending);
    assert_eq!((record.attempt, record.requeues, record.output_budget), (2, 1, Some(2000)));
    assert!(record.truncation_retried);
    // The raised budget travels to the adapter with the member.
    let batch = rig.submitted().await;
    assert_eq!(rig.store.batch_members(batch).await.unwrap()[0].output_budget, Some(2000));
    let report = rig.store.stage_results(batch, vec![(rig.id, truncated(2000))], RULES).await.unwrap();
    assert_eq!((report.truncated, report.failed_truncated, report.requeued), (1, 1, 0), "{report:?}");
    let record = rig.record().await;
    let (class, reason) = failure(&record);
    assert_eq!(class, FailureClass::Truncated);
    assert!(reason.contains("already retried once with an output budget of 2000"), "{reason}");
    let ledger = rig.store.extraction_ledger(rig.id).await.unwrap().unwrap();
    let charged: Vec<(ChargeKind, u32, u64)> =
        ledger.iter().map(|e| (e.kind, e.attempt, e.usage.output_tokens)).collect();
    assert_eq!(charged, [(ChargeKind::Unusable, 1, 1000), (ChargeKind::Unusable, 2, 2000)]);
    // An operator's retry allows one more truncation retry, with the budget kept.
    let RetryOutcome::Retried(retried) = rig.store.retry(rig.id).await.unwrap() else { panic!() };
    assert_eq!((retried.requeues, retried.truncation_retried, retried.output_budget), (0, false, Some(2000)));
    rig.stage(truncated(2000)).await;
    assert_eq!(rig.record().await.output_budget, Some(3000), "doubled up to the cap");
}

#[tokio::test]
async fn truncation_at_the_cap_fails_at_once() {
    let rig = rig().await;
    let rules = MemberRules { budget: OutputBudget { default: Some(3000), cap: 3000 }, ..RULES };
    let batch = rig.submitted().await;
    rig.store.stage_results(batch, vec![(rig.id, truncated(3000))], rules).await.unwrap();
    let (class, reason) = failure(&rig.record().await);
    assert_eq!(class, FailureClass::Truncated);
    assert!(reason.contains("no larger output budget"), "{reason}");
}

#[tokio::test]
async fn a_judged_answer_commits_as_it_is_staged_and_a_refetch_changes_nothing() {
    let rig = rig().await;
    let batch = rig.submitted().await;
    let usage = Usage { model: "m".into(), output_tokens: 9, request_id: Some("r1".into()), ..Usage::default() };
    let output = serde_json::json!({"findings": [{"k": 1}]});
    let finding = crate::domain::schema::ValidatedFinding {
        canonical_identity: "[1]".into(),
        body: output["findings"][0].clone(),
    };
    let line = IngestLine {
        id: rig.id,
        result: LineResult::Answer { output: output.to_string(), usage: Some(usage) },
        judged: Some(Judged::from(&Submission::Valid { findings: vec![finding], output })),
    };
    let report = rig.store.ingest_results(batch, vec![line.clone()], RULES, Flush::Now).await.unwrap();
    assert_eq!((report.committed, report.staged, report.failed_validation), (1, 0, 0), "{report:?}");
    assert!(matches!(rig.record().await.state, State::Committed { .. }));
    assert!(rig.store.ready_items("p".into(), 10).await.unwrap().is_empty(), "nothing was staged");
    assert_eq!(rig.store.findings(rig.id).await.unwrap().unwrap().len(), 1);
    let result = rig.store.result(rig.id).await.unwrap().unwrap();
    assert_eq!(result.usage.as_ref().map(|u| u.output_tokens), Some(9));
    // The same file read again after a crash: a replay, counted and never charged again.
    let again = rig.store.ingest_results(batch, vec![line], RULES, Flush::Now).await.unwrap();
    assert_eq!((again.committed, again.replays), (0, 1), "{again:?}");
    assert_eq!(rig.store.findings(rig.id).await.unwrap().unwrap().len(), 1);
    let ledger = rig.store.extraction_ledger(rig.id).await.unwrap().unwrap();
    assert_eq!(ledger.iter().map(|e| e.kind).collect::<Vec<_>>(), [ChargeKind::Fresh, ChargeKind::Replay]);
}

#[tokio::test]
async fn a_judged_invalid_answer_fails_validation_and_is_charged() {
    let rig = rig().await;
    let batch = rig.submitted().await;
    let usage = Usage { model: "m".into(), output_tokens: 9, ..Usage::default() };
    let line = IngestLine {
        id: rig.id,
        result: LineResult::Answer { output: "{}".into(), usage: Some(usage) },
        judged: Some(Judged::Invalid {
            reason: "/: findings is required".into(),
            issues: Vec::new(),
            output: String::new(),
            reask_limit: 0,
        }),
    };
    let report = rig.store.ingest_results(batch, vec![line], RULES, Flush::Now).await.unwrap();
    assert_eq!((report.committed, report.failed_validation), (0, 1), "{report:?}");
    assert_eq!(failure(&rig.record().await).0, FailureClass::Validation);
    let ledger = rig.store.extraction_ledger(rig.id).await.unwrap().unwrap();
    assert_eq!(ledger.iter().map(|e| e.kind).collect::<Vec<_>>(), [ChargeKind::FailedValidation]);
}

#[tokio::test]
async fn a_refusal_fails_refused_and_is_charged() {
    let rig = rig().await;
    let usage = Usage { model: "m".into(), output_tokens: 9, ..Usage::default() };
    let line = LineResult::Unusable { class: FailureClass::Refused, reason: "no".into(), usage: Some(usage) };
    let report = rig.stage(line).await;
    assert_eq!(report.model_refusals, 1);
    assert_eq!(failure(&rig.record().await).0, FailureClass::Refused);
    let ledger = rig.store.extraction_ledger(rig.id).await.unwrap().unwrap();
    assert_eq!(ledger.iter().map(|e| e.kind).collect::<Vec<_>>(), [ChargeKind::Unusable]);
}

#[tokio::test]
async fn requeues_stop_at_the_attempt_cap_and_a_retry_grants_a_new_allowance() {
    let rig = rig().await;
    let retry = || LineResult::Retry { reason: "batch_expired: not run".into() };
    rig.stage(retry()).await;
    let batch = rig.submitted().await;
    let closed = rig.store.close_batch(batch, "expired".into(), Leftover::Requeue, RULES).await.unwrap();
    assert_eq!(closed, CloseReport { requeued: 1, ..CloseReport::default() });
    assert_eq!((rig.record().await.attempt, rig.record().await.requeues), (3, 2));
    let report = rig.stage(retry()).await;
    assert_eq!((report.exhausted, report.requeued), (1, 0), "the third attempt is the last of 3");
    let (class, reason) = failure(&rig.record().await);
    assert_eq!(class, FailureClass::AttemptsExhausted);
    assert!(reason.contains("3 provider attempts used") && reason.contains("batch_expired"), "{reason}");

    rig.store.retry(rig.id).await.unwrap();
    let batch = rig.submitted().await;
    let closed = rig.store.close_batch(batch, "expired".into(), Leftover::Requeue, RULES).await.unwrap();
    assert_eq!(closed.requeued, 1, "a fresh allowance after the operator's retry");
    let one = MemberRules { max_attempts: 1, ..RULES };
    let batch = rig.submitted().await;
    let closed = rig.store.close_batch(batch, "expired".into(), Leftover::Requeue, one).await.unwrap();
    assert_eq!(closed, CloseReport { exhausted: 1, ..CloseReport::default() });
    assert_eq!(failure(&rig.record().await).0, FailureClass::AttemptsExhausted);
}
