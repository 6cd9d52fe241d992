//! The per-tenant counters: they follow every write (`state_counts_tests` checks them at
//! each of its steps through [`assert_depth_matches_the_records`]), a file without them
//! gets them counted when opened, and `verify` finds a wrong one.

use crate::store::seam::Extractions;

use redb::{Database, ReadableDatabase, ReadableTable};

use super::codec::decode;
use super::pending_queue_tests::intake;
use super::records::ExtractionRecord;
use super::rules::depth;
use super::tables::{self, META_TENANT_COUNTS};
use super::{ClaimRequest, Store, WriterGuard, verify_file};
use crate::domain::lifecycle::StateName;

/// `depth_by_tenant` against a recount of every stored record.
pub(super) async fn assert_depth_matches_the_records(store: &Store, step: &str) {
    let depths = store.depth_by_tenant().await.unwrap();
    let txn = store.db.begin_read().unwrap();
    let records: Vec<ExtractionRecord> = txn
        .open_table(tables::EXTRACTIONS)
        .unwrap()
        .iter()
        .unwrap()
        .map(|e| decode(e.unwrap().1.value()).unwrap())
        .collect();
    let mut reported = depth::Counts::new();
    for d in &depths {
        for (state, n) in &d.counts {
            reported.insert((d.tenant.clone(), d.schema.clone(), state.code()), *n);
        }
        let head = records
            .iter()
            .filter(|r| r.tenant == d.tenant && r.schema == d.schema && r.state.name() == StateName::Pending)
            .min_by_key(|r| r.seq);
        assert_eq!(d.oldest_pending_since_ms, head.map(|r| r.updated_at_ms), "after {step}: {d:?}");
    }
    assert_eq!(reported, depth::recount(&records), "after {step}: per-tenant depth against the records");
}

async fn close(store: Store, guard: WriterGuard) {
    drop(store);
    tokio::task::spawn_blocking(move || guard.join()).await.unwrap();
}

#[tokio::test]
async fn depth_splits_by_tenant_and_schema_and_a_file_without_counters_gets_them_on_open() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(super::FILE_NAME);
    let (store, guard) = Store::open(dir.path(), 1 << 20).unwrap();
    for i in 0..5 {
        intake(&store, "big", "code-review@1", &format!("s{i}")).await;
    }
    intake(&store, "big", "other@1", "o").await;
    intake(&store, "small", "code-review@1", "x").await;
    let claim = ClaimRequest {
        worker: "w".into(),
        limit: 2,
        lease_ms: 60_000,
        schema: None,
        estimate: None,
        scope: Default::default(),
    };
    assert_eq!(store.claim(claim).await.unwrap().len(), 2);
    let depths = store.depth_by_tenant().await.unwrap();
    let pairs: Vec<(&str, &str, u64, u64)> = depths
        .iter()
        .map(|d| (d.tenant.as_str(), d.schema.as_str(), d.count(StateName::Pending), d.count(StateName::Claimed)))
        .collect();
    assert_eq!(pairs, vec![("big", "code-review@1", 3, 2), ("big", "other@1", 1, 0), ("small", "code-review@1", 1, 0)]);
    assert_depth_matches_the_records(&store, "claims").await;
    let before = store.depth_by_tenant().await.unwrap();
    close(store, guard).await;

    // What a file of an earlier build looks like: no counters and no key.
    {
        let db = Database::open(&path).unwrap();
        let txn = db.begin_write().unwrap();
        txn.delete_table(tables::TENANT_COUNTS).unwrap();
        txn.open_table(tables::META).unwrap().remove(META_TENANT_COUNTS).unwrap();
        txn.commit().unwrap();
    }
    assert!(verify_file(&path).unwrap().is_ok(), "a file that predates the counters is sound");
    let (store, guard) = Store::open(dir.path(), 1 << 20).unwrap();
    assert_eq!(store.depth_by_tenant().await.unwrap(), before, "counted again when opened");
    close(store, guard).await;
    assert!(verify_file(&path).unwrap().is_ok());
}

#[tokio::test]
async fn verify_names_a_wrong_counter_and_an_open_recounts_it() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(super::FILE_NAME);
    let (store, guard) = Store::open(dir.path(), 1 << 20).unwrap();
    for i in 0..3 {
        intake(&store, "a", "code-review@1", &format!("s{i}")).await;
    }
    close(store, guard).await;
    {
        let db = Database::open(&path).unwrap();
        let txn = db.begin_write().unwrap();
        let mut counts = txn.open_table(tables::TENANT_COUNTS).unwrap();
        counts.insert(("a", "code-review@1", StateName::Pending.code()), 2).unwrap();
        drop(counts);
        txn.commit().unwrap();
    }
    let report = verify_file(&path).unwrap();
    assert!(!report.is_ok());
    let text = report.to_string();
    assert!(text.contains("the per-tenant counter of (a, code-review@1, pending) says 2, the records 3"), "{text}");
    let (store, guard) = Store::open(dir.path(), 1 << 20).unwrap();
    assert_eq!(store.depth_by_tenant().await.unwrap()[0].count(StateName::Pending), 3, "the sums disagreed: recounted");
    close(store, guard).await;
    assert!(verify_file(&path).unwrap().is_ok());
}
