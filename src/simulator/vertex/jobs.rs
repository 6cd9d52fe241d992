//! Batch prediction jobs: create (not idempotent), get, cancel (the list is `list`). A job's state comes
//! from elapsed time at each read: `JOB_STATE_PENDING`, `JOB_STATE_RUNNING` from a tenth of
//! `complete_after`; when it is due, its predictions are generated under the lock and
//! written to Cloud Storage without it, and only then does it read `JOB_STATE_SUCCEEDED`
//! with `outputInfo.gcsOutputDirectory`, so a client never sees an ended job without them.

use std::sync::Arc;
use std::time::{Instant, SystemTime};

use axum::Json;
use axum::body::Bytes;
use axum::extract::{ConnectInfo, Path, State};
use rand::SeedableRng;
use rand::rngs::StdRng;
use serde_json::{Map, Value, json};

use crate::domain::batch::approx_tokens;
use crate::simulator::faults::{Behaviour, Faults, every};
use crate::simulator::gemini::error::GoogleError;
use crate::simulator::gemini::model;
use crate::simulator::net::ConnHandle;
use crate::simulator::output::{batch_salt, push_line, truncate};
use crate::simulator::state::{Inner, Shared};

/// The dialect's memory: jobs in creation order and the tokens issued, by `/token` (a key
/// file's) and by the metadata server.
#[derive(Debug, Default)]
pub(crate) struct Store {
    pub(super) jobs: Vec<Job>,
    pub(super) tokens: Vec<String>,
    pub(super) metadata_tokens: Vec<String>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum TokenSource {
    KeyFile,
    MetadataServer,
}

impl Store {
    /// Which endpoint issued `token`, if one did.
    pub(super) fn token_source(&self, token: &str) -> Option<TokenSource> {
        if self.tokens.iter().any(|t| t == token) {
            Some(TokenSource::KeyFile)
        } else if self.metadata_tokens.iter().any(|t| t == token) {
            Some(TokenSource::MetadataServer)
        } else {
            None
        }
    }
}

#[derive(Clone, Debug)]
pub(super) struct Job {
    pub(super) name: String,
    display_name: String,
    model: String,
    input_uri: String,
    output_prefix: String,
    pub(super) labels: Map<String, Value>,
    state: &'static str,
    error: Option<Value>,
    output_directory: Option<String>,
    counts: (u64, u64),
    created: Instant,
    create_time: SystemTime,
    end_time: Option<SystemTime>,
    /// `(key, request)` in input order, read from Cloud Storage at create.
    lines: Arc<Vec<(String, Value)>>,
    faults: Faults,
    /// Output being written: reads still see the job running.
    finishing: bool,
}

impl Job {
    fn is_terminal(&self) -> bool {
        matches!(self.state, "JOB_STATE_SUCCEEDED" | "JOB_STATE_FAILED" | "JOB_STATE_CANCELLED" | "JOB_STATE_EXPIRED")
    }

    fn end(&mut self, state: &'static str) {
        self.state = state;
        self.end_time = Some(crate::domain::clock::now());
    }

    /// Failed with a `google.rpc.Status`: the integer code and a message.
    fn fail(&mut self, code: u32, message: String) {
        self.error = Some(json!({"code": code, "message": message}));
        self.end("JOB_STATE_FAILED");
    }

