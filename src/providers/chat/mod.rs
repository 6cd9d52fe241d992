//! A synchronous OpenAI-compatible chat completions server (vLLM, llama.cpp server,
//! Ollama's `/v1`) behind the batch trait.
//!
//! `submit` makes one `POST {base}/chat/completions` per member, at most
//! `concurrency` at a time, and keeps the answers in memory under a fresh job id
//! (`sync-<batch_key>-<random>`); `poll` then says Completed and `stream_results` hands
//! the answers over. Nothing is stored on the server side, so:
//!
//! - `find_job` is always Absent: a crash before the job id was persisted lost the
//!   answers with the process, and the only way to get them is to ask again.
//! - After a restart the persisted job id is unknown here, and `poll` answers `Gone`.
//!   The scheduler then closes the batch and requeues its members as a new attempt of the
//!   same identity: one more completion call per member for every attempt that was
//!   recorded but not ingested before the restart. Exactly-once is kept by the commit keys;
//!   the price is a repeated call, which a local server does not bill.
//! - `stream_results` forgets a job once every answer has gone into the channel (a second
//!   call is `Gone`); if the consumer stops half way the answers are kept for the next
//!   call, since staging the same line twice is a counted replay. `cancel` drops a job.
//!
//! A member's HTTP failure becomes that member's line: `Retry` for 408/409/429/5xx and
//! transport failures, `Refused` for other 4xx. Two failures stop the whole submit instead,
//! because they are about the provider, not the member: 401/403 (`Auth`, so the scheduler
//! pauses the provider) and quota exhaustion (`Budget`). And when no member got any
//! answer at all (the server is down or shedding load), submit fails `Transient` or
//! `RateLimited`, so the scheduler backs off instead of requeueing the whole batch at once.

pub(crate) mod wire;

use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use async_trait::async_trait;
use futures_util::StreamExt;
use reqwest::header::HeaderMap;
use tokio::sync::mpsc;

use super::{
    BatchProvider, BatchSpec, Checked, Coverage, ErrorClass, IntentRef, JobPhase, JobStatus, Lookup,
    PROBE_MAX_OUTPUT_TOKENS, Probe, ProviderError, ResultLine, StreamCounts, classify_status, describe_transport,
    parse_retry_after, probe_member, truncate,
};
use crate::domain::batch::{BatchMember, LineResult, OutputBudget};
use crate::domain::schema::{Dialect, Schema};
use wire::BudgetField;

pub const PROVIDER: &str = "chat";
const DEFAULT_CONCURRENCY: usize = 4;
/// Local models on modest hardware can take minutes for one long answer.
const DEFAULT_REQUEST_TIMEOUT: Duration = Duration::from_secs(300);
/// The retry of a truncated answer asks for at most this many tokens unless configured.
pub const DEFAULT_MAX_TOKENS_CAP: u32 = 8192;

pub use super::ApiKey;

#[derive(Debug, Clone)]
pub struct ChatConfig {
    /// Name used for this provider in the store and in operator output (default `chat`).
    pub name: String,
    /// The OpenAI-style base, e.g. `http://127.0.0.1:8000/v1` (vLLM) or
    /// `http://127.0.0.1:11434/v1` (Ollama); `/chat/completions` is appended.
    pub base_url: String,
    /// Sent as `Authorization: Bearer …` when set; local servers often need none.
    pub api_key: Option<ApiKey>,
    pub model: String,
    /// Most completions in flight at once (default 4; 0 is treated as 1).
    pub concurrency: usize,
    /// The whole of one completion call (default 300 s).
    pub request_timeout: Duration,
    /// Sent as `max_tokens` when set (default unset: the server's own limit).
    pub max_tokens: Option<u32>,
    /// The most a truncated answer's one retry may ask for (default 8192).
    pub max_tokens_cap: u32,
}

impl ChatConfig {
    /// A configuration with the documented defaults.
    pub fn new(base_url: impl Into<String>, model: impl Into<String>) -> Self {
        Self {
            name: PROVIDER.to_string(),
            base_url: base_url.into(),
            api_key: None,
            model: model.into(),
            concurrency: DEFAULT_CONCURRENCY,
            request_timeout: DEFAULT_REQUEST_TIMEOUT,
            max_tokens: None,
            max_tokens_cap: DEFAULT_MAX_TOKENS_CAP,
        }
    }
}

/// The answers of one submitted batch, waiting to be streamed.
#[derive(Debug, Default)]
struct KeptJob {
    lines: Vec<ResultLine>,
    /// 200 answers that were not completions: the member is left unanswered (requeued).
    malformed: u64,
}

#[derive(Debug)]
pub struct ChatCompletions {
    config: ChatConfig,
    http: reqwest::Client,
    jobs: Mutex<HashMap<String, KeptJob>>,
}

/// What one member's call came to.
enum Outcome {
    Line(LineResult),
    /// A retryable failure, with its class and the delay the server asked for.
    Failed(LineResult, ErrorClass, Option<Duration>),
    Malformed(String),
    /// A failure about the provider, not the member: the submit stops.
    Stop(ProviderError),
}

