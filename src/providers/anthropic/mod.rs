//! The Anthropic Message Batches adapter (PROVIDERS.md §2): one POST carries every
//! request inline; each asks for a forced call of one tool whose `input_schema` is the
//! provider schema, so the tool input is the extraction. Poll until `ended`, then stream
//! the JSONL at `results_url`.
//!
//! # Finding a job again
//!
//! Anthropic has no idempotency key and batches carry no metadata, so a job created just
//! before a crash (or before a dropped connection) can only be recognised by what it
//! holds. `find_job` lists batches newest first (`after_id` = the page's `last_id`) back to
//! the intent's creation time minus [`CREATED_AT_SLACK`] (clock skew), and keeps the
//! candidates whose request count equals the intent's member count:
//!
//! - an ended candidate is ours when its results name only the intent's members and
//!   name them all (lines too broken to name anyone are given the benefit of the doubt).
//!   A candidate that shares only some members is not ours: it is an earlier attempt or
//!   another intent, and resubmitting is what the intent needs. Its first foreign id ends
//!   the scan, so a stranger's results are not read to the end.
//! - a candidate still `in_progress`/`canceling` cannot be told apart until it ends (its
//!   results are not readable before): `Undecided`, asked again after [`RECHECK_AFTER`].
//! - otherwise `Absent`.
//!
//! An ended candidate whose results are gone (archived, 404) is skipped: even if it was
//! ours, nothing could be ingested from it. Wrongly answering `Absent` costs a second paid
//! batch, never a second commit; wrongly answering `Found` would strand the real job, which
//! is why overlap alone never counts.

pub(crate) mod wire;

use std::collections::HashSet;
use std::time::Duration;

use async_trait::async_trait;
use reqwest::Url;
use reqwest::header::{CONTENT_TYPE, HeaderMap, HeaderValue};
use tokio::sync::mpsc;

use crate::domain::schema::{Dialect, Schema};

use super::lines::{Line, Lines};
use super::{
    BatchProvider, BatchSpec, Checked, ErrorClass, IntentRef, JobPhase, JobStatus, Lookup, PROBE_MAX_OUTPUT_TOKENS,
    Probe, ProviderError, ResultLine, StreamCounts, classify_status, describe_transport, parse_retry_after,
    probe_member, truncate,
};
use crate::domain::batch::OutputBudget;

pub const DEFAULT_BASE_URL: &str = "https://api.anthropic.com";
const PROVIDER: &str = "anthropic";
/// Clock skew tolerated between our intent timestamp and the provider's `created_at`.
/// Kept short: a wider window lets an earlier attempt of the same members look like ours.
pub const CREATED_AT_SLACK: Duration = Duration::from_secs(120);
pub const RECHECK_AFTER: Duration = Duration::from_secs(60);
const PAGE_SIZE: &str = "100";
/// 5,000 batches created since the intent is far beyond what one scheduler makes.
const MAX_LIST_PAGES: usize = 50;

pub use super::ApiKey;

/// The retry of a truncated answer asks for at most this many tokens unless configured:
/// twice the default `max_tokens`, within every current model's output limit.
pub const DEFAULT_MAX_TOKENS_CAP: u32 = 8192;

/// `max_tokens` of every request unless configured: the Messages API requires one.
pub const DEFAULT_MAX_TOKENS: u32 = 4096;

#[derive(Debug, Clone)]
pub struct AnthropicConfig {
    /// Name used for this provider in the store and in operator output (default `anthropic`).
    pub name: String,
    /// The API origin without `/v1`, e.g. [`DEFAULT_BASE_URL`].
    pub base_url: String,
    pub api_key: ApiKey,
    pub model: String,
    /// `max_tokens` of every request unless its member's budget was raised; batches reject 0.
    pub max_tokens: u32,
    /// The most a truncated answer's one retry may ask for.
    pub max_tokens_cap: u32,
    pub connect_timeout: Duration,
    /// Whole-call limit for JSON calls; for result downloads, the longest silence.
    pub request_timeout: Duration,
}

