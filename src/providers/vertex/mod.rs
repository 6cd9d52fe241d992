//! Vertex AI batch prediction for Gemini models (docs/PROVIDERS.md, "Vertex AI"): each
//! member becomes a `GenerateContentRequest` (the Gemini adapter's, with the schema's Gemini
//! view as `responseJsonSchema`) on a JSONL line beside its key; the file goes to Cloud
//! Storage under the input prefix, and `batchPredictionJobs.create` starts a job reading
//! it (`inputConfig.gcsSource`) and writing under the output prefix
//! (`outputConfig.gcsDestination`). Poll the job until its `JOB_STATE_*` ends, then stream
//! every `*.jsonl` in the job's `outputInfo.gcsOutputDirectory`, joined on the key.
//!
//! # Finding a job again
//!
//! A create is not idempotent (the request has no id or token). The job carries the label
//! `commitpoint_batch = <batch key>`, so `find_job` lists the location's jobs filtered on
//! that label, page by page, and answers `Found` for a job with the label, `Absent` when the
//! whole list holds none, `Undecided` past [`MAX_LIST_PAGES`] pages.
//!
//! Auth is OAuth with a service account (`auth`): a key file, or the metadata server of
//! the machine (`metadata`); never a key in the config file.

mod auth;
mod gcs;
mod metadata;
mod probe;
pub(crate) mod wire;

use std::collections::HashSet;
use std::time::Duration;

use async_trait::async_trait;
use reqwest::Url;
use serde_json::Value;
use tokio::sync::mpsc;

pub use auth::{AuthError, Credentials, check_key_file};
pub use gcs::{DEFAULT_GCS_ENDPOINT, GcsUri};

use super::gemini::wire as google;
use super::job_list::{JobListPage, find_in_job_list};
use super::lines::forward;
use super::{
    BatchProvider, BatchSpec, ErrorClass, FailureCause, IntentRef, JobPhase, JobStatus, Lookup, Probe, ProviderError,
    ResultLine, StreamCounts, describe_transport,
};
use crate::domain::batch::OutputBudget;
use crate::domain::schema::{Dialect, Schema};

const PROVIDER: &str = "vertex";
/// "A batch job can include up to 200,000 requests" and the input file is at most 1 GB
/// (batch prediction from Cloud Storage guide).
pub const MAX_REQUESTS: usize = 200_000;
pub const MAX_FILE_BYTES: u64 = 1_000_000_000;
pub const DEFAULT_MAX_OUTPUT_TOKENS_CAP: u32 = 16_384;
pub const RECHECK_AFTER: Duration = Duration::from_secs(60);
pub const MAX_LIST_PAGES: usize = 20;
const PAGE_SIZE: &str = "100";
const DISPLAY_PREFIX: &str = "commitpoint-";
const INPUT_FILE: &str = "requests.jsonl";
/// The output directory's prediction files; anything else there (none today) is skipped.
const OUTPUT_SUFFIX: &str = ".jsonl";

#[derive(Debug, Clone)]
pub struct VertexConfig {
    pub name: String,
    pub project: String,
    /// A region such as `us-central1`, or `global`.
    pub location: String,
    /// A Gemini model id such as `gemini-2.5-flash`; sent as `publishers/google/models/{model}`.
    pub model: String,
    pub input: GcsUri,
    pub output: GcsUri,
    pub credentials: Credentials,
    /// The control plane; default `https://{location}-aiplatform.googleapis.com`.
    pub endpoint: Option<String>,
    /// Cloud Storage's JSON API; default [`DEFAULT_GCS_ENDPOINT`].
    pub gcs_endpoint: Option<String>,
    pub max_output_tokens: Option<u32>,
    pub max_output_tokens_cap: u32,
    pub request_timeout: Duration,
}

