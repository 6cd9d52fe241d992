//! The OpenAI Batch API adapter (PROVIDERS.md §1): upload the JSONL input, create the
//! batch with our batch key in `metadata`, poll it, stream the output and error files.
//!
//! OpenAI offers no idempotency key for batch creation, so the batch key in `metadata` is
//! how a job created just before a crash (or before a dropped connection) is found again:
//! the scheduler calls `find_job` before any resubmission.

mod azure;
mod create;
mod flavour;
mod lookup;
pub(crate) mod wire;

use std::sync::atomic::AtomicBool;
use std::time::Duration;

use async_trait::async_trait;
use reqwest::multipart::{Form, Part};
use tokio::sync::mpsc;

use crate::domain::schema::{Dialect, Schema};

use super::chat::wire::{self as chat_wire, BudgetField};
use super::lines::Lines;
use super::{
    BatchProvider, BatchSpec, Checked, Coverage, ErrorClass, FailureCause, IntentRef, JobPhase, JobStatus, Lookup,
    PROBE_MAX_OUTPUT_TOKENS, Probe, ProviderError, ResultLine, StreamCounts, classify_status, describe_transport,
    parse_retry_after, probe_member, truncate,
};
use crate::domain::batch::OutputBudget;

const PROVIDER: &str = "openai";
/// How far back (pages of 100) a lost job is looked for: far more than one scheduler
/// creates between a crash and its restart.
const MAX_LIST_PAGES: usize = 20;
/// An undecided lookup is tried again after this long (the scheduler may shorten it).
const LOOKUP_RECHECK_AFTER: Duration = Duration::from_secs(60);
/// `errors.data[].code` of a batch failed by the organisation's enqueued-token limit.
const TOKEN_LIMIT_CODE: &str = "token_limit_exceeded";
/// Clock skew tolerated between our intent timestamp and the provider's `created_at`.
const CREATED_AT_SLACK: Duration = Duration::from_secs(600);

pub use super::ApiKey;
pub use azure::{AzureAuth, AzureTarget, azure_adapter};
pub use flavour::{AZURE_FILE_EXPIRY, Auth, Flavour, ProbeTarget};

#[derive(Debug, Clone)]
pub struct OpenAiConfig {
    /// Name used for this provider in the store and in operator output.
    pub name: String,
    /// e.g. `https://api.openai.com/v1`.
    pub base_url: String,
    pub api_key: ApiKey,
    pub model: String,
    pub request_timeout: Duration,
    /// Sent as `max_completion_tokens` when set (unset: the model's own output limit).
    pub max_completion_tokens: Option<u32>,
    /// The most a truncated answer's one retry may ask for.
    pub max_completion_tokens_cap: u32,
}

/// gpt-4o and gpt-4o-mini answer at most 16,384 output tokens; asking for more is a 400.
pub const DEFAULT_MAX_COMPLETION_TOKENS_CAP: u32 = 16_384;

#[derive(Debug)]
pub struct OpenAiBatches {
    config: OpenAiConfig,
    http: reqwest::Client,
    flavour: Flavour,
    /// The platform refused `metadata` on a create: later creates leave it out.
    omit_metadata: AtomicBool,
    /// The platform refused or dropped `metadata`: lookups stop trusting it.
    metadata_lost: AtomicBool,
}

