//! Result rows that come back without their key. One third-party measurement saw error
//! rows like that; no Google source confirms or rules them out (docs/PROVIDERS.md). A row
//! nobody can name would send its member round again as unanswered, which for a paid answer
//! pays twice and for a request the model refuses (code 3) repeats it until its attempts
//! run out. But every request yields one row, so when exactly one row lacks its key and
//! exactly one submitted key has no row, that row is that key's. Anything less certain
//! stays unmatched, as before.
//!
//! Naming the missing key needs no list of keys: the adapter keeps, for each batch it
//! created, the count and the XOR of its keys (32 bytes), and a stream XORs away every
//! distinct key it sees. This lives in memory, so a batch created before a restart (or
//! found again by `find_job`) has no digest, and its unkeyed rows stay unmatched.

use std::collections::{HashSet, VecDeque};
use std::sync::Mutex;

use crate::domain::batch::LineResult;
use crate::domain::identity::ExtractionId;
use crate::providers::ResultLine;

/// Batches remembered; the oldest is forgotten first. Far more than are ever open at once.
const KEPT: usize = 4096;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Digest {
    count: usize,
    xor: [u8; 32],
}

impl Digest {
    pub(super) fn of<'a>(keys: impl IntoIterator<Item = &'a ExtractionId>) -> Self {
        let mut digest = Digest { count: 0, xor: [0; 32] };
        for key in keys {
            digest.count += 1;
            xor_into(&mut digest.xor, key);
        }
        digest
    }
}

fn xor_into(acc: &mut [u8; 32], key: &ExtractionId) {
    for (a, b) in acc.iter_mut().zip(key.as_bytes()) {
        *a ^= b;
    }
}

/// The digests of the batches this process created, by batch name.
#[derive(Debug, Default)]
pub(super) struct Submitted {
    jobs: Mutex<VecDeque<(String, Digest)>>,
}

impl Submitted {
    pub(super) fn record(&self, job: &str, digest: Digest) {
        let mut jobs = self.jobs.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if jobs.len() >= KEPT {
            jobs.pop_front();
        }
        jobs.push_back((job.to_string(), digest));
    }

    pub(super) fn digest(&self, job: &str) -> Option<Digest> {
        let jobs = self.jobs.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        jobs.iter().find(|(name, _)| name == job).map(|(_, digest)| *digest)
    }
}

/// What one stream of a batch's results saw.
#[derive(Debug)]
pub(super) struct Matcher {
    submitted: Option<Digest>,
    seen: HashSet<ExtractionId>,
    keyless: Vec<LineResult>,
}

impl Matcher {
    pub(super) fn new(submitted: Option<Digest>) -> Self {
        Self { submitted, seen: HashSet::new(), keyless: Vec::new() }
    }

    pub(super) fn saw(&mut self, key: &str) {
        if self.submitted.is_some()
            && let Ok(id) = key.parse::<ExtractionId>()
        {
            self.seen.insert(id);
        }
    }

    pub(super) fn keyless(&mut self, result: LineResult) {
        self.keyless.push(result);
    }

    /// The unkeyed row with its key when elimination names one, else every unkeyed row
    /// unmatched.
    pub(super) fn finish(mut self) -> Result<ResultLine, Vec<LineResult>> {
        let Some(submitted) = self.submitted else { return Err(self.keyless) };
        if self.keyless.len() != 1 || self.seen.len() + 1 != submitted.count {
            return Err(self.keyless);
        }
        let mut missing = submitted.xor;
        for key in &self.seen {
            xor_into(&mut missing, key);
        }
        match self.keyless.pop() {
            Some(result) => Ok((ExtractionId(missing).to_hex(), result)),
            None => Err(Vec::new()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(n: u8) -> ExtractionId {
        ExtractionId([n; 32])
    }

    fn retry() -> LineResult {
        LineResult::Retry { reason: "r".into() }
    }

    #[test]
    fn one_unkeyed_row_and_one_key_without_a_row_are_each_other() {
        let keys = [id(1), id(2), id(3)];
        let mut matcher = Matcher::new(Some(Digest::of(&keys)));
        matcher.saw(&id(3).to_hex());
        matcher.saw(&id(1).to_hex());
        matcher.saw(&id(1).to_hex());
        matcher.keyless(retry());
        let (key, _) = matcher.finish().unwrap();
        assert_eq!(key, id(2).to_hex());
    }

    #[test]
    fn anything_less_certain_stays_unmatched() {
        let keys = [id(1), id(2), id(3)];
        let mut two_missing = Matcher::new(Some(Digest::of(&keys)));
        two_missing.saw(&id(1).to_hex());
        two_missing.keyless(retry());
        assert_eq!(two_missing.finish().unwrap_err().len(), 1);
        let mut two_rows = Matcher::new(Some(Digest::of(&keys)));
        two_rows.saw(&id(1).to_hex());
        two_rows.keyless(retry());
        two_rows.keyless(retry());
        assert_eq!(two_rows.finish().unwrap_err().len(), 2);
        let mut unknown = Matcher::new(None);
        unknown.saw(&id(1).to_hex());
        unknown.saw(&id(2).to_hex());
        unknown.keyless(retry());
        assert_eq!(unknown.finish().unwrap_err().len(), 1, "no digest: another process created it");
    }

    #[test]
    fn the_oldest_batch_is_forgotten_first() {
        let submitted = Submitted::default();
        for n in 0..=KEPT {
            submitted.record(&format!("batches/{n}"), Digest::of(&[id(1)]));
        }
        assert!(submitted.digest("batches/0").is_none());
        assert!(submitted.digest(&format!("batches/{KEPT}")).is_some());
    }
}
