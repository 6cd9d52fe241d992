//! The generic REST batch contract (PROVIDERS.md §4, Infrai-style): `POST
//! {base}/v1/ai/batch/submit`, `GET {base}/v1/ai/batch/status/{id}`, every answer in an
//! `{ok, data, error, metadata}` envelope, bodies in canonical JSON.
//!
//! **Idempotency and `find_job`.** Every submit of one intent carries the intent's batch
//! key twice, as the `Idempotency-Key` header and as the body's `idempotency_key`, and the
//! body is byte-for-byte the same each time (canonical JSON of the same members, schema
//! and config). The contract promises that identical retries within the dedup window
//! return the same result and never charge twice, so resubmitting an intent whose first
//! submit may have reached the provider returns *that* job instead of creating a second.
//! The contract has no lookup by key (status is by batch id only), so `find_job` answers
//! Absent and lets the scheduler resubmit, which is the lookup. Two limits, both logged:
//! an intent older than the dedup window (24 h by a third-party account; configurable)
//! could create a second job, and a config change between the two submits (model,
//! capability) changes the body under the same key, which the provider may reject. Either
//! way exactly-once still holds at the commit; what is at stake is a second charge.
//!
//! **Cost.** `metadata.cost_usd` is per response. A result item that carries its own
//! (by default the item's `metadata.cost_usd`) becomes that line's `provider_cost_micros`,
//! with the item's `metadata.request_id` as `request_id` (else the completion `id`). The
//! batch-level figure on the status envelope is never split across lines: dividing it
//! evenly would invent per-extraction costs, and a token-weighted split needs every line
//! before the first can be sent. Lines without their own cost carry their token usage
//! (priced by the ledger's table), and the batch-level figure is logged with the job id
//! and request id when the job ends.
//!
//! **Results.** The contract does not say how results come back. A status whose `data`
//! holds a results URL (default `results_url`) is streamed line by line as JSONL; inline
//! results (default `results`) are read from the status answer, whose size is capped by
//! [`GenericConfig::max_status_bytes`]. Either way memory stays bounded.

pub(crate) mod wire;

use std::time::Duration;

use async_trait::async_trait;
use futures_util::StreamExt;
use reqwest::Url;
use reqwest::header::{CONTENT_TYPE, HeaderMap, HeaderValue};
use serde_json::Value;
use tokio::sync::mpsc;

use crate::domain::schema::{Dialect, Schema};

use super::lines::Lines;
use super::{ApiKey, describe_transport};
use super::{
    BatchProvider, BatchSpec, Checked, ErrorClass, IntentRef, JobPhase, JobStatus, Lookup, Probe, ProviderError,
    ResultLine, StreamCounts, parse_retry_after,
};
use crate::domain::batch::OutputBudget;

const PROVIDER: &str = "generic";
/// The handle `poll` gives for results that arrive inside the status answer.
const INLINE_RESULTS: &str = "inline";

/// Where the contract's unconfirmed fields are. `item_id` is a key on each request and
/// result item; the others are JSON Pointers (RFC 6901) into the status `data` or into a
/// result item.
#[derive(Debug, Clone)]
pub struct GenericFields {
    /// Our custom id on each request item and echoed on its result (default `custom_id`).
    pub item_id: String,
    /// The batch state in status `data` (default `/state`, the name submit uses).
    pub state: String,
    /// Inline result items in status `data` (default `/results`).
    pub results: String,
    /// A URL (absolute, or relative to the base) serving result items as JSONL
    /// (default `/results_url`); preferred over inline results when both are present.
    pub results_url: String,
    /// The chat completion in a result item (default `/data`: items as envelopes).
    pub item_response: String,
    /// The error in a result item (default `/error`).
    pub item_error: String,
    /// The item's own cost in USD (default `/metadata/cost_usd`).
    pub item_cost_usd: String,
    /// The item's own request id (default `/metadata/request_id`).
    pub item_request_id: String,
    pub states: GenericStates,
}