impl VertexConfig {
    pub fn new(
        project: &str,
        location: &str,
        model: &str,
        input: GcsUri,
        output: GcsUri,
        credentials: Credentials,
    ) -> Self {
        Self {
            name: PROVIDER.to_string(),
            project: project.to_string(),
            location: location.to_string(),
            model: model.to_string(),
            input,
            output,
            credentials,
            endpoint: None,
            gcs_endpoint: None,
            max_output_tokens: None,
            max_output_tokens_cap: DEFAULT_MAX_OUTPUT_TOKENS_CAP,
            request_timeout: Duration::from_secs(120),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// A setting Vertex would refuse on every call.
    #[error("vertex {key}: {rule}")]
    Refused { key: &'static str, rule: String },
    #[error("vertex {key} {url:?} must be an absolute http(s) URL")]
    Url { key: &'static str, url: String },
    #[error(transparent)]
    Auth(#[from] AuthError),
    #[error("cannot build the HTTP client")]
    Client(#[source] reqwest::Error),
}

/// Google Cloud project ids: 6–30 characters, lowercase letters, digits and hyphens,
/// starting with a letter and not ending with a hyphen; or the project's number, which
/// every Vertex path takes in place of the id.
pub fn project_rule(project: &str) -> Result<(), String> {
    let ok = is_project_number(project)
        || (6..=30).contains(&project.len())
            && project.bytes().next().is_some_and(|b| b.is_ascii_lowercase())
            && !project.ends_with('-')
            && project.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-');
    if ok {
        Ok(())
    } else {
        Err("a project id is 6-30 of a-z 0-9 -, starting with a letter (or the project's number)".to_string())
    }
}

/// A project number: digits only (Google's are 12 today; no length is promised).
fn is_project_number(segment: &str) -> bool {
    (1..=20).contains(&segment.len()) && segment.bytes().all(|b| b.is_ascii_digit())
}

/// A region (`us-central1`, `europe-west4`) or `global`: it becomes part of a host name.
pub fn location_rule(location: &str) -> Result<(), String> {
    let ok = !location.is_empty()
        && location.len() <= 30
        && location.bytes().next().is_some_and(|b| b.is_ascii_lowercase())
        && location.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-');
    if ok { Ok(()) } else { Err("a location is a region such as us-central1, or global".to_string()) }
}

/// A Gemini model id; batch prediction runs Google's publisher models only.
pub fn model_rule(model: &str) -> Result<(), String> {
    let ok =
        !model.is_empty() && model.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'@'));
    if ok { Ok(()) } else { Err("a Gemini model id such as gemini-2.5-flash (no path)".to_string()) }
}

#[derive(Debug)]
pub struct VertexBatches {
    config: VertexConfig,
    /// `{endpoint}/v1/projects/{project}/locations/{location}`.
    parent: Url,
    gcs: Url,
    tokens: auth::Tokens,
    http: reqwest::Client,
}

impl VertexBatches {
    pub fn new(config: VertexConfig) -> Result<Self, ConfigError> {
        let refused = |key: &'static str| move |rule: String| ConfigError::Refused { key, rule };
        project_rule(&config.project).map_err(refused("project"))?;
        location_rule(&config.location).map_err(refused("location"))?;
        model_rule(&config.model).map_err(refused("model"))?;
        let default_endpoint = if config.location == "global" {
            "https://aiplatform.googleapis.com".to_string()
        } else {
            format!("https://{}-aiplatform.googleapis.com", config.location)
        };
        let endpoint = config.endpoint.clone().unwrap_or(default_endpoint);
        let gcs = config.gcs_endpoint.clone().unwrap_or_else(|| DEFAULT_GCS_ENDPOINT.to_string());
        let parse = |key: &'static str, text: &str| {
            Url::parse(text.trim_end_matches('/'))
                .ok()
                .filter(|u| matches!(u.scheme(), "http" | "https") && u.has_host())
                .ok_or_else(|| ConfigError::Url { key, url: text.to_string() })
        };
        let mut parent = parse("endpoint", &endpoint)?;
        let gcs = parse("gcs_endpoint", &gcs)?;
        parent
            .path_segments_mut()
            .map_err(|()| ConfigError::Url { key: "endpoint", url: endpoint.clone() })?
            .pop_if_empty()
            .extend(["v1", "projects", &config.project, "locations", &config.location]);
        let tokens = auth::Tokens::new(config.credentials.clone())?;
        let http = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(10))
            .read_timeout(config.request_timeout)
            .build()
            .map_err(ConfigError::Client)?;
        Ok(Self { config, parent, gcs, tokens, http })
    }

    /// `{parent}/{segments…}`, the last segment may carry `:{verb}`.
    fn api_url(&self, segments: &[&str]) -> Result<Url, ProviderError> {
        let mut url = self.parent.clone();
        url.path_segments_mut()
            .map_err(|()| error(ErrorClass::Protocol, None, "the endpoint cannot take a path".into()))?
            .extend(segments);
        Ok(url)
    }

    /// `…/batchPredictionJobs/{id}` (with `:{verb}`) for a job name of ours.
    fn job_url(&self, job_id: &str, verb: Option<&str>) -> Result<Url, ProviderError> {
        let id = self.job_id(job_id)?;
        let last = verb.map_or_else(|| id.to_string(), |v| format!("{id}:{v}"));
        self.api_url(&["batchPredictionJobs", &last])
    }

    /// The id of a job name in our project and location: one path segment. Vertex answers
    /// names under the project *number* whatever the caller named (Google's batch samples),
    /// so the first segment is our project id or any number; the location must be ours.
    fn job_id<'a>(&self, name: &'a str) -> Result<&'a str, ProviderError> {
        let segments: Vec<&'a str> = name.split('/').collect();
        if let ["projects", project, "locations", location, "batchPredictionJobs", id] = segments[..]
            && (project == self.config.project || is_project_number(project))
            && location == self.config.location
            && !id.is_empty()
            && !id.contains(':')
        {
            Ok(id)
        } else {
            Err(error(
                ErrorClass::Protocol,
                None,
                format!(
                    "unexpected job name {name:?}: not projects/{}/locations/{}/batchPredictionJobs/<id> (or the \
                     project's number in place of its id)",
                    self.config.project, self.config.location
                ),
            ))
        }
    }