impl OpenAiBatches {
    pub fn new(config: OpenAiConfig) -> Result<Self, ProviderError> {
        let http = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(10))
            .read_timeout(config.request_timeout)
            .build()
            .map_err(|e| error(ErrorClass::InvalidRequest, None, format!("cannot build the HTTP client: {e}")))?;
        Ok(Self {
            config,
            http,
            flavour: Flavour::default(),
            omit_metadata: AtomicBool::new(false),
            metadata_lost: AtomicBool::new(false),
        })
    }

    /// The same adapter for Azure OpenAI or an OpenAI-compatible platform.
    pub fn with_flavour(mut self, flavour: Flavour) -> Self {
        self.flavour = flavour;
        self
    }

    fn url(&self, path: &str) -> String {
        format!("{}{path}", self.config.base_url.trim_end_matches('/'))
    }

    /// Sends with auth, turning transport failures and non-2xx answers into classified errors.
    async fn send(&self, request: reqwest::RequestBuilder) -> Result<reqwest::Response, ProviderError> {
        let request = match self.flavour.auth {
            Auth::Bearer => request.bearer_auth(self.config.api_key.expose()),
            Auth::ApiKeyHeader => request.header("api-key", api_key_header(&self.config.api_key)?),
        };
        let request = match &self.flavour.api_version {
            Some(version) => request.query(&[("api-version", version.as_str())]),
            None => request,
        };
        let response = request
            .send()
            .await
            .map_err(|e| error(ErrorClass::Transient, None, format!("request failed: {}", describe_transport(&e))))?;
        if response.status().is_success() {
            return Ok(response);
        }
        let status = response.status().as_u16();
        let headers = response.headers().clone();
        let body = response.text().await.unwrap_or_default();
        let parts = chat_wire::ErrorParts::parse(&body);
        let message = parts.message.unwrap_or_else(|| truncate(&body));
        let class = classify_status(status, &headers, parts.code.as_deref());
        let text = format!("{status} {}: {message}", parts.code.unwrap_or_default());
        // Named after the platform's flavour, so an Azure operator reads "azure: 429 …".
        let mut failure = ProviderError::new(self.flavour.label, class, Some(status), &text);
        failure.retry_after = parse_retry_after(&headers, crate::domain::clock::now())
            .or_else(|| (status == 429).then(|| super::ratelimit::reset_delay(&headers)).flatten());
        Err(failure)
    }

    async fn json<T: serde::de::DeserializeOwned>(&self, request: reqwest::RequestBuilder) -> Result<T, ProviderError> {
        let response = self.send(request.timeout(self.config.request_timeout)).await?;
        response
            .json()
            .await
            .map_err(|e| error(ErrorClass::Protocol, None, format!("unexpected answer: {}", describe_transport(&e))))
    }

    async fn upload(&self, spec: &BatchSpec<'_>) -> Result<String, ProviderError> {
        spec.schema.view(Dialect::OpenAiStrict).map_err(|e| error(ErrorClass::InvalidRequest, None, e.to_string()))?;
        let mut jsonl = Vec::with_capacity(spec.members.len() * 1024);
        for member in spec.members {
            let mut line = wire::input_line(member, spec.schema, &self.config.model, self.config.max_completion_tokens);
            line["url"] = self.flavour.request_url.into();
            serde_json::to_writer(&mut jsonl, &line)
                .map_err(|e| error(ErrorClass::InvalidRequest, None, format!("cannot encode a request: {e}")))?;
            jsonl.push(b'\n');
        }
        let (max_bytes, max_lines) = (self.flavour.max_input_bytes, self.flavour.max_input_lines);
        if jsonl.len() > max_bytes || spec.members.len() > max_lines {
            return Err(error(
                ErrorClass::TooLarge,
                None,
                format!(
                    "the batch input is {} bytes in {} requests, over the Batch API's {max_bytes} bytes / {max_lines} requests",
                    jsonl.len(),
                    spec.members.len()
                ),
            ));
        }
        let file = Part::bytes(jsonl)
            .file_name(lookup::input_file_name(spec.batch_key))
            .mime_str("application/jsonl")
            .map_err(|e| error(ErrorClass::InvalidRequest, None, e.to_string()))?;
        let mut form = Form::new().text("purpose", "batch").part("file", file);
        // Azure's documented field names; the file expires whatever happens to us.
        if let Some(expiry) = self.flavour.file_expiry {
            form = form
                .text("expires_after.anchor", "created_at")
                .text("expires_after.seconds", expiry.as_secs().to_string());
        }
        // Only a refusal that says the file is too large is one (OpenAI's 400 "File is too
        // large.", a 413): splitting gets under the limit. Any other 400 keeps the class
        // its status and code give: Azure's `invalidPayload` and OpenAI's file checks are
        // `invalid_request`, failing the members once instead of halving the batch down to
        // single members refused the same way; `quotaExceeded` is `budget`. No Azure
        // source names the code of a file over its size limit, which is checked before
        // sending (docs/PROVIDERS.md, "Azure OpenAI").
        let uploaded: wire::FileObject =
            self.json(self.http.post(self.url("/files")).multipart(form)).await.map_err(|mut e| {
                if says_too_large(e.status, e.message()) {
                    e.class = ErrorClass::TooLarge;
                }
                e
            })?;
        Ok(uploaded.id)
    }

    /// Finds the job whose metadata carries this batch key, created at or after the intent.
    /// Only a walk that reached the end of the list, or batches older than the intent, may
    /// say `Absent`: one that ran out of pages has not ruled the job out, and resubmitting
    /// then could pay twice for the same work.
    pub async fn find_by_batch_key(&self, batch_key: &str, created_after_ms: u64) -> Result<Lookup, ProviderError> {
        let oldest_secs = created_after_ms.saturating_sub(CREATED_AT_SLACK.as_millis() as u64) / 1000;
        let mut after: Option<String> = None;
        for _ in 0..MAX_LIST_PAGES {
            let mut request = self.http.get(self.url("/batches")).query(&[("limit", "100")]);
            if let Some(cursor) = &after {
                request = request.query(&[("after", cursor.as_str())]);
            }
            let page: wire::BatchList = self.json(request).await?;
            for batch in &page.data {
                let key = batch.metadata.as_ref().and_then(|m| m.get(wire::BATCH_KEY_METADATA));
                if key.is_some_and(|k| k == batch_key) {
                    return Ok(Lookup::Found(batch.id.clone()));
                }
            }
            // Newest first: once a page reaches past the intent's time, nothing older can match.
            let reached_older = page.data.iter().any(|b| b.created_at.is_some_and(|c| c < oldest_secs));
            if !page.has_more || reached_older {
                return Ok(Lookup::Absent);
            }
            after = page.last_id.or_else(|| page.data.last().map(|b| b.id.clone()));
            if after.is_none() {
                return Ok(undecided("the batch list says it has more but gives no cursor".to_string()));
            }
        }
        Ok(undecided(format!("more than {MAX_LIST_PAGES} pages of batches since the intent; cannot rule one out")))
    }
}

