//! Shrinking a submit intent the provider cannot take in one job (over its file size or
//! request count). Only an intent that never reached the provider is shrunk: the refusal
//! came before any job existed, so its batch key was never sent and stays the intent's.

use super::batches::{load_batch, save_batch};
use super::extractions::transition;
use super::records::BatchState;
use super::write_tables::WriteTables;
use super::{Error, Store};
use crate::domain::lifecycle::{self, Event, Outcome, State};

impl Store {
    /// Keeps the first `keep` members of an intent (at least one) and returns the rest to
    /// the queue as the same attempt: none of them was ever sent. Returns how many went back.
    pub async fn shrink_intent(&self, batch: u64, keep: usize) -> Result<u64, Error> {
        self.writer.write(move |t| shrink_intent(t, batch, keep.max(1))).await
    }
}

fn shrink_intent(t: &mut WriteTables<'_>, batch: u64, keep: usize) -> Result<(u64, bool), Error> {
    let mut record = load_batch(t, batch)?;
    if !matches!(record.state, BatchState::Intent) || record.members.len() <= keep {
        return Ok((0, false));
    }
    let excess = record.members.split_off(keep);
    let mut returned = 0;
    for seq in excess {
        let Some(mut member) = super::batches::load_member(t, seq)? else { continue };
        if !matches!(&member.state, State::Submitted { batch_key, .. } if *batch_key == record.batch_key) {
            continue;
        }
        let event = Event::Requeue { batch_key: record.batch_key.clone() };
        if let Ok(Outcome::Changed(next)) = lifecycle::apply(&member.state, event, t.now_ms) {
            transition(t, &mut member, next)?;
            returned += 1;
        }
    }
    record.next_action_at_ms = t.now_ms;
    record.updated_at_ms = t.now_ms;
    save_batch(t, &record)?;
    Ok((returned, true))
}
