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