impl AnthropicConfig {
    /// The public API with default limits.
    pub fn new(api_key: ApiKey, model: impl Into<String>) -> Self {
        Self {
            name: PROVIDER.to_string(),
            base_url: DEFAULT_BASE_URL.to_string(),
            api_key,
            model: model.into(),
            max_tokens: DEFAULT_MAX_TOKENS,
            max_tokens_cap: DEFAULT_MAX_TOKENS_CAP,
            connect_timeout: Duration::from_secs(10),
            request_timeout: Duration::from_secs(120),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("anthropic base_url {0:?} must be an absolute http(s) URL")]
    BaseUrl(String),
    #[error("anthropic base_url {0:?} must not end in /v1: the adapter adds the API paths itself")]
    BaseUrlWithVersion(String),
    #[error("the anthropic API key is empty")]
    EmptyKey,
    #[error("the anthropic API key holds characters an HTTP header cannot carry")]
    KeyNotHeaderSafe,
    #[error("the anthropic model is not set")]
    NoModel,
    #[error("anthropic max_tokens must be at least 1")]
    MaxTokens,
    #[error("anthropic timeouts must be greater than zero")]
    Timeout,
    #[error("cannot build the HTTP client")]
    Client(#[source] reqwest::Error),
}

#[derive(Debug)]
pub struct AnthropicBatches {
    config: AnthropicConfig,
    base: Url,
    /// Auth and version headers; the key's value is marked sensitive.
    headers: HeaderMap,
    http: reqwest::Client,
}

impl AnthropicBatches {
    pub fn new(config: AnthropicConfig) -> Result<Self, ConfigError> {
        let base = super::api_origin(&config.base_url, "v1").map_err(|problem| match problem {
            super::OriginProblem::NotHttp => ConfigError::BaseUrl(config.base_url.clone()),
            super::OriginProblem::WithVersion => ConfigError::BaseUrlWithVersion(config.base_url.clone()),
        })?;
        if config.api_key.expose().trim().is_empty() {
            return Err(ConfigError::EmptyKey);
        }
        if config.model.trim().is_empty() {
            return Err(ConfigError::NoModel);
        }
        if config.max_tokens == 0 {
            return Err(ConfigError::MaxTokens);
        }
        if config.connect_timeout.is_zero() || config.request_timeout.is_zero() {
            return Err(ConfigError::Timeout);
        }
        let mut key = HeaderValue::from_str(config.api_key.expose()).map_err(|_| ConfigError::KeyNotHeaderSafe)?;
        key.set_sensitive(true);
        let mut headers = HeaderMap::new();
        headers.insert("x-api-key", key);
        headers.insert("anthropic-version", HeaderValue::from_static(wire::API_VERSION));
        let http = reqwest::Client::builder()
            .connect_timeout(config.connect_timeout)
            .read_timeout(config.request_timeout)
            .build()
            .map_err(ConfigError::Client)?;
        Ok(Self { config, base, headers, http })
    }

    /// `{base}/v1/messages/batches[/{id}[/{action}]]`, the id percent-encoded as one segment.
    fn batches_url(&self, id: Option<&str>, action: Option<&str>) -> Result<Url, ProviderError> {
        let mut url = self.base.clone();
        url.path_segments_mut()
            .map_err(|()| error(ErrorClass::Protocol, None, "the base URL cannot take a path".into()))?
            .pop_if_empty()
            .extend(["v1", "messages", "batches"])
            .extend(id)
            .extend(action);
        Ok(url)
    }

    /// `results_url` is absolute today; a relative one is resolved against the base. The
    /// key is only ever sent to the configured origin.
    fn results_url(&self, raw: &str) -> Result<Url, ProviderError> {
        let url = self
            .base
            .join(raw)
            .map_err(|e| error(ErrorClass::Protocol, None, format!("unusable results_url {raw:?}: {e}")))?;
        if url.origin() != self.base.origin() {
            return Err(error(
                ErrorClass::Protocol,
                None,
                format!("results_url {raw:?} is outside the configured API origin; not sending the key there"),
            ));
        }
        Ok(url)
    }

    /// Sends with auth, turning transport failures and non-2xx answers into classified errors.
    async fn send(&self, request: reqwest::RequestBuilder) -> Result<reqwest::Response, ProviderError> {
        let response =
            request.headers(self.headers.clone()).send().await.map_err(|e| {
                error(ErrorClass::Transient, None, format!("request failed: {}", describe_transport(&e)))
            })?;
        if response.status().is_success() {
            return Ok(response);
        }
        let status = response.status().as_u16();
        let headers = response.headers().clone();
        let body = response.text().await.unwrap_or_default();
        let parsed: Option<wire::ErrorBody> = serde_json::from_str(&body).ok();
        let detail = parsed.as_ref().map(|b| &b.error);
        let kind = detail.and_then(|d| d.kind.clone());
        let class = if detail.is_some_and(wire::ErrorDetail::is_budget) {
            ErrorClass::Budget
        } else {
            classify_status(status, &headers, kind.as_deref())
        };
        let message = detail.and_then(|d| d.message.clone()).unwrap_or_else(|| truncate(&body));
        let request_id = parsed
            .as_ref()
            .and_then(|b| b.request_id.clone())
            .or_else(|| headers.get("request-id").and_then(|v| v.to_str().ok()).map(str::to_string));
        let trace = request_id.map(|id| format!(" (request-id {id})")).unwrap_or_default();
        let mut failure =
            error(class, Some(status), format!("{status} {}: {message}{trace}", kind.unwrap_or_default()));
        failure.retry_after = parse_retry_after(&headers, crate::domain::clock::now());
        Err(failure)
    }

    async fn json<T: serde::de::DeserializeOwned>(&self, request: reqwest::RequestBuilder) -> Result<T, ProviderError> {
        let response = self.send(request.timeout(self.config.request_timeout)).await?;
        response
            .json()
            .await
            .map_err(|e| error(ErrorClass::Protocol, None, format!("unexpected answer: {}", describe_transport(&e))))
    }

    /// The create body, checked against the documented limits before anything is sent.
    fn create_body(&self, spec: &BatchSpec<'_>, max_bytes: usize) -> Result<Vec<u8>, ProviderError> {
        let invalid = |message: String| error(ErrorClass::InvalidRequest, None, message);
        let count = spec.members.len();
        if count == 0 {
            return Err(invalid("a batch holds at least one request".to_string()));
        }
        // Over a limit, the batch is split by the scheduler: no member is at fault.
        let too_large = |message: String| error(ErrorClass::TooLarge, None, message);
        if count > wire::MAX_REQUESTS {
            return Err(too_large(format!("a batch holds at most {} requests, not {count}", wire::MAX_REQUESTS)));
        }
        let input_schema = &spec.schema.view(Dialect::AnthropicTool).map_err(|e| invalid(e.to_string()))?.document;
        let mut seen = HashSet::with_capacity(count);
        let mut body = Vec::with_capacity(count * 1024);
        body.extend_from_slice(b"{\"requests\":[");
        for (index, member) in spec.members.iter().enumerate() {
            let custom_id = member.id.to_hex();
            if !wire::is_valid_custom_id(&custom_id) || !seen.insert(custom_id) {
                return Err(invalid(format!("member {index} has an invalid or repeated custom_id")));
            }
            if index > 0 {
                body.push(b',');
            }
            let max_tokens = member.output_budget.unwrap_or(self.config.max_tokens);
            let request = wire::request(member, spec.schema, input_schema, &self.config.model, max_tokens);
            serde_json::to_writer(&mut body, &request).map_err(|e| invalid(format!("cannot encode a request: {e}")))?;
            if body.len() > max_bytes {
                return Err(too_large(format!("the batch is over the {max_bytes} byte limit")));
            }
        }
        body.extend_from_slice(b"]}");
        Ok(body)
    }

    async fn list_page(&self, after_id: Option<&str>) -> Result<wire::BatchPage, ProviderError> {
        let mut request = self.http.get(self.batches_url(None, None)?).query(&[("limit", PAGE_SIZE)]);
        if let Some(cursor) = after_id {
            request = request.query(&[("after_id", cursor)]);
        }
        self.json(request).await
    }

    /// Whether an ended batch's results name exactly these members (see the module doc).
    async fn holds_exactly(
        &self,
        batch: &wire::MessageBatch,
        members: &HashSet<String>,
    ) -> Result<bool, ProviderError> {
        let Some(raw) = batch.results_url.as_deref() else {
            return Ok(false);
        };
        let response = match self.send(self.http.get(self.results_url(raw)?)).await {
            Ok(response) => response,
            Err(e) if e.class == ErrorClass::Gone => return Ok(false),
            Err(e) => return Err(e),
        };
        let mut lines = Lines::new(response, PROVIDER);
        let (mut named, mut unreadable) = (HashSet::new(), 0usize);
        while let Some(line) = lines.next().await? {
            match line.parse(|text| wire::custom_id(text).ok_or_else(String::new)) {
                None => {}
                Some(Ok(id)) if members.contains(&id) => {
                    named.insert(id);
                }
                Some(Ok(_)) => return Ok(false),
                Some(Err(_)) => unreadable += 1,
            }
        }
        Ok(!named.is_empty() && named.len() + unreadable >= members.len())
    }
}

#[async_trait]
impl BatchProvider for AnthropicBatches {
    fn name(&self) -> &str {
        &self.config.name
    }

    fn output_budget(&self) -> OutputBudget {
        OutputBudget { default: Some(self.config.max_tokens), cap: self.config.max_tokens_cap }
    }

    async fn submit(&self, spec: &BatchSpec<'_>) -> Result<String, ProviderError> {
        let body = self.create_body(spec, wire::MAX_BODY_BYTES)?;
        let request = self.http.post(self.batches_url(None, None)?).header(CONTENT_TYPE, "application/json").body(body);
        let batch: wire::MessageBatch = self.json(request).await?;
        Ok(batch.id)
    }

    async fn find_job(&self, intent: &IntentRef<'_>) -> Result<Lookup, ProviderError> {
        let members: HashSet<String> = intent.members.iter().map(|id| id.to_hex()).collect();
        let oldest_ms = intent.created_at_ms.saturating_sub(CREATED_AT_SLACK.as_millis() as u64);
        let mut running = Vec::new();
        let mut after: Option<String> = None;
        for _ in 0..MAX_LIST_PAGES {
            let page = self.list_page(after.as_deref()).await?;
            let mut reached_older = false;
            for batch in &page.data {
                // An unreadable timestamp never excludes a batch that might be ours.
                if batch.created_at.as_deref().and_then(wire::unix_ms).is_some_and(|at| at < oldest_ms) {
                    reached_older = true;
                    continue;
                }
                if batch.request_counts.total() != members.len() as u64 || intent.known_jobs.contains(&batch.id) {
                    continue;
                }
                if batch.processing_status == "ended" {
                    if self.holds_exactly(batch, &members).await? {
                        return Ok(Lookup::Found(batch.id.clone()));
                    }
                } else {
                    running.push(batch.id.clone());
                }
            }
            after = page.last_id.clone().or_else(|| page.data.last().map(|b| b.id.clone()));
            if !page.has_more || reached_older || after.is_none() {
                return Ok(verdict(&running));
            }
        }
        Ok(Lookup::Undecided {
            recheck_after: RECHECK_AFTER,
            reason: format!("more than {MAX_LIST_PAGES} pages of batches since the intent; cannot rule one out"),
        })
    }

    async fn poll(&self, job_id: &str) -> Result<JobStatus, ProviderError> {
        let batch: wire::MessageBatch = self.json(self.http.get(self.batches_url(Some(job_id), None)?)).await?;
        // Anthropic never expires a whole batch: unfinished requests come back as `expired` lines.
        let phase = match batch.processing_status.as_str() {
            "in_progress" | "canceling" => JobPhase::Running,
            "ended" if batch.cancel_initiated_at.is_some() => JobPhase::Cancelled,
            "ended" => JobPhase::Completed,
            other => return Err(error(ErrorClass::Protocol, None, format!("unknown processing_status {other:?}"))),
        };
        let result_files = if phase.is_terminal() { batch.results_url.into_iter().collect() } else { Vec::new() };
        Ok(JobStatus { job_id: batch.id, phase, result_files })
    }

    async fn stream_results(
        &self,
        job: &JobStatus,
        out: &mpsc::Sender<ResultLine>,
    ) -> Result<StreamCounts, ProviderError> {
        let mut counts = StreamCounts::default();
        for raw in &job.result_files {
            let response = self.send(self.http.get(self.results_url(raw)?)).await?;
            let mut lines = Lines::new(response, PROVIDER);
            while let Some(line) = lines.next().await? {
                deliver(line, &mut counts, out).await?;
            }
        }
        Ok(counts)
    }

    async fn probe(&self, schema: &Schema) -> Probe {
        let input_schema = match schema.view(Dialect::AnthropicTool) {
            Ok(view) => &view.document,
            Err(e) => return Probe::Refused(error(ErrorClass::InvalidRequest, None, e.to_string())),
        };
        let request = wire::request(&probe_member(), schema, input_schema, &self.config.model, PROBE_MAX_OUTPUT_TOKENS);
        let mut url = self.base.clone();
        match url.path_segments_mut() {
            Ok(mut segments) => {
                segments.pop_if_empty().extend(["v1", "messages"]);
            }
            Err(()) => {
                return Probe::Refused(error(ErrorClass::Protocol, None, "the base URL cannot take a path".into()));
            }
        }
        let call = self.http.post(url).timeout(self.config.request_timeout).json(&request["params"]);
        match self.send(call).await {
            Ok(_) => Probe::Passed(Checked::everything()),
            Err(e) => Probe::Refused(e),
        }
    }

    async fn cancel(&self, job_id: &str) -> Result<(), ProviderError> {
        let _: wire::MessageBatch = self.json(self.http.post(self.batches_url(Some(job_id), Some("cancel"))?)).await?;
        Ok(())
    }
}

fn verdict(running: &[String]) -> Lookup {
    if running.is_empty() {
        return Lookup::Absent;
    }
    Lookup::Undecided {
        recheck_after: RECHECK_AFTER,
        reason: format!(
            "{} batch(es) of the same size still running ({}); their requests are unknown until they end",
            running.len(),
            running.join(", ")
        ),
    }
}

async fn deliver(line: Line, counts: &mut StreamCounts, out: &mpsc::Sender<ResultLine>) -> Result<(), ProviderError> {
    let Some(parsed) = line.parse(wire::parse_line) else {
        return Ok(());
    };
    counts.lines += 1;
    match parsed {
        Ok(parsed) => out
            .send(super::scrub(parsed))
            .await
            .map_err(|_| error(ErrorClass::Transient, None, "result consumer stopped".to_string())),
        Err(reason) => {
            // The line's content is model output: log why, never what.
            counts.malformed += 1;
            tracing::warn!(provider = PROVIDER, %reason, "skipping a malformed result line");
            Ok(())
        }
    }
}

fn error(class: ErrorClass, status: Option<u16>, message: String) -> ProviderError {
    ProviderError::new(PROVIDER, class, status, &message)
}

#[cfg(test)]
mod tests;
