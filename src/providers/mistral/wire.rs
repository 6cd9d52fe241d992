//! Mistral batch API wire types (docs/PROVIDERS.md, "Mistral"), private to this adapter.
//!
//! An input line is `{"custom_id", "body"}` whose body is a chat completion request
//! without `model` (the job names it). Mistral's request validation forbids unknown
//! fields (422 `extra_forbidden`, "Extra inputs are not permitted"), so the budget goes in
//! `max_tokens`, never OpenAI's `max_completion_tokens`.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use crate::domain::batch::{BatchMember, LineResult};
use crate::domain::lifecycle::FailureClass;
use crate::domain::schema::Schema;
use crate::providers::chat::wire::{self as chat, BudgetField};

/// The one endpoint our jobs run (`APIEndpoint` in the SDKs).
pub(crate) const ENDPOINT: &str = "/v1/chat/completions";
/// The `metadata` key carrying our batch key, which `find_job` looks for.
pub(crate) const BATCH_KEY_METADATA: &str = "commitpoint_batch_key";

/// One chat completion body for `member`: the strict `json_schema` response format and
/// `max_tokens`. `model` is left out in a batch line, where the job names it.
pub(crate) fn request_body(
    member: &BatchMember,
    schema: &Schema,
    model: Option<&str>,
    max_tokens: Option<u32>,
) -> Value {
    let mut body = chat::request_body(member, schema, model.unwrap_or_default(), max_tokens, BudgetField::MaxTokens);
    if model.is_none()
        && let Some(fields) = body.as_object_mut()
    {
        fields.remove("model");
    }
    body
}

pub(crate) fn input_line(member: &BatchMember, schema: &Schema, max_tokens: Option<u32>) -> Value {
    json!({"custom_id": member.id.to_hex(), "body": request_body(member, schema, None, max_tokens)})
}

#[derive(Debug, Serialize)]
pub(crate) struct CreateJob<'a> {
    pub input_files: [&'a str; 1],
    pub endpoint: &'static str,
    pub model: &'a str,
    pub metadata: BTreeMap<&'static str, &'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub timeout_hours: Option<u32>,
}

#[derive(Debug, Deserialize)]
pub(crate) struct FileObject {
    pub id: String,
}

/// `BatchJob` (client-python `models/batchjob.py`): the fields we read.
#[derive(Debug, Deserialize)]
pub(crate) struct Job {
    pub id: String,
    pub status: String,
    #[serde(default)]
    pub input_files: Vec<String>,
    #[serde(default)]
    pub metadata: Option<BTreeMap<String, Value>>,
    #[serde(default)]
    pub output_file: Option<String>,
    #[serde(default)]
    pub error_file: Option<String>,
    #[serde(default)]
    pub errors: Vec<JobError>,
    #[serde(default)]
    pub created_at: Option<u64>,
}

impl Job {
    pub(crate) fn batch_key(&self) -> Option<&str> {
        self.metadata.as_ref()?.get(BATCH_KEY_METADATA)?.as_str()
    }
}

#[derive(Debug, Deserialize)]
pub(crate) struct JobError {
    pub message: String,
    #[serde(default)]
    pub count: Option<u64>,
}

/// `ListBatchJobsResponse`: one page (`page` from 0, `page_size`), newest first by default
/// (`order_by = "-created"`), and the `total` count over all pages.
#[derive(Debug, Deserialize)]
pub(crate) struct JobList {
    #[serde(default)]
    pub data: Vec<Job>,
    pub total: u64,
}

/// What a job's status means to us.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum State {
    Running,
    Succeeded,
    Failed,
    TimedOut,
    Cancelled,
}

/// `BatchJobStatus`, an open enum: an unknown value is `None`, never guessed.
pub(crate) fn state(status: &str) -> Option<State> {
    Some(match status {
        "QUEUED" | "RUNNING" | "CANCELLATION_REQUESTED" => State::Running,
        "SUCCESS" => State::Succeeded,
        "FAILED" => State::Failed,
        "TIMEOUT_EXCEEDED" => State::TimedOut,
        "CANCELLED" => State::Cancelled,
        _ => return None,
    })
}

/// The parts of a Mistral error body. Published bodies come in three shapes:
/// `{"object":"error","message":"…","type":"…","param":null,"code":"1300"}`, the same with
/// `message` an object `{"detail":[{"type","loc","msg",…}]}` (422 validation), and bare
/// `{"message":"Unauthorized","request_id":…}` / `{"detail":…}` from the gateway.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub(crate) struct ErrorParts {
    /// `type`, else `code`: `invalid_model`, `rate_limited`, `invalid_request_error`, …
    pub kind: Option<String>,
    pub message: Option<String>,
}

