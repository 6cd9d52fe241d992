//! A batch's life, computed from elapsed time at each read rather than by a background
//! task: `validating → in_progress → finalizing → completed` over `complete_after`
//! (or `→ failed`, `→ expired`, `cancelling → cancelled`). Every timestamp is derived
//! from the creation time and fixed offsets, so it does not depend on when a client polls.

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::error::ApiError;
use super::faults::Faults;
use super::input::Input;
use super::output::{self, Plan};
use super::state::{DEFAULT_FILE_TTL_SECS, Inner};
use super::wire::{Batch, BatchError, BatchErrors, BatchStatus, PURPOSE_BATCH_OUTPUT, RequestCounts};

/// Cancelling lasts at most this long, as the real API promises.
const MAX_CANCEL_DELAY: Duration = Duration::from_secs(600);

#[derive(Clone, Copy, Debug)]
pub(super) struct Timeline {
    /// End of `validating`.
    validate_end: Duration,
    /// End of `in_progress` (lines are answered linearly until then).
    progress_end: Duration,
    /// End of `finalizing`: the batch is terminal.
    finish: Duration,
    cancel_delay: Duration,
}

impl Timeline {
    pub(super) fn new(complete_after: Duration) -> Self {
        Self {
            validate_end: complete_after.mul_f64(0.1),
            progress_end: complete_after.mul_f64(0.8),
            finish: complete_after,
            cancel_delay: (complete_after / 4).min(MAX_CANCEL_DELAY),
        }
    }

    /// Time from create to the terminal state when nothing interferes.
    pub(super) fn complete_after(&self) -> Duration {
        self.finish
    }

    /// Time from a cancel request to the terminal state.
    pub(super) fn cancel_delay(&self) -> Duration {
        self.cancel_delay
    }
}

#[derive(Clone, Debug)]
pub(super) struct BatchRecord {
    pub view: Batch,
    created: Instant,
    input: Arc<Input>,
    /// Distinct custom_ids, for the liveness statistics.
    custom_ids: Vec<String>,
    /// Snapshot at creation: later fault changes never rewrite a submitted batch.
    faults: Faults,
    output_expires_after: Option<i64>,
    cancel: Option<Cancel>,
    /// Input tokens, as the enqueued-token limit counts them.
    tokens: u64,
    /// Set at creation when the enqueued-token limit had no room for it: the message it fails with.
    over_token_limit: Option<String>,
}

#[derive(Clone, Copy, Debug)]
struct Cancel {
    at: Instant,
    done: usize,
}

impl BatchRecord {
    pub(super) fn new(
        view: Batch,
        created: Instant,
        input: Arc<Input>,
        faults: Faults,
        output_expires_after: Option<i64>,
    ) -> Self {
        let mut custom_ids = input.custom_ids.clone();
        custom_ids.sort();
        custom_ids.dedup();
        let tokens = input.requests.iter().map(|r| estimate_tokens(&r.body)).sum();
        Self {
            view,
            created,
            input,
            custom_ids,
            faults,
            output_expires_after,
            cancel: None,
            tokens,
            over_token_limit: None,
        }
    }

    pub(super) fn custom_ids(&self) -> &[String] {
        &self.custom_ids
    }

    pub(super) fn tokens(&self) -> u64 {
        self.tokens
    }

    /// Tokens this batch holds against the enqueued-token limit: those of a batch not yet
    /// ended that will run.
    pub(super) fn enqueued_tokens(&self) -> u64 {
        if self.view.status.is_terminal() || self.over_token_limit.is_some() { 0 } else { self.tokens }
    }

    /// Decided once, at creation (call after every other batch is brought up to date):
    /// OpenAI accepts the create and fails the batch while validating it.
    pub(super) fn check_token_limit(&mut self, limit: u64, enqueued_elsewhere: u64) {
        if limit == 0 || self.tokens.saturating_add(enqueued_elsewhere) <= limit {
            return;
        }
        let model = self.input.model.clone().unwrap_or_default();
        self.over_token_limit = Some(format!(
            "Enqueued token limit reached for {model} in organization org-simulated. Limit: {limit} enqueued \
             tokens. Please try again once some in_progress batches have been completed. \
             (SIMULATED fault: enqueued_token_limit)"
        ));
    }