    /// Sends an authorised control-plane call and reads its JSON answer; a refusal carries
    /// Google's status name and the delay it asked for.
    async fn call<T: serde::de::DeserializeOwned>(&self, request: reqwest::RequestBuilder) -> Result<T, ProviderError> {
        let bearer = self.tokens.bearer().await?;
        let response = request
            .timeout(self.config.request_timeout)
            .header(reqwest::header::AUTHORIZATION, bearer)
            .send()
            .await
            .map_err(|e| error(ErrorClass::Transient, None, format!("request failed: {}", describe_transport(&e))))?;
        let status = response.status().as_u16();
        if response.status().is_success() {
            return response.json().await.map_err(|e| {
                error(ErrorClass::Protocol, Some(status), format!("unexpected answer: {}", describe_transport(&e)))
            });
        }
        let headers = response.headers().clone();
        let body = response.text().await.unwrap_or_default();
        Err(google::refusal(PROVIDER, status, &headers, &body, "", self.tokens.scope_hint(&headers, &body)))
    }

    async fn job(&self, job_id: &str) -> Result<wire::Job, ProviderError> {
        self.call(self.http.get(self.job_url(job_id, None)?)).await
    }

    /// The JSONL of the batch, checked against the job limits before anything is sent.
    fn requests(&self, spec: &BatchSpec<'_>) -> Result<Vec<u8>, ProviderError> {
        let invalid = |message: String| error(ErrorClass::InvalidRequest, None, message);
        let count = spec.members.len();
        if count == 0 {
            return Err(invalid("a batch holds at least one request".to_string()));
        }
        if count > MAX_REQUESTS {
            return Err(error(
                ErrorClass::TooLarge,
                None,
                format!("{count} requests is over the {MAX_REQUESTS} a job takes"),
            ));
        }
        let view = &spec.schema.view(Dialect::GeminiJson).map_err(|e| invalid(e.to_string()))?.document;
        let mut seen = HashSet::with_capacity(count);
        let mut jsonl = Vec::new();
        for (index, member) in spec.members.iter().enumerate() {
            let key = member.id.to_hex();
            if !seen.insert(key.clone()) {
                return Err(invalid(format!("member {index} repeats the key {key}")));
            }
            let max = member.output_budget.or(self.config.max_output_tokens);
            let line = wire::input_line(&key, google::request(member, spec.schema, view, max));
            serde_json::to_writer(&mut jsonl, &line).map_err(|e| invalid(format!("cannot encode: {e}")))?;
            jsonl.push(b'\n');
            if jsonl.len() as u64 > MAX_FILE_BYTES {
                return Err(error(
                    ErrorClass::TooLarge,
                    None,
                    format!("the input file is over {MAX_FILE_BYTES} bytes"),
                ));
            }
        }
        Ok(jsonl)
    }