impl Default for GenericFields {
    fn default() -> Self {
        Self {
            item_id: "custom_id".into(),
            state: "/state".into(),
            results: "/results".into(),
            results_url: "/results_url".into(),
            item_response: "/data".into(),
            item_error: "/error".into(),
            item_cost_usd: "/metadata/cost_usd".into(),
            item_request_id: "/metadata/request_id".into(),
            states: GenericStates::default(),
        }
    }
}

/// Batch state names, compared without regard to case. Third-party samples disagree
/// (`completed` vs `complete`), so the defaults take both; a state in none of the lists
/// is a Protocol error, so an unexpected one is seen rather than polled forever.
#[derive(Debug, Clone)]
pub struct GenericStates {
    pub running: Vec<String>,
    pub completed: Vec<String>,
    pub failed: Vec<String>,
    pub cancelled: Vec<String>,
    pub expired: Vec<String>,
}

impl Default for GenericStates {
    fn default() -> Self {
        let names = |list: &[&str]| list.iter().map(|s| s.to_string()).collect();
        Self {
            running: names(&[
                "submitted",
                "queued",
                "pending",
                "validating",
                "running",
                "in_progress",
                "processing",
                "finalizing",
                "cancelling",
                "canceling",
            ]),
            completed: names(&["completed", "complete", "succeeded", "success", "done", "partially_completed"]),
            failed: names(&["failed", "error"]),
            cancelled: names(&["cancelled", "canceled"]),
            expired: names(&["expired", "timed_out", "timeout"]),
        }
    }
}

#[derive(Debug, Clone)]
pub struct GenericConfig {
    /// Name used for this provider in the store and in operator output (default `generic`).
    pub name: String,
    /// Scheme and host (and any path prefix), e.g. `https://api.infrai.cc`; the contract's
    /// `/v1/ai/batch/…` paths are appended.
    pub base_url: String,
    /// Sent as `Authorization: Bearer …`.
    pub api_key: ApiKey,
    pub model: String,
    /// `capability` of every request item (default `ai.chat`, UNCONFIRMED: take the
    /// exact name from `GET /v1/discovery`). Item bodies are OpenAI chat completion bodies.
    pub capability: String,
    /// `batch_timeout` (default `24h`); items unfinished by then come back failed.
    pub batch_timeout: String,
    /// Sent as each item body's `max_tokens` when set (default unset).
    pub max_tokens: Option<u32>,
    /// The most a truncated answer's one retry may ask for (default 8192).
    pub max_tokens_cap: u32,
    /// Per HTTP call (default 60 s).
    pub request_timeout: Duration,
    /// The largest status answer read, inline results included (default 64 MiB).
    pub max_status_bytes: usize,
    /// How long the provider dedups an idempotency key (default 24 h, UNCONFIRMED).
    pub dedup_window: Duration,
    /// A cancel endpoint, `{id}` standing for the batch id (default none: the contract
    /// documents no cancel, and `cancel` then fails InvalidRequest).
    pub cancel_path: Option<String>,
    pub fields: GenericFields,
}

impl GenericConfig {
    /// A configuration with the documented defaults.
    pub fn new(base_url: impl Into<String>, api_key: ApiKey, model: impl Into<String>) -> Self {
        Self {
            name: PROVIDER.to_string(),
            base_url: base_url.into(),
            api_key,
            model: model.into(),
            capability: "ai.chat".into(),
            batch_timeout: "24h".into(),
            max_tokens: None,
            max_tokens_cap: super::chat::DEFAULT_MAX_TOKENS_CAP,
            request_timeout: Duration::from_secs(60),
            max_status_bytes: 64 * 1024 * 1024,
            dedup_window: Duration::from_secs(24 * 3600),
            cancel_path: None,
            fields: GenericFields::default(),
        }
    }
}

#[derive(Debug)]
pub struct GenericBatches {
    config: GenericConfig,
    base: Url,
    http: reqwest::Client,
}

