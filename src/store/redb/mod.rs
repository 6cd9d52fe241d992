//! The redb backend: one file, one writer thread, group commit.
//!
//! This is the only module that imports redb. Writes are closures sent to a single
//! writer thread, which batches every job waiting in its queue into one write
//! transaction, commits it with `Durability::Immediate`, and only then answers each
//! caller. Reads run on the blocking pool, point reads on the caller's thread. No redb
//! call runs on a tokio worker.

mod backup;
mod batch_reads;
mod batches;
mod cancel;
#[cfg(test)]
mod cancel_tests;
mod commit_index;
mod compact;
mod drivers;
mod dump;
mod erase;
mod erase_refs;
#[cfg(test)]
mod erase_tests;
mod evaluations;
mod export;
#[cfg(test)]
mod export_tests;
mod extractions;
mod keys;
mod ledger;
mod migrate;
mod outbox;
mod pending_queue;
#[cfg(test)]
mod pending_queue_tests;
#[cfg(test)]
mod power_loss;
mod reads;
mod reservations;
#[cfg(test)]
mod reservations_tests;
mod retention;
mod revisions;
#[cfg(test)]
mod revisions_tests;
mod split;
mod staging;
#[cfg(test)]
mod staging_tests;
mod state_counts;
#[cfg(test)]
mod state_counts_tests;
mod tables;
mod tenant_counts;
#[cfg(test)]
mod tenant_counts_tests;
mod upkeep;
mod verify;
mod write_tables;
mod writer;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use ::redb::{Database, ReadableDatabase};

#[allow(unused_imports)] // the backend's files name the neutral store's items through `super::`
use super::*;

pub use compact::{CompactReport, compact_file};

pub use dump::dump_file;
pub use migrate::{MigrateError, MigrateProgress, MigrateReport, migrate_store};
pub use verify::verify_file;
pub use writer::WriterGuard;

pub const FILE_NAME: &str = "commitpoint.redb";

macro_rules! storage_from {
    ($($ty:ty),*) => {$(
        impl From<$ty> for Error {
            fn from(e: $ty) -> Self {
                Error::Storage(e.into())
            }
        }
    )*};
}
storage_from!(
    ::redb::StorageError,
    ::redb::TableError,
    ::redb::TransactionError,
    ::redb::CommitError,
    ::redb::SetDurabilityError
);

/// A cheap, cloneable handle on the store.
#[derive(Debug, Clone)]
pub struct Store {
    db: Arc<Database>,
    writer: writer::WriterHandle,
    path: PathBuf,
    policies: writer::PolicyCell,
    cursor_key: crate::domain::cursor::CursorKey,
}

impl Store {
    /// Opens (or creates) `DIR/commitpoint.redb` and starts the writer thread. The guard
    /// must outlive every handle; `WriterGuard::join` waits for the last write to land.
    /// `cache_bytes` caps redb's page cache (its default, 1 GiB, lets memory grow with
    /// every page a large ingestion touches).
    pub fn open(data_dir: &Path, cache_bytes: usize) -> Result<(Store, WriterGuard), Error> {
        std::fs::create_dir_all(data_dir)
            .map_err(|source| Error::CreateDir { path: data_dir.to_path_buf(), source })?;
        let path = data_dir.join(FILE_NAME);
        let db = Database::builder()
            .set_cache_size(cache_bytes)
            .create(&path)
            .map_err(|source| Error::Open { path: path.clone(), source: source.into() })?;
        Self::start(db, path)
    }

    /// Starts the writer over an already opened database (tests use simulated disks).
    pub(crate) fn start(db: Database, path: PathBuf) -> Result<(Store, WriterGuard), Error> {
        let db = Arc::new(db);
        let next_seq = writer::initialize(&db)?;
        let cursor_key = keys::cursor_key(&db)?;
        let policies: writer::PolicyCell = Arc::default();
        let (writer, guard) = writer::spawn(Arc::clone(&db), next_seq, Arc::clone(&policies))?;
        Ok((Store { db, writer, path, policies, cursor_key }, guard))
    }

    /// Changes with every commit of this store. Every change to the file passes through
    /// this process's writer, so waiting on it misses nothing.
    pub fn commits(&self) -> tokio::sync::watch::Receiver<u64> {
        self.writer.commits()
    }

    /// The key page cursors are sealed with (see `crate::domain::cursor`).
    pub fn cursor_key(&self) -> &crate::domain::cursor::CursorKey {
        &self.cursor_key
    }

    /// Sets the outbox sinks and the pricing used from the next write on. Events already
    /// queued keep their sinks; entries already written keep their costs.
    pub fn set_policies(&self, policies: Policies) {
        crate::store::policies::replace(&self.policies, policies);
    }

    fn current_policies(&self) -> Arc<Policies> {
        crate::store::policies::current(&self.policies)
    }

    /// Waits until this is the only handle on the database, so that dropping it closes the
    /// file. `false` if other handles remain after `deadline`.
    pub async fn wait_until_last_handle(self, deadline: std::time::Duration) -> bool {
        let until = tokio::time::Instant::now() + deadline;
        while Arc::strong_count(&self.db) > 1 {
            if tokio::time::Instant::now() >= until {
                return false;
            }
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        true
    }

    /// Runs a point read (a key or two, a few B-tree pages) on the caller's thread. It
    /// takes microseconds, less than handing it to the blocking pool and waking a thread
    /// for it, which cost about 40 % of the server's CPU at 128 concurrent intakes
    /// (docs/PERFORMANCE.md). Pages the cache lacks come from the OS page cache; a cold
    /// file can make the first reads wait for the disk, which is why only point reads
    /// come here.
    fn read_point<R, F>(&self, f: F) -> Result<R, Error>
    where
        F: FnOnce(&::redb::ReadTransaction) -> Result<R, Error>,
    {
        let txn = self.db.begin_read()?;
        f(&txn)
    }

    /// Runs a read-only closure on the blocking pool against one consistent snapshot.
    async fn read<R, F>(&self, f: F) -> Result<R, Error>
    where
        R: Send + 'static,
        F: FnOnce(&::redb::ReadTransaction) -> Result<R, Error> + Send + 'static,
    {
        let db = Arc::clone(&self.db);
        tokio::task::spawn_blocking(move || {
            let txn = db.begin_read()?;
            f(&txn)
        })
        .await
        .map_err(|e| Error::task("read", e))?
    }
}

impl Backend for Store {
    fn cursor_key(&self) -> &crate::domain::cursor::CursorKey {
        Store::cursor_key(self)
    }

    fn file_size(&self) -> Option<u64> {
        Store::file_size(self)
    }

    fn backend_name(&self) -> &'static str {
        "redb"
    }

    fn commits(&self) -> Option<tokio::sync::watch::Receiver<u64>> {
        Some(Store::commits(self))
    }
}