impl ErrorParts {
    pub(crate) fn read(body: &Value) -> Self {
        let text = |v: &Value| v.as_str().map(str::to_string);
        let message = match body.get("message") {
            Some(Value::String(m)) => Some(m.clone()),
            Some(other @ Value::Object(_)) => detail(&other["detail"]),
            _ => detail(&body["detail"]),
        };
        Self { kind: text(&body["type"]).or_else(|| text(&body["code"])), message }
    }

    pub(crate) fn parse(body: &str) -> Self {
        serde_json::from_str::<Value>(body).map(|v| Self::read(&v)).unwrap_or_default()
    }
}

/// `detail` as text: a string, or each validation error as `loc: msg`.
fn detail(detail: &Value) -> Option<String> {
    match detail {
        Value::String(text) => Some(text.clone()),
        Value::Array(items) if !items.is_empty() => Some(
            items
                .iter()
                .map(|item| {
                    let loc: Vec<String> = item["loc"]
                        .as_array()
                        .map(|l| l.iter().map(|p| p.as_str().map_or_else(|| p.to_string(), str::to_string)).collect())
                        .unwrap_or_default();
                    format!("{}: {}", loc.join("."), item["msg"].as_str().unwrap_or("invalid"))
                })
                .collect::<Vec<_>>()
                .join("; "),
        ),
        _ => None,
    }
}

#[derive(Debug, Deserialize)]
struct OutputLine {
    #[serde(default)]
    custom_id: Option<String>,
    #[serde(default)]
    response: Option<LineResponse>,
    #[serde(default)]
    error: Option<Value>,
}

#[derive(Debug, Deserialize)]
struct LineResponse {
    status_code: u16,
    #[serde(default)]
    body: Value,
}

/// One output or error file line: (custom_id, what it means for the member).
pub(crate) fn parse_line(line: &str) -> Result<(String, LineResult), String> {
    let parsed: OutputLine = serde_json::from_str(line).map_err(|e| format!("unreadable result line: {e}"))?;
    let id = parsed.custom_id.filter(|id| !id.is_empty()).ok_or("a result line without its custom_id")?;
    let result = match (parsed.response, parsed.error) {
        (Some(response), _) if response.status_code == 200 => completion(&response.body)?,
        (Some(response), _) => http_failure(response.status_code, &response.body),
        // A line with an error and no response never ran; what it says is not documented,
        // so it is read as the provider's trouble and the member goes round again (bounded
        // by max_attempts), never as the member's fault.
        (None, Some(error)) if !error.is_null() => {
            let parts = ErrorParts::read(&error);
            let message = parts.message.or_else(|| error.as_str().map(str::to_string));
            LineResult::Retry { reason: format!("error line: {}", message.unwrap_or_else(|| error.to_string())) }
        }
        _ => return Err(format!("line for {id} has neither response nor error")),
    };
    Ok((id, result))
}

/// A completion whose `finish_reason` is Mistral's own: `model_length` (the model's context
/// ran out, so the answer is cut like `length`) and `error` (generation failed: nothing to
/// commit, asked again). The rest is the OpenAI-shaped body the chat reader knows.
fn completion(body: &Value) -> Result<LineResult, String> {
    let request_id = body["id"].as_str().map(str::to_string);
    match body.pointer("/choices/0/finish_reason").and_then(Value::as_str) {
        Some("model_length") => {
            let mut result = chat::parse_batch_completion(body, request_id)?;
            if let LineResult::Answer { usage, .. } = result {
                result = LineResult::Unusable {
                    class: FailureClass::Truncated,
                    reason: "finish_reason \"model_length\": the answer was cut off at the model's context length"
                        .to_string(),
                    usage,
                };
            }
            Ok(result)
        }
        Some("error") => Ok(LineResult::Retry { reason: "finish_reason \"error\": the generation failed".to_string() }),
        _ => chat::parse_batch_completion(body, request_id),
    }
}

