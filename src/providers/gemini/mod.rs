//! The Gemini API batch mode adapter (docs/PROVIDERS.md, "Gemini"): each member becomes a
//! `GenerateContentRequest` whose `generationConfig` asks for `application/json` under the
//! schema's Gemini view (`responseJsonSchema`), keyed by its extraction id. Small batches
//! go inline in the `models/{model}:batchGenerateContent` call; one whose body would pass
//! the inline limit is uploaded as JSONL through the File API's resumable protocol first.
//! Poll `batches/{id}` until its state ends, then read the keyed results inline from the
//! batch or stream them from the responses file.
//!
//! # Finding a job again
//!
//! Creating a batch is not idempotent ("If you send the same creation request twice, two
//! separate batch jobs will be created", batch guide). But a batch carries the
//! `displayName` we give it, and we give it the intent's batch key, so `find_job` lists
//! batches page by page (`pageToken` = the previous page's `nextPageToken`) and answers
//! `Found` for the one with that name, `Absent` when the whole list holds none, and
//! `Undecided` when the list is longer than [`MAX_LIST_PAGES`]: it never resubmits on a
//! guess.

mod http;
mod keyless;
pub(crate) mod wire;

use std::collections::HashSet;
use std::time::Duration;

use async_trait::async_trait;
use reqwest::Url;
use reqwest::header::{HeaderMap, HeaderValue};
use serde_json::{Value, json};
use tokio::sync::mpsc;

use super::job_list::{JobListPage, find_in_job_list};
use super::lines::{Line, Lines};
use super::{
    BatchProvider, BatchSpec, Checked, ErrorClass, FailureCause, IntentRef, JobPhase, JobStatus, Lookup,
    PROBE_MAX_OUTPUT_TOKENS, Probe, ProviderError, ResultLine, StreamCounts, probe_member, redact,
};
use crate::domain::batch::{LineResult, OutputBudget};
use crate::domain::schema::{Dialect, Schema};

pub use super::ApiKey;

pub const DEFAULT_BASE_URL: &str = "https://generativelanguage.googleapis.com";
/// "Inline requests ... keep the total request size under 20MB" (batch guide).
pub const INLINE_MAX_BYTES: u64 = 20_000_000;
/// "The maximum allowed file size for an input file is 2GB" (batch guide).
pub const MAX_FILE_BYTES: u64 = 2_000_000_000;
/// The most a truncation retry asks for unless configured: within every current model's limit.
pub const DEFAULT_MAX_OUTPUT_TOKENS_CAP: u32 = 16_384;
const PROVIDER: &str = "gemini";
/// Names our batches so `find_job` can tell them from others of the same project.
const DISPLAY_PREFIX: &str = "commitpoint-";
pub const RECHECK_AFTER: Duration = Duration::from_secs(60);
const PAGE_SIZE: &str = "100";
/// 5,000 batches is far more than the project keeps listed in any window we care about.
pub const MAX_LIST_PAGES: usize = 50;
/// Result handles in [`JobStatus::result_files`]: the batch itself, or its responses file.
const INLINE_HANDLE: &str = "inline:";
const FILE_HANDLE: &str = "file:";

#[derive(Debug, Clone)]
pub struct GeminiConfig {
    /// Name used for this provider in the store and in operator output (default `gemini`).
    pub name: String,
    /// The API origin without `/v1beta`, e.g. [`DEFAULT_BASE_URL`].
    pub base_url: String,
    pub api_key: ApiKey,
    /// A model id such as `gemini-2.5-flash`.
    pub model: String,
    /// `generationConfig.maxOutputTokens` unless a member's budget was raised.
    pub max_output_tokens: Option<u32>,
    pub max_output_tokens_cap: u32,
    /// Batches whose inline body would be larger go through the File API.
    pub inline_max_bytes: u64,
    pub connect_timeout: Duration,
    /// Whole-call limit for JSON calls; for uploads and downloads, the longest silence.
    pub request_timeout: Duration,
}

