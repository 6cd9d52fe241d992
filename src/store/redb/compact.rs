//! Offline compaction: redb gives pages freed by deletions back to its own free list, not
//! to the file system, so after retention or an erasure the file only shrinks when it is
//! compacted. `Database::compact` needs the only handle on the database with no
//! transaction open, which a serving process never has (its writer thread and readers hold
//! the database), so compaction runs with the server stopped.

use std::path::Path;

use redb::Database;

use super::Error;
use super::Report;
use super::verify::verify_file;

#[derive(Debug)]
pub struct CompactReport {
    pub bytes_before: u64,
    pub bytes_after: u64,
    /// `verify` of the compacted file.
    pub verify: Report,
}

/// Opens the file exclusively (a running server holds it locked: `Error::Open`), compacts
/// it, closes it, and checks it.
pub fn compact_file(path: &Path) -> Result<CompactReport, Error> {
    let bytes_before = size(path)?;
    {
        let mut db =
            Database::open(path).map_err(|source| Error::Open { path: path.to_path_buf(), source: source.into() })?;
        // One call compacts what it can; a second finds pages the first one freed.
        for _ in 0..4 {
            if !db.compact().map_err(|e| Error::Storage(e.into()))? {
                break;
            }
        }
    }
    let bytes_after = size(path)?;
    let verify = verify_file(path)?;
    Ok(CompactReport { bytes_before, bytes_after, verify })
}

fn size(path: &Path) -> Result<u64, Error> {
    std::fs::metadata(path).map(|m| m.len()).map_err(|source| Error::Io {
        path: path.to_path_buf(),
        what: "read its size",
        source,
    })
}
