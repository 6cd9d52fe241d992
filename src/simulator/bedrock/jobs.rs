//! Model invocation jobs: create (idempotent on `clientRequestToken`), get, list, stop.
//! A job's state is computed from elapsed time at each read: `Submitted`, `Validating` for
//! the first tenth of `complete_after`, then `InProgress`; when it is due, its output is
//! generated under the lock and written to S3 without it, and only then does the job read
//! as ended, so a client never sees an ended job without its files.

use std::sync::Arc;
use std::time::{Instant, SystemTime};

use axum::Json;
use axum::body::Bytes;
use axum::extract::{ConnectInfo, Path, Query, State};
use axum::http::StatusCode;
use object_store::aws::AmazonS3Builder;
use object_store::{ObjectStore, ObjectStoreExt, PutPayload};
use rand::SeedableRng;
use rand::rngs::StdRng;
use serde::Deserialize;
use serde_json::{Value, json};

use super::{AwsError, MAX_RECORDS, constraints};
use crate::simulator::answer::Attempts;
use crate::simulator::anthropic::model;
use crate::simulator::faults::{Faults, every};
use crate::simulator::net::ConnHandle;
use crate::simulator::output::{batch_salt, push_line, random_id, truncate};
use crate::simulator::state::{Inner, Shared};

pub(super) const REGION: &str = "us-east-1";
pub(super) const ACCOUNT: &str = "123456789012";
const ANTHROPIC_VERSION: &str = "bedrock-2023-05-31";

#[derive(Clone, Debug)]
pub(crate) struct Job {
    arn: String,
    name: String,
    token: Option<String>,
    model: String,
    role: String,
    input_uri: String,
    output_uri: String,
    status: &'static str,
    message: Option<String>,
    created: Instant,
    submitted: SystemTime,
    ended: Option<SystemTime>,
    /// `(recordId, modelInput)` in input order, as read from S3 at create.
    records: Arc<Vec<(String, Value)>>,
    faults: Faults,
    /// Output being written: reads still see the job running.
    finishing: bool,
}

impl Job {
    fn id(&self) -> &str {
        self.arn.rsplit('/').next().unwrap_or(&self.arn)
    }

    fn is_terminal(&self) -> bool {
        matches!(self.status, "Completed" | "PartiallyCompleted" | "Failed" | "Stopped" | "Expired")
    }

    fn describe(&self) -> Value {
        let mut job = json!({
            "jobArn": self.arn,
            "jobName": self.name,
            "modelId": self.model,
            "roleArn": self.role,
            "status": self.status,
            "submitTime": rfc3339(self.submitted),
            "lastModifiedTime": rfc3339(self.ended.unwrap_or(self.submitted)),
            "inputDataConfig": {"s3InputDataConfig": {"s3Uri": self.input_uri, "s3InputFormat": "JSONL"}},
            "outputDataConfig": {"s3OutputDataConfig": {"s3Uri": self.output_uri}},
        });
        if let Some(token) = &self.token {
            job["clientRequestToken"] = json!(token);
        }
        if let Some(message) = &self.message {
            job["message"] = json!(message);
        }
        if let Some(ended) = self.ended {
            job["endTime"] = json!(rfc3339(ended));
        }
        job
    }
}

fn rfc3339(at: SystemTime) -> String {
    humantime::format_rfc3339_millis(at).to_string()
}

fn split_s3(uri: &str) -> Option<(String, String)> {
    let (bucket, key) = uri.strip_prefix("s3://")?.split_once('/')?;
    (!bucket.is_empty()).then(|| (bucket.to_string(), key.trim_matches('/').to_string()))
}

fn bucket(shared: &Shared, name: &str) -> Result<impl ObjectStore, AwsError> {
    let s3 = shared
        .s3
        .as_ref()
        .ok_or_else(|| AwsError::validation("the simulator was started without an S3 endpoint (--s3-endpoint)"))?;
    AmazonS3Builder::new()
        .with_bucket_name(name)
        .with_region(REGION)
        .with_endpoint(&s3.endpoint)
        .with_allow_http(s3.endpoint.starts_with("http://"))
        .with_access_key_id(&s3.access_key_id)
        .with_secret_access_key(&s3.secret_access_key)
        .build()
        .map_err(|e| AwsError::validation(format!("S3 bucket {name}: {e}")))
}

