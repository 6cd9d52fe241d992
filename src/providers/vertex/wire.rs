//! Vertex AI batch prediction wire types (docs/PROVIDERS.md, "Vertex AI"), private to this
//! adapter: the `BatchPredictionJob` we create and read, the job list, `JobState`, and the
//! lines of the output JSONL. The request each member becomes is Gemini's own
//! `GenerateContentRequest` (`gemini::wire::request`), and so are the answer and error
//! readers: one wire, two services.

use serde::Deserialize;
use serde_json::{Value, json};

use crate::domain::batch::LineResult;
use crate::providers::gemini::wire as google;

/// The job label carrying our batch key: label keys and values are at most 63 characters
/// of lowercase letters, digits, `-` and `_` (a batch key `cpb-<32 hex>` is one).
pub(crate) const BATCH_LABEL: &str = "commitpoint_batch";

/// The request labels carrying a member's key. A key is 64 hex characters and a label value
/// at most 63, so it goes in two halves; label keys start with a letter.
pub(crate) const KEY_LABELS: [&str; 2] = ["commitpoint_key_a", "commitpoint_key_b"];

/// A line of the input JSONL: our key beside the request, and again in the request's
/// `labels`. Whether Vertex copies fields beside `request` into the output line is not
/// documented (PredictionResult's "key … from the input instance" suggests so; litellm
/// found it does not), while the output line repeats the request, labels included: so a
/// line is matched by either, and neither reading of the docs loses a job.
pub(crate) fn input_line(key: &str, mut request: Value) -> Value {
    if let Some(fields) = request.as_object_mut() {
        let (first, second) = key.split_at(key.len().div_ceil(2));
        let labels = fields.entry("labels").or_insert_with(|| json!({}));
        labels[KEY_LABELS[0]] = json!(first);
        labels[KEY_LABELS[1]] = json!(second);
    }
    json!({"key": key, "request": request})
}

/// The member key an output line names: its `key` field, else the request's key labels. A
/// line naming two different keys is not trusted with either.
fn line_key(line: &Value) -> Result<String, String> {
    let labels = line.pointer("/request/labels");
    let labelled = match KEY_LABELS.map(|name| labels.and_then(|l| l.get(name)).and_then(Value::as_str)) {
        [Some(first), Some(second)] => Some(format!("{first}{second}")),
        _ => None,
    };
    match (line.get("key").and_then(Value::as_str), labelled) {
        (Some(key), Some(labelled)) if key != labelled => {
            Err(format!("a result line whose key {key} differs from its request's labels ({labelled})"))
        }
        (Some(key), _) => Ok(key.to_string()),
        (None, Some(labelled)) => Ok(labelled),
        (None, None) => Err("a result line with neither its key nor the request's key labels".to_string()),
    }
}

/// The `batchPredictionJobs.create` body.
pub(crate) struct CreateJob<'a> {
    pub display_name: &'a str,
    pub model: &'a str,
    pub input_uri: &'a str,
    pub output_prefix: &'a str,
    pub batch_key: &'a str,
}

impl CreateJob<'_> {
    pub(crate) fn body(&self) -> Value {
        json!({
            "displayName": self.display_name,
            "model": self.model,
            "inputConfig": {"instancesFormat": "jsonl", "gcsSource": {"uris": [self.input_uri]}},
            "outputConfig": {"predictionsFormat": "jsonl", "gcsDestination": {"outputUriPrefix": self.output_prefix}},
            "labels": {BATCH_LABEL: self.batch_key},
        })
    }
}

