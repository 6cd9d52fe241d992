//! The seam between the store and the layers above it: the reads and writes the service
//! and the engine need, as one trait per concern (each in the file of its name, with the
//! types it passes), implemented by both backends, `redb::Store` and `postgres::PgStore`.
//!
//! The traits are `async_trait`s, so they stay usable as `dyn` objects (a backend chosen
//! at start, not at compile time); each backend implements them directly, in the file of
//! the same name.

use std::collections::HashMap;
use std::future::Future;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::Arc;

use super::*;
use crate::domain::batch::{BatchMember, LineResult};
use crate::domain::cursor::CursorKey;
use crate::domain::identity::ExtractionId;
use crate::domain::lifecycle::{FailureClass, State, StateName, TransitionError};
use crate::domain::names::{BatchKey, LeaseToken};
use crate::domain::schema::{ValidatedFinding, ValidationIssue};

/// What every seam method returns: the store's answer, once it is durable for a write.
pub type StoreFuture<'a, T> = Pin<Box<dyn Future<Output = Result<T, Error>> + Send + 'a>>;

/// Visits ledger entries one at a time, so a report over a long period needs no list.
pub type LedgerVisitor = Box<dyn FnMut(LedgerRecord) + Send + 'static>;

/// Takes exported extractions one at a time on a blocking thread (it may block to pass
/// them on); `None` marks the end of a complete walk. Returning `false` stops the walk.
pub type ExportSink = Box<dyn FnMut(Option<Exported>) -> bool + Send + 'static>;

mod batches;
mod drivers;
mod evaluations;
mod extractions;
mod ledger;
mod outbox;
mod revisions;
mod upkeep;

pub use batches::*;
pub use drivers::*;
pub use evaluations::*;
pub use extractions::*;
pub use ledger::*;
pub use outbox::*;
pub use revisions::*;
pub use upkeep::*;

/// Everything the layers above need from a store backend.
pub trait Backend: Extractions + Batches + Ledger + Outbox + Upkeep + Revisions + Evaluations + Drivers {
    /// The key list cursors are sealed with; the same for every reader of this store.
    fn cursor_key(&self) -> &CursorKey;
    /// The size of the store's file, where it has one.
    fn file_size(&self) -> Option<u64>;
    /// `redb` or `postgres`, as `[store] backend` names it.
    fn backend_name(&self) -> &'static str;
    /// Changes with every commit, where this process sees every commit (redb: the file
    /// is locked to one process); `None` where other processes write too.
    fn commits(&self) -> Option<tokio::sync::watch::Receiver<u64>>;
}

/// The store as the service and the engine hold it.
pub type SharedStore = Arc<dyn Backend>;