/// `[a-zA-Z0-9]{1,63}(-*[a-zA-Z0-9\+\-\.]){0,63}`, at most 63 characters (jobName).
fn valid_job_name(name: &str) -> bool {
    (1..=63).contains(&name.len())
        && name.bytes().next().is_some_and(|b| b.is_ascii_alphanumeric())
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'+' | b'.'))
}

/// `[a-zA-Z0-9]{1,256}(-*[a-zA-Z0-9]){0,256}` (clientRequestToken).
fn valid_token(token: &str) -> bool {
    (1..=256).contains(&token.len())
        && token.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
        && token.bytes().next().is_some_and(|b| b.is_ascii_alphanumeric())
        && !token.ends_with('-')
}

pub(super) async fn create(
    State(shared): State<Arc<Shared>>,
    ConnectInfo(conn): ConnectInfo<ConnHandle>,
    body: Bytes,
) -> Result<Json<Value>, AwsError> {
    let body: Value =
        serde_json::from_slice(&body).map_err(|e| AwsError::validation(format!("Malformed JSON: {e}")))?;
    let text = |pointer: &str| body.pointer(pointer).and_then(Value::as_str).map(str::to_string);
    let required = |pointer: &str, name: &str| {
        text(pointer).filter(|v| !v.is_empty()).ok_or_else(|| {
            AwsError::validation(format!("1 validation error detected: Value null at '{name}' failed to satisfy constraint: Member must not be null"))
        })
    };
    let name = required("/jobName", "jobName")?;
    let role = required("/roleArn", "roleArn")?;
    let model = required("/modelId", "modelId")?;
    let input_uri = required("/inputDataConfig/s3InputDataConfig/s3Uri", "inputDataConfig.s3InputDataConfig.s3Uri")?;
    let output_uri =
        required("/outputDataConfig/s3OutputDataConfig/s3Uri", "outputDataConfig.s3OutputDataConfig.s3Uri")?;
    let token = text("/clientRequestToken");
    if !valid_job_name(&name) {
        return Err(AwsError::validation(format!(
            "1 validation error detected: Value '{name}' at 'jobName' failed to satisfy constraint: Member must satisfy regular expression pattern: [a-zA-Z0-9]{{1,63}}(-*[a-zA-Z0-9\\+\\-\\.]){{0,63}}"
        )));
    }
    if let Some(token) = token.as_deref().filter(|t| !valid_token(t)) {
        return Err(AwsError::validation(format!(
            "1 validation error detected: Value '{token}' at 'clientRequestToken' failed to satisfy constraint: Member must satisfy regular expression pattern: [a-zA-Z0-9]{{1,256}}(-*[a-zA-Z0-9]){{0,256}}"
        )));
    }
    constraints::check(&body)?;
    if let Some(format) = text("/inputDataConfig/s3InputDataConfig/s3InputFormat").filter(|f| f != "JSONL") {
        return Err(AwsError::validation(format!("Unsupported s3InputFormat {format}")));
    }
    // A repeated token is ignored without error: the first job answers.
    if let Some(token) = &token {
        let inner = shared.lock();
        if let Some(job) = inner.bedrock.iter().find(|j| j.token.as_ref() == Some(token)) {
            return Ok(Json(json!({"jobArn": job.arn})));
        }
        if inner.bedrock.iter().any(|j| j.name == name) {
            return Err(AwsError::new(
                StatusCode::BAD_REQUEST,
                "ValidationException",
                format!("A job with the name {name} already exists."),
            ));
        }
    }
    let (in_bucket, in_key) =
        split_s3(&input_uri).ok_or_else(|| AwsError::validation("inputDataConfig s3Uri must be s3://bucket/key"))?;
    split_s3(&output_uri).ok_or_else(|| AwsError::validation("outputDataConfig s3Uri must be s3://bucket/prefix"))?;
    let store = bucket(&shared, &in_bucket)?;
    let object = store
        .get(&object_store::path::Path::from(in_key.as_str()))
        .await
        .map_err(|e| AwsError::validation(format!("Unable to access the input data at {input_uri}: {e}")))?;
    let bytes = object.bytes().await.map_err(|e| AwsError::validation(format!("Unable to read {input_uri}: {e}")))?;
    let records = parse_records(&bytes);
    let mut inner = shared.lock();
    let arn = format!(
        "arn:aws:bedrock:{REGION}:{ACCOUNT}:model-invocation-job/{}",
        inner.new_id("", 12).to_ascii_lowercase()
    );
    let mut job = Job {
        arn: arn.clone(),
        name,
        token,
        model,
        role,
        input_uri,
        output_uri,
        status: "Submitted",
        message: None,
        created: Instant::now(),
        submitted: crate::domain::clock::now(),
        ended: None,
        records: Arc::new(Vec::new()),
        faults: inner.faults.clone(),
        finishing: false,
    };
    let min_records = job.faults.bedrock_min_records as usize;
    match records {
        Ok(records) if records.len() < min_records => {
            job.fail(format!("The number of records ({}) in the input is less than the minimum required ({min_records}) for a batch inference job.", records.len()));
        }
        Ok(records) if records.len() > MAX_RECORDS => {
            job.fail(format!("The number of records ({}) in the input exceeds the maximum ({MAX_RECORDS}) for a batch inference job.", records.len()));
        }
        Ok(records) => job.records = Arc::new(records),
        Err(message) => job.fail(message),
    }
    let ids: Vec<String> = job.records.iter().map(|(id, _)| id.clone()).collect();
    inner.batch_went_live(&ids);
    inner.bedrock.push(job);
    inner.stats.batches_created += 1;
    let drop_connection = inner.faults.take_drop_after_create();
    inner.stats.dropped_connections += u64::from(drop_connection);
    drop(inner);
    if drop_connection {
        tracing::warn!(job = %arn, client = %conn.remote, "SIMULATED fault: Bedrock job created, connection dropped without an answer");
        conn.kill();
    } else {
        tracing::info!(job = %arn, "SIMULATED provider: Bedrock job created");
    }
    Ok(Json(json!({"jobArn": arn})))
}

