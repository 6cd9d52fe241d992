//! Bulk retry works in bounded jobs, each of which leaves a file that verifies.

use super::cancel::retry_chunk;
use super::verify::verify_file;
use super::{Authority, ClaimRequest, NewExtraction, PostResult, Store, Submission};
use crate::domain::identity::{ExtractionId, SourceHash};
use crate::domain::lifecycle::{FailureClass, StateName};
use crate::store::seam::Extractions;
use crate::store::seam::{RETRY_CHUNK, RetryFilter};

const SCHEMA: &str = "code-review@1";

/// Intakes `n` extractions of `tenant` and fails each through a worker (class validation).
async fn fail(store: &Store, tenant: &str, n: usize) {
    for i in 0..n {
        let content = format!("fn f{i}() {{}}");
        let hash = SourceHash::compute(content.as_bytes(), SCHEMA);
        let source_id = format!("s{i}");
        let id = ExtractionId::compute(tenant, &source_id, &hash, SCHEMA);
        let new = NewExtraction {
            id,
            tenant: tenant.into(),
            source_id,
            source_hash: hash,
            schema: SCHEMA.into(),
            metadata_json: None,
            content,
        };
        store.intake(new).await.unwrap();
    }
    let request = ClaimRequest {
        worker: "w".into(),
        limit: n,
        lease_ms: 60_000,
        schema: None,
        estimate: None,
        scope: Default::default(),
    };
    for grant in store.claim(request).await.unwrap() {
        let submission =
            Submission::Invalid { reason: "bad".into(), issues: Vec::new(), output: String::new(), reask_limit: 0 };
        let post = PostResult {
            id: grant.record.id,
            authority: Authority::Lease(grant.lease_token),
            submission,
            charge: None,
        };
        store.post_result(post).await.unwrap();
    }
}

async fn count(store: &Store, state: StateName) -> u64 {
    store.counts_by_state().await.unwrap().iter().find(|c| c.state == state).map_or(0, |c| c.count)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_job_moves_at_most_a_chunk_and_the_rest_follows() {
    let dir = tempfile::tempdir().unwrap();
    let (store, guard) = Store::open(dir.path(), 1 << 20).unwrap();
    fail(&store, "a", 1100).await;
    fail(&store, "b", 30).await;
    let only_a = RetryFilter { tenant: Some("a".into()), failure_class: Some(FailureClass::Validation), schema: None };

    let filter = only_a.clone();
    let (moved, next) = store.writer.write(move |t| retry_chunk(t, &filter, 0, RETRY_CHUNK)).await.unwrap();
    assert_eq!(moved, RETRY_CHUNK as u64, "one job moves one chunk");
    assert!(next.is_some(), "and says where the next one starts");
    assert_eq!(count(&store, StateName::Pending).await, RETRY_CHUNK as u64);

    let none = RetryFilter { failure_class: Some(FailureClass::Truncated), ..RetryFilter::default() };
    assert_eq!(store.retry_failed(none, u64::MAX).await.unwrap(), 0);
    assert_eq!(store.retry_failed(only_a, u64::MAX).await.unwrap(), 600, "the rest of a's, b's left alone");
    assert_eq!(count(&store, StateName::Failed).await, 30);
    assert_eq!(store.retry_failed(RetryFilter::default(), 10).await.unwrap(), 10, "the limit holds");
    assert_eq!(store.retry_failed(RetryFilter::default(), u64::MAX).await.unwrap(), 20);
    assert_eq!(count(&store, StateName::Failed).await, 0);
    assert_eq!(count(&store, StateName::Pending).await, 1130);
    drop(store);
    tokio::task::spawn_blocking(move || guard.join()).await.unwrap();
    assert!(verify_file(&dir.path().join(super::FILE_NAME)).unwrap().is_ok());
}
