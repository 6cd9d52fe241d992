//! A message batch's life, computed from elapsed time at each read (nothing runs in the
//! background): `in_progress` for `complete_after`, then `ended`; a cancel goes
//! `canceling` for the timeline's cancel delay, then `ended` with `canceled` lines for the
//! requests not yet run; `expire_batches` ends it with about half the requests `expired`.
//! Timestamps derive from the creation time and fixed offsets, never from poll times.

use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use bytes::Bytes;

use super::results::{self, Plan, Unfinished};
use super::wire::{MessageBatch, ProcessingStatus, Request, RequestCounts};
use crate::simulator::faults::Faults;
use crate::simulator::state::Inner;

/// Requests can be processed for up to 24 hours.
pub(super) const EXPIRY: Duration = Duration::from_secs(24 * 3600);

#[derive(Clone, Debug)]
pub(crate) struct Record {
    pub view: MessageBatch,
    created: Instant,
    created_wall: SystemTime,
    requests: Arc<Vec<Request>>,
    /// Snapshot at creation: later fault changes never rewrite a submitted batch.
    faults: Faults,
    cancel: Option<Cancel>,
    /// The results JSONL, written once at the end.
    pub results: Option<Bytes>,
}

#[derive(Clone, Copy, Debug)]
struct Cancel {
    at: Instant,
    at_wall: SystemTime,
    done: usize,
}

pub(super) fn rfc3339(at: SystemTime) -> String {
    humantime::format_rfc3339_micros(at).to_string()
}

impl Record {
    pub(crate) fn new(
        id: String,
        created: Instant,
        created_wall: SystemTime,
        requests: Vec<Request>,
        faults: Faults,
    ) -> Self {
        let view = MessageBatch {
            id,
            kind: "message_batch".to_string(),
            processing_status: ProcessingStatus::InProgress,
            request_counts: RequestCounts { processing: count(requests.len()), ..RequestCounts::default() },
            ended_at: None,
            created_at: rfc3339(created_wall),
            expires_at: rfc3339(created_wall + EXPIRY),
            archived_at: None,
            cancel_initiated_at: None,
            results_url: None,
        };
        Self { view, created, created_wall, requests: Arc::new(requests), faults, cancel: None, results: None }
    }

    pub(crate) fn custom_ids(&self) -> Vec<String> {
        self.requests.iter().map(|r| r.custom_id.clone()).collect()
    }

    fn total(&self) -> usize {
        self.requests.len()
    }

    /// How many requests run before the end: all, or about half when expiring.
    fn reachable(&self) -> usize {
        if self.faults.expire_batches { self.total() / 2 } else { self.total() }
    }

    /// Requests run after `elapsed`, growing linearly until `complete_after`.
    fn done_at(&self, elapsed: Duration, complete_after: Duration) -> usize {
        if complete_after.is_zero() || elapsed >= complete_after {
            return self.reachable();
        }
        let fraction = elapsed.as_secs_f64() / complete_after.as_secs_f64();
        // Truncation is the intent: a request is done only once fully answered.
        #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss, clippy::cast_precision_loss)]
        let done = (fraction * self.reachable() as f64) as usize;
        done.min(self.reachable())
    }

    pub(crate) fn advance(&mut self, now: Instant, inner: &mut Inner, origin: &str) {
        if self.view.processing_status == ProcessingStatus::Ended {
            return;
        }
        let timeline = inner.timeline;
        if let Some(cancel) = self.cancel {
            if now.saturating_duration_since(cancel.at) >= timeline.cancel_delay() {
                let ended = cancel.at_wall + timeline.cancel_delay();
                self.end(cancel.done, Unfinished::Canceled, ended, inner, origin);
            }
            return;
        }
        let complete_after = timeline.complete_after();
        if now.saturating_duration_since(self.created) >= complete_after {
            let ended = self.created_wall + complete_after;
            self.end(self.reachable(), Unfinished::Expired, ended, inner, origin);
        }
    }

    /// Call after `advance` to `now`. Canceling twice is harmless; an ended batch cannot be.
    pub(crate) fn cancel(
        &mut self,
        now: Instant,
        now_wall: SystemTime,
        complete_after: Duration,
    ) -> Result<(), String> {
        match self.view.processing_status {
            ProcessingStatus::Canceling => Ok(()),
            ProcessingStatus::Ended => Err(format!("Batch {} has already ended and cannot be canceled.", self.view.id)),
            ProcessingStatus::InProgress => {
                let done = self.done_at(now.saturating_duration_since(self.created), complete_after);
                self.view.processing_status = ProcessingStatus::Canceling;
                self.view.cancel_initiated_at = Some(rfc3339(now_wall));
                self.cancel = Some(Cancel { at: now, at_wall: now_wall, done });
                Ok(())
            }
        }
    }

    fn end(&mut self, done: usize, unfinished: Unfinished, ended: SystemTime, inner: &mut Inner, origin: &str) {
        let generated = results::generate(
            &Plan {
                batch_id: &self.view.id,
                requests: &self.requests,
                done,
                unfinished,
                faults: &self.faults,
                seed: inner.seed,
            },
            &mut inner.attempts,
        );
        let counts = generated.counts;
        inner.stats.lines_completed += counts.succeeded;
        inner.stats.lines_truncated += generated.truncated;
        inner.stats.lines_refused += generated.refused;
        inner.stats.lines_failed += counts.errored + counts.canceled + counts.expired;
        self.results = Some(generated.jsonl.into());
        self.view.processing_status = ProcessingStatus::Ended;
        self.view.ended_at = Some(rfc3339(ended));
        self.view.results_url = Some(format!("{origin}/v1/messages/batches/{}/results", self.view.id));
        tracing::info!(
            batch = %self.view.id,
            succeeded = counts.succeeded,
            errored = counts.errored,
            canceled = counts.canceled,
            expired = counts.expired,
            "SIMULATED provider: message batch ended"
        );
        self.view.request_counts = counts;
        inner.batch_went_terminal(&self.custom_ids());
    }
}

/// Brings every message batch up to `now`, so listings and liveness counts are exact.
pub(super) fn advance_all(inner: &mut Inner, now: Instant, origin: &str) {
    let mut batches = std::mem::take(&mut inner.message_batches);
    for batch in &mut batches {
        batch.advance(now, inner, origin);
    }
    inner.message_batches = batches;
}

/// Advances one batch by id and returns a copy of its wire view.
pub(super) fn advance_one(inner: &mut Inner, id: &str, now: Instant, origin: &str) -> Option<MessageBatch> {
    let index = inner.message_batches.iter().position(|b| b.view.id == id)?;
    let mut batches = std::mem::take(&mut inner.message_batches);
    let view = batches.get_mut(index).map(|batch| {
        batch.advance(now, inner, origin);
        batch.view.clone()
    });
    inner.message_batches = batches;
    view
}

fn count(n: usize) -> u64 {
    u64::try_from(n).unwrap_or(u64::MAX)
}
