//! Shrinking a submit intent the provider cannot take in one job (over its file size or
//! request count): `rules::close::shrink` decides, this writes it.

use super::batches::{apply_moves, load_batch, load_members, save_batch};
use super::rules::close;
use super::{Error, Store};

impl Store {
    /// Keeps the first `keep` members of an intent (at least one) and returns the rest to
    /// the queue as the same attempt: none of them was ever sent. Returns how many went back.
    pub async fn shrink_intent(&self, batch: u64, keep: usize) -> Result<u64, Error> {
        self.writer
            .write(move |t| {
                let record = load_batch(t, batch)?;
                let excess = load_members(t, close::to_shrink(&record, keep))?;
                let Some(shrinking) = close::shrink(&record, keep, excess, t.now_ms) else {
                    return Ok((0, false));
                };
                let returned = shrinking.moves.len() as u64;
                apply_moves(t, shrinking.moves)?;
                save_batch(t, &shrinking.batch)?;
                Ok((returned, true))
            })
            .await
    }
}
