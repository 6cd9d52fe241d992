//! The per-state counters against the index they summarise, through every kind of write
//! that moves an extraction between states or removes it, across a reopen, and against
//! a tampered file.

use crate::store::seam::{Batches, Extractions, Upkeep};
use std::collections::BTreeMap;
use std::sync::Arc;

use redb::{Database, ReadableDatabase};
use serde_json::json;

use super::records::NewExtraction;
use super::rules::intent::{IntentOutcome, IntentRequest, WorkFilter};
use super::{Authority, ClaimRequest, PostOutcome, PostResult, Store, Submission, WriterGuard, tables, verify_file};
use crate::domain::identity::{ExtractionId, SourceHash};
use crate::domain::lifecycle::StateName;

const SCHEMA: &str = "code-review@1";

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

/// The counters as `counts_by_state` reports them, and the index counted entry by entry.
async fn both(store: &Store) -> (BTreeMap<&'static str, u64>, BTreeMap<&'static str, u64>) {
    let stored = store.counts_by_state().await.unwrap().into_iter().map(|c| (c.state.as_str(), c.count)).collect();
    let txn = store.db.begin_read().unwrap();
    let index = txn.open_table(tables::STATE_INDEX).unwrap();
    let counted = StateName::ALL
        .iter()
        .map(|s| (s.as_str(), index.range((s.code(), 0)..=(s.code(), u64::MAX)).unwrap().count() as u64))
        .collect();
    (stored, counted)
}

async fn assert_counts(store: &Store, step: &str, expect: &[(&str, u64)]) {
    let (stored, counted) = both(store).await;
    assert_eq!(stored, counted, "after {step}: counters against the index");
    super::tenant_counts_tests::assert_depth_matches_the_records(store, step).await;
    for (state, n) in expect {
        assert_eq!(stored.get(state).copied(), Some(*n), "after {step}: {state} in {stored:?}");
    }
}

async fn close(store: Store, guard: WriterGuard) {
    drop(store);
    tokio::task::spawn_blocking(move || guard.join()).await.unwrap();
}

#[tokio::test]
async fn counters_follow_every_write_and_survive_a_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let (store, guard) = Store::open(dir.path(), 1 << 20).unwrap();
    let mut ids = Vec::new();
    for i in 0..6 {
        ids.push(intake(&store, "a", &format!("s{i}")).await);
    }
    for i in 0..3 {
        intake(&store, "b", &format!("t{i}")).await;
    }
    intake(&store, "a", "s0").await; // a redelivery writes nothing and counts nothing
    assert_counts(&store, "intake", &[("pending", 9), ("claimed", 0)]).await;

    let claim = ClaimRequest {
        worker: "w".into(),
        limit: 3,
        lease_ms: 60_000,
        schema: None,
        estimate: None,
        scope: Default::default(),
    };
    let grants = store.claim(claim).await.unwrap();
    assert_eq!(grants.len(), 3);
    assert_counts(&store, "claim", &[("pending", 6), ("claimed", 3)]).await;

    let post = |i: usize, submission| PostResult {
        id: grants[i].record.id,
        authority: Authority::Lease(grants[i].lease_token.clone()),
        submission,
        charge: None,
    };
    let valid = Submission::Valid { findings: Vec::new(), output: json!({"findings": []}) };
    assert!(matches!(store.post_result(post(0, valid.clone())).await.unwrap(), PostOutcome::Committed { .. }));
    // A replay of the same answer changes nothing.
    assert!(matches!(store.post_result(post(0, valid)).await.unwrap(), PostOutcome::Replay { .. }));
    let invalid =
        Submission::Invalid { reason: "not json".into(), issues: Vec::new(), output: String::new(), reask_limit: 0 };
    assert!(matches!(store.post_result(post(1, invalid)).await.unwrap(), PostOutcome::Failed { .. }));
    assert_counts(&store, "commit and fail", &[("claimed", 1), ("committed", 1), ("failed", 1)]).await;

    store.retry(grants[1].record.id).await.unwrap();
    assert_counts(&store, "retry", &[("pending", 7), ("failed", 0)]).await;

    store.cancel(ids[5]).await.unwrap();
    assert_counts(&store, "cancel", &[("pending", 6), ("cancelled", 1)]).await;

    let request = IntentRequest {
        provider: "p".into(),
        schema: SCHEMA.into(),
        accept: WorkFilter(Arc::new(|_: &str, _: &str| true)),
        max_size: 2,
        max_content_bytes: u64::MAX,
        max_wait_ms: 0,
        minimum: None,
        estimate: None,
    };
    assert!(matches!(store.create_intent(request).await.unwrap(), IntentOutcome::Created(_)));
    assert_counts(&store, "batch intent", &[("pending", 4), ("submitted", 2)]).await;

    let erased = store.erase_tenant("b".into()).await.unwrap();
    assert_eq!(erased.extractions, 3);
    assert_counts(&store, "erasure", &[("pending", 1)]).await;
    let before = both(&store).await.0;
    close(store, guard).await;

    let (store, guard) = Store::open(dir.path(), 1 << 20).unwrap();
    assert_eq!(both(&store).await.0, before, "a reopen keeps the counters");
    close(store, guard).await;
    let report = verify_file(&dir.path().join(super::FILE_NAME)).unwrap();
    assert!(report.is_ok(), "{report}");
}

#[tokio::test]
async fn verify_reports_a_wrong_counter_and_the_next_open_recounts() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(super::FILE_NAME);
    let (store, guard) = Store::open(dir.path(), 1 << 20).unwrap();
    for i in 0..4 {
        intake(&store, "a", &format!("s{i}")).await;
    }
    close(store, guard).await;

    {
        let db = Database::open(&path).unwrap();
        let txn = db.begin_write().unwrap();
        {
            let mut counts = txn.open_table(tables::STATE_COUNTS).unwrap();
            counts.insert(StateName::Pending.code(), 40).unwrap();
            counts.insert(99u8, 1).unwrap();
        }
        txn.commit().unwrap();
    }
    let report = verify_file(&path).unwrap();
    let text = report.to_string();
    assert!(text.contains("pending counter says 40, but 4 extractions are pending"), "{text}");
    assert!(text.contains("unknown state code 99"), "{text}");

    // A file whose counters are gone altogether (written before they existed).
    let (store, guard) = Store::open(dir.path(), 1 << 20).unwrap();
    assert_counts(&store, "reopen of a tampered file", &[("pending", 4)]).await;
    close(store, guard).await;
    assert!(verify_file(&path).unwrap().is_ok());
    {
        let db = Database::open(&path).unwrap();
        let txn = db.begin_write().unwrap();
        txn.delete_table(tables::STATE_COUNTS).unwrap();
        txn.commit().unwrap();
    }
    assert!(verify_file(&path).unwrap().is_ok(), "a file without counters is not damaged");
    let (store, guard) = Store::open(dir.path(), 1 << 20).unwrap();
    assert_counts(&store, "first open of a file without counters", &[("pending", 4)]).await;
    close(store, guard).await;
    assert!(verify_file(&path).unwrap().is_ok());
}
