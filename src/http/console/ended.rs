//! Sessions ended before their time. A session is a signed cookie, valid on its own until
//! it expires, so ending one needs state here: a logout records the session's id until the
//! cookie would have expired anyway, and the epoch (random per process, part of the
//! signing key) ends every session at once. Nothing of this is persisted, so the epoch
//! changes at every start: a restart ends all sessions, and no logged-out cookie comes
//! back to life with a forgotten list. Rotated tokens end sessions through the key too
//! (`session.rs`).

use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};

/// Ids kept at most; past it every session is ended (a new epoch) rather than any kept
/// alive, and the list starts empty. Only holders of a token can log out, so this is a
/// bound for a hostile one, not a limit an operator meets.
const MAX_ENDED: usize = 100_000;

#[derive(Debug)]
pub(super) struct Ended {
    inner: Mutex<Inner>,
}

#[derive(Debug)]
struct Inner {
    epoch: [u8; 16],
    /// Session id → when its cookie expires (ms), after which it needs no entry.
    ids: HashMap<String, u64>,
}

impl Default for Ended {
    fn default() -> Self {
        Self { inner: Mutex::new(Inner { epoch: rand::random(), ids: HashMap::new() }) }
    }
}

impl Ended {
    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    pub(super) fn epoch(&self) -> [u8; 16] {
        self.lock().epoch
    }

    pub(super) fn contains(&self, id: &str) -> bool {
        self.lock().ids.contains_key(id)
    }

    /// Ends session `id`, whose cookie expires at `expires_ms`.
    pub(super) fn end(&self, id: &str, expires_ms: u64, now_ms: u64) {
        let mut inner = self.lock();
        if inner.ids.len() >= MAX_ENDED {
            inner.ids.retain(|_, expires| *expires > now_ms);
        }
        if inner.ids.len() >= MAX_ENDED {
            inner.epoch = rand::random();
            inner.ids.clear();
            tracing::warn!(max = MAX_ENDED, "too many logged-out sessions to track: every console session ended");
            return;
        }
        inner.ids.insert(id.to_string(), expires_ms);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_ended_id_stays_ended_and_the_list_is_bounded() {
        let ended = Ended::default();
        let epoch = ended.epoch();
        ended.end("a", 10, 0);
        assert!(ended.contains("a") && !ended.contains("b"));
        for i in 0..MAX_ENDED {
            ended.end(&i.to_string(), 5, 0);
        }
        assert!(ended.epoch() != epoch, "past the bound every session ends");
        assert!(!ended.contains("a"));
    }
}
