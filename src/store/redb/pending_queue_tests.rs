//! The pending queue: claims and batch intents take only what they can use, in intake
//! order across tenants, the queue follows every state change, and a file without it
//! gets it built on open.

use crate::store::seam::{Batches, Extractions};
use std::sync::Arc;

use redb::Database;

use super::records::NewExtraction;
use super::rules::intent::{IntentOutcome, IntentRequest, WorkFilter};
use super::{ClaimRequest, Store, WriterGuard, tables, verify_file};
use crate::domain::identity::{ExtractionId, SourceHash};

/// Takes in `fn {source}() {}` for the tenant and schema (the per-tenant counters' tests use it too).
pub(super) async fn intake(store: &Store, tenant: &str, schema: &str, source: &str) -> ExtractionId {
    let content = format!("fn {source}() {{}}");
    let hash = SourceHash::compute(content.as_bytes(), schema);
    let id = ExtractionId::compute(tenant, source, &hash, schema);
    let new = NewExtraction {
        id,
        tenant: tenant.into(),
        source_id: source.into(),
        source_hash: hash,
        schema: schema.into(),
        metadata_json: None,
        content,
    };
    store.intake(new).await.unwrap();
    id
}

fn intent(schema: &str, refused: &'static str, max_size: usize) -> IntentRequest {
    IntentRequest {
        provider: "p".into(),
        schema: schema.into(),
        accept: WorkFilter(Arc::new(move |tenant: &str, _: &str| tenant != refused)),
        max_size,
        max_content_bytes: u64::MAX,
        max_wait_ms: 0,
    }
}

fn claim(schema: Option<&str>, limit: usize) -> ClaimRequest {
    ClaimRequest { worker: "w".into(), limit, lease_ms: 60_000, schema: schema.map(str::to_string) }
}

async fn close_and_verify(store: Store, guard: WriterGuard, path: &std::path::Path) {
    drop(store);
    tokio::task::spawn_blocking(move || guard.join()).await.unwrap();
    let report = verify_file(path).unwrap();
    assert!(report.is_ok(), "{report}");
}

/// Interleaved tenants and schemas, so intake order is not any tenant's order.
async fn fill(store: &Store) -> Vec<(ExtractionId, &'static str, &'static str)> {
    let mut all = Vec::new();
    for i in 0..12 {
        let tenant = ["a", "b", "c"][i % 3];
        let schema = if i % 4 == 3 { "other@1" } else { "code-review@1" };
        all.push((intake(store, tenant, schema, &format!("s{i}")).await, tenant, schema));
    }
    all
}

#[tokio::test]
async fn claims_and_intents_take_their_schema_oldest_first_across_tenants() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(super::FILE_NAME);
    let (store, guard) = Store::open(dir.path(), 1 << 20).unwrap();
    let all = fill(&store).await;
    let of = |schema: &str, refused: &str| -> Vec<ExtractionId> {
        all.iter().filter(|(_, t, s)| *s == schema && *t != refused).map(|(id, _, _)| *id).collect()
    };

    let grants = store.claim(claim(Some("other@1"), 2)).await.unwrap();
    let got: Vec<ExtractionId> = grants.iter().map(|g| g.record.id).collect();
    assert_eq!(got, of("other@1", "")[..2], "the two oldest of that schema, whatever their tenant");

    let IntentOutcome::Created(batch) = store.create_intent(intent("code-review@1", "b", 4)).await.unwrap() else {
        panic!("no intent")
    };
    let members: Vec<u64> = batch.members.clone();
    let expected: Vec<u64> = {
        let ids = of("code-review@1", "b");
        let mut seqs = Vec::new();
        for id in &ids[..4] {
            seqs.push(store.get(*id).await.unwrap().unwrap().seq);
        }
        seqs
    };
    assert_eq!(members, expected, "the refused tenant's work is skipped, the rest goes in intake order");

    // What is left of code-review@1: b's three and one of a's or c's; an unfiltered
    // claim still takes the oldest pending of any schema.
    let rest = store.claim(claim(None, 100)).await.unwrap();
    assert_eq!(rest.len(), 12 - 2 - 4);
    let seqs: Vec<u64> = rest.iter().map(|g| g.record.seq).collect();
    assert!(seqs.windows(2).all(|w| w[0] < w[1]), "intake order: {seqs:?}");
    assert!(store.claim(claim(Some("code-review@1"), 10)).await.unwrap().is_empty());
    assert!(matches!(store.create_intent(intent("absent@1", "", 10)).await.unwrap(), IntentOutcome::Nothing));
    close_and_verify(store, guard, &path).await;
}

#[tokio::test]
async fn a_file_without_the_queue_gets_it_on_open_and_verify_sees_a_gap() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(super::FILE_NAME);
    let (store, guard) = Store::open(dir.path(), 1 << 20).unwrap();
    let all = fill(&store).await;
    close_and_verify(store, guard, &path).await;

    // An entry lost: verify names the extraction.
    let (victim, tenant, schema) = all[0];
    {
        let db = Database::open(&path).unwrap();
        let txn = db.begin_write().unwrap();
        txn.open_table(tables::PENDING_QUEUE).unwrap().remove((schema, tenant, 1u64)).unwrap();
        txn.commit().unwrap();
    }
    let text = verify_file(&path).unwrap().to_string();
    assert!(text.contains(&format!("{victim}: pending but missing from the pending queue")), "{text}");

    // The next open sees the count disagree and builds it again.
    let (store, guard) = Store::open(dir.path(), 1 << 20).unwrap();
    close_and_verify(store, guard, &path).await;

    // A file from before the queue: no table, no marker.
    {
        let db = Database::open(&path).unwrap();
        let txn = db.begin_write().unwrap();
        txn.delete_table(tables::PENDING_QUEUE).unwrap();
        txn.open_table(tables::META).unwrap().remove(tables::META_PENDING_QUEUE).unwrap();
        txn.commit().unwrap();
    }
    assert!(verify_file(&path).unwrap().is_ok(), "a file without the queue is not damaged");
    let (store, guard) = Store::open(dir.path(), 1 << 20).unwrap();
    let grants = store.claim(claim(Some("other@1"), 10)).await.unwrap();
    assert_eq!(grants.len(), 3, "the rebuilt queue holds the other schema's three");
    close_and_verify(store, guard, &path).await;
}
