//! The store's one error type, shared by both backends and mapped once above the seam.

use std::path::PathBuf;
use std::sync::Arc;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{path}: cannot open the database")]
    Open {
        path: PathBuf,
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    #[error("{path}: cannot create the data directory")]
    CreateDir {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The embedded database failed (an I/O error underneath, usually).
    #[error("storage failure")]
    Storage(#[source] Box<dyn std::error::Error + Send + Sync>),
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
    /// The writer refuses writes until restart: a storage failure stopped it, a group
    /// commit failed under this write, or its thread is gone.
    #[error("the store is not accepting writes: {reason}")]
    Halted {
        reason: String,
        /// What made it so, kept for the log.
        #[source]
        cause: Option<Arc<Error>>,
    },
    /// The server is stopping; the write was not made.
    #[error("commitpoint is shutting down; the write was not made")]
    Closing,
    /// Something else changed the same rows first (a PostgreSQL serialization failure or
    /// deadlock, a fence that moved under a lock, an aborted group): nothing was written,
    /// and the same call may simply be made again.
    #[error("a concurrent change got there first ({reason}); nothing was written, retry")]
    Conflict {
        reason: String,
        #[source]
        cause: Option<Box<Error>>,
    },
    /// A backup (or another file the store creates) would replace an existing file.
    #[error("{path}: already exists; choose a new name")]
    TargetExists { path: PathBuf },
    /// A file the store reads or writes beside its database failed.
    #[error("{path}: cannot {what}")]
    Io {
        path: PathBuf,
        what: &'static str,
        #[source]
        source: std::io::Error,
    },
    /// Work handed to another thread ended without an answer (it panicked or the runtime
    /// is stopping).
    #[error("a store task ended without an answer: {what}: {reason}")]
    Task { what: &'static str, reason: String },
    /// The PostgreSQL database holds a `migrate-store` copy that never passed its checks.
    #[error(
        "this database holds a migrate-store copy that was never verified (the migration failed or was \
         interrupted): drop it, create an empty database and run migrate-store again"
    )]
    UnverifiedCopy,
    /// A batch write of a provider's driver after its term ended: another instance may
    /// drive the provider now, so the write was refused and nothing of it is stored.
    #[error(
        "this instance no longer drives provider {provider}'s batches (its lease lapsed or another instance took over)"
    )]
    NotDriving { provider: String },
}

impl Error {
    /// An I/O or redb failure after which the writer refuses further writes until restart.
    pub fn is_fatal(&self) -> bool {
        matches!(self, Error::Storage(_))
    }

    /// Whether the same call may be made again as it is: nothing was written.
    pub fn is_conflict(&self) -> bool {
        matches!(self, Error::Conflict { .. })
    }

    /// A blocking task that ended without answering.
    pub(crate) fn task(what: &'static str, e: impl std::fmt::Display) -> Error {
        Error::Task { what, reason: e.to_string() }
    }

    pub fn is_corruption(&self) -> bool {
        matches!(self, Error::Corrupt { .. })
    }
}

/// An error and its causes, for the log: `Display` of a `thiserror` type shows only the
/// outermost message.
pub fn chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}