impl OpenAiBatches {
    /// A batch deployment takes no synchronous call: a free authenticated read checks the
    /// endpoint and the key, and the model and schema wait for a deployment that can answer.
    async fn probe_by_listing(&self) -> Probe {
        let request = self.http.get(self.url("/batches")).query(&[("limit", "1")]);
        match self.json::<wire::BatchList>(request).await {
            Ok(_) => {
                let why = "a batch deployment takes no synchronous call, so neither was sent (the key was, to GET \
                           /batches): set check_deployment to a Standard deployment of the same model";
                let not = || Coverage::NotChecked(why.to_string());
                Probe::Passed(Checked { key: Coverage::Exercised, model: not(), schema: not() })
            }
            Err(e) => Probe::Refused(e),
        }
    }
}

/// Whether an upload refusal is about the file's size: a 413, or a 400 saying so.
fn says_too_large(status: Option<u16>, message: &str) -> bool {
    match status {
        Some(413) => true,
        Some(400) => message.to_ascii_lowercase().contains("too large"),
        _ => false,
    }
}

/// The key as an `api-key` header value, kept out of debug output like a bearer token.
fn api_key_header(key: &ApiKey) -> Result<reqwest::header::HeaderValue, ProviderError> {
    let mut value = reqwest::header::HeaderValue::from_str(key.expose()).map_err(|_| {
        error(ErrorClass::InvalidRequest, None, "the API key holds characters an HTTP header cannot carry".to_string())
    })?;
    value.set_sensitive(true);
    Ok(value)
}

fn undecided(reason: String) -> Lookup {
    Lookup::Undecided { recheck_after: LOOKUP_RECHECK_AFTER, reason }
}

#[async_trait]
impl BatchProvider for OpenAiBatches {
    fn name(&self) -> &str {
        &self.config.name
    }

    fn output_budget(&self) -> OutputBudget {
        OutputBudget { default: self.config.max_completion_tokens, cap: self.config.max_completion_tokens_cap }
    }

    async fn submit(&self, spec: &BatchSpec<'_>) -> Result<String, ProviderError> {
        let file_id = self.upload(spec).await?;
        self.create_batch(spec.batch_key, &file_id).await
    }

    async fn find_job(&self, intent: &IntentRef<'_>) -> Result<Lookup, ProviderError> {
        self.lookup(intent).await
    }

    async fn poll(&self, job_id: &str) -> Result<JobStatus, ProviderError> {
        let batch: wire::Batch = self.json(self.http.get(self.url(&format!("/batches/{job_id}")))).await?;
        // Azure's dated API versions have answered `Validating`, `Completed`.
        let phase = match batch.status.to_ascii_lowercase().as_str() {
            "validating" | "in_progress" | "finalizing" | "cancelling" => JobPhase::Running,
            "completed" => JobPhase::Completed,
            "expired" => JobPhase::Expired,
            "cancelled" => JobPhase::Cancelled,
            "failed" => {
                let (reason, cause) = batch_failure(&batch);
                JobPhase::Failed { reason: super::redact(&reason), cause }
            }
            other => return Err(error(ErrorClass::Protocol, None, format!("unknown batch status {other:?}"))),
        };
        let result_files = [batch.output_file_id, batch.error_file_id].into_iter().flatten().collect();
        Ok(JobStatus { job_id: batch.id, phase, result_files })
    }

