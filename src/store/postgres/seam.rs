//! The seam traits for [`PgStore`]. What PostgreSQL never does through commitpoint
//! (`backup`) answers a typed `NotOnBackend` error naming the operation and what to use
//! instead, never a panic or a silent nothing.

use super::PgStore;
use crate::domain::cursor::CursorKey;
use crate::store::seam::Backend;

impl Backend for PgStore {
    fn cursor_key(&self) -> &CursorKey {
        PgStore::cursor_key(self)
    }

    fn file_size(&self) -> Option<u64> {
        None
    }

    fn backend_name(&self) -> &'static str {
        "postgres"
    }

    /// Other instances commit to the same database unseen.
    fn commits(&self) -> Option<tokio::sync::watch::Receiver<u64>> {
        None
    }
}