    pub(super) fn describe(&self) -> Value {
        let mut job = json!({
            "name": self.name,
            "displayName": self.display_name,
            "model": self.model,
            "inputConfig": {"instancesFormat": "jsonl", "gcsSource": {"uris": [self.input_uri]}},
            "outputConfig": {"predictionsFormat": "jsonl", "gcsDestination": {"outputUriPrefix": self.output_prefix}},
            "state": self.state,
            "labels": self.labels,
            "createTime": rfc3339(self.create_time),
            "updateTime": rfc3339(self.end_time.unwrap_or(self.create_time)),
        });
        if let Some(error) = &self.error {
            job["error"] = error.clone();
        }
        if let Some(directory) = &self.output_directory {
            job["outputInfo"] = json!({"gcsOutputDirectory": directory});
        }
        if let Some(end) = self.end_time {
            job["endTime"] = json!(rfc3339(end));
            // int64 fields are strings in proto3 JSON.
            job["completionStats"] = json!({"successfulCount": self.counts.0.to_string(),
                "failedCount": self.counts.1.to_string(), "incompleteCount": "0"});
        }
        job
    }
}

fn rfc3339(at: SystemTime) -> String {
    humantime::format_rfc3339_micros(at).to_string()
}

/// `gs://bucket/name` → (bucket, name).
fn split_gs(uri: &str) -> Option<(&str, &str)> {
    let (bucket, name) = uri.strip_prefix("gs://")?.split_once('/')?;
    (!bucket.is_empty()).then_some((bucket, name.trim_end_matches('/')))
}

fn gcs_url(shared: &Shared, path: &[&str]) -> Result<reqwest::Url, String> {
    let endpoint = shared.gcs.as_deref().ok_or("the simulator was started without a GCS endpoint (--gcs-endpoint)")?;
    let mut url = reqwest::Url::parse(endpoint).map_err(|e| e.to_string())?;
    url.path_segments_mut().map_err(|()| "a GCS endpoint without a path".to_string())?.pop_if_empty().extend(path);
    Ok(url)
}

async fn gcs_read(shared: &Shared, uri: &str) -> Result<Bytes, String> {
    let (bucket, name) = split_gs(uri).ok_or_else(|| format!("{uri} is not a gs:// object"))?;
    let mut url = gcs_url(shared, &["storage", "v1", "b", bucket, "o", name])?;
    url.query_pairs_mut().append_pair("alt", "media");
    let response = reqwest::get(url).await.map_err(|e| e.to_string())?;
    if !response.status().is_success() {
        return Err(format!("{} reading {uri}", response.status()));
    }
    response.bytes().await.map_err(|e| e.to_string())
}

async fn gcs_write(shared: &Shared, bucket: &str, name: &str, body: Vec<u8>) -> Result<(), String> {
    let mut url = gcs_url(shared, &["upload", "storage", "v1", "b", bucket, "o"])?;
    url.query_pairs_mut().append_pair("uploadType", "media").append_pair("name", name);
    let client = reqwest::Client::new();
    let response = client
        .post(url)
        .header("content-type", "application/octet-stream")
        .body(body)
        .send()
        .await
        .map_err(|e| e.to_string())?;
    if !response.status().is_success() {
        return Err(format!("{} writing gs://{bucket}/{name}", response.status()));
    }
    Ok(())
}

/// Vertex's field-level refusal: "List of found errors: 1.Field: …; Message: …".
fn field_error(field: &str, message: &str) -> GoogleError {
    GoogleError::invalid(format!("List of found errors:\t1.Field: batch_prediction_job.{field}; Message: {message}\t"))
}

/// Label keys and values: at most 63 characters of lowercase letters, digits, `-` and
/// `_`; keys start with a letter.
const LABEL_RULE: &str = "Label keys and values must be at most 63 lowercase letters, digits, - or _.";

fn label_ok(key: &str, value: &str) -> bool {
    let chars = |s: &str| s.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'_');
    (1..=63).contains(&key.len())
        && key.bytes().next().is_some_and(|b| b.is_ascii_lowercase())
        && chars(key)
        && value.len() <= 63
        && chars(value)
}