    async fn stream_results(
        &self,
        job: &JobStatus,
        out: &mpsc::Sender<ResultLine>,
    ) -> Result<StreamCounts, ProviderError> {
        let mut counts = StreamCounts::default();
        for file_id in &job.result_files {
            let response = self.send(self.http.get(self.url(&format!("/files/{file_id}/content")))).await?;
            let mut lines = Lines::new(response, PROVIDER);
            while let Some(line) = lines.next().await? {
                super::lines::deliver(PROVIDER, &line, wire::parse_line, &mut counts, out).await?;
            }
        }
        Ok(counts)
    }

    async fn probe(&self, schema: &Schema) -> Probe {
        if let Err(e) = schema.view(Dialect::OpenAiStrict) {
            return Probe::Refused(error(ErrorClass::InvalidRequest, None, e.to_string()));
        }
        let model = match &self.flavour.probe {
            ProbeTarget::BatchModel => self.config.model.as_str(),
            ProbeTarget::Model(model) => model.as_str(),
            ProbeTarget::ListOnly => return self.probe_by_listing().await,
        };
        let budget = Some(PROBE_MAX_OUTPUT_TOKENS);
        let body = chat_wire::request_body(&probe_member(), schema, model, budget, BudgetField::MaxCompletionTokens);
        let path = self.flavour.chat_path(model);
        let request = self.http.post(self.url(&path)).timeout(self.config.request_timeout).json(&body);
        match self.send(request).await {
            Ok(_) => Probe::Passed(Checked::everything()),
            Err(e) => Probe::Refused(e),
        }
    }

    async fn cancel(&self, job_id: &str) -> Result<(), ProviderError> {
        let _: wire::Batch = self.json(self.http.post(self.url(&format!("/batches/{job_id}/cancel")))).await?;
        Ok(())
    }

    /// Files count against the organisation's storage until deleted (DELETE /v1/files/{id}).
    /// One already gone (404) counts as done, so a retry after a partial run converges.
    async fn delete_files(&self, job: &JobStatus) -> Result<u64, ProviderError> {
        let batch: wire::Batch = self.json(self.http.get(self.url(&format!("/batches/{}", job.job_id)))).await?;
        let files = [batch.input_file_id, batch.output_file_id, batch.error_file_id];
        let mut deleted = 0;
        for file_id in files.into_iter().flatten() {
            match self.send(self.http.delete(self.url(&format!("/files/{file_id}")))).await {
                Ok(_) => deleted += 1,
                Err(e) if e.class == ErrorClass::Gone => {}
                Err(e) => return Err(e),
            }
        }
        Ok(deleted)
    }
}

/// Why a batch failed, and whose fault it is. The enqueued-token limit is OpenAI's
/// capacity, not the content's (openai-python #2084, #1643); an error naming a line is
/// that line's; one naming nothing accuses no member.
fn batch_failure(batch: &wire::Batch) -> (String, FailureCause) {
    let errors: Vec<&wire::BatchError> = batch.errors.iter().flat_map(|e| &e.data).collect();
    let details: Vec<String> = errors
        .iter()
        .map(|e| {
            let line = e.line.map(|l| format!(" (line {l})")).unwrap_or_default();
            format!("{}{line}: {}", e.code.as_deref().unwrap_or("error"), e.message.as_deref().unwrap_or(""))
        })
        .collect();
    let reason = if details.is_empty() { "the provider failed the batch".to_string() } else { details.join("; ") };
    let capacity = errors.iter().any(|e| e.code.as_deref() == Some(TOKEN_LIMIT_CODE));
    let mut lines: Vec<u64> = errors.iter().filter_map(|e| e.line).collect();
    lines.sort_unstable();
    lines.dedup();
    let cause = if capacity {
        FailureCause::Capacity
    } else if lines.is_empty() {
        FailureCause::Unattributed
    } else {
        FailureCause::Lines(lines)
    };
    (reason, cause)
}

fn error(class: ErrorClass, status: Option<u16>, message: String) -> ProviderError {
    ProviderError::new(PROVIDER, class, status, &message)
}

#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_azure;
#[cfg(test)]
mod tests_compat;
