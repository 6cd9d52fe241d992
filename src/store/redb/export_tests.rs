//! The export's snapshot and the commit index of files that predate it.

use crate::store::seam::Extractions;
use std::sync::mpsc;

use redb::{Database, ReadableTable};
use serde_json::json;

use super::tables::{self, META_COMMIT_INDEX};
use super::verify::verify_file;
use super::{Authority, ClaimRequest, ExportFilter, NewExtraction, PostResult, Store, Submission, WriterGuard};
use crate::domain::identity::{ExtractionId, SourceHash};
use crate::domain::schema::ValidatedFinding;

const SCHEMA: &str = "code-review@1";

fn open(dir: &std::path::Path) -> (Store, WriterGuard) {
    Store::open(dir, 1 << 20).unwrap()
}

/// Intakes and commits `n` extractions of tenant `t` (sources `from..from+n`), one finding each.
async fn commit(store: &Store, from: usize, n: usize) {
    for i in from..from + n {
        let content = format!("fn f{i}() {{}}");
        let hash = SourceHash::compute(content.as_bytes(), SCHEMA);
        let source_id = format!("s{i}");
        let id = ExtractionId::compute("t", &source_id, &hash, SCHEMA);
        let new = NewExtraction {
            id,
            tenant: "t".into(),
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
}

fn everything() -> ExportFilter {
    ExportFilter { tenant: "t".into(), schema: None, since_ms: 0, until_ms: u64::MAX, latest: false }
}

async fn exported(store: &Store) -> Vec<u64> {
    store
        .export(everything(), Vec::new(), |seen, item| {
            assert_eq!(item.findings.len(), 1);
            seen.push(item.record.seq);
            true
        })
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_export_reads_one_snapshot_while_commits_go_on() {
    let dir = tempfile::tempdir().unwrap();
    let (store, guard) = open(dir.path());
    commit(&store, 0, 10).await;
    let (started, wait_started) = tokio::sync::oneshot::channel();
    let (release, gate) = mpsc::channel::<()>();
    let mut started = Some(started);
    let reader = store.clone();
    let walk = tokio::spawn(async move {
        reader
            .export(everything(), Vec::new(), move |seen, item| {
                if let Some(started) = started.take() {
                    let _ = started.send(());
                    gate.recv().unwrap();
                }
                seen.push(item.record.seq);
                true
            })
            .await
    });
    wait_started.await.unwrap();
    // Commits made while the export is paused on its first line are not in it.
    commit(&store, 10, 10).await;
    release.send(()).unwrap();
    assert_eq!(walk.await.unwrap().unwrap().len(), 10);
    assert_eq!(exported(&store).await.len(), 20);
    // A consumer that stops early stops the walk.
    let first = store.export(everything(), 0, |n, _| {
        *n += 1;
        false
    });
    assert_eq!(first.await.unwrap(), 1);
    drop(store);
    tokio::task::spawn_blocking(move || guard.join()).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_without_the_commit_index_gets_it_built_when_opened() {
    let dir = tempfile::tempdir().unwrap();
    let (store, guard) = open(dir.path());
    commit(&store, 0, 7).await;
    let before = exported(&store).await;
    drop(store);
    tokio::task::spawn_blocking(move || guard.join()).await.unwrap();
    let path = dir.path().join(super::FILE_NAME);
    let db = Database::open(&path).unwrap();
    let txn = db.begin_write().unwrap();
    {
        let mut index = txn.open_table(tables::COMMIT_INDEX).unwrap();
        let (tenant, at_ms, seq) = {
            let (key, _) = index.first().unwrap().unwrap();
            let (tenant, at_ms, seq) = key.value();
            (tenant.to_string(), at_ms, seq)
        };
        index.remove((tenant.as_str(), at_ms, seq)).unwrap();
    }
    txn.commit().unwrap();
    drop(db);
    let report = verify_file(&path).unwrap();
    assert!(report.problems.iter().any(|p| p.contains("missing from the commit index")), "{report}");
    // An older binary committing to the file leaves entries missing: the next open rebuilds.
    let (store, guard) = open(dir.path());
    assert_eq!(exported(&store).await, before);
    drop(store);
    tokio::task::spawn_blocking(move || guard.join()).await.unwrap();
    assert!(verify_file(&path).unwrap().is_ok());
    {
        // What a file written before the index existed looks like: fine as it is.
        let db = Database::open(&path).unwrap();
        let txn = db.begin_write().unwrap();
        txn.delete_table(tables::COMMIT_INDEX).unwrap();
        txn.open_table(tables::META).unwrap().remove(META_COMMIT_INDEX).unwrap();
        txn.commit().unwrap();
    }
    assert!(verify_file(&path).unwrap().is_ok());
    let (store, guard) = open(dir.path());
    assert_eq!(exported(&store).await, before);
    drop(store);
    tokio::task::spawn_blocking(move || guard.join()).await.unwrap();
    assert!(verify_file(&path).unwrap().is_ok());
}