    /// The prediction files of a finished job, as `gs://` URIs in the output bucket.
    async fn output_files(&self, job: &wire::Job) -> Result<Vec<String>, ProviderError> {
        let Some(directory) = job.output_info.as_ref().and_then(|o| o.gcs_output_directory.as_deref()) else {
            return Ok(Vec::new());
        };
        let dir = GcsUri::parse(directory)
            .map_err(|e| error(ErrorClass::Protocol, None, format!("output directory: {e}")))?;
        let mut names = self.gcs_list(&dir.bucket, &format!("{}/", dir.prefix)).await?;
        names.retain(|n| n.ends_with(OUTPUT_SUFFIX));
        names.sort();
        Ok(names.into_iter().map(|n| format!("gs://{}/{n}", dir.bucket)).collect())
    }
}

#[async_trait]
impl BatchProvider for VertexBatches {
    fn name(&self) -> &str {
        &self.config.name
    }

    fn output_budget(&self) -> OutputBudget {
        OutputBudget { default: self.config.max_output_tokens, cap: self.config.max_output_tokens_cap }
    }

    async fn submit(&self, spec: &BatchSpec<'_>) -> Result<String, ProviderError> {
        let display_name = display_name(spec.batch_key);
        let jsonl = self.requests(spec)?;
        let input_name = self.config.input.key(&format!("{display_name}/{INPUT_FILE}"));
        // The same name and bytes for the same intent: an upload repeated after a crash
        // changes nothing.
        self.gcs_put(&self.config.input.bucket, &input_name, jsonl).await?;
        let model = format!("publishers/google/models/{}", self.config.model);
        let input_uri = self.config.input.uri(&format!("{display_name}/{INPUT_FILE}"));
        let output_prefix = self.config.output.uri(&display_name);
        let body = wire::CreateJob {
            display_name: &display_name,
            model: &model,
            input_uri: &input_uri,
            output_prefix: &output_prefix,
            batch_key: spec.batch_key,
        }
        .body();
        let job: wire::Job = self.call(self.http.post(self.api_url(&["batchPredictionJobs"])?).json(&body)).await?;
        self.job_id(&job.name)?;
        Ok(job.name)
    }

    async fn find_job(&self, intent: &IntentRef<'_>) -> Result<Lookup, ProviderError> {
        let filter = format!("labels.{}=\"{}\"", wire::BATCH_LABEL, intent.batch_key);
        let read_page = |token: Option<String>| {
            let filter = &filter;
            async move {
                let mut url = self.api_url(&["batchPredictionJobs"])?;
                url.query_pairs_mut().append_pair("filter", filter).append_pair("pageSize", PAGE_SIZE);
                if let Some(token) = &token {
                    url.query_pairs_mut().append_pair("pageToken", token);
                }
                let page: wire::JobList = self.call(self.http.get(url)).await?;
                // The label is checked here too: a filter the service ignored must not match.
                let ours = page.batch_prediction_jobs.into_iter().find(|job| {
                    job.labels.get(wire::BATCH_LABEL).map(String::as_str) == Some(intent.batch_key)
                        && !intent.known_jobs.contains(&job.name)
                });
                if let Some(job) = &ours {
                    self.job_id(&job.name)?;
                }
                Ok(JobListPage { ours: ours.map(|job| job.name), next: page.next_page_token })
            }
        };
        let unfinished = || format!("more than {MAX_LIST_PAGES} pages of jobs labelled {filter}");
        find_in_job_list(MAX_LIST_PAGES, RECHECK_AFTER, unfinished, read_page).await
    }