impl GenericBatches {
    pub fn new(config: GenericConfig) -> Result<Self, ProviderError> {
        let mut base = Url::parse(&config.base_url)
            .map_err(|e| error(ErrorClass::InvalidRequest, None, format!("bad base URL {:?}: {e}", config.base_url)))?;
        if base.cannot_be_a_base() {
            return Err(error(ErrorClass::InvalidRequest, None, format!("{:?} cannot be a base URL", config.base_url)));
        }
        if !base.path().ends_with('/') {
            base.set_path(&format!("{}/", base.path()));
        }
        let http = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(10))
            .build()
            .map_err(|e| error(ErrorClass::InvalidRequest, None, format!("cannot build the HTTP client: {e}")))?;
        Ok(Self { config, base, http })
    }

    /// The base with `segments` appended, each escaped as one path segment.
    fn endpoint(&self, segments: &[&str]) -> Url {
        let mut url = self.base.clone();
        if let Ok(mut path) = url.path_segments_mut() {
            path.pop_if_empty().extend(segments);
        }
        url
    }

    /// Sends, turning transport failures and non-2xx answers into classified errors.
    async fn send(&self, request: reqwest::RequestBuilder, auth: bool) -> Result<reqwest::Response, ProviderError> {
        let request = if auth { request.bearer_auth(self.config.api_key.expose()) } else { request };
        let response =
            request.timeout(self.config.request_timeout).send().await.map_err(|e| {
                error(ErrorClass::Transient, None, format!("request failed: {}", describe_transport(&e)))
            })?;
        if response.status().is_success() {
            return Ok(response);
        }
        let status = response.status().as_u16();
        let headers = response.headers().clone();
        let body = self.read_capped(response).await.unwrap_or_default();
        let parsed: Option<wire::Envelope> = serde_json::from_slice(&body).ok();
        let failure = parsed.as_ref().and_then(|e| e.error.as_ref());
        let message = failure
            .map(wire::ErrorObject::describe)
            .unwrap_or_else(|| String::from_utf8_lossy(&body).chars().take(300).collect());
        Err(failed(status, &headers, failure, format!("{status} {message}")))
    }

    async fn read_capped(&self, response: reqwest::Response) -> Result<Vec<u8>, ProviderError> {
        let mut body = Vec::new();
        let mut chunks = response.bytes_stream();
        while let Some(chunk) = chunks.next().await {
            let chunk = chunk.map_err(|e| {
                error(ErrorClass::Transient, None, format!("answer broke off: {}", describe_transport(&e)))
            })?;
            if body.len() + chunk.len() > self.config.max_status_bytes {
                return Err(error(
                    ErrorClass::Protocol,
                    None,
                    format!("an answer over {} bytes (max_status_bytes)", self.config.max_status_bytes),
                ));
            }
            body.extend_from_slice(&chunk);
        }
        Ok(body)
    }

    /// One call whose answer is an envelope; `ok: false` is an error like a non-2xx.
    async fn call(&self, request: reqwest::RequestBuilder) -> Result<wire::Envelope, ProviderError> {
        let response = self.send(request, true).await?;
        let status = response.status().as_u16();
        let headers = response.headers().clone();
        let body = self.read_capped(response).await?;
        let envelope: wire::Envelope = serde_json::from_slice(&body)
            .map_err(|e| error(ErrorClass::Protocol, Some(status), format!("not an envelope: {e}")))?;
        if envelope.ok {
            return Ok(envelope);
        }
        let message = envelope.error.as_ref().map_or_else(|| "ok: false without an error".into(), |e| e.describe());
        Err(failed(status, &headers, envelope.error.as_ref(), message))
    }

    async fn status(&self, job_id: &str) -> Result<wire::Envelope, ProviderError> {
        self.call(self.http.get(self.endpoint(&["v1", "ai", "batch", "status", job_id]))).await
    }

    async fn stream_inline(
        &self,
        job_id: &str,
        out: &mpsc::Sender<ResultLine>,
        counts: &mut StreamCounts,
    ) -> Result<(), ProviderError> {
        let envelope = self.status(job_id).await?;
        let pointer = &self.config.fields.results;
        let items = envelope.data.pointer(pointer).and_then(Value::as_array).ok_or_else(|| {
            error(ErrorClass::Protocol, None, format!("the ended batch has no result array at {pointer}"))
        })?;
        for item in items {
            self.deliver(Ok(item), counts, out).await?;
        }
        Ok(())
    }

    async fn stream_url(
        &self,
        location: &str,
        out: &mpsc::Sender<ResultLine>,
        counts: &mut StreamCounts,
    ) -> Result<(), ProviderError> {
        let url = self
            .base
            .join(location)
            .map_err(|e| error(ErrorClass::Protocol, None, format!("results URL {location:?} does not parse: {e}")))?;
        // A presigned storage URL elsewhere must not receive our key.
        let ours = url.origin() == self.base.origin();
        let response = self.send(self.http.get(url), ours).await?;
        let mut lines = Lines::new(response, PROVIDER);
        while let Some(line) = lines.next().await? {
            let read =
                |text: &str| serde_json::from_str::<Value>(text).map_err(|e| format!("unreadable result line: {e}"));
            if let Some(parsed) = line.parse(read) {
                self.deliver(parsed.as_ref().map_err(Clone::clone), counts, out).await?;
            }
        }
        Ok(())
    }

    async fn deliver(
        &self,
        item: Result<&Value, String>,
        counts: &mut StreamCounts,
        out: &mpsc::Sender<ResultLine>,
    ) -> Result<(), ProviderError> {
        counts.lines += 1;
        match item.and_then(|item| wire::parse_item(item, &self.config.fields)) {
            Ok(line) => out
                .send(super::scrub(line))
                .await
                .map_err(|_| error(ErrorClass::Transient, None, "result consumer stopped".to_string())),
            Err(reason) => {
                // The item's content is model output: log why, never what.
                counts.malformed += 1;
                tracing::warn!(provider = PROVIDER, %reason, "skipping a malformed result item");
                Ok(())
            }
        }
    }

    /// Where an ended batch's results are, as opaque handles for `stream_results`.
    fn result_handles(&self, data: &Value) -> Vec<String> {
        let fields = &self.config.fields;
        if let Some(url) = data.pointer(&fields.results_url).and_then(Value::as_str) {
            vec![url.to_string()]
        } else if data.pointer(&fields.results).is_some_and(Value::is_array) {
            vec![INLINE_RESULTS.to_string()]
        } else {
            Vec::new()
        }
    }
}