    fn total(&self) -> usize {
        self.input.requests.len()
    }

    /// How many lines can be answered before the end: all, or about half when expiring.
    fn reachable(&self) -> usize {
        if self.faults.expire_batches { self.total() / 2 } else { self.total() }
    }

    fn answering_until(&self, t: &Timeline) -> Duration {
        if self.faults.expire_batches { t.finish } else { t.progress_end }
    }

    /// Lines answered after `elapsed`, growing linearly through `in_progress`.
    fn done_at(&self, elapsed: Duration, t: &Timeline) -> usize {
        let span = self.answering_until(t).saturating_sub(t.validate_end);
        let into = elapsed.saturating_sub(t.validate_end);
        if span.is_zero() || into >= span {
            return self.reachable();
        }
        let fraction = into.as_secs_f64() / span.as_secs_f64();
        // Truncation is the intent: a line is done only once fully answered.
        #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss, clippy::cast_precision_loss)]
        let done = (fraction * self.reachable() as f64) as usize;
        done.min(self.reachable())
    }

    fn partial_counts(&self, done: usize) -> RequestCounts {
        let every = usize::try_from(self.faults.failed_line_every).unwrap_or(0);
        let failed = done.checked_div(every).unwrap_or(0);
        RequestCounts { total: to_u64(self.total()), completed: to_u64(done - failed), failed: to_u64(failed) }
    }

    fn at(&self, offset: Duration) -> i64 {
        self.view.created_at + i64::try_from(offset.as_secs()).unwrap_or(i64::MAX / 2)
    }

    pub(super) fn advance(&mut self, now: Instant, inner: &mut Inner) {
        if self.view.status.is_terminal() {
            return;
        }
        let t = inner.timeline;
        if let Some(cancel) = self.cancel {
            if now.saturating_duration_since(cancel.at) >= t.cancel_delay {
                let at = self.view.cancelling_at.unwrap_or(self.view.created_at)
                    + i64::try_from(t.cancel_delay.as_secs()).unwrap_or(0);
                self.view.cancelled_at = Some(at);
                self.finish(BatchStatus::Cancelled, cancel.done, "batch_cancelled", at, inner);
            }
            return;
        }
        let elapsed = now.saturating_duration_since(self.created);
        if elapsed < t.validate_end {
            return;
        }
        if let Some(message) = self.over_token_limit.clone() {
            self.fail_with(self.at(t.validate_end), vec![token_limit_error(message)], inner);
            inner.stats.token_limit_failures += 1;
            return;
        }
        if self.faults.fail_batch_validation || !self.input.errors.is_empty() {
            self.fail_validation(self.at(t.validate_end), inner);
            return;
        }
        self.view.in_progress_at = Some(self.at(t.validate_end));
        if elapsed < self.answering_until(&t) {
            self.view.status = BatchStatus::InProgress;
            self.view.request_counts = self.partial_counts(self.done_at(elapsed, &t));
            return;
        }
        if self.faults.expire_batches {
            let at = self.at(t.finish);
            self.view.expired_at = Some(at);
            self.finish(BatchStatus::Expired, self.reachable(), "batch_expired", at, inner);
            return;
        }
        self.view.finalizing_at = Some(self.at(t.progress_end));
        if elapsed < t.finish {
            self.view.status = BatchStatus::Finalizing;
            self.view.request_counts = self.partial_counts(self.total());
            return;
        }
        let at = self.at(t.finish);
        self.view.completed_at = Some(at);
        self.finish(BatchStatus::Completed, self.total(), "batch_expired", at, inner);
    }

