//! A batch job's life, computed from elapsed time at each read (nothing runs in the
//! background): `QUEUED` for the first tenth of `complete_after`, then `RUNNING`, then
//! `SUCCESS` with its output and error files. With `fail_batch_validation` it ends
//! `FAILED` with `errors: [{message, count}]` and no files; with `expire_batches` it ends
//! `TIMEOUT_EXCEEDED` after running the first half of its requests. A cancel asks first
//! (`CANCELLATION_REQUESTED`) and the job is `CANCELLED` at the next read, without output.
//! Statuses: `BatchJobStatus` in client-python.

use std::sync::Arc;
use std::time::Instant;

use serde_json::{Value, json};

use super::results;
use crate::simulator::faults::Faults;
use crate::simulator::state::{Inner, unix_now};

/// One request of a job, as its input file holds it.
#[derive(Clone, Debug)]
pub(crate) struct Request {
    pub custom_id: Option<String>,
    pub body: Value,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Status {
    Queued,
    Running,
    Success,
    Failed,
    TimeoutExceeded,
    CancellationRequested,
    Cancelled,
}

impl Status {
    pub(crate) fn wire(self) -> &'static str {
        match self {
            Status::Queued => "QUEUED",
            Status::Running => "RUNNING",
            Status::Success => "SUCCESS",
            Status::Failed => "FAILED",
            Status::TimeoutExceeded => "TIMEOUT_EXCEEDED",
            Status::CancellationRequested => "CANCELLATION_REQUESTED",
            Status::Cancelled => "CANCELLED",
        }
    }

    pub(crate) fn is_terminal(self) -> bool {
        matches!(self, Status::Success | Status::Failed | Status::TimeoutExceeded | Status::Cancelled)
    }
}

#[derive(Clone, Debug)]
pub(crate) struct Job {
    pub id: String,
    pub model: String,
    pub metadata: Value,
    pub input_files: Vec<String>,
    pub status: Status,
    created: Instant,
    created_at: i64,
    started_at: Option<i64>,
    completed_at: Option<i64>,
    requests: Arc<Vec<Request>>,
    /// Snapshot at creation: later fault changes never rewrite a submitted job.
    faults: Faults,
    output_file: Option<String>,
    error_file: Option<String>,
    errors: Vec<Value>,
    succeeded: u64,
    failed: u64,
}

impl Job {
    pub(crate) fn new(
        id: String,
        model: String,
        metadata: Value,
        input_files: Vec<String>,
        requests: Vec<Request>,
    ) -> Self {
        Self {
            id,
            model,
            metadata,
            input_files,
            status: Status::Queued,
            created: Instant::now(),
            created_at: unix_now(),
            started_at: None,
            completed_at: None,
            requests: Arc::new(requests),
            faults: Faults::default(),
            output_file: None,
            error_file: None,
            errors: Vec::new(),
            succeeded: 0,
            failed: 0,
        }
    }

    pub(crate) fn with_faults(mut self, faults: Faults) -> Self {
        self.faults = faults;
        self
    }

    pub(crate) fn custom_ids(&self) -> Vec<String> {
        self.requests.iter().filter_map(|r| r.custom_id.clone()).collect()
    }

    pub(crate) fn advance(&mut self, now: Instant, inner: &mut Inner) {
        if self.status.is_terminal() {
            return;
        }
        if self.status == Status::CancellationRequested {
            self.finish(Status::Cancelled, inner);
            return;
        }
        let complete_after = inner.timeline.complete_after();
        let elapsed = now.saturating_duration_since(self.created);
        if elapsed < complete_after {
            if elapsed >= complete_after / 10 && self.status == Status::Queued {
                self.status = Status::Running;
                self.started_at = Some(unix_now());
            }
            return;
        }
        self.started_at.get_or_insert_with(unix_now);
        if self.faults.fail_batch_validation {
            let message =
                "Batch job failed: the input could not be processed. (SIMULATED fault: fail_batch_validation)";
            self.errors.push(json!({"message": message, "count": self.requests.len()}));
            self.finish(Status::Failed, inner);
            return;
        }
        let (status, ran) = if self.faults.expire_batches {
            (Status::TimeoutExceeded, self.requests.len() / 2)
        } else {
            (Status::Success, self.requests.len())
        };
        let requests = Arc::clone(&self.requests);
        let written = results::generate(&self.id, &self.model, &requests[..ran], &self.faults, inner);
        self.output_file = written.output_file;
        self.error_file = written.error_file;
        self.succeeded = written.succeeded;
        self.failed = written.failed;
        self.finish(status, inner);
    }

    /// Call after `advance` to now. A job that has ended cannot be cancelled.
    pub(crate) fn cancel(&mut self) -> Result<(), String> {
        if self.status.is_terminal() {
            return Err(format!("Batch job {} is already {} and cannot be cancelled.", self.id, self.status.wire()));
        }
        self.status = Status::CancellationRequested;
        Ok(())
    }

    fn finish(&mut self, status: Status, inner: &mut Inner) {
        self.status = status;
        self.completed_at = Some(unix_now());
        let unrun = (self.requests.len() as u64).saturating_sub(self.succeeded + self.failed);
        inner.stats.lines_failed += unrun;
        inner.batch_went_terminal(&self.custom_ids());
        tracing::info!(job = %self.id, status = status.wire(), "SIMULATED provider: Mistral batch job ended");
    }

    /// The `BatchJob` object every job endpoint answers.
    pub(crate) fn object(&self) -> Value {
        let total = self.requests.len() as u64;
        json!({
            "id": self.id,
            "object": "batch",
            "input_files": self.input_files,
            "metadata": self.metadata,
            "endpoint": "/v1/chat/completions",
            "model": self.model,
            "agent_id": null,
            "output_file": self.output_file,
            "error_file": self.error_file,
            "errors": self.errors,
            "outputs": null,
            "status": self.status.wire(),
            "created_at": self.created_at,
            "total_requests": total,
            "completed_requests": self.succeeded + self.failed,
            "succeeded_requests": self.succeeded,
            "failed_requests": self.failed,
            "started_at": self.started_at,
            "completed_at": self.completed_at,
        })
    }
}

/// Brings every job up to `now`, so listings and liveness counts are exact.
pub(super) fn advance_all(inner: &mut Inner, now: Instant) {
    let mut jobs = std::mem::take(&mut inner.mistral.jobs);
    for job in &mut jobs {
        job.advance(now, inner);
    }
    inner.mistral.jobs = jobs;
}

/// Advances one job and returns its index.
pub(super) fn advance_one(inner: &mut Inner, id: &str, now: Instant) -> Option<usize> {
    let index = inner.mistral.jobs.iter().position(|j| j.id == id)?;
    let mut jobs = std::mem::take(&mut inner.mistral.jobs);
    if let Some(job) = jobs.get_mut(index) {
        job.advance(now, inner);
    }
    inner.mistral.jobs = jobs;
    Some(index)
}
