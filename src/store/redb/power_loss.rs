//! Power-loss simulation. SIGKILL keeps the page cache, so it cannot catch a missing or
//! misplaced fsync; this can. redb runs on a simulated disk that keeps what was written
//! apart from what was synced. For every N, the disk "loses power" at the N-th sync (that
//! sync and everything after it never reach the platter); the synced image is reopened
//! and must hold every acknowledged intake and commit, and pass every invariant.

use crate::store::seam::{Batches, Extractions, Ledger};
use std::collections::BTreeSet;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use redb::{Database, StorageBackend};
use serde_json::json;

use super::verify::verify_database;
use super::{Authority, Charge, ClaimRequest, NewExtraction, Policies, PostOutcome, PostResult, Store, Submission};
use crate::domain::batch::Usage;
use crate::domain::identity::{ExtractionId, SourceHash};
use crate::domain::schema::{BUILTIN_CODE_REVIEW, Registry};

#[derive(Debug, Default)]
struct Disk {
    written: Mutex<Vec<u8>>,
    synced: Mutex<Vec<u8>>,
    syncs: AtomicU64,
    /// The sync number that never completes (0: never crash).
    crash_at: u64,
    dead: AtomicBool,
}

#[derive(Debug, Clone)]
struct SimDisk(Arc<Disk>);

/// redb's backend error type (without its experimental API) is `std::io::Error`.
type BackendIoError = std::io::Error;

fn power_off() -> BackendIoError {
    std::io::Error::other("simulated power loss")
}

impl SimDisk {
    fn check(&self) -> Result<(), BackendIoError> {
        if self.0.dead.load(Ordering::SeqCst) { Err(power_off()) } else { Ok(()) }
    }
}

impl StorageBackend for SimDisk {
    fn len(&self) -> Result<u64, BackendIoError> {
        self.check()?;
        Ok(self.0.written.lock().unwrap().len() as u64)
    }

    fn read(&self, offset: u64, out: &mut [u8]) -> Result<(), BackendIoError> {
        self.check()?;
        let data = self.0.written.lock().unwrap();
        let start = offset as usize;
        let end = start + out.len();
        if end > data.len() {
            return Err(std::io::Error::from(std::io::ErrorKind::UnexpectedEof));
        }
        out.copy_from_slice(&data[start..end]);
        Ok(())
    }

    fn set_len(&self, len: u64) -> Result<(), BackendIoError> {
        self.check()?;
        self.0.written.lock().unwrap().resize(len as usize, 0);
        Ok(())
    }

    fn sync_data(&self) -> Result<(), BackendIoError> {
        self.check()?;
        let n = self.0.syncs.fetch_add(1, Ordering::SeqCst) + 1;
        if n == self.0.crash_at {
            self.0.dead.store(true, Ordering::SeqCst);
            return Err(power_off());
        }
        let image = self.0.written.lock().unwrap().clone();
        *self.0.synced.lock().unwrap() = image;
        Ok(())
    }

    fn write(&self, offset: u64, data: &[u8]) -> Result<(), BackendIoError> {
        self.check()?;
        let mut image = self.0.written.lock().unwrap();
        let end = offset as usize + data.len();
        if image.len() < end {
            image.resize(end, 0);
        }
        image[offset as usize..end].copy_from_slice(data);
        Ok(())
    }
}

fn new_extraction(n: usize) -> NewExtraction {
    let content = format!("let v{n} = x.unwrap();");
    let source_hash = SourceHash::compute(content.as_bytes(), BUILTIN_CODE_REVIEW);
    let source_id = format!("src-{n}");
    NewExtraction {
        id: ExtractionId::compute("acme", &source_id, &source_hash, BUILTIN_CODE_REVIEW),
        tenant: "acme".into(),
        source_id,
        source_hash,
        schema: BUILTIN_CODE_REVIEW.into(),
        metadata_json: None,
        content,
    }
}

#[derive(Debug, Default)]
struct Acknowledged {
    intakes: BTreeSet<ExtractionId>,
    commits: BTreeSet<ExtractionId>,
}

/// Concurrent intakes (some duplicated), then claims and commits, recording every
/// acknowledgement. Stops at the first error: after a power loss nothing more is acked.
async fn workload(store: &Store) -> Acknowledged {
    let mut acked = Acknowledged::default();
    let intakes: Vec<_> = (0..24).map(|n| new_extraction(n % 16)).collect();
    let results = futures_util::future::join_all(intakes.into_iter().map(|new| {
        let store = store.clone();
        async move { (new.id, store.intake(new).await) }
    }))
    .await;
    for (id, result) in results {
        if result.is_ok() {
            acked.intakes.insert(id);
        }
    }
    let request = ClaimRequest {
        worker: "w".into(),
        limit: 8,
        lease_ms: 60_000,
        schema: None,
        estimate: None,
        scope: Default::default(),
    };
    let Ok(grants) = store.claim(request).await else { return acked };
    let schema = Registry::builtin().get(BUILTIN_CODE_REVIEW).unwrap();
    for grant in grants {
        let output = json!({"findings": [{"rule": "no-unwrap", "severity": "medium", "file": grant.record.source_id, "line": 1, "summary": "s"}]});
        let findings = schema.validate(&output).unwrap();
        let post = PostResult {
            id: grant.record.id,
            authority: Authority::Lease(grant.lease_token),
            submission: Submission::Valid { findings, output },
            charge: Some(Charge {
                provider: "worker".into(),
                job_id: None,
                usage: Usage {
                    model: "m".into(),
                    input_tokens: 10,
                    output_tokens: 5,
                    provider_cost_micros: Some(7),
                    ..Usage::default()
                },
                latency_ms: None,
                batch: false,
            }),
        };
        match store.post_result(post).await {
            Ok(PostOutcome::Committed { .. }) => {
                acked.commits.insert(grant.record.id);
            }
            _ => break,
        }
    }
    acked
}