impl GeminiConfig {
    pub fn new(api_key: ApiKey, model: impl Into<String>) -> Self {
        Self {
            name: PROVIDER.to_string(),
            base_url: DEFAULT_BASE_URL.to_string(),
            api_key,
            model: model.into(),
            max_output_tokens: None,
            max_output_tokens_cap: DEFAULT_MAX_OUTPUT_TOKENS_CAP,
            inline_max_bytes: INLINE_MAX_BYTES,
            connect_timeout: Duration::from_secs(10),
            request_timeout: Duration::from_secs(120),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("gemini base_url {0:?} must be an absolute http(s) URL")]
    BaseUrl(String),
    #[error("gemini base_url {0:?} must not end in /v1beta: the adapter adds the API paths itself")]
    BaseUrlWithVersion(String),
    #[error("the gemini API key is empty")]
    EmptyKey,
    #[error("the gemini API key holds characters an HTTP header cannot carry")]
    KeyNotHeaderSafe,
    #[error("the gemini model is not set")]
    NoModel,
    #[error("gemini timeouts must be greater than zero")]
    Timeout,
    #[error("cannot build the HTTP client")]
    Client(#[source] reqwest::Error),
}

#[derive(Debug)]
pub struct GeminiBatches {
    config: GeminiConfig,
    base: Url,
    /// `x-goog-api-key`, marked sensitive.
    headers: HeaderMap,
    http: reqwest::Client,
    /// What `keyless` needs of the batches this process created.
    submitted: keyless::Submitted,
}

impl GeminiBatches {
    pub fn new(config: GeminiConfig) -> Result<Self, ConfigError> {
        let trimmed = config.base_url.trim_end_matches('/');
        let base = Url::parse(trimmed)
            .ok()
            .filter(|u| matches!(u.scheme(), "http" | "https") && u.has_host())
            .ok_or_else(|| ConfigError::BaseUrl(config.base_url.clone()))?;
        if base.path().trim_end_matches('/').ends_with("/v1beta") {
            return Err(ConfigError::BaseUrlWithVersion(config.base_url.clone()));
        }
        if config.api_key.expose().trim().is_empty() {
            return Err(ConfigError::EmptyKey);
        }
        if config.model.trim().is_empty() {
            return Err(ConfigError::NoModel);
        }
        if config.connect_timeout.is_zero() || config.request_timeout.is_zero() {
            return Err(ConfigError::Timeout);
        }
        let mut key = HeaderValue::from_str(config.api_key.expose()).map_err(|_| ConfigError::KeyNotHeaderSafe)?;
        key.set_sensitive(true);
        let mut headers = HeaderMap::new();
        headers.insert("x-goog-api-key", key);
        let http = reqwest::Client::builder()
            .connect_timeout(config.connect_timeout)
            .read_timeout(config.request_timeout)
            .build()
            .map_err(ConfigError::Client)?;
        Ok(Self { config, base, headers, http, submitted: keyless::Submitted::default() })
    }

    /// Every request of the batch, keyed by extraction id, checked before anything is sent.
    fn requests(&self, spec: &BatchSpec<'_>) -> Result<Vec<(String, Value)>, ProviderError> {
        let invalid = |message: String| error(ErrorClass::InvalidRequest, None, message);
        if spec.members.is_empty() {
            return Err(invalid("a batch holds at least one request".to_string()));
        }
        let view = &spec.schema.view(Dialect::GeminiJson).map_err(|e| invalid(e.to_string()))?.document;
        let mut seen = HashSet::with_capacity(spec.members.len());
        let mut requests = Vec::with_capacity(spec.members.len());
        for (index, member) in spec.members.iter().enumerate() {
            let key = member.id.to_hex();
            if !seen.insert(key.clone()) {
                return Err(invalid(format!("member {index} repeats the key {key}")));
            }
            let max = member.output_budget.or(self.config.max_output_tokens);
            requests.push((key, wire::request(member, spec.schema, view, max)));
        }
        Ok(requests)
    }

    /// The `inputConfig`: inline when the body stays within the limit, else an uploaded file
    /// (whose name comes back too).
    async fn input_config(&self, spec: &BatchSpec<'_>) -> Result<(Value, Option<String>), ProviderError> {
        let requests = self.requests(spec)?;
        let encode = |e: serde_json::Error| error(ErrorClass::InvalidRequest, None, format!("cannot encode: {e}"));
        let inline: Vec<Value> = requests.iter().map(|(key, r)| wire::inline_entry(key, r.clone())).collect();
        let config = json!({"requests": {"requests": inline}});
        let size = serde_json::to_vec(&config).map_err(encode)?.len() as u64;
        if size <= self.config.inline_max_bytes {
            return Ok((config, None));
        }
        drop(config);
        let mut jsonl = Vec::with_capacity(usize::try_from(size).unwrap_or(0));
        for (key, request) in requests {
            serde_json::to_writer(&mut jsonl, &wire::file_line(&key, request)).map_err(encode)?;
            jsonl.push(b'\n');
            if jsonl.len() as u64 > MAX_FILE_BYTES {
                // Over a limit, the batch is split by the scheduler: no member is at fault.
                return Err(error(
                    ErrorClass::TooLarge,
                    None,
                    format!("the input file is over {MAX_FILE_BYTES} bytes"),
                ));
            }
        }
        let file = self.upload(&display_name(spec.batch_key), jsonl).await?;
        Ok((json!({"fileName": file}), Some(file)))
    }

    /// An upload no batch refers to, because the create was answered with a refusal (an
    /// answer, unlike a lost connection, means no batch was made): deleted now rather than
    /// left to fill the project's 20 GB for 48 hours. A failure here is only logged.
    async fn discard_upload(&self, file: &str) {
        let deleted = match self.file_url(file) {
            Ok(url) => self.send(self.http.delete(url).timeout(self.config.request_timeout)).await.map(drop),
            Err(e) => Err(e),
        };
        match deleted {
            Ok(()) => {}
            Err(e) if e.class == ErrorClass::Gone => {}
            Err(e) => tracing::warn!(provider = PROVIDER, %file, error = %e,
                "cannot delete the input file of a refused create; the File API drops it after 48 hours"),
        }
    }

    /// A 404 from a `models/{model}:…` call names what is missing. The model (Gemini's
    /// "models/<m> is not found for API version v1beta, or is not supported for <method>"):
    /// nothing a retry fixes, so an invalid request that says so. The input file, gone before
    /// the create: the next attempt uploads it again. A 404 naming neither (a wrong
    /// `base_url`, say) is left as it came.
    fn on_model_call_error(&self, e: ProviderError, input_file: Option<&str>) -> ProviderError {
        if e.status != Some(404) {
            return e;
        }
        if input_file.is_some_and(|file| e.message().contains(file)) {
            return error(ErrorClass::Transient, Some(404), e.message().to_string());
        }
        let model = &self.config.model;
        if !e.message().contains(&format!("models/{model}")) {
            return e;
        }
        error(ErrorClass::InvalidRequest, Some(404), format!("unknown model {model}: {}", e.message()))
    }

    /// `batchGenerateContent`: the created batch's name.
    async fn create(&self, url: Url, body: &Value) -> Result<String, ProviderError> {
        let input_file = body.pointer("/batch/inputConfig/fileName").and_then(Value::as_str);
        let operation: wire::Operation =
            self.json(self.http.post(url).json(body)).await.map_err(|e| self.on_model_call_error(e, input_file))?;
        job_name(&operation.name)?;
        Ok(operation.name)
    }

    async fn list_page(&self, token: Option<&str>) -> Result<wire::ListPage, ProviderError> {
        let mut request = self.http.get(self.api_url(&["batches"])?).query(&[("pageSize", PAGE_SIZE)]);
        if let Some(token) = token {
            request = request.query(&[("pageToken", token)]);
        }
        self.json(request).await
    }

    async fn operation(&self, job_id: &str) -> Result<wire::Operation, ProviderError> {
        self.json(self.http.get(self.batch_url(job_id, None)?)).await
    }

    /// The results kept in the batch itself, re-read now (never held in the job status).
    async fn stream_inline(
        &self,
        job_id: &str,
        seen: &mut Seen,
        out: &mpsc::Sender<ResultLine>,
    ) -> Result<(), ProviderError> {
        let operation = self.operation(job_id).await?;
        let entries = operation.output().and_then(|o| o.inlined_responses.as_ref()).map(|i| &i.inlined_responses);
        for entry in entries.into_iter().flatten() {
            seen.counts.lines += 1;
            deliver(wire::inline_row(entry), seen, out).await?;
        }
        Ok(())
    }

    async fn stream_file(
        &self,
        file: &str,
        seen: &mut Seen,
        out: &mpsc::Sender<ResultLine>,
    ) -> Result<(), ProviderError> {
        let response = self.send(self.http.get(self.download_url(file)?)).await?;
        let mut lines = Lines::new(response, PROVIDER);
        while let Some(line) = lines.next().await? {
            let Some(parsed) = Line::parse(&line, wire::file_row) else { continue };
            seen.counts.lines += 1;
            deliver(parsed, seen, out).await?;
        }
        Ok(())
    }
}

#[async_trait]
impl BatchProvider for GeminiBatches {
    fn name(&self) -> &str {
        &self.config.name
    }

    fn output_budget(&self) -> OutputBudget {
        OutputBudget { default: self.config.max_output_tokens, cap: self.config.max_output_tokens_cap }
    }

    async fn submit(&self, spec: &BatchSpec<'_>) -> Result<String, ProviderError> {
        let (input, uploaded) = self.input_config(spec).await?;
        let body = wire::create_body(&display_name(spec.batch_key), input);
        let url = self.model_url("batchGenerateContent")?;
        let created = self.create(url, &body).await;
        if let Ok(job) = &created {
            self.submitted.record(job, keyless::Digest::of(spec.members.iter().map(|m| &m.id)));
        }
        // Without an answer (status None) a batch may exist and refer to the file: kept.
        if let (Err(refused), Some(file)) = (&created, &uploaded)
            && refused.status.is_some()
        {
            self.discard_upload(file).await;
        }
        created
    }

    async fn find_job(&self, intent: &IntentRef<'_>) -> Result<Lookup, ProviderError> {
        let wanted = display_name(intent.batch_key);
        let read_page = |token: Option<String>| {
            let wanted = &wanted;
            async move {
                let page = self.list_page(token.as_deref()).await?;
                let ours = page
                    .operations
                    .into_iter()
                    .find(|op| op.display_name() == Some(wanted.as_str()) && !intent.known_jobs.contains(&op.name));
                if let Some(op) = &ours {
                    job_name(&op.name)?;
                }
                Ok(JobListPage { ours: ours.map(|op| op.name), next: page.next_page_token })
            }
        };
        let unfinished = || format!("more than {MAX_LIST_PAGES} pages of batches; cannot rule out one named {wanted}");
        find_in_job_list(MAX_LIST_PAGES, RECHECK_AFTER, unfinished, read_page).await
    }

    async fn poll(&self, job_id: &str) -> Result<JobStatus, ProviderError> {
        let operation = self.operation(job_id).await?;
        let state = operation.state();
        let phase = match wire::state(state) {
            Some(wire::State::Running) => JobPhase::Running,
            Some(wire::State::Succeeded) => JobPhase::Completed,
            Some(wire::State::Cancelled) => JobPhase::Cancelled,
            // "The job will not have any results to retrieve" (batch guide); any it does
            // carry are read, and the rest go back to the queue.
            Some(wire::State::Expired) => JobPhase::Expired,
            Some(wire::State::Failed) => JobPhase::Failed {
                reason: operation.error.as_ref().map_or_else(|| "the batch failed".to_string(), wire::Status::describe),
                cause: FailureCause::Unattributed,
            },
            None => return Err(error(ErrorClass::Protocol, None, format!("unknown batch state {state:?}"))),
        };
        let mut result_files = Vec::new();
        if phase.is_terminal()
            && let Some(output) = operation.output()
        {
            if let Some(file) = &output.responses_file {
                result_files.push(format!("{FILE_HANDLE}{file}"));
            }
            if output.inlined_responses.is_some() {
                result_files.push(format!("{INLINE_HANDLE}{job_id}"));
            }
        }
        Ok(JobStatus { job_id: job_id.to_string(), phase, result_files })
    }

    async fn stream_results(
        &self,
        job: &JobStatus,
        out: &mpsc::Sender<ResultLine>,
    ) -> Result<StreamCounts, ProviderError> {
        let mut seen = Seen {
            counts: StreamCounts::default(),
            matcher: keyless::Matcher::new(self.submitted.digest(&job.job_id)),
        };
        for handle in &job.result_files {
            if let Some(job_id) = handle.strip_prefix(INLINE_HANDLE) {
                self.stream_inline(job_id, &mut seen, out).await?;
            } else if let Some(file) = handle.strip_prefix(FILE_HANDLE) {
                self.stream_file(file, &mut seen, out).await?;
            } else {
                return Err(error(ErrorClass::Protocol, None, format!("unknown result handle {handle:?}")));
            }
        }
        let Seen { mut counts, matcher } = seen;
        match matcher.finish() {
            Ok(line) => {
                tracing::warn!(provider = PROVIDER, key = %line.0,
                    "a result without its key was matched by elimination: the only key without a result");
                send(line, out).await?;
            }
            Err(unmatched) => {
                for result in unmatched {
                    counts.malformed += 1;
                    tracing::warn!(provider = PROVIDER, result = %describe_keyless(&result),
                        "a result without its key, matching no member for certain: its member goes round again");
                }
            }
        }
        Ok(counts)
    }

    async fn cancel(&self, job_id: &str) -> Result<(), ProviderError> {
        self.send(self.http.post(self.batch_url(job_id, Some("cancel"))?)).await.map(drop)
    }

    /// The Files API keeps at most 20 GB per project for 48 hours: a busy account's input
    /// files would fill it, so they (and the responses file) go once the batch is closed.
    async fn delete_files(&self, job: &JobStatus) -> Result<u64, ProviderError> {
        let mut deleted = 0;
        for file in self.operation(&job.job_id).await?.files() {
            match self.send(self.http.delete(self.file_url(&file)?)).await {
                Ok(_) => deleted += 1,
                Err(e) if e.class == ErrorClass::Gone => {}
                Err(e) => return Err(e),
            }
        }
        Ok(deleted)
    }

    async fn probe(&self, schema: &Schema) -> Probe {
        let view = match schema.view(Dialect::GeminiJson) {
            Ok(view) => &view.document,
            Err(e) => return Probe::Refused(error(ErrorClass::InvalidRequest, None, e.to_string())),
        };
        let request = wire::request(&probe_member(), schema, view, Some(PROBE_MAX_OUTPUT_TOKENS));
        let url = match self.model_url("generateContent") {
            Ok(url) => url,
            Err(e) => return Probe::Refused(e),
        };
        match self.send(self.http.post(url).timeout(self.config.request_timeout).json(&request)).await {
            Ok(_) => Probe::Passed(Checked::everything()),
            Err(e) => Probe::Refused(self.on_model_call_error(e, None)),
        }
    }
}

/// What `find_job` looks for: the intent's batch key, which no other intent shares.
fn display_name(batch_key: &str) -> String {
    format!("{DISPLAY_PREFIX}{batch_key}")
}

/// A job id is the operation name `batches/{id}`; the id is one path segment.
fn job_name(name: &str) -> Result<&str, ProviderError> {
    name.strip_prefix("batches/")
        .filter(|id| !id.is_empty() && !id.contains('/'))
        .ok_or_else(|| error(ErrorClass::Protocol, None, format!("unexpected batch name {name:?}")))
}

/// One stream's counts and its rows without a key, held to the end (see `keyless`).
struct Seen {
    counts: StreamCounts,
    matcher: keyless::Matcher,
}

async fn deliver(
    parsed: Result<wire::Row, String>,
    seen: &mut Seen,
    out: &mpsc::Sender<ResultLine>,
) -> Result<(), ProviderError> {
    match parsed {
        Ok((Some(key), result)) => {
            seen.matcher.saw(&key);
            send((key, result), out).await
        }
        Ok((None, result)) => {
            seen.matcher.keyless(result);
            Ok(())
        }
        Err(reason) => {
            // The line's content is model output: log why, never what.
            seen.counts.malformed += 1;
            tracing::warn!(provider = PROVIDER, %reason, "skipping a malformed result");
            Ok(())
        }
    }
}

async fn send(line: ResultLine, out: &mpsc::Sender<ResultLine>) -> Result<(), ProviderError> {
    out.send(super::scrub(line))
        .await
        .map_err(|_| error(ErrorClass::Transient, None, "result consumer stopped".to_string()))
}

/// What an unmatched row was, for the log: an error's code and words, never model output.
fn describe_keyless(result: &LineResult) -> String {
    match result {
        LineResult::Refused { reason, .. } | LineResult::Retry { reason } => redact(reason),
        LineResult::Unusable { .. } => "an unusable answer".to_string(),
        LineResult::Answer { .. } => "an answer (paid for)".to_string(),
    }
}

fn error(class: ErrorClass, status: Option<u16>, message: String) -> ProviderError {
    ProviderError::new(PROVIDER, class, status, &message)
}

#[cfg(test)]
mod tests;
