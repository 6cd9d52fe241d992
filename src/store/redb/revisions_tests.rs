//! The revisions index on redb: commits link revisions in their write, and a file written
//! before the index existed opens, verifies, and gets it built.

use crate::store::seam::{Extractions, Revisions};

use redb::Database;
use serde_json::json;

use super::tables::{self, META_REVISIONS};
use super::verify::verify_file;
use super::{Authority, ClaimRequest, NewExtraction, PostResult, Store, Submission, WriterGuard};
use crate::domain::identity::{ExtractionId, SourceHash};
use crate::domain::schema::ValidatedFinding;

const SCHEMA: &str = "code-review@1";

fn open(dir: &std::path::Path) -> (Store, WriterGuard) {
    Store::open(dir, 1 << 20).unwrap()
}

async fn close(store: Store, guard: WriterGuard) {
    drop(store);
    tokio::task::spawn_blocking(move || guard.join()).await.unwrap();
}

/// Takes in one revision of source "s" per content and commits them newest first.
async fn newest_first(store: &Store, contents: &[&str]) -> Vec<ExtractionId> {
    let mut ids = Vec::new();
    for content in contents {
        let hash = SourceHash::compute(content.as_bytes(), SCHEMA);
        let id = ExtractionId::compute("t", "s", &hash, SCHEMA);
        let new = NewExtraction {
            id,
            tenant: "t".into(),
            source_id: "s".into(),
            source_hash: hash,
            schema: SCHEMA.into(),
            metadata_json: None,
            content: content.to_string(),
        };
        store.intake(new).await.unwrap();
        ids.push(id);
    }
    let request = ClaimRequest {
        worker: "w".into(),
        limit: contents.len(),
        lease_ms: 60_000,
        schema: None,
        estimate: None,
        scope: Default::default(),
    };
    let mut grants = store.claim(request).await.unwrap();
    grants.reverse();
    for grant in grants {
        let finding = ValidatedFinding { canonical_identity: "[1]".into(), body: json!({"line": 1}) };
        let submission = Submission::Valid { findings: vec![finding], output: json!({"findings": [{"line": 1}]}) };
        let post = PostResult {
            id: grant.record.id,
            authority: Authority::Lease(grant.lease_token),
            submission,
            charge: None,
        };
        store.post_result(post).await.unwrap();
    }
    ids
}

async fn links(store: &Store) -> Vec<Option<ExtractionId>> {
    let revisions = store.revisions("t".into(), "s".into(), "code-review".into()).await.unwrap();
    revisions.iter().map(|r| r.superseded_by).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_file_without_the_revisions_index_verifies_and_gets_it_built_when_opened() {
    let dir = tempfile::tempdir().unwrap();
    let (store, guard) = open(dir.path());
    let ids = newest_first(&store, &["fn a() {}", "fn b() {}"]).await;
    assert_eq!(links(&store).await, vec![Some(ids[1]), None], "the older one is born superseded");
    close(store, guard).await;
    let path = dir.path().join(super::FILE_NAME);
    assert!(verify_file(&path).unwrap().is_ok());
    {
        let db = Database::open(&path).unwrap();
        let txn = db.begin_write().unwrap();
        txn.delete_table(tables::REVISIONS).unwrap();
        txn.open_table(tables::META).unwrap().remove(META_REVISIONS).unwrap();
        txn.commit().unwrap();
    }
    assert!(verify_file(&path).unwrap().is_ok(), "a file that predates the index is sound");
    let (store, guard) = open(dir.path());
    assert_eq!(links(&store).await, vec![Some(ids[1]), None], "the index is built when the file is opened");
    close(store, guard).await;
    assert!(verify_file(&path).unwrap().is_ok());
}
