//! Work distribution and results: claims, a worker's result, a provider's staged answer,
//! and operator retries. Output is validated here, outside the writer.

use std::sync::atomic::Ordering;

use serde_json::Value;

use super::{Error, MAX_CLAIM_LIMIT, MAX_LEASE_SECONDS, MAX_REASON_CHARS, ResultRequest, Service, check_text, invalid};
use crate::identity::ExtractionId;
use crate::lifecycle::TransitionError;
use crate::schema::ValidationIssue;
use crate::store::{
    Authority, Charge, ClaimRequest, ExtractionRecord, Grant, PostOutcome, PostResult, ReadyItem, RetryOutcome,
    Submission,
};

impl Service {
    pub async fn claim(&self, request: ClaimRequest) -> Result<Vec<Grant>, Error> {
        check_text("worker", &request.worker, 256)?;
        if request.limit == 0 || request.limit > MAX_CLAIM_LIMIT {
            return Err(invalid("limit", format!("must be between 1 and {MAX_CLAIM_LIMIT}")));
        }
        if request.lease_ms == 0 || request.lease_ms > MAX_LEASE_SECONDS * 1000 {
            return Err(invalid("lease_seconds", format!("must be between 1 and {MAX_LEASE_SECONDS}")));
        }
        if let Some(schema) = &request.schema {
            self.registry.get(schema)?;
        }
        Ok(self.store.claim(request).await?)
    }

    /// Validates the output against the extraction's schema outside the writer, then
    /// commits (or fails) it in one transaction that re-checks the lease.
    pub async fn post_result(&self, id: ExtractionId, request: ResultRequest) -> Result<PostOutcome, Error> {
        check_text("lease_token", &request.lease_token, 256)?;
        let record = self.get(id).await?;
        let schema = self.registry.get(&record.schema)?;
        let mut too_many = None;
        let (submission, issues) = match schema.validate(&request.output) {
            Ok(findings) if findings.len() > self.max_findings => {
                too_many = Some(findings.len());
                (Submission::Invalid { reason: self.too_many(findings.len()) }, None)
            }
            Ok(findings) => (Submission::Valid { findings, output: request.output }, None),
            Err(issues) => (Submission::Invalid { reason: summarize(&issues) }, Some(issues)),
        };
        let charge = request.usage.map(|u| Charge {
            provider: u.provider,
            job_id: None,
            usage: u.usage,
            latency_ms: u.latency_ms,
            batch: false,
        });
        let post = PostResult { id, authority: Authority::Lease(request.lease_token), submission, charge };
        let outcome = self.store.post_result(post).await?;
        count_outcome(&outcome, "worker");
        match outcome {
            PostOutcome::NotFound => Err(Error::NotFound(id)),
            PostOutcome::Rejected(e) => Err(Error::Transition(e)),
            PostOutcome::Failed { .. } => Err(match too_many {
                Some(count) => Error::TooManyFindings { count, max: self.max_findings },
                None => Error::ValidationFailed { schema: record.schema, issues: issues.unwrap_or_default() },
            }),
            outcome => Ok(outcome),
        }
    }

    /// Validates a provider's staged answer and commits it (or fails it) under the
    /// authority of the batch it came from. `batch_api`: the answer came through a batch
    /// API and is priced at its discount (never for a synchronous provider).
    pub async fn commit_ready(&self, item: ReadyItem, batch_api: bool) -> Result<PostOutcome, Error> {
        let id = item.record.id;
        let Some(batch_key) = item.record.state.batch_key().map(str::to_string) else {
            return Err(Error::Transition(TransitionError::StaleBatch));
        };
        let schema = self.registry.get(&item.record.schema)?;
        // The staged answer names its provider (`worker`) and job (`lease_token`).
        let charge = item.staged.usage.clone().map(|usage| Charge {
            provider: item.staged.worker.clone(),
            job_id: Some(item.staged.lease_token.clone()).filter(|j| !j.is_empty()),
            usage,
            latency_ms: item.staged.latency_ms,
            batch: batch_api,
        });
        let submission = match serde_json::from_str::<Value>(&item.staged.output_json) {
            Ok(mut output) => {
                schema.normalize_provider_answer(&mut output);
                match schema.validate(&output) {
                    Ok(findings) if findings.len() > self.max_findings => {
                        Submission::Invalid { reason: self.too_many(findings.len()) }
                    }
                    Ok(findings) => Submission::Valid { findings, output },
                    Err(issues) => Submission::Invalid { reason: summarize(&issues) },
                }
            }
            Err(e) => Submission::Invalid { reason: format!("the model's answer is not JSON: {e}") },
        };
        let outcome = self
            .store
            .post_result(PostResult { id, authority: Authority::Batch(batch_key), submission, charge })
            .await?;
        count_outcome(&outcome, "provider");
        if matches!(outcome, PostOutcome::Failed { .. }) {
            self.wake_schedulers();
        }
        Ok(outcome)
    }

    /// The failure reason of an output over the cap: it is refused whole (a truncated
    /// answer would look complete to whoever reads it).
    fn too_many(&self, count: usize) -> String {
        format!(
            "{count} findings, more than the {} allowed per output (limits.max_findings_per_output)",
            self.max_findings
        )
    }

    pub async fn retry(&self, id: ExtractionId) -> Result<ExtractionRecord, Error> {
        match self.store.retry(id).await? {
            RetryOutcome::Retried(record) => {
                metrics::counter!("commitpoint_retries_total").increment(1);
                self.arrivals.fetch_add(1, Ordering::Relaxed);
                self.wake_schedulers();
                Ok(*record)
            }
            RetryOutcome::NotFound => Err(Error::NotFound(id)),
            RetryOutcome::Rejected(e) => Err(Error::Transition(e)),
        }
    }
}

fn count_outcome(outcome: &PostOutcome, path: &'static str) {
    match outcome {
        PostOutcome::Committed { .. } => metrics::counter!("commitpoint_commits_total", "path" => path).increment(1),
        PostOutcome::Replay { .. } => metrics::counter!("commitpoint_replays_total").increment(1),
        PostOutcome::Failed { .. } => {
            metrics::counter!("commitpoint_failures_total", "class" => "validation").increment(1);
        }
        PostOutcome::NotFound | PostOutcome::Rejected(_) => {}
    }
}

fn summarize(issues: &[ValidationIssue]) -> String {
    let mut text = issues
        .iter()
        .map(|i| format!("{}: {}", if i.path.is_empty() { "/" } else { &i.path }, i.message))
        .collect::<Vec<_>>()
        .join("; ");
    if text.chars().count() > MAX_REASON_CHARS {
        text = text.chars().take(MAX_REASON_CHARS).collect::<String>() + "…";
    }
    text
}
