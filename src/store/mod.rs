//! The commit point: one redb file, one writer thread, group commit.
//!
//! `store` is the only module that touches redb. Writes are closures sent to a single
//! writer thread, which batches every job waiting in its queue into one write
//! transaction, commits it with `Durability::Immediate`, and only then answers each
//! caller. Reads run on the blocking pool. No redb call runs on a tokio worker.

mod backup;
mod batches;
mod cancel;
#[cfg(test)]
mod cancel_tests;
pub(crate) mod codec;
mod commit_index;
mod compact;
mod drivers;
mod dump;
mod erase;
mod erase_refs;
mod erase_rules;
#[cfg(test)]
mod erase_tests;
mod export;
#[cfg(test)]
mod export_tests;
mod intent_rules;
mod keys;
mod ledger;
mod member_rules;
mod migrate;
mod migrate_compare;
mod ops;
mod outbox;
mod pending_queue;
#[cfg(test)]
mod pending_queue_tests;
mod policies;
pub mod postgres;
#[cfg(test)]
mod power_loss;
mod read;
mod records;
mod retention;
mod retention_rules;
pub mod seam;
mod split;
mod staged;
mod state_counts;
#[cfg(test)]
mod state_counts_tests;
mod tables;
mod verify;
mod write_tables;
mod writer;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use redb::{Database, ReadableDatabase};

pub use backup::BackupReport;
pub use batches::{CloseReport, IngestLine, Leftover, ReadyItem, StageReport};
pub use cancel::{CancelOutcome, RETRY_CHUNK, RetryFilter};
pub use compact::{CompactReport, compact_file};
pub use drivers::{ProviderDriver, this_instance};
pub use dump::dump_file;
pub use erase::ErasureReport;
pub use export::{ExportFilter, Exported};
pub use intent_rules::{IntentOutcome, IntentRequest, WorkFilter};
pub use ledger::{Charge, store_day_ms};
pub use member_rules::MemberRules;
pub use migrate::{MigrateError, MigrateProgress, MigrateReport, migrate_store};
pub use migrate_compare::Comparison;
pub use ops::{
    Authority, ClaimRequest, DeliveryOutcome, EncodedFinding, Grant, IntakeOutcome, Judged, PostOutcome, PostResult,
    RetryOutcome, Submission,
};
pub use outbox::{DeliveryReport, OutboxFilter};
pub use policies::{Policies, Pricing, ProviderReportedOnly};
pub use read::{ListFilter, ListPage, StateCount};
#[cfg(feature = "fuzzing")] // only the fuzz entry points decode it from outside the store
pub(crate) use records::StoredContent;
pub use records::{
    BatchRecord, BatchState, ChargeKind, CostSource, DeliveryState, ExtractionRecord, Fence, FindingRecord,
    LedgerRecord, NewExtraction, OutboxKind, OutboxRecord, ResultRecord,
};
pub use retention_rules::{RetentionPolicy, RetentionStep};
pub use seam::{Backend, SharedStore};
pub use staged::StagedAnswer;
pub use tables::{RETIRED_CONTENT, RETIRED_RAW_RESULT};
pub use verify::{Report, verify_file};
pub use writer::{Flush, WriterGuard, chain as error_chain};

pub const FILE_NAME: &str = "commitpoint.redb";

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{path}: cannot open the database")]
    Open {
        path: PathBuf,
        #[source]
        source: redb::DatabaseError,
    },
    #[error("{path}: cannot create the data directory")]
    CreateDir {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("storage failure")]
    Storage(#[source] redb::Error),
    #[error("stored {kind} value is unreadable: {reason}")]
    Corrupt { kind: &'static str, reason: String },
    #[error("cannot encode {kind} value: {reason}")]
    Encode { kind: &'static str, reason: String },
    #[error("PostgreSQL: {context}")]
    Postgres {
        context: &'static str,
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    #[error("{operation} is not available on the {backend} store: {hint}")]
    NotOnBackend { operation: &'static str, backend: &'static str, hint: &'static str },
    #[error(
        "the database schema is at version {found}, newer than this build knows ({known}): \
         run the commitpoint version that migrated it"
    )]
    SchemaTooNew { found: i64, known: i64 },
    #[error(
        "the database schema is at version {found}, older than this build's ({known}): start this build's \
         `serve` on it once to migrate it, or use the commitpoint version that wrote it"
    )]
    SchemaTooOld { found: i64, known: i64 },
    #[error("the database holds no commitpoint schema (no refinery_schema_history table): is the URL right?")]
    NoSchema,
    #[error("the store is not accepting writes: {reason}")]
    Unavailable {
        reason: String,
        /// What made it so, kept for the log.
        #[source]
        cause: Option<Arc<Error>>,
    },
}

impl Error {
    /// An I/O or redb failure after which the writer refuses further writes until restart.
    pub fn is_fatal(&self) -> bool {
        matches!(self, Error::Storage(_))
    }

    pub fn is_corruption(&self) -> bool {
        matches!(self, Error::Corrupt { .. })
    }
}

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
    redb::StorageError,
    redb::TableError,
    redb::TransactionError,
    redb::CommitError,
    redb::SetDurabilityError
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
            .map_err(|source| Error::Open { path: path.clone(), source })?;
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
        let next = Arc::new(policies);
        match self.policies.write() {
            Ok(mut current) => *current = next,
            Err(poisoned) => *poisoned.into_inner() = next,
        }
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
        F: FnOnce(&redb::ReadTransaction) -> Result<R, Error>,
    {
        let txn = self.db.begin_read()?;
        f(&txn)
    }

    /// Runs a read-only closure on the blocking pool against one consistent snapshot.
    async fn read<R, F>(&self, f: F) -> Result<R, Error>
    where
        R: Send + 'static,
        F: FnOnce(&redb::ReadTransaction) -> Result<R, Error> + Send + 'static,
    {
        let db = Arc::clone(&self.db);
        tokio::task::spawn_blocking(move || {
            let txn = db.begin_read()?;
            f(&txn)
        })
        .await
        .map_err(|e| Error::Unavailable { reason: format!("read task failed: {e}"), cause: None })?
    }
}