impl Job {
    fn fail(&mut self, message: String) {
        self.status = "Failed";
        self.message = Some(message);
        self.ended = Some(crate::domain::clock::now());
    }
}

/// Each line `{recordId, modelInput}`; a line that is not is a validation failure of the job.
fn parse_records(bytes: &[u8]) -> Result<Vec<(String, Value)>, String> {
    let text = std::str::from_utf8(bytes).map_err(|_| "The input file is not UTF-8 JSONL.".to_string())?;
    let mut records = Vec::new();
    for (index, line) in text.lines().enumerate().filter(|(_, l)| !l.trim().is_empty()) {
        let record: Value =
            serde_json::from_str(line).map_err(|e| format!("Line {} is not valid JSON: {e}", index + 1))?;
        let id = record.get("recordId").and_then(Value::as_str).map(str::to_string);
        let input = record.get("modelInput").filter(|v| v.is_object()).cloned();
        let (Some(id), Some(input)) = (id, input) else {
            return Err(format!("Line {} must be an object with recordId and modelInput.", index + 1));
        };
        records.push((id, input));
    }
    Ok(records)
}

/// What a due job writes: its output files, and the state it ends in.
struct Finish {
    index: usize,
    status: &'static str,
    files: Vec<(String, String, Vec<u8>)>,
}

