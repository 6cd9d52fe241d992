//! A batch's life, computed from elapsed time at each read (nothing runs in the
//! background): `BATCH_STATE_PENDING` for the first tenth of `complete_after`, then
//! `BATCH_STATE_RUNNING`, then `BATCH_STATE_SUCCEEDED` with its output. With
//! `expire_batches` it ends `BATCH_STATE_EXPIRED` instead, with no output at all: "The job
//! will not have any results to retrieve" (batch guide, "Monitoring job status"). With
//! `fail_batch_validation` it ends `BATCH_STATE_FAILED` with an `error` status. A cancel
//! ends it `BATCH_STATE_CANCELLED` at once, also without output.

use std::sync::Arc;
use std::time::{Instant, SystemTime};

use serde_json::{Value, json};

use super::results::{self, Output};
use crate::simulator::faults::Faults;
use crate::simulator::state::Inner;

const BATCH_TYPE: &str = "type.googleapis.com/google.ai.generativelanguage.v1beta.GenerateContentBatch";
const OUTPUT_TYPE: &str = "type.googleapis.com/google.ai.generativelanguage.v1beta.GenerateContentBatchOutput";

/// One request of a batch, as submitted: the key is ours to echo (optional inline).
#[derive(Clone, Debug)]
pub(crate) struct Request {
    pub key: Option<String>,
    pub request: Value,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum State {
    Pending,
    Running,
    Succeeded,
    Failed,
    Cancelled,
    Expired,
}

impl State {
    pub(crate) fn wire(self) -> &'static str {
        match self {
            State::Pending => "BATCH_STATE_PENDING",
            State::Running => "BATCH_STATE_RUNNING",
            State::Succeeded => "BATCH_STATE_SUCCEEDED",
            State::Failed => "BATCH_STATE_FAILED",
            State::Cancelled => "BATCH_STATE_CANCELLED",
            State::Expired => "BATCH_STATE_EXPIRED",
        }
    }

    pub(crate) fn is_terminal(self) -> bool {
        !matches!(self, State::Pending | State::Running)
    }
}

#[derive(Clone, Debug)]
pub(crate) struct Record {
    /// `batches/{id}`.
    pub name: String,
    pub display_name: String,
    pub model: String,
    /// The uploaded input file, for a file batch.
    pub input_file: Option<String>,
    pub state: State,
    created: Instant,
    created_wall: SystemTime,
    ended_wall: Option<SystemTime>,
    requests: Arc<Vec<Request>>,
    /// Snapshot at creation: later fault changes never rewrite a submitted batch.
    faults: Faults,
    output: Option<Output>,
    error: Option<Value>,
    succeeded: u64,
    failed: u64,
}

pub(super) fn rfc3339(at: SystemTime) -> String {
    humantime::format_rfc3339_micros(at).to_string()
}

impl Record {
    pub(crate) fn new(
        name: String,
        display_name: String,
        model: String,
        input_file: Option<String>,
        requests: Vec<Request>,
    ) -> Self {
        Self {
            name,
            display_name,
            model,
            input_file,
            state: State::Pending,
            created: Instant::now(),
            created_wall: crate::domain::clock::now(),
            ended_wall: None,
            requests: Arc::new(requests),
            faults: Faults::default(),
            output: None,
            error: None,
            succeeded: 0,
            failed: 0,
        }
    }

    pub(crate) fn with_faults(mut self, faults: Faults) -> Self {
        self.faults = faults;
        self
    }

    pub(crate) fn keys(&self) -> Vec<String> {
        self.requests.iter().filter_map(|r| r.key.clone()).collect()
    }

