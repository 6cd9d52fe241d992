//! Amazon Bedrock batch inference (docs/PROVIDERS.md, "Amazon Bedrock"): each member
//! becomes a JSONL record `{recordId, modelInput}` (the Anthropic Messages body Claude on
//! Bedrock takes, with `anthropic_version` and the forced tool the Anthropic adapter
//! derives from the schema), the records go to S3 under the input prefix, and
//! `CreateModelInvocationJob` starts the job with the role, model and S3 locations from
//! the config. Poll `GetModelInvocationJob` until it ends, then read every `*.jsonl.out`
//! Bedrock wrote under `{output prefix}/{job id}/`, joined on `recordId`.
//!
//! # Finding a job again
//!
//! The create carries `clientRequestToken` = the batch key: Bedrock ignores a repeat of a
//! token it has seen, so a create sent again after a lost answer makes no second job. The
//! job is also named after the batch key, so `find_job` lists jobs whose name contains it
//! (`nameContains`) and answers `Found` for the exact name, `Absent` when the listing has
//! none, `Undecided` when it is longer than [`MAX_LIST_PAGES`] pages.
//!
//! Credentials come from the standard AWS chain, never from the config file.

mod aws;
mod probe;
pub mod rules;
pub(crate) mod wire;

use std::collections::HashSet;
use std::time::Duration;

use async_trait::async_trait;
use serde_json::Value;
use tokio::sync::mpsc;

pub use aws::S3Uri;

use super::job_list::{JobListPage, find_in_job_list};
use super::lines::{Lines, forward};
use super::{
    BatchProvider, BatchSpec, ErrorClass, FailureCause, IntentRef, JobPhase, JobStatus, Lookup, Probe, ProviderError,
    ResultLine, StreamCounts, classify_status, describe_transport, parse_retry_after, truncate,
};
use crate::domain::batch::OutputBudget;
use crate::domain::schema::{Dialect, Schema};

const PROVIDER: &str = "bedrock";
/// Bedrock's default quotas per job (adjustable per account and model, hence settable):
/// at least 100 records, at most 50,000 records in one file and in one job, 1 GB a file.
pub const DEFAULT_MIN_RECORDS: usize = 100;
pub const DEFAULT_MAX_RECORDS: usize = 50_000;
pub const MAX_FILE_BYTES: u64 = 1_000_000_000;
pub const DEFAULT_MAX_TOKENS: u32 = 4096;
pub const DEFAULT_MAX_TOKENS_CAP: u32 = 16_384;
/// How long a batch below the minimum is held before it is offered again.
pub const HOLD_BELOW_MINIMUM: Duration = Duration::from_secs(300);
pub const RECHECK_AFTER: Duration = Duration::from_secs(60);
pub const MAX_LIST_PAGES: usize = 20;
const INPUT_FILE: &str = "records.jsonl";
const OUTPUT_SUFFIX: &str = ".jsonl.out";

#[derive(Debug, Clone)]
pub struct BedrockConfig {
    pub name: String,
    pub region: String,
    /// A model id such as `anthropic.claude-3-5-haiku-20241022-v1:0`.
    pub model: String,
    /// The service role Bedrock assumes to read the input and write the output.
    pub role_arn: String,
    pub input: S3Uri,
    pub output: S3Uri,
    /// The control plane; default `https://bedrock.{region}.amazonaws.com`.
    pub endpoint: Option<String>,
    /// S3; default AWS's regional endpoint (set for a VPC endpoint or a test server).
    pub s3_endpoint: Option<String>,
    pub max_tokens: u32,
    pub max_tokens_cap: u32,
    pub min_records: usize,
    pub max_records: usize,
    pub timeout_hours: Option<u32>,
    pub request_timeout: Duration,
}