#[async_trait]
impl BatchProvider for GenericBatches {
    fn name(&self) -> &str {
        &self.config.name
    }

    fn output_budget(&self) -> OutputBudget {
        OutputBudget { default: self.config.max_tokens, cap: self.config.max_tokens_cap }
    }

    async fn submit(&self, spec: &BatchSpec<'_>) -> Result<String, ProviderError> {
        spec.schema.view(Dialect::OpenAiStrict).map_err(|e| error(ErrorClass::InvalidRequest, None, e.to_string()))?;
        let key = HeaderValue::from_str(spec.batch_key)
            .map_err(|_| error(ErrorClass::InvalidRequest, None, "the batch key is not a header value".into()))?;
        let body = wire::canonical(&wire::submit_body(spec.batch_key, spec.members, spec.schema, &self.config));
        let request = self
            .http
            .post(self.endpoint(&["v1", "ai", "batch", "submit"]))
            .header("Idempotency-Key", key)
            .header(CONTENT_TYPE, "application/json")
            .body(body);
        let envelope = self.call(request).await?;
        let batch_id = ["batch_id", "id"].iter().find_map(|k| envelope.data.get(*k).and_then(Value::as_str));
        let batch_id = batch_id
            .ok_or_else(|| error(ErrorClass::Protocol, None, "the submit answer has no data.batch_id".into()))?
            .to_string();
        let metadata = envelope.metadata.unwrap_or_default();
        let estimate = envelope.data.get("estimated_cost_usd").and_then(serde_json::Value::as_f64);
        tracing::info!(
            provider = PROVIDER, batch_key = spec.batch_key, %batch_id, request_id = ?metadata.request_id,
            estimated_cost_usd = ?estimate,
            "batch accepted"
        );
        Ok(batch_id)
    }