impl ChatCompletions {
    pub fn new(config: ChatConfig) -> Result<Self, ProviderError> {
        let http = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(10))
            .build()
            .map_err(|e| error(ErrorClass::InvalidRequest, None, format!("cannot build the HTTP client: {e}")))?;
        Ok(Self { config, http, jobs: Mutex::default() })
    }

    fn jobs(&self) -> std::sync::MutexGuard<'_, HashMap<String, KeptJob>> {
        // The map is only ever inserted into or removed from whole: a panic elsewhere
        // cannot leave it half-updated.
        self.jobs.lock().unwrap_or_else(PoisonError::into_inner)
    }

    async fn complete(&self, member: &BatchMember, schema: &Schema) -> Outcome {
        let url = format!("{}/chat/completions", self.config.base_url.trim_end_matches('/'));
        let body =
            wire::request_body(member, schema, &self.config.model, self.config.max_tokens, BudgetField::MaxTokens);
        let mut request = self.http.post(url).timeout(self.config.request_timeout).json(&body);
        if let Some(key) = &self.config.api_key {
            request = request.bearer_auth(key.expose());
        }
        let response = match request.send().await {
            Ok(response) => response,
            Err(e) => return transport_failure(&e),
        };
        let status = response.status().as_u16();
        let headers = response.headers().clone();
        let text = match response.text().await {
            Ok(text) => text,
            Err(e) => return transport_failure(&e),
        };
        if (200..300).contains(&status) {
            let parsed = serde_json::from_str(&text).map_err(|e| format!("unreadable completion: {e}"));
            return match parsed.and_then(|body| wire::parse_completion(&body, None)) {
                Ok(line) => Outcome::Line(line),
                Err(reason) => Outcome::Malformed(reason),
            };
        }
        http_failure(status, &headers, &text)
    }
}

impl ChatCompletions {
    /// Every member's call, at most `concurrency` in flight, in completion order.
    fn calls<'a>(
        &'a self,
        members: &'a [BatchMember],
        schema: &'a Schema,
    ) -> impl futures_util::Stream<Item = (String, Outcome)> + Send + Unpin + 'a {
        let calls = members.iter().map(move |member: &'a BatchMember| async move {
            (member.id.to_hex(), self.complete(member, schema).await)
        });
        futures_util::stream::iter(calls).buffer_unordered(self.config.concurrency.max(1)).boxed()
    }
}

fn http_failure(status: u16, headers: &HeaderMap, text: &str) -> Outcome {
    let parts = wire::ErrorParts::parse(text);
    let class = classify_status(status, headers, parts.code.as_deref());
    // Redacted here, not only at the boundary: a retried member's reason is logged below.
    let message = super::redact(&truncate(parts.message.as_deref().unwrap_or(text)));
    let reason = format!("{status} {}: {message}", parts.code.unwrap_or_default());
    match class {
        ErrorClass::Auth | ErrorClass::Budget => {
            let mut stop = error(class, Some(status), reason);
            stop.retry_after = parse_retry_after(headers, crate::domain::clock::now());
            Outcome::Stop(stop)
        }
        ErrorClass::RateLimited | ErrorClass::Transient => Outcome::Failed(
            LineResult::Retry { reason: format!("the server answered {reason}") },
            class,
            parse_retry_after(headers, crate::domain::clock::now()),
        ),
        ErrorClass::InvalidRequest | ErrorClass::Gone | ErrorClass::Protocol | ErrorClass::TooLarge => {
            Outcome::Line(wire::refused(format!("the server refused the request: {reason}")))
        }
    }
}

fn transport_failure(e: &reqwest::Error) -> Outcome {
    let reason = format!("completion call failed: {}", describe_transport(e));
    Outcome::Failed(LineResult::Retry { reason }, ErrorClass::Transient, None)
}

#[async_trait]
impl BatchProvider for ChatCompletions {
    fn name(&self) -> &str {
        &self.config.name
    }

    fn output_budget(&self) -> OutputBudget {
        OutputBudget { default: self.config.max_tokens, cap: self.config.max_tokens_cap }
    }

    /// One synchronous call per member: billed at list price, never a batch discount.
    fn batch_api(&self) -> bool {
        false
    }