/// Brings job `index` up to now; when it falls due, writes its output before it reads as ended.
async fn settle(shared: &Shared, index: usize) {
    let plan = {
        let mut inner = shared.lock();
        let complete_after = inner.timeline.complete_after();
        let Some(job) = inner.bedrock.get_mut(index) else { return };
        if job.is_terminal() || job.finishing {
            return;
        }
        let elapsed = job.created.elapsed();
        if elapsed < complete_after {
            job.status = if elapsed >= complete_after / 10 { "InProgress" } else { "Validating" };
            return;
        }
        if job.faults.fail_batch_validation {
            job.fail("The batch inference job failed validation. (SIMULATED fault: fail_batch_validation)".into());
            return;
        }
        job.finishing = true;
        let job = job.clone();
        output(&job, index, &mut inner)
    };
    let mut failure = None;
    for (bucket_name, key, bytes) in plan.files {
        let written = match bucket(shared, &bucket_name) {
            Ok(store) => store
                .put(&object_store::path::Path::from(key.as_str()), PutPayload::from(bytes))
                .await
                .map(drop)
                .map_err(|e| e.to_string()),
            Err(e) => Err(e.message),
        };
        if let Err(e) = written {
            failure = Some(format!("Unable to write the output to s3://{bucket_name}/{key}: {e}"));
            break;
        }
    }
    let mut inner = shared.lock();
    let Some(job) = inner.bedrock.get_mut(plan.index) else { return };
    job.finishing = false;
    match failure {
        Some(message) => job.fail(message),
        None => {
            job.status = plan.status;
            job.ended = Some(crate::domain::clock::now());
        }
    }
    let ids: Vec<String> = job.records.iter().map(|(id, _)| id.clone()).collect();
    let status = job.status;
    inner.batch_went_terminal(&ids);
    tracing::info!(status, "SIMULATED provider: Bedrock job ended");
}

/// Answers the records as the `.jsonl.out` lines Bedrock writes, plus `manifest.json.out`.
/// The service model's states (`ModelInvocationJobStatus`): `Expired` is a job that was
/// scheduled but did not begin before its timeout, so it writes nothing;
/// `PartiallyCompleted` is one whose timeout came while it ran ("not all of your records
/// could be processed in time"), so only the first half is answered and the rest are
/// missing from the output. Record errors in a job that processed everything still end it
/// `Completed` (the manifest counts them).
fn output(job: &Job, index: usize, inner: &mut Inner) -> Finish {
    let faults = &job.faults;
    if faults.expire_batches {
        inner.stats.lines_failed += job.records.len() as u64;
        return Finish { index, status: "Expired", files: Vec::new() };
    }
    let mut rng = StdRng::seed_from_u64(inner.seed ^ batch_salt(&job.arn));
    let answered = if faults.partial_batches { job.records.len() / 2 } else { job.records.len() };
    let (mut ok, mut errors, mut input_tokens, mut output_tokens) = (0u64, 0u64, 0u64, 0u64);
    let mut jsonl = Vec::new();
    for (position, (id, input)) in job.records.iter().take(answered).enumerate().map(|(i, r)| (i + 1, r)) {
        let mut line = json!({"recordId": id, "modelInput": input});
        match answer(input, faults, position, &job.model, &mut rng, &mut inner.attempts) {
            Ok((output, used_in, used_out)) => {
                ok += 1;
                input_tokens += used_in;
                output_tokens += used_out;
                line["modelOutput"] = output;
            }
            Err((code, message)) => {
                errors += 1;
                line["error"] = json!({"errorCode": code, "errorMessage": message});
            }
        }
        let text = line.to_string();
        push_line(&mut jsonl, if every(faults.malformed_line_every, position) { truncate(&text) } else { &text });
    }
    inner.stats.lines_completed += ok;
    inner.stats.lines_failed += errors + (job.records.len() - answered) as u64;
    let manifest = json!({
        "totalRecordCount": job.records.len(),
        "processedRecordCount": answered,
        "successRecordCount": ok,
        "errorRecordCount": errors,
        "inputTokenCount": input_tokens,
        "outputTokenCount": output_tokens,
    });
    let (out_bucket, out_prefix) = split_s3(&job.output_uri).unwrap_or_default();
    let input_name = job.input_uri.rsplit('/').next().unwrap_or("input.jsonl");
    let dir = if out_prefix.is_empty() { job.id().to_string() } else { format!("{out_prefix}/{}", job.id()) };
    let files = vec![
        (out_bucket.clone(), format!("{dir}/{input_name}.out"), jsonl),
        (out_bucket, format!("{dir}/manifest.json.out"), manifest.to_string().into_bytes()),
    ];
    let status = if answered < job.records.len() { "PartiallyCompleted" } else { "Completed" };
    Finish { index, status, files }
}