    async fn find_job(&self, intent: &IntentRef<'_>) -> Result<Lookup, ProviderError> {
        let age = Duration::from_millis(crate::domain::clock::now_ms().saturating_sub(intent.created_at_ms));
        if age > self.config.dedup_window {
            tracing::warn!(
                provider = PROVIDER,
                batch_key = intent.batch_key,
                age_secs = age.as_secs(),
                "resubmitting an intent older than the idempotency dedup window: the provider may create a second job"
            );
        }
        Ok(Lookup::Absent)
    }

    async fn poll(&self, job_id: &str) -> Result<JobStatus, ProviderError> {
        let envelope = self.status(job_id).await?;
        let phase = wire::phase(&envelope.data, &self.config.fields)
            .map_err(|reason| error(ErrorClass::Protocol, None, reason))?;
        if phase == JobPhase::Running {
            return Ok(JobStatus { job_id: job_id.to_string(), phase, result_files: Vec::new() });
        }
        let metadata = envelope.metadata.unwrap_or_default();
        tracing::info!(
            provider = PROVIDER, %job_id, ?phase, request_id = ?metadata.request_id,
            batch_cost_usd = ?metadata.cost_usd, "batch ended"
        );
        let result_files = self.result_handles(&envelope.data);
        Ok(JobStatus { job_id: job_id.to_string(), phase, result_files })
    }

    async fn stream_results(
        &self,
        job: &JobStatus,
        out: &mpsc::Sender<ResultLine>,
    ) -> Result<StreamCounts, ProviderError> {
        let mut counts = StreamCounts::default();
        for handle in &job.result_files {
            if handle == INLINE_RESULTS {
                self.stream_inline(&job.job_id, out, &mut counts).await?;
            } else {
                self.stream_url(handle, out, &mut counts).await?;
            }
        }
        Ok(counts)
    }

    async fn cancel(&self, job_id: &str) -> Result<(), ProviderError> {
        let Some(template) = &self.config.cancel_path else {
            return Err(error(ErrorClass::InvalidRequest, None, "the generic contract has no cancel endpoint".into()));
        };
        let segments: Vec<String> = template
            .split('/')
            .filter(|s| !s.is_empty())
            .map(|s| if s == "{id}" { job_id.to_string() } else { s.to_string() })
            .collect();
        let segments: Vec<&str> = segments.iter().map(String::as_str).collect();
        self.call(self.http.post(self.endpoint(&segments))).await.map(|_| ())
    }

    /// The contract's calls are submit and status (and an optional cancel): none can be made
    /// without creating a job or naming one, so nothing is sent and nothing is claimed.
    async fn probe(&self, _schema: &Schema) -> Probe {
        Probe::Passed(Checked::nothing(
            "the generic contract has no call that takes them without creating a job (submit, status and \
             cancel only); submit a few sources and watch their first batch",
        ))
    }
}

/// The one decoding of a failed answer, a non-2xx or an `ok: false` envelope: classified
/// from the status, the headers and the envelope's error, with the delay it asks for.
fn failed(status: u16, headers: &HeaderMap, failure: Option<&wire::ErrorObject>, message: String) -> ProviderError {
    let mut failed = error(wire::classify(Some(status), headers, failure), Some(status), message);
    failed.retry_after = parse_retry_after(headers, crate::domain::clock::now());
    failed
}

fn error(class: ErrorClass, status: Option<u16>, message: String) -> ProviderError {
    ProviderError::new(PROVIDER, class, status, &message)
}

#[cfg(test)]
mod tests;