fn http_failure(status: u16, body: &Value) -> LineResult {
    let parts = ErrorParts::read(body);
    let message = parts.message.unwrap_or_else(|| "no message".to_string());
    let kind = parts.kind.map(|k| format!(" {k}")).unwrap_or_default();
    let reason = format!("provider answered {status}{kind} for this request: {message}");
    match status {
        408 | 409 | 429 | 500.. | 401 | 403 => LineResult::Retry { reason },
        _ => LineResult::Refused { class: FailureClass::InvalidRequest, reason },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn error_bodies_in_every_published_shape() {
        let flat =
            r#"{"object":"error","message":"Rate limit exceeded","type":"rate_limited","param":null,"code":"1300"}"#;
        let parts = ErrorParts::parse(flat);
        assert_eq!(
            (parts.kind.as_deref(), parts.message.as_deref()),
            (Some("rate_limited"), Some("Rate limit exceeded"))
        );
        let nested = r#"{"object":"error","message":{"detail":[{"type":"extra_forbidden","loc":["body","max_completion_tokens"],"msg":"Extra inputs are not permitted","input":32000}]},"type":"invalid_request_error","param":null,"code":null}"#;
        let parts = ErrorParts::parse(nested);
        assert_eq!(parts.message.as_deref(), Some("body.max_completion_tokens: Extra inputs are not permitted"));
        let gateway = r#"{"message":"Unauthorized","request_id":"c61f"}"#;
        assert_eq!(ErrorParts::parse(gateway).message.as_deref(), Some("Unauthorized"));
        assert_eq!(ErrorParts::parse(r#"{"detail":"Unauthorized"}"#).message.as_deref(), Some("Unauthorized"));
        assert_eq!(ErrorParts::parse("<html>"), ErrorParts::default());
    }

    fn line(finish: &str) -> String {
        format!(
            r#"{{"id":"r1","custom_id":"abc","response":{{"status_code":200,"body":{{"id":"cmpl-1","object":"chat.completion","model":"mistral-small-latest","choices":[{{"index":0,"message":{{"role":"assistant","content":"{{\"findings\":[]}}"}},"finish_reason":"{finish}"}}],"usage":{{"prompt_tokens":30,"completion_tokens":7,"total_tokens":37}}}}}},"error":null}}"#
        )
    }

    #[test]
    fn answers_carry_usage_and_mistral_finish_reasons_are_not_answers() {
        let (id, result) = parse_line(&line("stop")).unwrap();
        assert_eq!(id, "abc");
        let LineResult::Answer { output, usage } = result else { panic!("{result:?}") };
        assert_eq!(output, r#"{"findings":[]}"#);
        let usage = usage.unwrap();
        assert_eq!((usage.input_tokens, usage.output_tokens), (30, 7));
        assert_eq!(usage.request_id.as_deref(), Some("cmpl-1"));
        let (_, cut) = parse_line(&line("model_length")).unwrap();
        assert!(matches!(cut, LineResult::Unusable { class: FailureClass::Truncated, usage: Some(_), .. }), "{cut:?}");
        let (_, cut) = parse_line(&line("length")).unwrap();
        assert!(matches!(cut, LineResult::Unusable { class: FailureClass::Truncated, .. }), "{cut:?}");
        assert!(matches!(parse_line(&line("error")).unwrap().1, LineResult::Retry { .. }));
    }

    #[test]
    fn failed_lines_are_refused_or_retried_by_status() {
        let refused = r#"{"id":"r","custom_id":"a","response":{"status_code":400,"body":{"object":"error","message":"Prompt too long","type":"invalid_request_error","param":null,"code":null}},"error":null}"#;
        let LineResult::Refused { class, reason } = parse_line(refused).unwrap().1 else { panic!() };
        assert_eq!(class, FailureClass::InvalidRequest);
        assert!(reason.contains("Prompt too long") && reason.contains("400"), "{reason}");
        let limited = r#"{"custom_id":"a","response":{"status_code":429,"body":{"object":"error","message":"Rate limit exceeded","type":"rate_limited","param":null,"code":"1300"}}}"#;
        assert!(matches!(parse_line(limited).unwrap().1, LineResult::Retry { .. }));
        let bare = r#"{"custom_id":"a","response":null,"error":{"message":"internal"}}"#;
        assert!(matches!(parse_line(bare).unwrap().1, LineResult::Retry { .. }));
    }

    #[test]
    fn garbage_is_an_error_not_a_panic() {
        assert!(parse_line("{\"custom_id\":").is_err());
        assert!(parse_line(r#"{"custom_id":"a"}"#).is_err());
        assert!(parse_line(r#"{"response":{"status_code":200,"body":{}}}"#).is_err(), "no custom_id");
        assert!(parse_line(r#"{"custom_id":"a","response":{"status_code":200,"body":{}}}"#).is_err());
    }

    #[test]
    fn states_are_mapped_and_unknown_ones_are_not_guessed() {
        assert_eq!(state("CANCELLATION_REQUESTED"), Some(State::Running));
        assert_eq!(state("TIMEOUT_EXCEEDED"), Some(State::TimedOut));
        assert_eq!(state("SUCCESS"), Some(State::Succeeded));
        assert_eq!(state("success"), None);
    }
}