pub(super) async fn create(
    State(shared): State<Arc<Shared>>,
    ConnectInfo(conn): ConnectInfo<ConnHandle>,
    Path((project, location)): Path<(String, String)>,
    body: Bytes,
) -> Result<Json<Value>, GoogleError> {
    let body: Value = serde_json::from_slice(&body)
        .map_err(|e| GoogleError::invalid(format!("Invalid JSON payload received. {e}")))?;
    let text = |pointer: &str| body.pointer(pointer).and_then(Value::as_str).filter(|s| !s.is_empty());
    let display_name = text("/displayName").ok_or_else(|| field_error("display_name", "Required field is not set."))?;
    let model = text("/model").ok_or_else(|| field_error("model", "Required field is not set."))?;
    if !model.starts_with("publishers/google/models/") || model.len() == "publishers/google/models/".len() {
        return Err(field_error("model", "Invalid publisher model resource name."));
    }
    if text("/inputConfig/instancesFormat") != Some("jsonl") {
        return Err(field_error("input_config.instances_format", "Unsupported instances format, expected jsonl."));
    }
    let input_uri = text("/inputConfig/gcsSource/uris/0")
        .ok_or_else(|| field_error("input_config.gcs_source.uris", "Required field is not set."))?;
    if text("/outputConfig/predictionsFormat") != Some("jsonl") {
        return Err(field_error("output_config.predictions_format", "Unsupported predictions format, expected jsonl."));
    }
    let output_prefix = text("/outputConfig/gcsDestination/outputUriPrefix")
        .ok_or_else(|| field_error("output_config.gcs_destination.output_uri_prefix", "Required field is not set."))?;
    if split_gs(output_prefix).is_none() && !output_prefix.starts_with("gs://") {
        return Err(field_error("output_config.gcs_destination.output_uri_prefix", "Must be a gs:// URI."));
    }
    let labels = body.get("labels").and_then(Value::as_object).cloned().unwrap_or_default();
    if labels.iter().any(|(k, v)| !v.as_str().is_some_and(|v| label_ok(k, v))) {
        return Err(field_error("labels", LABEL_RULE));
    }
    // The input is read when the job is made; unreadable input fails the job, not the call.
    let lines = match gcs_read(&shared, input_uri).await {
        Ok(bytes) => parse_input(&bytes),
        Err(e) => Err(format!("Failed to import data. Unable to read {input_uri}: {e}")),
    };
    let mut inner = shared.lock();
    let name = job_name(&project, &location, &inner.new_id("", 19));
    let mut job = Job {
        name: name.clone(),
        display_name: display_name.to_string(),
        model: model.to_string(),
        input_uri: input_uri.to_string(),
        output_prefix: output_prefix.trim_end_matches('/').to_string(),
        labels,
        state: "JOB_STATE_PENDING",
        error: None,
        output_directory: None,
        counts: (0, 0),
        created: Instant::now(),
        create_time: crate::domain::clock::now(),
        end_time: None,
        lines: Arc::new(Vec::new()),
        faults: inner.faults.clone(),
        finishing: false,
    };
    match lines {
        Ok(lines) => job.lines = Arc::new(lines),
        Err(message) => job.fail(3, message),
    }
    let keys: Vec<String> = job.lines.iter().map(|(key, _)| key.clone()).collect();
    inner.batch_went_live(&keys);
    let answer = job.describe();
    inner.vertex.jobs.push(job);
    inner.stats.batches_created += 1;
    let drop_connection = inner.faults.take_drop_after_create();
    inner.stats.dropped_connections += u64::from(drop_connection);
    drop(inner);
    if drop_connection {
        tracing::warn!(job = %name, client = %conn.remote, "SIMULATED fault: Vertex job created, connection dropped without an answer");
        conn.kill();
    } else {
        tracing::info!(job = %name, "SIMULATED provider: Vertex batch prediction job created");
    }
    Ok(Json(answer))
}

/// Each line an object with a `request`; the other fields (our `key`) are carried into the
/// output line. A line without a request fails the job at import.
fn parse_input(bytes: &[u8]) -> Result<Vec<(String, Value)>, String> {
    let text = std::str::from_utf8(bytes).map_err(|_| "Failed to import data. The input is not UTF-8.".to_string())?;
    let mut lines = Vec::new();
    for (index, line) in text.lines().enumerate().filter(|(_, l)| !l.trim().is_empty()) {
        let value: Value = serde_json::from_str(line)
            .map_err(|e| format!("Failed to import data. Line {} is not valid JSON: {e}", index + 1))?;
        if !value.get("request").is_some_and(Value::is_object) {
            return Err(format!("Failed to import data. Line {} has no request object.", index + 1));
        }
        let key = value.get("key").and_then(Value::as_str).unwrap_or_default().to_string();
        lines.push((key, value));
    }
    if lines.is_empty() {
        return Err("Failed to import data. The input file is empty.".to_string());
    }
    Ok(lines)
}

/// What a due job writes, and the state it ends in.
struct Finish {
    index: usize,
    directory: String,
    file: Option<(String, String, Vec<u8>)>,
    counts: (u64, u64),
}

