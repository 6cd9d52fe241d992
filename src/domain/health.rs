//! What operators see of a provider: pauses, the last error, and counters of what the
//! scheduler did. Shared between the scheduler task and the HTTP API.

use std::sync::{Arc, Mutex, MutexGuard};

use serde::Serialize;

#[derive(Debug, Clone, Default, Serialize, PartialEq, Eq)]
pub struct ProviderHealth {
    pub name: String,
    /// Set while calls (or, for budget errors, only new submissions) are paused.
    pub paused_until_ms: Option<u64>,
    pub pause_submissions_only: bool,
    pub pause_reason: Option<String>,
    /// Set by an operator (persisted): no new submissions; known jobs are still polled.
    pub operator_paused: bool,
    pub last_error: Option<String>,
    pub batches_formed: u64,
    pub batches_submitted: u64,
    /// Intents whose job was found at the provider by batch key instead of resubmitted.
    pub batches_recovered: u64,
    pub batches_closed: u64,
    pub rate_limited: u64,
    pub lines_ingested: u64,
    pub malformed_lines: u64,
    pub members_requeued: u64,
    /// Set while new submissions wait for room at the provider (a batch failed on its
    /// capacity, or failed naming no member): lifted early when one of its jobs ends.
    pub held_until_ms: Option<u64>,
    pub hold_reason: Option<String>,
    /// Set while work waits only because it is under the provider's minimum job size.
    pub waiting_for_minimum: Option<String>,
    /// Intents under the minimum bound to the provider's `min_batch_fallback` instead.
    pub batches_handed_over: u64,
    /// Failed batches whose members went back to the queue as the same attempt.
    pub batches_returned: u64,
    /// Failed batches that blamed no member: each member's attempt was counted, so a
    /// batch failing every time ends its members `attempts_exhausted`, not in a loop.
    pub batches_failed: u64,
    /// Polls answered 404 for a job we created, while it was not yet declared gone.
    pub polls_not_found: u64,
    /// Uploaded and result files deleted at the provider after ingestion.
    pub files_deleted: u64,
    /// Answers cut off at their output budget (finish_reason `length`, stop_reason `max_tokens`).
    pub truncated: u64,
    /// Truncated answers sent back once with a larger output budget.
    pub budget_retries: u64,
    /// Answers the model declined (failed `refused`).
    pub model_refusals: u64,
    /// Extractions failed `attempts_exhausted` instead of another requeue.
    pub attempts_exhausted: u64,
    /// Terms driving this provider that ended without a shutdown: the lease lapsed (the
    /// process was paused or cut off from the database) or another instance took over.
    pub driver_terms_lost: u64,
}

#[derive(Debug, Clone)]
pub struct SharedHealth(Arc<Mutex<ProviderHealth>>);

impl SharedHealth {
    pub fn new(name: &str) -> Self {
        Self(Arc::new(Mutex::new(ProviderHealth { name: name.to_string(), ..ProviderHealth::default() })))
    }

    fn lock(&self) -> MutexGuard<'_, ProviderHealth> {
        // The data is plain counters: a panic elsewhere cannot leave them inconsistent.
        self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    pub fn snapshot(&self) -> ProviderHealth {
        self.lock().clone()
    }

    pub fn update(&self, f: impl FnOnce(&mut ProviderHealth)) {
        f(&mut self.lock());
    }

    pub fn pause(&self, until_ms: u64, submissions_only: bool, reason: String) {
        self.update(|h| {
            h.paused_until_ms = Some(until_ms);
            h.pause_submissions_only = submissions_only;
            h.pause_reason = Some(reason);
        });
    }

    pub fn hold(&self, until_ms: u64, reason: String) {
        self.update(|h| {
            h.held_until_ms = Some(until_ms);
            h.hold_reason = Some(reason);
        });
    }

    /// Ends a hold early: true if one was in force.
    pub fn release_hold(&self) -> bool {
        let mut h = self.lock();
        h.hold_reason = None;
        h.held_until_ms.take().is_some()
    }

    pub fn set_operator_pause(&self, paused: bool) {
        self.update(|h| h.operator_paused = paused);
    }

    /// When the pause that applies to this kind of call ends, if one is in force. An
    /// operator's pause of submissions has no end time (`u64::MAX`): resuming wakes the loop.
    pub fn paused_until(&self, now_ms: u64, submitting: bool) -> Option<u64> {
        let h = self.lock();
        if submitting && h.operator_paused {
            return Some(u64::MAX);
        }
        let held = h.held_until_ms.filter(|until| submitting && *until > now_ms);
        let paused = h.paused_until_ms.filter(|until| *until > now_ms && (submitting || !h.pause_submissions_only));
        held.max(paused)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn budget_pause_stops_submissions_but_not_polls() {
        let health = SharedHealth::new("p");
        health.pause(1_000, true, "quota".into());
        assert_eq!(health.paused_until(500, true), Some(1_000));
        assert_eq!(health.paused_until(500, false), None);
        assert_eq!(health.paused_until(1_000, true), None, "the pause ends on time");
        health.pause(2_000, false, "401".into());
        assert_eq!(health.paused_until(500, false), Some(2_000));
    }

    #[test]
    fn a_capacity_hold_stops_submissions_until_released_or_over() {
        let health = SharedHealth::new("p");
        health.hold(1_000, "token limit".into());
        assert_eq!(health.paused_until(500, true), Some(1_000));
        assert_eq!(health.paused_until(500, false), None, "running jobs are still polled");
        assert_eq!(health.paused_until(1_000, true), None, "the hold ends on time");
        health.pause(2_000, true, "quota".into());
        assert_eq!(health.paused_until(500, true), Some(2_000), "the longer of a hold and a pause applies");
        assert!(health.release_hold());
        assert!(!health.release_hold());
        assert_eq!(health.paused_until(500, true), Some(2_000), "releasing a hold leaves a budget pause alone");
    }

    #[test]
    fn an_operator_pause_holds_submissions_until_resumed() {
        let health = SharedHealth::new("p");
        health.set_operator_pause(true);
        assert_eq!(health.paused_until(0, true), Some(u64::MAX));
        assert_eq!(health.paused_until(0, false), None, "known jobs are still polled");
        health.set_operator_pause(false);
        assert_eq!(health.paused_until(0, true), None);
    }
}
