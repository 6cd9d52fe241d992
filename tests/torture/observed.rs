//! What the test saw happen besides intake acknowledgements, for the checks at the end:
//! every result the worker sent (with the ledger entry each one must have produced),
//! every failed attempt it saw, and every signed webhook delivery it made.

use std::collections::BTreeMap;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex, MutexGuard};

use crate::workload::Source;

/// The kind of a ledger entry, as the API names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Kind {
    Fresh,
    Replay,
    FailedValidation,
}

impl Kind {
    pub fn parse(text: &str) -> Kind {
        match text {
            "fresh" => Kind::Fresh,
            "replay" => Kind::Replay,
            "failed_validation" => Kind::FailedValidation,
            other => panic!("unknown ledger entry kind {other:?}"),
        }
    }

    /// Fresh work and validation failures cost money; replays never do.
    pub fn charged(self) -> bool {
        self != Kind::Replay
    }
}

/// One POST of a result by the worker. Each carries its own `request_id` in its usage, so
/// the entry it wrote can be found; `call` groups the sends of one model answer (a resend
/// after a lost answer, or the deliberate second post of the same answer).
#[derive(Debug, Clone)]
pub struct WorkerSend {
    pub request_id: String,
    pub call: u64,
    pub extraction_id: String,
    pub input_tokens: u64,
    pub output_tokens: u64,
    /// `None`: the answer was lost to a kill, so zero or one entry. `Some`: exactly this one.
    pub expect: Option<Kind>,
    /// The answer, for failure messages.
    pub answer: String,
}

/// An attempt seen failed: listed as failed, or answered 422 to the worker.
#[derive(Debug, Clone)]
pub struct FailedSeen {
    pub id: String,
    pub attempt: u64,
    pub class: String,
}

/// One answer to a signed webhook delivery.
#[derive(Debug, Clone)]
pub struct HookAnswer {
    pub status: u16,
    pub created: bool,
    pub redelivery: bool,
    pub extraction_id: String,
}

/// Everything sent under one delivery id: always the same body.
#[derive(Debug)]
pub struct HookDelivery {
    pub source: Arc<Source>,
    pub body: Vec<u8>,
    pub sends: u32,
    pub lost: u32,
    pub answers: Vec<HookAnswer>,
}

#[derive(Debug, Default)]
pub struct Observed {
    sends: Mutex<Vec<WorkerSend>>,
    failures: Mutex<Vec<FailedSeen>>,
    hooks: Mutex<BTreeMap<String, HookDelivery>>,
    /// Numbers the worker's model calls.
    pub calls: AtomicU64,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Observed {
    pub fn sends(&self) -> MutexGuard<'_, Vec<WorkerSend>> {
        lock(&self.sends)
    }

    pub fn failures(&self) -> MutexGuard<'_, Vec<FailedSeen>> {
        lock(&self.failures)
    }

    pub fn hooks(&self) -> MutexGuard<'_, BTreeMap<String, HookDelivery>> {
        lock(&self.hooks)
    }

    pub fn failed(&self, id: &str, attempt: u64, class: &str) {
        self.failures().push(FailedSeen { id: id.to_string(), attempt, class: class.to_string() });
    }

    /// Records every `state=failed` record of a listing.
    pub fn failed_listing(&self, listing: &[serde_json::Value]) {
        for record in listing {
            let id = record["extraction_id"].as_str().expect("extraction_id");
            let attempt = record["attempts"].as_u64().expect("attempts");
            let class = record["failure_class"].as_str().expect("failure_class of a failed record");
            self.failed(id, attempt, class);
        }
    }
}
