//! Work distribution and results: claims, a worker's result and operator retries. Output
//! is judged (`engine::commit`) outside the writer.

use super::{
    Error, MAX_CLAIM_LIMIT, MAX_LEASE_SECONDS, ResultRequest, Service, WorkerPricing, WorkerUsage, check_text, invalid,
};
use tracing::Instrument;

use crate::domain::identity::ExtractionId;
use crate::domain::schema::{SourceText, ValidationIssue};
use crate::domain::trace::{self, TraceRoot};
use crate::engine::commit::{Refusal, count_outcome};
use crate::store::{
    Authority, Charge, ClaimRequest, ExtendOutcome, ExtractionRecord, Grant, LeaseExtension, PostOutcome, PostResult,
    RetryOutcome,
};

impl Service {
    /// Leases for a worker; with `pricing`, each pending source it takes is reserved
    /// against its tenant's budget at what the declared model may charge for it.
    pub async fn claim(&self, mut request: ClaimRequest, pricing: Option<WorkerPricing>) -> Result<Vec<Grant>, Error> {
        check_text("worker", &request.worker, 256)?;
        if request.limit == 0 || request.limit > MAX_CLAIM_LIMIT {
            return Err(invalid("limit", format!("must be between 1 and {MAX_CLAIM_LIMIT}")));
        }
        if request.lease_ms == 0 || request.lease_ms > MAX_LEASE_SECONDS * 1000 {
            return Err(invalid("lease_seconds", format!("must be between 1 and {MAX_LEASE_SECONDS}")));
        }
        if let Some(schema) = &request.schema {
            self.judge.registry().get(schema)?;
        }
        if let Some(pricing) = &pricing {
            request.estimate = Some(self.worker_estimate(pricing)?);
        }
        let grants = self.store.claim(request).await?;
        if !grants.is_empty() {
            self.work_in_flight();
        }
        Ok(grants)
    }

    /// Validates the output against the extraction's schema outside the writer, then
    /// commits (or fails) it in one transaction that re-checks the lease.
    pub async fn post_result(&self, id: ExtractionId, request: ResultRequest) -> Result<PostOutcome, Error> {
        check_text("lease_token", &request.lease_token, 256)?;
        if let Some(usage) = &request.usage {
            check_usage(usage)?;
        }
        let record = self.get(id).await?;
        let schema = self.judge.registry().get(&record.schema)?;
        // The source is read only for a schema with grounding rules.
        let sources = match schema.grounding() {
            Some(_) => self.store.sources(vec![id]).await?,
            None => Default::default(),
        };
        let source = sources.get(&id).map(|s| SourceText { id: &s.source_id, text: &s.content });
        let (submission, refusal) = self.judge.judge(&schema, request.output, source);
        let submission = submission.with_reask_limit((!request.reask).then_some(0));
        let charge = request.usage.map(|u| Charge {
            provider: u.provider,
            job_id: None,
            usage: u.usage,
            latency_ms: u.latency_ms,
            batch: false,
        });
        let post = PostResult { id, authority: Authority::Lease(request.lease_token.into()), submission, charge };
        // A worker's commit, in the extraction's trace (docs/OPERATIONS.md, "Traces").
        let span = tracing::trace_span!(
            target: trace::TARGET, "commit",
            extraction = %id, tenant = %record.tenant, schema = %record.schema, provider = "worker",
            attempt = record.attempt, outcome = tracing::field::Empty,
        );
        TraceRoot::of_extraction(&id).adopt(&span);
        let outcome = self.store.post_result(post).instrument(span.clone()).await;
        span.record("outcome", outcome.as_ref().map_or("error", crate::engine::commit::outcome_name));
        let outcome = outcome?;
        count_outcome(&outcome, "worker", &record, "worker");
        match outcome {
            PostOutcome::NotFound => Err(Error::NotFound(id)),
            PostOutcome::Rejected(e) => Err(Error::Transition(e)),
            PostOutcome::Failed { .. } => Err(match refusal {
                Some(Refusal::TooManyFindings(count)) => {
                    Error::TooManyFindings { count, max: self.judge.max_findings() }
                }
                Some(Refusal::Invalid(issues)) => Error::ValidationFailed { schema: record.schema, issues },
                None => Error::ValidationFailed { schema: record.schema, issues: Vec::new() },
            }),
            PostOutcome::Reasked { reask, .. } => {
                let issues = match refusal {
                    Some(Refusal::Invalid(issues)) => issues,
                    Some(Refusal::TooManyFindings(count)) => vec![ValidationIssue {
                        path: String::new(),
                        message: format!("{count} findings, more than the {} allowed", self.judge.max_findings()),
                    }],
                    None => Vec::new(),
                };
                Err(Error::Reasked { schema: record.schema, issues, reask })
            }
            outcome => Ok(outcome),
        }
    }

    /// Gives the holder of the current lease `lease_seconds` more from now (within the
    /// claims' bounds); answers the new expiry in milliseconds since the epoch.
    pub async fn extend_lease(&self, id: ExtractionId, lease_token: String, lease_seconds: u64) -> Result<u64, Error> {
        check_text("lease_token", &lease_token, 256)?;
        check_lease_seconds(lease_seconds)?;
        let extension = LeaseExtension { id, lease_token: lease_token.into(), lease_ms: lease_seconds * 1000 };
        match self.store.extend_lease(extension).await? {
            ExtendOutcome::Extended { expires_at_ms } => Ok(expires_at_ms),
            ExtendOutcome::NotFound => Err(Error::NotFound(id)),
            ExtendOutcome::Rejected(e) => Err(Error::Transition(e)),
        }
    }

    pub async fn retry(&self, id: ExtractionId) -> Result<ExtractionRecord, Error> {
        match self.store.retry(id).await? {
            RetryOutcome::Retried(record) => {
                metrics::counter!(crate::domain::metric_names::RETRIES_TOTAL).increment(1);
                self.signals.arrived();
                Ok(*record)
            }
            RetryOutcome::NotFound => Err(Error::NotFound(id)),
            RetryOutcome::Rejected(e) => Err(Error::Transition(e)),
        }
    }
}

/// The most a worker's usage names (`model`, `provider`, `request_id`) may hold. They go
/// into the ledger, its reports and the unpriced-model warning; real names are far shorter.
const MAX_USAGE_NAME_BYTES: usize = 256;

/// A worker's usage names: bounded and printable, since each is stored and may be logged.
/// An empty model is let through as before (it is simply unpriced).
fn check_usage(worker: &WorkerUsage) -> Result<(), Error> {
    let usage = &worker.usage;
    let names = [
        ("usage.model", Some(usage.model.as_str())),
        ("usage.provider", Some(worker.provider.as_str())),
        ("usage.request_id", usage.request_id.as_deref()),
    ];
    for (field, value) in names {
        if let Some(value) = value.filter(|v| !v.is_empty()) {
            check_text(field, value, MAX_USAGE_NAME_BYTES)?;
        }
    }
    Ok(())
}

/// An extension runs 1 s to `MAX_LEASE_SECONDS`, as a claim's lease does.
fn check_lease_seconds(lease_seconds: u64) -> Result<(), Error> {
    if lease_seconds == 0 || lease_seconds > MAX_LEASE_SECONDS {
        return Err(invalid("lease_seconds", format!("must be between 1 and {MAX_LEASE_SECONDS}")));
    }
    Ok(())
}