    async fn submit(&self, spec: &BatchSpec<'_>) -> Result<String, ProviderError> {
        spec.schema.view(Dialect::OpenAiStrict).map_err(|e| error(ErrorClass::InvalidRequest, None, e.to_string()))?;
        let mut calls = self.calls(spec.members, spec.schema);
        let mut kept = KeptJob::default();
        let mut answered_or_refused = false;
        let mut shortfall: Option<Shortfall> = None;
        while let Some((custom_id, outcome)) = calls.next().await {
            match outcome {
                // Dropping the stream cancels the calls still in flight.
                Outcome::Stop(e) => return Err(e),
                Outcome::Line(line) => {
                    answered_or_refused = true;
                    kept.lines.push((custom_id, line));
                }
                Outcome::Failed(line, class, delay) => {
                    if let LineResult::Retry { reason } = &line {
                        tracing::warn!(provider = PROVIDER, %reason, "a completion call failed; the member will be retried");
                        shortfall = Some(Shortfall::merge(shortfall.take(), class, delay, reason));
                    }
                    kept.lines.push((custom_id, line));
                }
                Outcome::Malformed(reason) => {
                    answered_or_refused = true;
                    kept.malformed += 1;
                    tracing::warn!(provider = PROVIDER, %reason, "the server answered something that is not a completion");
                }
            }
        }
        if let (false, Some(shortfall)) = (answered_or_refused, shortfall) {
            let mut failure = error(shortfall.class, None, format!("no member got an answer: {}", shortfall.reason));
            failure.retry_after = shortfall.retry_after;
            return Err(failure);
        }
        let job_id = format!("sync-{}-{:016x}", spec.batch_key, rand::random::<u64>());
        self.jobs().insert(job_id.clone(), kept);
        Ok(job_id)
    }

    async fn find_job(&self, _intent: &IntentRef<'_>) -> Result<Lookup, ProviderError> {
        Ok(Lookup::Absent)
    }

    async fn poll(&self, job_id: &str) -> Result<JobStatus, ProviderError> {
        if self.jobs().contains_key(job_id) {
            Ok(JobStatus { job_id: job_id.to_string(), phase: JobPhase::Completed, result_files: Vec::new() })
        } else {
            Err(gone(job_id))
        }
    }

    async fn stream_results(
        &self,
        job: &JobStatus,
        out: &mpsc::Sender<ResultLine>,
    ) -> Result<StreamCounts, ProviderError> {
        let kept = self.jobs().remove(&job.job_id).ok_or_else(|| gone(&job.job_id))?;
        for line in &kept.lines {
            if out.send(super::scrub(line.clone())).await.is_err() {
                self.jobs().insert(job.job_id.clone(), kept);
                return Err(error(ErrorClass::Transient, None, "result consumer stopped".to_string()));
            }
        }
        Ok(StreamCounts { lines: kept.lines.len() as u64 + kept.malformed, malformed: kept.malformed })
    }

    async fn probe(&self, schema: &Schema) -> Probe {
        if let Err(e) = schema.view(Dialect::OpenAiStrict) {
            return Probe::Refused(error(ErrorClass::InvalidRequest, None, e.to_string()));
        }
        let url = format!("{}/chat/completions", self.config.base_url.trim_end_matches('/'));
        let body = wire::request_body(
            &probe_member(),
            schema,
            &self.config.model,
            Some(PROBE_MAX_OUTPUT_TOKENS),
            BudgetField::MaxTokens,
        );
        let mut request = self.http.post(url).timeout(self.config.request_timeout).json(&body);
        if let Some(key) = &self.config.api_key {
            request = request.bearer_auth(key.expose());
        }
        let response = match request.send().await {
            Ok(response) => response,
            Err(e) => {
                let message = format!("request failed: {}", describe_transport(&e));
                return Probe::Refused(error(ErrorClass::Transient, None, message));
            }
        };
        let status = response.status().as_u16();
        if response.status().is_success() {
            let key = match self.config.api_key {
                Some(_) => Coverage::Exercised,
                None => Coverage::NotChecked("no api_key_env is configured, so none was sent".to_string()),
            };
            return Probe::Passed(Checked { key, ..Checked::everything() });
        }
        let headers = response.headers().clone();
        let text = response.text().await.unwrap_or_default();
        let class = classify_status(status, &headers, None);
        Probe::Refused(error(class, Some(status), format!("{status}: {}", truncate(&text))))
    }

    async fn cancel(&self, job_id: &str) -> Result<(), ProviderError> {
        self.jobs().remove(job_id);
        Ok(())
    }
}

/// Why a submit got no answer at all, as the scheduler should back off from it.
#[derive(Debug)]
struct Shortfall {
    class: ErrorClass,
    retry_after: Option<Duration>,
    reason: String,
}

impl Shortfall {
    /// A rate limit outweighs a transient failure, and the longest delay asked for wins.
    fn merge(current: Option<Self>, class: ErrorClass, delay: Option<Duration>, reason: &str) -> Self {
        let Some(mut shortfall) = current else {
            return Self { class, retry_after: delay, reason: reason.to_string() };
        };
        if class == ErrorClass::RateLimited && shortfall.class != ErrorClass::RateLimited {
            shortfall.class = class;
            shortfall.reason = reason.to_string();
        }
        shortfall.retry_after = shortfall.retry_after.max(delay);
        shortfall
    }
}

fn gone(job_id: &str) -> ProviderError {
    error(
        ErrorClass::Gone,
        None,
        format!("job {job_id} is not in memory (answers are not kept across restarts, or were already delivered)"),
    )
}

fn error(class: ErrorClass, status: Option<u16>, message: String) -> ProviderError {
    ProviderError::new(PROVIDER, class, status, &message)
}

#[cfg(test)]
mod tests;
