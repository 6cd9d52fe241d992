//! Erasure against provider batches, at the store: an intent loses its erased members (or
//! closes), a submitted batch keeps its list, and everything that later walks that list
//! (job acceptance, answers, closing) steps over the gaps without writing or charging.

use crate::store::seam::{Batches, Extractions, Ledger, Upkeep};
use std::sync::Arc;

use super::MemberRules;
use super::records::{BatchState, NewExtraction};
use super::rules::intent::{IntentOutcome, IntentRequest, WorkFilter};
use super::{Leftover, Store, WriterGuard, verify_file};
use crate::domain::batch::{LineResult, OutputBudget, Usage};
use crate::domain::identity::{ExtractionId, SourceHash};

const SCHEMA: &str = "code-review@1";
const RULES: MemberRules =
    MemberRules { max_attempts: 3, budget: OutputBudget { default: None, cap: 1000 }, batch_api: true };

async fn intake(store: &Store, tenant: &str, source: &str) -> ExtractionId {
    let content = format!("fn {source}() {{}}");
    let hash = SourceHash::compute(content.as_bytes(), SCHEMA);
    let id = ExtractionId::compute(tenant, source, &hash, SCHEMA);
    let new = NewExtraction {
        id,
        tenant: tenant.into(),
        source_id: source.into(),
        source_hash: hash,
        schema: SCHEMA.into(),
        metadata_json: None,
        content,
    };
    store.intake(new).await.unwrap();
    id
}

async fn intent(store: &Store, max_size: usize) -> u64 {
    let request = IntentRequest {
        provider: "p".into(),
        schema: SCHEMA.into(),
        accept: WorkFilter(Arc::new(|_: &str, _: &str| true)),
        max_size,
        max_content_bytes: u64::MAX,
        max_wait_ms: 0,
        minimum: None,
        estimate: None,
    };
    let IntentOutcome::Created(batch) = store.create_intent(request).await.unwrap() else { panic!("no intent") };
    batch.seq
}

async fn close(store: Store, guard: WriterGuard, dir: &tempfile::TempDir) -> String {
    drop(store);
    tokio::task::spawn_blocking(move || guard.join()).await.unwrap();
    let report = verify_file(&dir.path().join(super::FILE_NAME)).unwrap();
    assert!(report.is_ok(), "{report}");
    report.to_string()
}

#[tokio::test]
async fn batches_step_over_erased_members_and_late_answers_are_strangers() {
    let dir = tempfile::tempdir().unwrap();
    let (store, guard) = Store::open(dir.path(), 1 << 20).unwrap();
    let gone = [intake(&store, "gone", "a").await, intake(&store, "gone", "b").await];
    let kept = intake(&store, "kept", "c").await;
    // Batch 1 (submitted): a and b. Batch 2 (intent): c, then one more of gone's.
    let submitted = intent(&store, 2).await;
    store.record_job(submitted, "job-1".into(), 0).await.unwrap();
    let late = intake(&store, "gone", "d").await;
    let mixed = intent(&store, 2).await;
    let only_gone = {
        intake(&store, "gone", "e").await;
        intent(&store, 1).await
    };

    // One answer is staged (ready, awaiting validation) when the erasure comes.
    let answer = || LineResult::Answer { output: "{\"findings\":[]}".into(), usage: None };
    let staged = store.stage_results(submitted, vec![(gone[0], answer())], RULES).await.unwrap();
    assert_eq!(staged.staged, 1);

    let report = store.erase_tenant("gone".into()).await.unwrap();
    assert_eq!((report.extractions, report.intents_closed), (4, 1), "{report:?}");
    assert_eq!((report.staged_answers, report.contents), (1, 4), "{report:?}");
    assert!(store.ready_items("p".into(), 10).await.unwrap().is_empty(), "nothing left to commit");

    let open: Vec<_> = store.open_batches().await.unwrap();
    let find = |seq| open.iter().find(|b| b.seq == seq).cloned();
    let mixed_now = find(mixed).expect("the mixed intent stays open");
    assert_eq!(mixed_now.members.len(), 1, "only the kept member is left to send");
    assert!(find(only_gone).is_none(), "an intent of erased work only is closed unsent");
    assert_eq!(store.batch_members(mixed).await.unwrap()[0].id, kept);
    // A job accepted for the closed intent (a submit racing the erasure) changes nothing.
    let record = store.record_job(only_gone, "job-x".into(), 0).await.unwrap();
    assert!(matches!(record.state, BatchState::Closed { .. }), "{record:?}");

    // The submitted batch keeps its positions: file line N is still member N.
    let members = store.batch_members(submitted).await.unwrap();
    assert_eq!(members.len(), 2);
    assert!(members.iter().all(|m| m.content.is_empty()), "no erased content is handed out again");
    let usage = Usage { model: "m".into(), output_tokens: 5, provider_cost_micros: Some(99), ..Usage::default() };
    let lines = gone
        .iter()
        .chain([&late])
        .map(|id| (*id, LineResult::Answer { output: "{\"findings\":[]}".into(), usage: Some(usage.clone()) }))
        .collect();
    let staged = store.stage_results(submitted, lines, RULES).await.unwrap();
    assert_eq!((staged.staged, staged.strangers), (0, 3), "{staged:?}");
    let closed = store.close_batch(submitted, "completed".into(), Leftover::Requeue, RULES).await.unwrap();
    assert_eq!(closed.requeued, 0);
    for id in gone.iter().chain([&late]) {
        assert!(store.get(*id).await.unwrap().is_none(), "nothing is recreated");
        assert!(store.extraction_ledger(*id).await.unwrap().is_none(), "nothing is charged");
    }
    // New work never takes an erased sequence number, even after a restart.
    let text = close(store, guard, &dir).await;
    assert!(text.contains("extractions: 1"), "{text}");
    let (store, guard) = Store::open(dir.path(), 1 << 20).unwrap();
    let again = intake(&store, "gone", "a").await;
    assert_eq!(again, gone[0], "the same identity");
    let record = store.get(again).await.unwrap().unwrap();
    assert!(record.seq > 5, "a fresh sequence number, above every erased one: {}", record.seq);
    close(store, guard, &dir).await;
}

#[tokio::test]
async fn a_large_tenant_is_erased_in_several_transactions() {
    let dir = tempfile::tempdir().unwrap();
    let (store, guard) = Store::open(dir.path(), 8 << 20).unwrap();
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..1200 {
        let store = store.clone();
        tasks.spawn(async move { intake(&store, if i % 4 == 0 { "kept" } else { "gone" }, &format!("s{i}")).await });
    }
    while let Some(done) = tasks.join_next().await {
        done.unwrap();
    }
    let report = store.erase_tenant("gone".into()).await.unwrap();
    assert_eq!((report.extractions, report.contents), (900, 900));
    assert_eq!(store.erase_tenant("gone".into()).await.unwrap(), super::ErasureReport::default(), "idempotent");
    let text = close(store, guard, &dir).await;
    assert!(text.contains("extractions: 300"), "{text}");
}
