//! The pending queue: claims and batch intents take only what they can use, tenant by
//! tenant by the fair pick, the queue follows every state change, and a file without it
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
        minimum: None,
        estimate: None,
    }
}

fn claim(schema: Option<&str>, limit: usize) -> ClaimRequest {
    ClaimRequest {
        worker: "w".into(),
        limit,
        lease_ms: 60_000,
        schema: schema.map(str::to_string),
        estimate: None,
        scope: Default::default(),
    }
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

/// A quantum of one byte: every tenant takes one source per round.
fn one_each() -> crate::store::Policies {
    let fairness = crate::store::Fairness { quantum_bytes: 1, ..Default::default() };
    crate::store::Policies::new(Vec::new(), Arc::new(crate::store::ProviderReportedOnly), fairness)
}

#[tokio::test]
async fn claims_and_intents_take_their_schema_tenant_by_tenant_oldest_first_within_each() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(super::FILE_NAME);
    let (store, guard) = Store::open(dir.path(), 1 << 20).unwrap();
    store.set_policies(one_each());
    let all = fill(&store).await;
    let seq_of = |id: ExtractionId| {
        let store = &store;
        async move { store.get(id).await.unwrap().unwrap().seq }
    };
    let of = |schema: &str, tenant: &str| -> Vec<ExtractionId> {
        all.iter().filter(|(_, t, s)| *s == schema && *t == tenant).map(|(id, _, _)| *id).collect()
    };

    let grants = store.claim(claim(Some("other@1"), 2)).await.unwrap();
    let got: Vec<ExtractionId> = grants.iter().map(|g| g.record.id).collect();
    assert_eq!(got, vec![of("other@1", "a")[0], of("other@1", "b")[0]], "one of each tenant, in rotation");
    // The rotation goes on from b: c's is next, then a's (the claim of a drained it).
    let got: Vec<ExtractionId> =
        store.claim(claim(Some("other@1"), 5)).await.unwrap().iter().map(|g| g.record.id).collect();
    assert_eq!(got, vec![of("other@1", "c")[0]]);

    let IntentOutcome::Created(batch) = store.create_intent(intent("code-review@1", "b", 4)).await.unwrap() else {
        panic!("no intent")
    };
    let (a, c) = (of("code-review@1", "a"), of("code-review@1", "c"));
    let expected = vec![seq_of(a[0]).await, seq_of(c[0]).await, seq_of(a[1]).await, seq_of(c[1]).await];
    assert_eq!(batch.members, expected, "the refused tenant is skipped; a and c alternate, oldest first in each");

    // What is left: b's three of code-review@1 and one each of a and c.
    let rest = store.claim(claim(None, 100)).await.unwrap();
    let mut got: Vec<ExtractionId> = rest.iter().map(|g| g.record.id).collect();
    let mut expected: Vec<ExtractionId> = of("code-review@1", "b");
    expected.extend([a[2], c[2]]);
    got.sort();
    expected.sort();
    assert_eq!(got, expected);
    assert!(store.claim(claim(Some("code-review@1"), 10)).await.unwrap().is_empty());
    assert!(matches!(store.create_intent(intent("absent@1", "", 10)).await.unwrap(), IntentOutcome::Nothing));
    close_and_verify(store, guard, &path).await;
}

#[tokio::test]
async fn a_backlog_delays_another_tenant_by_one_batch_and_a_tenant_never_passes_its_in_flight_limit() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(super::FILE_NAME);
    let (store, guard) = Store::open(dir.path(), 1 << 20).unwrap();
    let fairness = crate::store::Fairness {
        tenants: std::collections::HashMap::from([(
            "capped".to_string(),
            crate::store::TenantShare { max_in_flight: Some(3), ..Default::default() },
        )]),
        ..Default::default()
    };
    store.set_policies(crate::store::Policies::new(Vec::new(), Arc::new(crate::store::ProviderReportedOnly), fairness));
    for i in 0..400 {
        intake(&store, "backlog", "code-review@1", &format!("b{i}")).await;
    }
    let late = intake(&store, "late", "code-review@1", "l0").await;
    for i in 0..10 {
        intake(&store, "capped", "code-review@1", &format!("c{i}")).await;
    }
    let late_seq = store.get(late).await.unwrap().unwrap().seq;
    // Sources this small fill a batch of 50 within one tenant's quantum, so the backlog
    // (first by name) fills the first batch, and the rotation then starts after it.
    let (mut capped, mut late_in) = (0, None);
    for n in 0..10 {
        let IntentOutcome::Created(batch) = store.create_intent(intent("code-review@1", "", 50)).await.unwrap() else {
            break;
        };
        if batch.members.contains(&late_seq) {
            late_in = Some(n);
        }
        for &seq in &batch.members {
            capped += usize::from(store.get_by_seq(seq).await.unwrap().is_some_and(|r| r.tenant == "capped"));
        }
    }
    assert_eq!(late_in, Some(1), "the late tenant's one source goes in the second batch, not after the backlog");
    assert_eq!(capped, 3, "three may be in flight; the rest wait");
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