    async fn poll(&self, job_id: &str) -> Result<JobStatus, ProviderError> {
        let job = self.job(job_id).await?;
        let phase = match wire::state(job.state()) {
            Some(wire::State::Running) => JobPhase::Running,
            // Not ended, so not read: what it wrote so far would be taken as all there is,
            // and the rest requeued and paid for twice once it resumes.
            Some(wire::State::Paused) => JobPhase::Stalled {
                reason: format!(
                    "Vertex job {job_id} is JOB_STATE_PAUSED: stopped, and it does not go on by itself; its members \
                     wait with it (resume it, or cancel it to requeue them)"
                ),
            },
            Some(wire::State::Succeeded) => JobPhase::Completed,
            Some(wire::State::Cancelled) => JobPhase::Cancelled,
            Some(wire::State::Expired) => JobPhase::Expired,
            // Nothing names a request: each member's attempt is counted, so a job that fails
            // the same way every time ends its members after `max_attempts`.
            Some(wire::State::Failed) => JobPhase::Failed {
                reason: job.error.as_ref().map_or_else(|| "the job failed".to_string(), google::Status::describe),
                cause: FailureCause::Unattributed,
            },
            None => return Err(error(ErrorClass::Protocol, None, format!("unknown job state {:?}", job.state()))),
        };
        // Cancelled and expired jobs may have written what ran; a failed one is not read.
        let result_files = if phase.is_terminal() && !matches!(phase, JobPhase::Failed { .. }) {
            self.output_files(&job).await?
        } else {
            Vec::new()
        };
        Ok(JobStatus { job_id: job_id.to_string(), phase, result_files })
    }

    async fn stream_results(
        &self,
        job: &JobStatus,
        out: &mpsc::Sender<ResultLine>,
    ) -> Result<StreamCounts, ProviderError> {
        let mut counts = StreamCounts::default();
        for file in &job.result_files {
            let uri = GcsUri::parse(file).map_err(|e| error(ErrorClass::Protocol, None, e))?;
            let mut lines = self.gcs_lines(&uri.bucket, &uri.prefix).await?;
            forward(&mut lines, wire::parse_line, out, &mut counts).await?;
        }
        Ok(counts)
    }

    async fn cancel(&self, job_id: &str) -> Result<(), ProviderError> {
        let _: Value = self.call(self.http.post(self.job_url(job_id, Some("cancel"))?)).await?;
        Ok(())
    }

    /// A free check of what a job needs: a token from the configured credentials, accepted
    /// by the control plane (a one-job listing); the model answering for this project and
    /// location (`:countTokens` with the request a batch line would carry, schema included:
    /// counted, never generated, so nothing is billed, and the schema not judged); the input
    /// prefix listable in Cloud Storage. No job is created.
    async fn probe(&self, schema: &Schema) -> Probe {
        match self.probe_steps(schema).await {
            Ok(checked) => Probe::Passed(checked),
            Err(e) => Probe::Refused(e),
        }
    }

    /// The input file and the prediction files go once the results are in.
    async fn delete_files(&self, job: &JobStatus) -> Result<u64, ProviderError> {
        let described = self.job(&job.job_id).await?;
        let mut deleted = 0;
        for file in described.input_uris().iter().chain(&job.result_files) {
            let uri = GcsUri::parse(file).map_err(|e| error(ErrorClass::Protocol, None, e))?;
            deleted += u64::from(self.gcs_delete(&uri.bucket, &uri.prefix).await?);
        }
        Ok(deleted)
    }
}

/// What names a job after its intent: the batch key, which no other intent shares.
fn display_name(batch_key: &str) -> String {
    format!("{DISPLAY_PREFIX}{batch_key}")
}

fn error(class: ErrorClass, status: Option<u16>, message: String) -> ProviderError {
    ProviderError::new(PROVIDER, class, status, &message)
}

#[cfg(test)]
mod tests;
