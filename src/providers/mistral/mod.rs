//! The Mistral batch API adapter (docs/PROVIDERS.md, "Mistral"): upload the JSONL input
//! (`POST /v1/files`, `purpose = batch`), create a job on `/v1/chat/completions` with our
//! batch key in `metadata` (`POST /v1/batch/jobs`), poll it (`GET /v1/batch/jobs/{id}`),
//! stream its `output_file` and `error_file` (`GET /v1/files/{id}/content`), joined on
//! `custom_id`.
//!
//! # Finding a job again
//!
//! Creating a job is not idempotent and takes no idempotency key, but a job keeps the
//! `metadata` we give it. `find_job` walks the job list (`page` from 0, newest first) and
//! answers `Found` for the job whose metadata carries the intent's batch key, `Absent`
//! once the list ends or reaches jobs older than the intent, and `Undecided` past
//! [`MAX_LIST_PAGES`]: it never resubmits on a guess.

pub(crate) mod wire;

use std::collections::{BTreeMap, HashSet};
use std::time::Duration;

use async_trait::async_trait;
use reqwest::Url;
use reqwest::multipart::{Form, Part};
use tokio::sync::mpsc;

use super::job_list::{JobListPage, find_in_job_list};
use super::lines::Lines;
use super::{
    BatchProvider, BatchSpec, Checked, ErrorClass, FailureCause, IntentRef, JobPhase, JobStatus, Lookup,
    PROBE_MAX_OUTPUT_TOKENS, Probe, ProviderError, ResultLine, StreamCounts, classify_status, describe_transport,
    parse_retry_after, probe_member, truncate,
};
use crate::domain::batch::OutputBudget;
use crate::domain::schema::{Dialect, Schema};

pub use super::ApiKey;

pub const DEFAULT_BASE_URL: &str = "https://api.mistral.ai";
/// The most a truncation retry asks for unless configured.
pub const DEFAULT_MAX_TOKENS_CAP: u32 = 16_384;
const PROVIDER: &str = "mistral";
pub const RECHECK_AFTER: Duration = Duration::from_secs(60);
/// The SDKs' default `page_size`.
const PAGE_SIZE: u64 = 100;
/// 2,000 jobs: far more than one scheduler creates between a crash and its restart.
pub const MAX_LIST_PAGES: usize = 20;
/// Clock skew tolerated between our intent timestamp and the provider's `created_at`.
const CREATED_AT_SLACK: Duration = Duration::from_secs(600);

#[derive(Debug, Clone)]
pub struct MistralConfig {
    /// Name used for this provider in the store and in operator output (default `mistral`).
    pub name: String,
    /// The API origin without `/v1`, e.g. [`DEFAULT_BASE_URL`].
    pub base_url: String,
    pub api_key: ApiKey,
    /// A model id such as `mistral-small-latest`.
    pub model: String,
    /// Each request's `max_tokens` unless a member's budget was raised.
    pub max_tokens: Option<u32>,
    pub max_tokens_cap: u32,
    /// The job's `timeout_hours` (Mistral's default when unset).
    pub timeout_hours: Option<u32>,
    pub connect_timeout: Duration,
    /// Whole-call limit for JSON calls; for uploads and downloads, the longest silence.
    pub request_timeout: Duration,
}