/// Runs the workload on a disk that dies at sync `crash_at`; returns the synced image,
/// what was acknowledged, and whether the crash happened.
fn run_until_power_loss(crash_at: u64) -> (Vec<u8>, Acknowledged, bool) {
    let disk = SimDisk(Arc::new(Disk { crash_at, ..Disk::default() }));
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let acked = match Database::builder().create_with_backend(disk.clone()) {
        Err(_) => Acknowledged::default(),
        Ok(db) => match Store::start(db, PathBuf::from("simulated")) {
            Err(_) => Acknowledged::default(),
            Ok((store, guard)) => {
                // Outbox events and ledger entries ride in the same commits.
                store.set_policies(Policies { sinks: vec!["downstream".into()], ..Policies::default() });
                let acked = runtime.block_on(workload(&store));
                drop(store);
                guard.join();
                acked
            }
        },
    };
    let crashed = disk.0.dead.load(Ordering::SeqCst);
    let image = disk.0.synced.lock().unwrap().clone();
    (image, acked, crashed)
}

/// Opens a disk image as a restarted process would (redb repairs what needs repairing).
fn reopen(image: Vec<u8>) -> Option<(Database, SimDisk)> {
    let disk = SimDisk(Arc::new(Disk::default()));
    *disk.0.written.lock().unwrap() = image;
    Database::builder().create_with_backend(disk.clone()).ok().map(|db| (db, disk))
}

#[test]
fn every_acknowledgement_survives_power_loss_at_every_sync() {
    let mut crash_points = 0;
    for crash_at in 1.. {
        let (image, acked, crashed) = run_until_power_loss(crash_at);
        if !crashed {
            assert!(crash_at > 3, "the workload must sync several times");
            break;
        }
        crash_points += 1;
        let Some((db, disk)) = reopen(image) else {
            assert!(acked.intakes.is_empty(), "crash {crash_at}: unreadable image after acknowledgements");
            continue;
        };
        // Restart exactly as `serve` does: open the store (creating missing tables), then
        // look for every acknowledged write.
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        let (store, guard) = Store::start(db, PathBuf::from("reopened")).unwrap();
        runtime.block_on(async {
            for id in &acked.intakes {
                assert!(store.get(*id).await.unwrap().is_some(), "crash {crash_at}: acknowledged intake {id} lost");
            }
            for id in &acked.commits {
                let record = store.get(*id).await.unwrap().unwrap();
                assert_eq!(record.state.name().as_str(), "committed", "crash {crash_at}: acknowledged commit lost");
                assert_eq!(store.findings(*id).await.unwrap().unwrap().len(), 1);
                let ledger = store.extraction_ledger(*id).await.unwrap().unwrap();
                assert_eq!(ledger.len(), 1, "crash {crash_at}: one ledger entry per acknowledged commit");
                assert_eq!(ledger[0].cost_micros, 7);
            }
        });
        drop(store);
        guard.join();
        let image = disk.0.written.lock().unwrap().clone();
        let (mut db, _) = reopen(image).unwrap();
        let report = verify_database(&mut db).unwrap();
        assert!(report.is_ok(), "crash at sync {crash_at}:\n{report}");
        assert!(report.outbox_events >= acked.commits.len() as u64, "crash at sync {crash_at}: an event per commit");
    }
    assert!(crash_points >= 5, "only {crash_points} crash points were exercised");
}

/// The synced image of a disk, opened as a restarted process would; whether `provider`
/// is paused there.
fn paused_after_power_loss(image: Vec<u8>, provider: &str) -> bool {
    let (db, _) = reopen(image).expect("the synced image opens");
    let (store, guard) = Store::start(db, PathBuf::from("reopened")).unwrap();
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let paused = runtime.block_on(store.provider_paused(provider.to_string())).unwrap();
    drop(store);
    guard.join();
    paused
}

#[test]
fn a_write_left_unflushed_is_visible_at_once_and_durable_only_after_a_flush() {
    let disk = SimDisk(Arc::new(Disk::default()));
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let db = Database::builder().create_with_backend(disk.clone()).unwrap();
    let (store, guard) = Store::start(db, PathBuf::from("simulated")).unwrap();
    let pause = |t: &mut super::write_tables::WriteTables<'_>| {
        t.meta.insert(format!("{}sim", super::tables::META_PAUSE_PREFIX).as_str(), 1)?;
        Ok(((), true))
    };
    runtime.block_on(async {
        store.writer.write_flushed(super::Flush::Later, pause).await.unwrap();
        assert!(store.provider_paused("sim".into()).await.unwrap(), "an unflushed commit is visible to readers");
    });
    let before_flush = disk.0.synced.lock().unwrap().clone();
    let syncs = disk.0.syncs.load(Ordering::SeqCst);
    runtime.block_on(store.flush()).unwrap();
    assert!(disk.0.syncs.load(Ordering::SeqCst) > syncs, "a flush syncs the disk");
    let after_flush = disk.0.synced.lock().unwrap().clone();
    drop(store);
    guard.join();
    assert!(!paused_after_power_loss(before_flush, "sim"), "power lost before the flush takes the write back");
    assert!(paused_after_power_loss(after_flush, "sim"), "the flush put the earlier write on disk");
}