/// Brings job `index` up to now; when it falls due, writes its predictions first.
pub(super) async fn settle(shared: &Shared, index: usize) {
    let plan = {
        let mut inner = shared.lock();
        let complete_after = inner.timeline.complete_after();
        let paused = inner.faults.pause_jobs;
        let Some(job) = inner.vertex.jobs.get_mut(index) else { return };
        if job.is_terminal() || job.finishing {
            return;
        }
        let elapsed = job.created.elapsed();
        if elapsed < complete_after {
            job.state = if elapsed >= complete_after / 10 { "JOB_STATE_RUNNING" } else { "JOB_STATE_PENDING" };
            return;
        }
        if paused {
            job.state = "JOB_STATE_PAUSED";
            return;
        }
        if job.faults.fail_batch_validation {
            job.fail(3, "Failed to run the batch prediction job: the request is invalid. (SIMULATED fault: fail_batch_validation)".into());
            let keys: Vec<String> = job.lines.iter().map(|(k, _)| k.clone()).collect();
            inner.batch_went_terminal(&keys);
            return;
        }
        if job.faults.expire_batches {
            job.end("JOB_STATE_EXPIRED");
            let keys: Vec<String> = job.lines.iter().map(|(k, _)| k.clone()).collect();
            inner.stats.lines_failed += keys.len() as u64;
            inner.batch_went_terminal(&keys);
            return;
        }
        job.finishing = true;
        let job = job.clone();
        predictions(&job, index, &mut inner)
    };
    let written = match &plan.file {
        Some((bucket, name, bytes)) => gcs_write(shared, bucket, name, bytes.clone()).await,
        None => Ok(()),
    };
    let mut inner = shared.lock();
    let Some(job) = inner.vertex.jobs.get_mut(plan.index) else { return };
    job.finishing = false;
    match written {
        Ok(()) => {
            job.output_directory = Some(plan.directory);
            job.counts = plan.counts;
            job.end("JOB_STATE_SUCCEEDED");
        }
        Err(e) => job.fail(13, format!("Unable to write the predictions: {e}")),
    }
    let keys: Vec<String> = job.lines.iter().map(|(k, _)| k.clone()).collect();
    inner.batch_went_terminal(&keys);
}

/// The prediction lines: the input line's fields, then `response` with an empty `status`,
/// or only a `status` saying why the request did not run.
fn predictions(job: &Job, index: usize, inner: &mut Inner) -> Finish {
    let faults = &job.faults;
    let mut rng = StdRng::seed_from_u64(inner.seed ^ batch_salt(&job.name));
    let model_id = job.model.rsplit('/').next().unwrap_or_default().to_string();
    let processed = rfc3339(crate::domain::clock::now());
    let (mut ok, mut failed) = (0u64, 0u64);
    let mut jsonl = Vec::new();
    for (position, (_, input)) in job.lines.iter().enumerate().map(|(i, l)| (i + 1, l)) {
        let mut line = input.clone();
        let request = &input["request"];
        let input_tokens = approx_tokens(request.to_string().len() as u64);
        let status = if faults.max_input_tokens > 0 && input_tokens > faults.max_input_tokens {
            Some((
                400,
                "Bad Request",
                "INVALID_ARGUMENT",
                format!(
                    "The input token count ({input_tokens}) exceeds the maximum number of tokens allowed ({}).",
                    faults.max_input_tokens
                ),
            ))
        } else if every(faults.failed_line_every, position) {
            Some((
                429,
                "Too Many Requests",
                "RESOURCE_EXHAUSTED",
                "Resource exhausted. Please try again later. (SIMULATED fault: failed_line_every)".to_string(),
            ))
        } else if let Err(message) = model::check(request) {
            Some((400, "Bad Request", "INVALID_ARGUMENT", message))
        } else if let Some(labels) = request.get("labels")
            && !labels.as_object().is_some_and(|l| l.iter().all(|(k, v)| v.as_str().is_some_and(|v| label_ok(k, v))))
        {
            Some((400, "Bad Request", "INVALID_ARGUMENT", format!("Invalid request labels: {LABEL_RULE}")))
        } else {
            None
        };
        match status {
            Some((code, reason, name, message)) => {
                failed += 1;
                let body = json!({"error": {"code": code, "message": message, "status": name}});
                line["status"] = json!(format!("{reason}: {body}"));
            }
            None => {
                ok += 1;
                let behaviour = inner.attempts.behaviour(faults, position, &model::ask(request));
                let response = model::respond(request, behaviour, &model_id, &mut rng);
                let finish = response.pointer("/candidates/0/finishReason").and_then(Value::as_str);
                inner.stats.lines_truncated += u64::from(finish == Some("MAX_TOKENS"));
                inner.stats.lines_refused += u64::from(matches!(behaviour, Behaviour::Refuse { .. }));
                line["status"] = json!("");
                line["response"] = response;
            }
        }
        if !faults.vertex_echoes_key
            && let Some(fields) = line.as_object_mut()
        {
            fields.remove("key");
        }
        line["processed_time"] = json!(processed);
        let text = line.to_string();
        push_line(&mut jsonl, if every(faults.malformed_line_every, position) { truncate(&text) } else { &text });
    }
    inner.stats.lines_completed += ok;
    inner.stats.lines_failed += failed;
    let stamp = humantime::format_rfc3339_millis(crate::domain::clock::now()).to_string().replace([':', '.'], "-");
    let directory = format!("{}/prediction-model-{stamp}", job.output_prefix);
    let file =
        split_gs(&directory).map(|(bucket, dir)| (bucket.to_string(), format!("{dir}/predictions.jsonl"), jsonl));
    Finish { index, directory, file, counts: (ok, failed) }
}