/// One record's `modelOutput` (a Messages response) and its token counts, or its error.
fn answer(
    input: &Value,
    faults: &Faults,
    position: usize,
    model_id: &str,
    rng: &mut StdRng,
    attempts: &mut Attempts,
) -> Result<(Value, u64, u64), (u16, String)> {
    if every(faults.failed_line_every, position) {
        return Err((
            429,
            "Too many requests, please wait before trying again. (SIMULATED fault: failed_line_every)".into(),
        ));
    }
    if let Some(message) = constraints::extraneous_key(input, model_id) {
        return Err((400, message));
    }
    if input.get("anthropic_version").and_then(Value::as_str) != Some(ANTHROPIC_VERSION) {
        return Err((400, format!("Malformed input request: anthropic_version must be {ANTHROPIC_VERSION}")));
    }
    let ask = model::ask(input, model::forced_name(input).as_deref());
    let behaviour = attempts.behaviour(faults, position, &ask);
    let answer = model::respond(input, behaviour, rng).map_err(|message| (400, message))?;
    let output = json!({
        "id": random_id(rng, "msg_bdrk_", 24),
        "type": "message",
        "role": "assistant",
        "model": model_id,
        "content": answer.content,
        "stop_reason": answer.stop_reason,
        "usage": {"input_tokens": answer.input_tokens, "output_tokens": answer.output_tokens},
    });
    Ok((output, answer.input_tokens, answer.output_tokens))
}

fn find(inner: &Inner, id: &str) -> Option<usize> {
    inner.bedrock.iter().position(|j| j.arn == id || j.id() == id)
}

pub(super) async fn get(State(shared): State<Arc<Shared>>, Path(id): Path<String>) -> Result<Json<Value>, AwsError> {
    let index = find(&shared.lock(), &id);
    let index = index
        .ok_or_else(|| AwsError::not_found(format!("Could not find a batch inference job with identifier {id}")))?;
    settle(&shared, index).await;
    let mut inner = shared.lock();
    inner.stats.polls += 1;
    Ok(Json(inner.bedrock[index].describe()))
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct ListQuery {
    name_contains: Option<String>,
    max_results: Option<usize>,
    next_token: Option<String>,
}

pub(super) async fn list(
    State(shared): State<Arc<Shared>>,
    Query(query): Query<ListQuery>,
) -> Result<Json<Value>, AwsError> {
    let max = query.max_results.unwrap_or(1000);
    if !(1..=1000).contains(&max) {
        return Err(AwsError::validation("maxResults must be between 1 and 1000"));
    }
    let count = shared.lock().bedrock.len();
    for index in 0..count {
        settle(&shared, index).await;
    }
    let mut inner = shared.lock();
    inner.stats.batches_listed += 1;
    let skip = match &query.next_token {
        Some(token) => token.parse::<usize>().map_err(|_| AwsError::validation("Invalid nextToken"))?,
        None => 0,
    };
    let matching: Vec<Value> = inner
        .bedrock
        .iter()
        .rev()
        .filter(|j| query.name_contains.as_deref().is_none_or(|n| j.name.contains(n)))
        .map(Job::describe)
        .collect();
    let page: Vec<Value> = matching.iter().skip(skip).take(max).cloned().collect();
    let mut answer = json!({"invocationJobSummaries": page});
    if skip + max < matching.len() {
        answer["nextToken"] = json!((skip + max).to_string());
    }
    Ok(Json(answer))
}

pub(super) async fn stop(State(shared): State<Arc<Shared>>, Path(id): Path<String>) -> Result<Json<Value>, AwsError> {
    let index = find(&shared.lock(), &id);
    let index = index
        .ok_or_else(|| AwsError::not_found(format!("Could not find a batch inference job with identifier {id}")))?;
    settle(&shared, index).await;
    let mut inner = shared.lock();
    let job = &mut inner.bedrock[index];
    if job.is_terminal() || job.finishing {
        return Err(AwsError::validation(format!("The job {id} can't be stopped in its current state.")));
    }
    job.status = "Stopped";
    job.ended = Some(crate::domain::clock::now());
    let ids: Vec<String> = job.records.iter().map(|(id, _)| id.clone()).collect();
    inner.batch_went_terminal(&ids);
    Ok(Json(json!({})))
}