impl MistralConfig {
    pub fn new(api_key: ApiKey, model: impl Into<String>) -> Self {
        Self {
            name: PROVIDER.to_string(),
            base_url: DEFAULT_BASE_URL.to_string(),
            api_key,
            model: model.into(),
            max_tokens: None,
            max_tokens_cap: DEFAULT_MAX_TOKENS_CAP,
            timeout_hours: None,
            connect_timeout: Duration::from_secs(10),
            request_timeout: Duration::from_secs(120),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("mistral base_url {0:?} must be an absolute http(s) URL")]
    BaseUrl(String),
    #[error("mistral base_url {0:?} must not end in /v1: the adapter adds the API paths itself")]
    BaseUrlWithVersion(String),
    #[error("the mistral API key is empty")]
    EmptyKey,
    #[error("the mistral API key holds characters an HTTP header cannot carry")]
    KeyNotHeaderSafe,
    #[error("the mistral model is not set")]
    NoModel,
    #[error("mistral timeouts must be greater than zero")]
    Timeout,
    #[error("cannot build the HTTP client")]
    Client(#[source] reqwest::Error),
}

#[derive(Debug)]
pub struct MistralBatches {
    config: MistralConfig,
    base: Url,
    /// `Authorization: Bearer <key>`, marked sensitive.
    auth: reqwest::header::HeaderValue,
    http: reqwest::Client,
}

impl MistralBatches {
    pub fn new(config: MistralConfig) -> Result<Self, ConfigError> {
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
        if config.connect_timeout.is_zero() || config.request_timeout.is_zero() {
            return Err(ConfigError::Timeout);
        }
        let mut auth = reqwest::header::HeaderValue::from_str(&format!("Bearer {}", config.api_key.expose()))
            .map_err(|_| ConfigError::KeyNotHeaderSafe)?;
        auth.set_sensitive(true);
        let http = reqwest::Client::builder()
            .connect_timeout(config.connect_timeout)
            .read_timeout(config.request_timeout)
            .build()
            .map_err(ConfigError::Client)?;
        Ok(Self { config, base, auth, http })
    }

    /// `{base}/v1/{segments…}`, each segment percent-encoded (a job or file id is one).
    fn url(&self, segments: &[&str]) -> Result<Url, ProviderError> {
        let mut url = self.base.clone();
        url.path_segments_mut()
            .map_err(|()| error(ErrorClass::InvalidRequest, None, "base_url cannot take a path".to_string()))?
            .pop_if_empty()
            .push("v1")
            .extend(segments);
        Ok(url)
    }

    /// Sends with auth, turning transport failures and non-2xx answers into classified errors.
    async fn send(&self, request: reqwest::RequestBuilder) -> Result<reqwest::Response, ProviderError> {
        let response =
            request.header(reqwest::header::AUTHORIZATION, self.auth.clone()).send().await.map_err(|e| {
                error(ErrorClass::Transient, None, format!("request failed: {}", describe_transport(&e)))
            })?;
        if response.status().is_success() {
            return Ok(response);
        }
        let status = response.status().as_u16();
        let headers = response.headers().clone();
        let body = response.text().await.unwrap_or_default();
        let parts = wire::ErrorParts::parse(&body);
        let class = classify_status(status, &headers, parts.kind.as_deref());
        let message = parts.message.unwrap_or_else(|| truncate(&body));
        let kind = parts.kind.map(|k| format!(" {k}")).unwrap_or_default();
        let mut failure = error(class, Some(status), format!("{status}{kind}: {message}"));
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

    /// The JSONL input, every member checked before anything is sent.
    fn input(&self, spec: &BatchSpec<'_>) -> Result<Vec<u8>, ProviderError> {
        let invalid = |message: String| error(ErrorClass::InvalidRequest, None, message);
        if spec.members.is_empty() {
            return Err(invalid("a batch holds at least one request".to_string()));
        }
        spec.schema.view(Dialect::OpenAiStrict).map_err(|e| invalid(e.to_string()))?;
        let mut seen = HashSet::with_capacity(spec.members.len());
        let mut jsonl = Vec::with_capacity(spec.members.len() * 1024);
        for (index, member) in spec.members.iter().enumerate() {
            let key = member.id.to_hex();
            if !seen.insert(key.clone()) {
                return Err(invalid(format!("member {index} repeats the custom_id {key}")));
            }
            let line = wire::input_line(member, spec.schema, self.config.max_tokens);
            serde_json::to_writer(&mut jsonl, &line).map_err(|e| invalid(format!("cannot encode a request: {e}")))?;
            jsonl.push(b'\n');
        }
        Ok(jsonl)
    }

    async fn upload(&self, spec: &BatchSpec<'_>) -> Result<String, ProviderError> {
        let jsonl = self.input(spec)?;
        let file = Part::bytes(jsonl)
            .file_name(format!("commitpoint-{}.jsonl", spec.batch_key))
            .mime_str("application/jsonl")
            .map_err(|e| error(ErrorClass::InvalidRequest, None, e.to_string()))?;
        let form = Form::new().text("purpose", "batch").part("file", file);
        // A file over the upload limit is refused before any job exists: the scheduler
        // splits the batch rather than failing its members.
        let uploaded: wire::FileObject =
            self.json(self.http.post(self.url(&["files"])?).multipart(form)).await.map_err(|mut e| {
                if e.status == Some(413) {
                    e.class = ErrorClass::TooLarge;
                }
                e
            })?;
        Ok(uploaded.id)
    }

    async fn job(&self, job_id: &str) -> Result<wire::Job, ProviderError> {
        self.json(self.http.get(self.url(&["batch", "jobs", job_id])?)).await
    }

    async fn list_page(&self, page: u64) -> Result<wire::JobList, ProviderError> {
        let request = self.http.get(self.url(&["batch", "jobs"])?).query(&[
            ("page", page.to_string()),
            ("page_size", PAGE_SIZE.to_string()),
            ("order_by", "-created".to_string()),
        ]);
        self.json(request).await
    }

    async fn delete_file(&self, file_id: &str) -> Result<bool, ProviderError> {
        match self.send(self.http.delete(self.url(&["files", file_id])?)).await {
            Ok(_) => Ok(true),
            Err(e) if e.class == ErrorClass::Gone => Ok(false),
            Err(e) => Err(e),
        }
    }
}

#[async_trait]
impl BatchProvider for MistralBatches {
    fn name(&self) -> &str {
        &self.config.name
    }

    fn output_budget(&self) -> OutputBudget {
        OutputBudget { default: self.config.max_tokens, cap: self.config.max_tokens_cap }
    }

    async fn submit(&self, spec: &BatchSpec<'_>) -> Result<String, ProviderError> {
        let file_id = self.upload(spec).await?;
        let body = wire::CreateJob {
            input_files: [&file_id],
            endpoint: wire::ENDPOINT,
            model: &self.config.model,
            metadata: BTreeMap::from([(wire::BATCH_KEY_METADATA, spec.batch_key)]),
            timeout_hours: self.config.timeout_hours,
        };
        let created = self.json::<wire::Job>(self.http.post(self.url(&["batch", "jobs"])?).json(&body)).await;
        // An answered refusal means no job refers to the upload: it goes now. Without an
        // answer (status None) a job may exist and read it, so it stays.
        if let Err(refused) = &created
            && refused.status.is_some()
            && let Err(e) = self.delete_file(&file_id).await
        {
            tracing::warn!(provider = PROVIDER, file = %file_id, error = %e,
                "cannot delete the input file of a refused create");
        }
        Ok(created?.id)
    }

    async fn find_job(&self, intent: &IntentRef<'_>) -> Result<Lookup, ProviderError> {
        let oldest_secs = intent.created_at_ms.saturating_sub(CREATED_AT_SLACK.as_millis() as u64) / 1000;
        let read_page = |token: Option<String>| async move {
            let page_number = token.as_deref().and_then(|t| t.parse::<u64>().ok()).unwrap_or(0);
            let page = self.list_page(page_number).await?;
            let ours = page
                .data
                .iter()
                .find(|job| job.batch_key() == Some(intent.batch_key) && !intent.known_jobs.contains(&job.id))
                .map(|job| job.id.clone());
            // Newest first: once a page reaches past the intent's time, nothing older is ours.
            let reached_older = page.data.iter().any(|job| job.created_at.is_some_and(|c| c < oldest_secs));
            let more = !page.data.is_empty() && (page_number + 1).saturating_mul(PAGE_SIZE) < page.total;
            let next = (more && !reached_older).then(|| (page_number + 1).to_string());
            Ok(JobListPage { ours, next })
        };
        let unfinished =
            || format!("more than {MAX_LIST_PAGES} pages of batch jobs since the intent; cannot rule one out");
        find_in_job_list(MAX_LIST_PAGES, RECHECK_AFTER, unfinished, read_page).await
    }

    async fn poll(&self, job_id: &str) -> Result<JobStatus, ProviderError> {
        let job = self.job(job_id).await?;
        let phase = match wire::state(&job.status) {
            Some(wire::State::Running) => JobPhase::Running,
            Some(wire::State::Succeeded) => JobPhase::Completed,
            // Ran out of `timeout_hours`: what ran is in the files, the rest goes again.
            Some(wire::State::TimedOut) => JobPhase::Expired,
            Some(wire::State::Cancelled) => JobPhase::Cancelled,
            // `errors` names no line: whatever did run is still read from the files, and
            // each member's attempt is counted, so a job failing every time ends.
            Some(wire::State::Failed) => {
                JobPhase::Failed { reason: job_failure(&job), cause: FailureCause::Unattributed }
            }
            None => {
                return Err(error(ErrorClass::Protocol, None, format!("unknown batch job status {:?}", job.status)));
            }
        };
        let result_files = if phase.is_terminal() {
            [job.output_file, job.error_file].into_iter().flatten().collect()
        } else {
            vec![]
        };
        Ok(JobStatus { job_id: job.id, phase, result_files })
    }

    async fn stream_results(
        &self,
        job: &JobStatus,
        out: &mpsc::Sender<ResultLine>,
    ) -> Result<StreamCounts, ProviderError> {
        let mut counts = StreamCounts::default();
        for file_id in &job.result_files {
            let response = self.send(self.http.get(self.url(&["files", file_id, "content"])?)).await?;
            let mut lines = Lines::new(response, PROVIDER);
            while let Some(line) = lines.next().await? {
                super::lines::deliver(PROVIDER, &line, wire::parse_line, &mut counts, out).await?;
            }
        }
        Ok(counts)
    }

    async fn cancel(&self, job_id: &str) -> Result<(), ProviderError> {
        let _: wire::Job = self.json(self.http.post(self.url(&["batch", "jobs", job_id, "cancel"])?)).await?;
        Ok(())
    }

    /// Input, output and error files stay in the organisation's storage until deleted; one
    /// already gone counts as done, so a retry after a partial run converges.
    async fn delete_files(&self, job: &JobStatus) -> Result<u64, ProviderError> {
        let stored = self.job(&job.job_id).await?;
        let files = stored.input_files.into_iter().chain(stored.output_file).chain(stored.error_file);
        let mut deleted = 0;
        for file_id in files {
            deleted += u64::from(self.delete_file(&file_id).await?);
        }
        Ok(deleted)
    }

    async fn probe(&self, schema: &Schema) -> Probe {
        if let Err(e) = schema.view(Dialect::OpenAiStrict) {
            return Probe::Refused(error(ErrorClass::InvalidRequest, None, e.to_string()));
        }
        let body = wire::request_body(&probe_member(), schema, Some(&self.config.model), Some(PROBE_MAX_OUTPUT_TOKENS));
        let url = match self.url(&["chat", "completions"]) {
            Ok(url) => url,
            Err(e) => return Probe::Refused(e),
        };
        match self.send(self.http.post(url).timeout(self.config.request_timeout).json(&body)).await {
            Ok(_) => Probe::Passed(Checked::everything()),
            Err(e) => Probe::Refused(e),
        }
    }
}

/// A failed job's `errors` (`{message, count}` each), joined.
fn job_failure(job: &wire::Job) -> String {
    let details: Vec<String> = job
        .errors
        .iter()
        .map(|e| match e.count {
            Some(count) if count > 1 => format!("{} (x{count})", e.message),
            _ => e.message.clone(),
        })
        .collect();
    let reason = if details.is_empty() { "the batch job failed".to_string() } else { details.join("; ") };
    super::redact(&reason)
}

fn error(class: ErrorClass, status: Option<u16>, message: String) -> ProviderError {
    ProviderError::new(PROVIDER, class, status, &message)
}

#[cfg(test)]
mod tests;