fn find(inner: &Inner, name: &str) -> Result<usize, GoogleError> {
    inner
        .vertex
        .jobs
        .iter()
        .position(|j| j.name == name)
        .ok_or_else(|| GoogleError::not_found(format!("The BatchPredictionJob does not exist: {name}")))
}

/// A job's resource name, as Vertex answers it: under the project *number*, whether the
/// caller named the project by id or by number (docs/PROVIDERS.md, "Vertex AI").
pub(super) fn job_name(project: &str, location: &str, job: &str) -> String {
    format!("projects/{}/locations/{location}/batchPredictionJobs/{job}", project_number(project))
}

/// The number Google gives a project beside its id: 12 digits, made up here from the id so
/// that one id always has one number. A path that names the number already keeps it.
pub(super) fn project_number(project: &str) -> String {
    if !project.is_empty() && project.bytes().all(|b| b.is_ascii_digit()) {
        return project.to_string();
    }
    let hash = blake3::hash(project.as_bytes());
    let mut bytes = [0u8; 8];
    bytes.copy_from_slice(&hash.as_bytes()[..8]);
    (100_000_000_000 + u64::from_le_bytes(bytes) % 900_000_000_000).to_string()
}

pub(super) async fn get(
    State(shared): State<Arc<Shared>>,
    Path((project, location, job)): Path<(String, String, String)>,
) -> Result<Json<Value>, GoogleError> {
    let index = find(&shared.lock(), &job_name(&project, &location, &job))?;
    settle(&shared, index).await;
    let mut inner = shared.lock();
    inner.stats.polls += 1;
    Ok(Json(inner.vertex.jobs[index].describe()))
}

/// `POST …/batchPredictionJobs/{id}:cancel`, the one custom verb.
pub(super) async fn verb(
    State(shared): State<Arc<Shared>>,
    Path((project, location, job)): Path<(String, String, String)>,
) -> Result<Json<Value>, GoogleError> {
    let Some(id) = job.strip_suffix(":cancel") else {
        return Err(GoogleError::not_found(format!("Unknown method on {job}")));
    };
    let index = find(&shared.lock(), &job_name(&project, &location, id))?;
    settle(&shared, index).await;
    let mut inner = shared.lock();
    let job = &mut inner.vertex.jobs[index];
    if job.is_terminal() || job.finishing {
        return Err(GoogleError::failed_precondition(format!(
            "BatchPredictionJob {} is in state {} and cannot be cancelled.",
            job.name, job.state
        )));
    }
    job.end("JOB_STATE_CANCELLED");
    let keys: Vec<String> = job.lines.iter().map(|(k, _)| k.clone()).collect();
    inner.batch_went_terminal(&keys);
    Ok(Json(json!({})))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels_follow_the_rules() {
        assert!(label_ok("commitpoint_batch", "cpb-0123"));
        assert!(!label_ok("Commitpoint", "x"));
        assert!(!label_ok("k", &"a".repeat(64)));
    }

    #[test]
    fn input_lines_need_a_request() {
        let lines = parse_input(b"{\"key\":\"k1\",\"request\":{\"contents\":[]}}\n\n").unwrap();
        assert_eq!(lines[0].0, "k1");
        assert!(parse_input(b"{\"key\":\"k1\"}\n").unwrap_err().contains("no request"));
        assert!(parse_input(b"").is_err());
    }
}