    /// Call after `advance` to `now`.
    pub(super) fn cancel(&mut self, now: Instant, now_unix: i64, timeline: &Timeline) -> Result<(), ApiError> {
        let done = match self.view.status {
            BatchStatus::Cancelling => return Ok(()),
            status if status.is_terminal() => {
                return Err(ApiError::invalid(format!("Cannot cancel a batch with status '{}'.", status_name(status)))
                    .code("invalid_batch_status"));
            }
            BatchStatus::Validating => 0,
            BatchStatus::Finalizing => self.total(),
            _ => self.done_at(now.saturating_duration_since(self.created), timeline),
        };
        self.view.status = BatchStatus::Cancelling;
        self.view.cancelling_at = Some(now_unix);
        self.cancel = Some(Cancel { at: now, done });
        Ok(())
    }

    fn fail_validation(&mut self, at: i64, inner: &mut Inner) {
        let mut data = self.input.errors.clone();
        if data.is_empty() {
            data.push(BatchError {
                code: "invalid_request".to_string(),
                message: "The input file failed validation. (SIMULATED fault: fail_batch_validation)".to_string(),
                param: None,
                line: Some(1),
            });
        }
        self.fail_with(at, data, inner);
    }

    fn fail_with(&mut self, at: i64, data: Vec<BatchError>, inner: &mut Inner) {
        self.view.status = BatchStatus::Failed;
        self.view.failed_at = Some(at);
        self.view.errors = Some(BatchErrors { object: "list".to_string(), data });
        inner.batch_went_terminal(&self.custom_ids);
        for id in &self.custom_ids {
            *inner.stats.unrun_submissions_per_custom_id.entry(id.clone()).or_default() += 1;
        }
        tracing::info!(batch = %self.view.id, "SIMULATED provider: batch failed validation");
    }

    fn finish(&mut self, status: BatchStatus, done: usize, unfinished_code: &'static str, at: i64, inner: &mut Inner) {
        let generated = output::generate(
            &Plan {
                batch_id: &self.view.id,
                requests: &self.input.requests,
                done,
                unfinished_code,
                faults: &self.faults,
                seed: inner.seed,
                created: at,
            },
            &mut inner.attempts,
        );
        let expires_at = Some(at + self.output_expires_after.unwrap_or(DEFAULT_FILE_TTL_SECS));
        let id = &self.view.id;
        let mut store = |suffix: &str, content: Vec<u8>| {
            let name = format!("{id}_{suffix}.jsonl");
            inner.insert_file(PURPOSE_BATCH_OUTPUT, name, at, expires_at, content.into(), None).id
        };
        let output_file_id = store("output", generated.output);
        let error_file_id = store("error", generated.errors);
        self.view.output_file_id = Some(output_file_id);
        self.view.error_file_id = Some(error_file_id);
        inner.stats.lines_completed += generated.counts.completed;
        inner.stats.lines_truncated += generated.truncated;
        inner.stats.lines_refused += generated.refused;
        inner.stats.lines_failed += generated.counts.failed;
        self.view.request_counts = generated.counts;
        self.view.usage = Some(generated.usage);
        self.view.status = status;
        inner.batch_went_terminal(&self.custom_ids);
        tracing::info!(
            batch = %self.view.id,
            status = status_name(status),
            completed = self.view.request_counts.completed,
            failed = self.view.request_counts.failed,
            "SIMULATED provider: batch finished"
        );
    }
}

/// OpenAI counts a batch's input tokens; a quarter of the request's JSON text is close
/// enough for a limit a test sets.
fn estimate_tokens(body: &serde_json::Value) -> u64 {
    u64::try_from(body.to_string().len() / 4).unwrap_or(u64::MAX).max(1)
}

fn token_limit_error(message: String) -> BatchError {
    BatchError { code: "token_limit_exceeded".to_string(), message, param: None, line: None }
}

pub(super) fn status_name(status: BatchStatus) -> &'static str {
    match status {
        BatchStatus::Validating => "validating",
        BatchStatus::Failed => "failed",
        BatchStatus::InProgress => "in_progress",
        BatchStatus::Finalizing => "finalizing",
        BatchStatus::Completed => "completed",
        BatchStatus::Expired => "expired",
        BatchStatus::Cancelling => "cancelling",
        BatchStatus::Cancelled => "cancelled",
    }
}

fn to_u64(n: usize) -> u64 {
    u64::try_from(n).unwrap_or(u64::MAX)
}