impl BedrockConfig {
    pub fn new(region: &str, model: &str, role_arn: &str, input: S3Uri, output: S3Uri) -> Self {
        Self {
            name: PROVIDER.to_string(),
            region: region.to_string(),
            model: model.to_string(),
            role_arn: role_arn.to_string(),
            input,
            output,
            endpoint: None,
            s3_endpoint: None,
            max_tokens: DEFAULT_MAX_TOKENS,
            max_tokens_cap: DEFAULT_MAX_TOKENS_CAP,
            min_records: DEFAULT_MIN_RECORDS,
            max_records: DEFAULT_MAX_RECORDS,
            timeout_hours: None,
            request_timeout: Duration::from_secs(60),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("bedrock endpoint {0:?} must be an absolute http(s) URL")]
    Endpoint(String),
    #[error("bedrock region {0:?} is not a region name such as us-east-1")]
    Region(String),
    #[error("bedrock: min_records ({min}) must be between 1 and max_records ({max})")]
    Records { min: usize, max: usize },
    /// A setting `CreateModelInvocationJob` would refuse on every create.
    #[error("bedrock {key}: {rule}")]
    Refused { key: &'static str, rule: String },
    #[error("cannot set up S3 for bucket {bucket}")]
    S3 {
        bucket: String,
        #[source]
        source: object_store::Error,
    },
    #[error("cannot build the HTTP client")]
    Client(#[source] reqwest::Error),
}

#[derive(Debug)]
pub struct BedrockBatches {
    config: BedrockConfig,
    endpoint: String,
    input: aws::Bucket,
    output: aws::Bucket,
    http: reqwest::Client,
}

impl BedrockBatches {
    pub fn new(config: BedrockConfig) -> Result<Self, ConfigError> {
        let region_ok = !config.region.is_empty()
            && config.region.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-');
        if !region_ok {
            return Err(ConfigError::Region(config.region));
        }
        let endpoint = match &config.endpoint {
            Some(url) => url.trim_end_matches('/').to_string(),
            None => format!("https://bedrock.{}.amazonaws.com", config.region),
        };
        let parsed = reqwest::Url::parse(&endpoint).ok();
        if !parsed.is_some_and(|u| matches!(u.scheme(), "http" | "https") && u.has_host()) {
            return Err(ConfigError::Endpoint(endpoint));
        }
        if config.min_records == 0 || config.min_records > config.max_records {
            return Err(ConfigError::Records { min: config.min_records, max: config.max_records });
        }
        let refused = |key: &'static str| move |rule: String| ConfigError::Refused { key, rule };
        rules::role_arn(&config.role_arn).map_err(refused("role_arn"))?;
        rules::s3_uri(&config.input.uri("")).map_err(refused("input_s3_uri"))?;
        rules::s3_uri(&config.output.uri("")).map_err(refused("output_s3_uri"))?;
        if let Some(hours) = config.timeout_hours {
            rules::timeout_hours(hours).map_err(refused("timeout_hours"))?;
        }
        let bucket = |uri: &S3Uri| {
            aws::Bucket::new(&uri.bucket, &config.region, config.s3_endpoint.as_deref())
                .map_err(|source| ConfigError::S3 { bucket: uri.bucket.clone(), source })
        };
        let (input, output) = (bucket(&config.input)?, bucket(&config.output)?);
        let http = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(10))
            .timeout(config.request_timeout)
            .build()
            .map_err(ConfigError::Client)?;
        Ok(Self { config, endpoint, input, output, http })
    }

    /// The JSONL of the batch, checked against Bedrock's limits before anything is sent.
    fn records(&self, spec: &BatchSpec<'_>) -> Result<Vec<u8>, ProviderError> {
        let invalid = |message: String| error(ErrorClass::InvalidRequest, None, message);
        let count = spec.members.len();
        if count > self.config.max_records {
            return Err(error(
                ErrorClass::TooLarge,
                None,
                format!("{count} records is over the {} a job takes", self.config.max_records),
            ));
        }
        if count < self.config.min_records {
            // Bedrock refuses a job under its minimum; sending it would only fail later.
            // Held (and shown in /healthz) until `min_records` is lowered to match the
            // account's quota, never failed: the members are not at fault.
            let mut held = error(
                ErrorClass::RateLimited,
                None,
                format!(
                    "held: {count} records is below the {} Bedrock takes in one job (min_records; see docs/PROVIDERS.md)",
                    self.config.min_records
                ),
            );
            held.retry_after = Some(HOLD_BELOW_MINIMUM);
            return Err(held);
        }
        let view = &spec.schema.view(Dialect::AnthropicTool).map_err(|e| invalid(e.to_string()))?.document;
        let mut seen = HashSet::with_capacity(count);
        let mut jsonl = Vec::new();
        for (index, member) in spec.members.iter().enumerate() {
            let id = member.id.to_hex();
            if !seen.insert(id.clone()) {
                return Err(invalid(format!("member {index} repeats the record id {id}")));
            }
            let max_tokens = member.output_budget.unwrap_or(self.config.max_tokens);
            let record = wire::record(member, spec.schema, view, max_tokens);
            serde_json::to_writer(&mut jsonl, &record).map_err(|e| invalid(format!("cannot encode: {e}")))?;
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

    /// Sends one signed control-plane call and reads its JSON answer.
    async fn call<T: serde::de::DeserializeOwned>(
        &self,
        method: http::Method,
        path_and_query: &str,
        body: Option<&Value>,
    ) -> Result<T, ProviderError> {
        let credential = self.input.credentials().await?;
        let bytes = match body {
            Some(body) => serde_json::to_vec(body).map_err(|e| error(ErrorClass::Protocol, None, e.to_string()))?,
            None => Vec::new(),
        };
        let mut builder = http::Request::builder().method(method).uri(format!("{}{path_and_query}", self.endpoint));
        if body.is_some() {
            builder = builder.header("content-type", "application/json");
        }
        let request = builder.body(bytes).map_err(|e| error(ErrorClass::Protocol, None, e.to_string()))?;
        let request = aws::signed(&credential, &self.config.region, request)?;
        let response =
            self.http.execute(request).await.map_err(|e| {
                error(ErrorClass::Transient, None, format!("request failed: {}", describe_transport(&e)))
            })?;
        let status = response.status().as_u16();
        let headers = response.headers().clone();
        let text = response.text().await.map_err(|e| {
            error(ErrorClass::Transient, Some(status), format!("answer broke off: {}", describe_transport(&e)))
        })?;
        if (200..300).contains(&status) {
            return serde_json::from_str(&text)
                .map_err(|e| error(ErrorClass::Protocol, Some(status), format!("unexpected answer: {e}")));
        }
        let parsed: wire::ErrorBody = serde_json::from_str(&text).unwrap_or_default();
        let header_kind = headers.get("x-amzn-errortype").and_then(|v| v.to_str().ok()).map(str::to_string);
        let kind = header_kind.or(parsed.kind).map(|k| wire::error_name(&k).to_string()).unwrap_or_default();
        let class = wire::classify(&kind).unwrap_or_else(|| classify_status(status, &headers, None));
        let message = parsed.message.unwrap_or_else(|| truncate(&text));
        let request_id = headers.get("x-amzn-requestid").and_then(|v| v.to_str().ok());
        let trace = request_id.map(|id| format!(" (request id {id})")).unwrap_or_default();
        let mut failure = error(class, Some(status), format!("{status} {kind}: {message}{trace}"));
        failure.retry_after = parse_retry_after(&headers, crate::domain::clock::now());
        Err(failure)
    }

    async fn job(&self, job_arn: &str) -> Result<wire::Job, ProviderError> {
        self.call(http::Method::GET, &format!("/model-invocation-job/{}", aws::encode_segment(job_arn)), None).await
    }

    /// The output keys Bedrock wrote for a job: `{output prefix}/{job id}/…`.
    async fn output_files(&self, job_arn: &str) -> Result<Vec<String>, ProviderError> {
        let id = job_arn.rsplit('/').next().unwrap_or(job_arn);
        let mut keys = self.output.list(&self.config.output.key(id)).await?;
        keys.retain(|k| k.ends_with(OUTPUT_SUFFIX));
        keys.sort();
        Ok(keys)
    }
}

#[async_trait]
impl BatchProvider for BedrockBatches {
    fn name(&self) -> &str {
        &self.config.name
    }

    fn output_budget(&self) -> OutputBudget {
        OutputBudget { default: Some(self.config.max_tokens), cap: self.config.max_tokens_cap }
    }

    async fn submit(&self, spec: &BatchSpec<'_>) -> Result<String, ProviderError> {
        let invalid = |m: String| error(ErrorClass::InvalidRequest, None, m);
        let job_name = wire::job_name(spec.batch_key)
            .ok_or_else(|| invalid(format!("batch key {:?} makes no valid Bedrock job name", spec.batch_key)))?;
        if !wire::is_valid_token(spec.batch_key) {
            return Err(invalid(format!("batch key {:?} is not a valid clientRequestToken", spec.batch_key)));
        }
        let jsonl = self.records(spec)?;
        let input_key = self.config.input.key(&format!("{job_name}/{INPUT_FILE}"));
        // Same key and bytes for the same intent: a put repeated after a crash changes nothing.
        self.input.put(&input_key, jsonl).await?;
        let input_uri = self.config.input.uri(&format!("{job_name}/{INPUT_FILE}"));
        let output_uri = self.config.output.uri("");
        let body = wire::CreateJob {
            job_name: &job_name,
            token: spec.batch_key,
            role_arn: &self.config.role_arn,
            model_id: &self.config.model,
            input_uri: &input_uri,
            output_uri: &output_uri,
            timeout_hours: self.config.timeout_hours,
        }
        .body();
        let created: wire::Created = self.call(http::Method::POST, "/model-invocation-job", Some(&body)).await?;
        if created.job_arn.is_empty() {
            return Err(error(ErrorClass::Protocol, None, "the create answered an empty jobArn".to_string()));
        }
        Ok(created.job_arn)
    }

    async fn find_job(&self, intent: &IntentRef<'_>) -> Result<Lookup, ProviderError> {
        let Some(wanted) = wire::job_name(intent.batch_key) else { return Ok(Lookup::Absent) };
        let read_page = |token: Option<String>| {
            let wanted = &wanted;
            async move {
                let mut query = format!("/model-invocation-jobs?maxResults=100&nameContains={wanted}");
                if let Some(next) = &token {
                    query.push_str(&format!("&nextToken={}", aws::encode_segment(next)));
                }
                let page: wire::JobList = self.call(http::Method::GET, &query, None).await?;
                let ours = page
                    .invocation_job_summaries
                    .into_iter()
                    .find(|j| j.job_name.as_deref() == Some(wanted.as_str()) && !intent.known_jobs.contains(&j.job_arn))
                    .map(|j| j.job_arn);
                Ok(JobListPage { ours, next: page.next_token })
            }
        };
        let unfinished = || format!("more than {MAX_LIST_PAGES} pages of jobs named like {wanted}");
        find_in_job_list(MAX_LIST_PAGES, RECHECK_AFTER, unfinished, read_page).await
    }

    async fn poll(&self, job_id: &str) -> Result<JobStatus, ProviderError> {
        let job = self.job(job_id).await?;
        let reason = || job.message.clone().unwrap_or_else(|| format!("the job ended {}", job.status));
        let phase = match wire::state(&job.status) {
            Some(wire::State::Running) => JobPhase::Running,
            Some(wire::State::Completed) => JobPhase::Completed,
            // Both end the job before every record ran; what did is read from the output
            // (an `Expired` job never began, so normally nothing) and the rest is requeued.
            Some(wire::State::OutOfTime | wire::State::NeverStarted) => JobPhase::Expired,
            Some(wire::State::Stopped) => JobPhase::Cancelled,
            Some(wire::State::Failed) => JobPhase::Failed { reason: reason(), cause: FailureCause::Unattributed },
            None => {
                return Err(error(ErrorClass::Protocol, None, format!("unknown job status {:?}", job.status)));
            }
        };
        // Completed, partial, expired and stopped jobs all leave what ran in the output.
        let result_files = if phase.is_terminal() && !matches!(phase, JobPhase::Failed { .. }) {
            self.output_files(&job.job_arn).await?
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
        for key in &job.result_files {
            let mut lines = Lines::from_described(self.output.stream(key).await?, PROVIDER);
            forward(&mut lines, wire::parse_line, out, &mut counts).await?;
        }
        Ok(counts)
    }

    async fn cancel(&self, job_id: &str) -> Result<(), ProviderError> {
        let path = format!("/model-invocation-job/{}/stop", aws::encode_segment(job_id));
        let _: Value = self.call(http::Method::POST, &path, None).await?;
        Ok(())
    }

    /// Free reads of what a job needs (`probe.rs`): the credentials, the input prefix and
    /// the model id; the schema is not checked (batch inference has no synchronous call).
    async fn probe(&self, _schema: &Schema) -> Probe {
        match self.probe_steps().await {
            Ok(checked) => Probe::Passed(checked),
            Err(e) => Probe::Refused(e),
        }
    }

    /// The input records and the output files go once the results are in.
    async fn delete_files(&self, job: &JobStatus) -> Result<u64, ProviderError> {
        let mut deleted = 0;
        for key in &job.result_files {
            deleted += u64::from(self.output.delete(key).await?);
        }
        Ok(deleted)
    }
}

fn error(class: ErrorClass, status: Option<u16>, message: String) -> ProviderError {
    ProviderError::new(PROVIDER, class, status, &message)
}
