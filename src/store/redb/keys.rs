//! Secrets the store keeps for itself: today the key behind page cursors. It lives in
//! `META` (as four u64 words) so cursors survive restarts and a restored backup, and it
//! never leaves the process except inside the file.

use redb::{Database, Durability, ReadableTable};

use super::Error;
use super::tables::META;
use crate::domain::cursor::CursorKey;

const CURSOR_KEY_WORDS: [&str; 4] = ["cursor_key:0", "cursor_key:1", "cursor_key:2", "cursor_key:3"];

/// The store's cursor key, made (randomly) the first time a store without one opens.
pub(super) fn cursor_key(db: &Database) -> Result<CursorKey, Error> {
    let mut txn = db.begin_write()?;
    txn.set_durability(Durability::Immediate)?;
    let mut words = [0u64; 4];
    let created = {
        let mut meta = txn.open_table(META)?;
        let mut found = true;
        for (word, name) in words.iter_mut().zip(CURSOR_KEY_WORDS) {
            match meta.get(name)?.map(|v| v.value()) {
                Some(v) => *word = v,
                None => found = false,
            }
        }
        if !found {
            for (word, name) in words.iter_mut().zip(CURSOR_KEY_WORDS) {
                *word = rand::random();
                meta.insert(name, *word)?;
            }
        }
        !found
    };
    if created {
        txn.commit()?;
    } else {
        txn.abort()?;
    }
    let mut bytes = [0u8; 32];
    for (chunk, word) in bytes.chunks_exact_mut(8).zip(words) {
        chunk.copy_from_slice(&word.to_le_bytes());
    }
    Ok(CursorKey::new(bytes))
}

/// The cursor key as `META` holds it, if it was ever made (read-only: `migrate-store`
/// copies it so cursors and console sessions stay valid on the new store).
pub(super) fn stored_cursor_key(meta: &impl ReadableTable<&'static str, u64>) -> Result<Option<[u8; 32]>, Error> {
    let mut bytes = [0u8; 32];
    for (chunk, name) in bytes.chunks_exact_mut(8).zip(CURSOR_KEY_WORDS) {
        match meta.get(name)? {
            Some(word) => chunk.copy_from_slice(&word.value().to_le_bytes()),
            None => return Ok(None),
        }
    }
    Ok(Some(bytes))
}