    pub(crate) fn advance(&mut self, now: Instant, inner: &mut Inner) {
        if self.state.is_terminal() {
            return;
        }
        let complete_after = inner.timeline.complete_after();
        let elapsed = now.saturating_duration_since(self.created);
        if elapsed < complete_after {
            if elapsed >= complete_after / 10 {
                self.state = State::Running;
            }
            return;
        }
        let ended = self.created_wall + complete_after;
        if self.faults.fail_batch_validation {
            self.error = Some(
                json!({"code": 3, "message": "The batch failed validation. (SIMULATED fault: fail_batch_validation)"}),
            );
            self.finish(State::Failed, ended, inner);
        } else if self.faults.expire_batches {
            self.finish(State::Expired, ended, inner);
        } else {
            let generated = results::generate(
                &self.name,
                &self.model,
                &self.requests,
                self.input_file.is_some(),
                &self.faults,
                inner,
            );
            self.succeeded = generated.succeeded;
            self.failed = generated.failed;
            self.output = Some(generated.output);
            self.finish(State::Succeeded, ended, inner);
        }
    }

    /// Call after `advance` to now. Cancelling an ended batch is refused.
    pub(crate) fn cancel(&mut self, inner: &mut Inner) -> Result<(), String> {
        if self.state.is_terminal() {
            return Err(format!("Batch {} is already in a terminal state and cannot be cancelled.", self.name));
        }
        self.finish(State::Cancelled, crate::domain::clock::now(), inner);
        Ok(())
    }

    fn finish(&mut self, state: State, ended: SystemTime, inner: &mut Inner) {
        self.state = state;
        self.ended_wall = Some(ended);
        if state != State::Succeeded {
            inner.stats.lines_failed += self.requests.len() as u64;
        }
        inner.batch_went_terminal(&self.keys());
        tracing::info!(batch = %self.name, state = state.wire(), "SIMULATED provider: Gemini batch ended");
    }

    /// The batch as `GET batches/{id}` answers it: an Operation whose `metadata` is the
    /// batch; `done` and `response` (the output again) once it has ended. Counts are int64,
    /// which the proto3 JSON mapping writes as strings.
    pub(crate) fn operation(&self) -> Value {
        let total = self.requests.len() as u64;
        let pending = if self.state.is_terminal() { 0 } else { total };
        let mut stats = json!({"requestCount": total.to_string(), "pendingRequestCount": pending.to_string()});
        if self.state == State::Succeeded {
            stats["successfulRequestCount"] = json!(self.succeeded.to_string());
            stats["failedRequestCount"] = json!(self.failed.to_string());
        }
        let mut batch = json!({
            "@type": BATCH_TYPE,
            "model": format!("models/{}", self.model),
            "displayName": self.display_name,
            "createTime": rfc3339(self.created_wall),
            "updateTime": rfc3339(self.ended_wall.unwrap_or(self.created_wall)),
            "batchStats": stats,
            "state": self.state.wire(),
            "name": self.name,
        });
        if let Some(file) = &self.input_file {
            batch["inputConfig"] = json!({"fileName": file});
        }
        if let Some(ended) = self.ended_wall {
            batch["endTime"] = json!(rfc3339(ended));
        }
        let output = self.output.as_ref().map(Output::to_json);
        if let Some(output) = &output {
            batch["output"] = output.clone();
        }
        let mut operation = json!({"name": self.name, "metadata": batch});
        if self.state.is_terminal() {
            operation["done"] = json!(true);
            if let Some(error) = &self.error {
                operation["error"] = error.clone();
            }
            if let Some(Value::Object(mut output)) = output {
                output.insert("@type".to_string(), json!(OUTPUT_TYPE));
                operation["response"] = Value::Object(output);
            }
        }
        operation
    }
}

/// Brings every batch up to `now`, so listings and liveness counts are exact.
pub(super) fn advance_all(inner: &mut Inner, now: Instant) {
    let mut batches = std::mem::take(&mut inner.gemini.batches);
    for batch in &mut batches {
        batch.advance(now, inner);
    }
    inner.gemini.batches = batches;
}

/// Advances one batch (`batches/{id}`) and returns its index.
pub(super) fn advance_one(inner: &mut Inner, name: &str, now: Instant) -> Option<usize> {
    let index = inner.gemini.batches.iter().position(|b| b.name == name)?;
    let mut batches = std::mem::take(&mut inner.gemini.batches);
    if let Some(batch) = batches.get_mut(index) {
        batch.advance(now, inner);
    }
    inner.gemini.batches = batches;
    Some(index)
}