/// The parts of a `BatchPredictionJob` we read.
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct Job {
    #[serde(default)]
    pub name: String,
    #[serde(default)]
    pub state: Option<String>,
    #[serde(default)]
    pub labels: std::collections::BTreeMap<String, String>,
    /// Why a failed job failed (`google.rpc.Status`: an integer code and a message).
    #[serde(default)]
    pub error: Option<google::Status>,
    #[serde(default)]
    pub output_info: Option<OutputInfo>,
    #[serde(default)]
    pub input_config: Option<InputConfig>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct OutputInfo {
    #[serde(default)]
    pub gcs_output_directory: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct InputConfig {
    #[serde(default)]
    pub gcs_source: Option<GcsSource>,
}

#[derive(Debug, Default, Deserialize)]
pub(crate) struct GcsSource {
    #[serde(default)]
    pub uris: Vec<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct JobList {
    #[serde(default)]
    pub batch_prediction_jobs: Vec<Job>,
    #[serde(default)]
    pub next_page_token: Option<String>,
}

impl Job {
    pub(crate) fn state(&self) -> &str {
        self.state.as_deref().unwrap_or("JOB_STATE_UNSPECIFIED")
    }

    pub(crate) fn input_uris(&self) -> &[String] {
        self.input_config.as_ref().and_then(|c| c.gcs_source.as_ref()).map_or(&[], |s| s.uris.as_slice())
    }
}

/// Where a job stands (aiplatform v1 `JobState`).
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum State {
    Running,
    /// "The job has been stopped, and can be resumed" (`job_state.proto`): by someone else,
    /// as the v1 API has no resume call for batch prediction jobs.
    Paused,
    /// Every request ran (`SUCCEEDED`), or some did and the job still ended
    /// (`PARTIALLY_SUCCEEDED`): read the output, requeue what it lacks.
    Succeeded,
    Failed,
    Cancelled,
    Expired,
}

pub(crate) fn state(name: &str) -> Option<State> {
    Some(match name.strip_prefix("JOB_STATE_")? {
        "UNSPECIFIED" | "QUEUED" | "PENDING" | "RUNNING" | "CANCELLING" | "UPDATING" => State::Running,
        "PAUSED" => State::Paused,
        "SUCCEEDED" | "PARTIALLY_SUCCEEDED" => State::Succeeded,
        "FAILED" => State::Failed,
        "CANCELLED" => State::Cancelled,
        "EXPIRED" => State::Expired,
        _ => return None,
    })
}

/// An output line: the input line's fields (our `key`, the `request`), then `response`
/// and an empty `status` when the request ran, or a non-empty `status` saying why not.
pub(crate) fn parse_line(line: &str) -> Result<(String, LineResult), String> {
    let value: Value = serde_json::from_str(line).map_err(|e| format!("unreadable result line: {e}"))?;
    let key = line_key(&value)?;
    if let Some(status) = value["status"].as_str().filter(|s| !s.trim().is_empty()) {
        return Ok((key, google::errored(&line_status(status))));
    }
    match value.get("response") {
        Some(response) if response.is_object() => Ok((key, google::answer(response))),
        _ => Err("a result line with neither response nor status".to_string()),
    }
}

/// A line's `status` is text: an HTTP reason followed by Google's JSON error body
/// (`Bad Request: {"error": {"code": 400, "message": …, "status": "INVALID_ARGUMENT"}}`).
/// The body decides the class; text without one is read for a canonical code name, and
/// text naming none is retried as unknown.
fn line_status(text: &str) -> google::Status {
    let body = text.find('{').and_then(|at| serde_json::from_str::<google::ErrorBody>(&text[at..]).ok());
    if let Some(body) = body {
        let mut status = body.error;
        if status.status.is_none() {
            status.code = None;
        }
        return status;
    }
    let named = CODE_NAMES.iter().find(|name| text.contains(*name)).map(|name| name.to_string());
    google::Status { status: named, message: Some(text.to_string()), ..google::Status::default() }
}

/// The canonical names a status text may carry without a JSON body.
const CODE_NAMES: [&str; 9] = [
    "INVALID_ARGUMENT",
    "FAILED_PRECONDITION",
    "OUT_OF_RANGE",
    "PERMISSION_DENIED",
    "UNAUTHENTICATED",
    "RESOURCE_EXHAUSTED",
    "DEADLINE_EXCEEDED",
    "UNAVAILABLE",
    "INTERNAL",
];
