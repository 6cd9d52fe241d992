//! Amazon Bedrock batch inference wire shapes (docs/PROVIDERS.md, "Amazon Bedrock"),
//! private to this adapter: the `CreateModelInvocationJob` body, the job as
//! `GetModelInvocationJob` and `ListModelInvocationJobs` describe it, the JSONL records in
//! and out of S3, and the JSON error body.

use serde::Deserialize;
use serde_json::{Value, json};

use crate::domain::batch::{BatchMember, LineResult};
use crate::domain::lifecycle::FailureClass;
use crate::domain::schema::Schema;
use crate::providers::ErrorClass;
use crate::providers::anthropic::wire as anthropic;

/// The `anthropic_version` Claude on Bedrock takes in an `InvokeModel` body.
pub(crate) const ANTHROPIC_VERSION: &str = "bedrock-2023-05-31";

/// `jobName`: `[a-zA-Z0-9]{1,63}(-*[a-zA-Z0-9\+\-\.]){0,63}`, at most 63 characters.
const MAX_JOB_NAME: usize = 63;

/// One input record: our extraction id as `recordId`, the model-native body as `modelInput`.
/// Only the keys Bedrock documents for Claude's body go out: `tool_choice` is `{type, name}`.
/// Bedrock refused `disable_parallel_tool_use` ("extraneous key … is not permitted") for
/// Claude 3.5 Sonnet v2 (anthropic-sdk-python#739); the forced tool gets the answer anyway.
pub(crate) fn record(member: &BatchMember, schema: &Schema, input_schema: &Value, max_tokens: u32) -> Value {
    let mut body = anthropic::params(member, schema, input_schema, max_tokens);
    body["anthropic_version"] = json!(ANTHROPIC_VERSION);
    if let Some(choice) = body.get_mut("tool_choice").and_then(Value::as_object_mut) {
        choice.retain(|key, _| matches!(key.as_str(), "type" | "name"));
    }
    json!({"recordId": member.id.to_hex(), "modelInput": body})
}

pub(crate) struct CreateJob<'a> {
    pub job_name: &'a str,
    pub token: &'a str,
    pub role_arn: &'a str,
    pub model_id: &'a str,
    pub input_uri: &'a str,
    pub output_uri: &'a str,
    pub timeout_hours: Option<u32>,
}

impl CreateJob<'_> {
    pub(crate) fn body(&self) -> Value {
        let mut body = json!({
            "jobName": self.job_name,
            "clientRequestToken": self.token,
            "roleArn": self.role_arn,
            "modelId": self.model_id,
            "inputDataConfig": {"s3InputDataConfig": {"s3Uri": self.input_uri, "s3InputFormat": "JSONL"}},
            "outputDataConfig": {"s3OutputDataConfig": {"s3Uri": self.output_uri}},
        });
        if let Some(hours) = self.timeout_hours {
            body["timeoutDurationInHours"] = json!(hours);
        }
        body
    }
}

/// The job name derived from the batch key, so a job can be found by name after a crash.
pub(crate) fn job_name(batch_key: &str) -> Option<String> {
    let name = format!("commitpoint-{batch_key}");
    let ok = name.len() <= MAX_JOB_NAME
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
        && !name.ends_with('-');
    ok.then_some(name)
}

/// `clientRequestToken`: `[a-zA-Z0-9]{1,256}(-*[a-zA-Z0-9]){0,256}`.
pub(crate) fn is_valid_token(token: &str) -> bool {
    (1..=256).contains(&token.len())
        && token.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
        && token.bytes().next().is_some_and(|b| b.is_ascii_alphanumeric())
        && !token.ends_with('-')
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct Created {
    pub job_arn: String,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct Job {
    pub job_arn: String,
    #[serde(default)]
    pub job_name: Option<String>,
    pub status: String,
    #[serde(default)]
    pub message: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct JobList {
    #[serde(default)]
    pub invocation_job_summaries: Vec<Job>,
    #[serde(default)]
    pub next_token: Option<String>,
}

/// Bedrock's job states, sorted into what we do about them. The two ways a timeout ends a
/// job are told apart as the service model's `ModelInvocationJobStatus` does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum State {
    /// Submitted, Validating, Scheduled, InProgress, and Stopping (not ended yet).
    Running,
    /// Every record was processed; those that errored say so in their lines.
    Completed,
    Failed,
    Stopped,
    /// `PartiallyCompleted`: the timeout came while it ran ("not all of your records could
    /// be processed in time"): what ran is in the output, the rest is missing from it.
    OutOfTime,
    /// `Expired`: scheduled but never begun before its timeout; submit anew.
    NeverStarted,
}

pub(crate) fn state(status: &str) -> Option<State> {
    Some(match status {
        "Submitted" | "Validating" | "Scheduled" | "InProgress" | "Stopping" => State::Running,
        "Completed" => State::Completed,
        "PartiallyCompleted" => State::OutOfTime,
        "Failed" => State::Failed,
        "Stopped" => State::Stopped,
        "Expired" => State::NeverStarted,
        _ => return None,
    })
}

/// The error body of a refused call: `{"message": …}`, the error type in the
/// `x-amzn-ErrorType` header or in `__type` (either may carry a `:`-suffix or a namespace).
#[derive(Debug, Default, Deserialize)]
pub(crate) struct ErrorBody {
    #[serde(default, rename = "__type")]
    pub kind: Option<String>,
    #[serde(default, alias = "Message")]
    pub message: Option<String>,
}

/// `aws.protocols#restJson1` error names: `ns#Name:extra` → `Name`.
pub(crate) fn error_name(raw: &str) -> &str {
    let raw = raw.split(':').next().unwrap_or(raw);
    raw.rsplit('#').next().unwrap_or(raw)
}

/// Bedrock's error classes mapped onto ours. The name decides when it is known; otherwise
/// the status does (see `classify_status`).
pub(crate) fn classify(name: &str) -> Option<ErrorClass> {
    Some(match name {
        "ThrottlingException" | "TooManyRequestsException" => ErrorClass::RateLimited,
        // A quota (jobs in progress, records per job) is not a passing rate limit.
        "ServiceQuotaExceededException" => ErrorClass::Budget,
        "AccessDeniedException"
        | "UnrecognizedClientException"
        | "InvalidSignatureException"
        | "ExpiredTokenException" => ErrorClass::Auth,
        "ResourceNotFoundException" => ErrorClass::Gone,
        "InternalServerException" | "ServiceUnavailableException" => ErrorClass::Transient,
        // A name conflict is a create repeated with a different token: never our retry.
        "ValidationException" | "ConflictException" => ErrorClass::InvalidRequest,
        _ => return None,
    })
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct OutputRecord {
    record_id: String,
    #[serde(default)]
    model_output: Option<Value>,
    #[serde(default)]
    error: Option<RecordError>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct RecordError {
    #[serde(default)]
    error_code: Option<Value>,
    #[serde(default)]
    error_message: Option<String>,
}

/// One line of a `.jsonl.out` file: the record's answer (a Messages response, read as the
/// Anthropic adapter reads one) or its error.
pub(crate) fn parse_line(line: &str) -> Result<(String, LineResult), String> {
    let record: OutputRecord = serde_json::from_str(line).map_err(|e| format!("unreadable output record: {e}"))?;
    let result = match (record.model_output, record.error) {
        (Some(output), None) => anthropic::parse_message(output)?,
        (_, Some(error)) => errored(&error),
        (None, None) => return Err("an output record with neither modelOutput nor error".to_string()),
    };
    Ok((record.record_id, result))
}

fn errored(error: &RecordError) -> LineResult {
    let code = error.error_code.as_ref().and_then(|c| c.as_u64().or_else(|| c.as_str()?.parse().ok()));
    let reason = format!(
        "record error {}: {}",
        code.map_or_else(|| "?".to_string(), |c| c.to_string()),
        error.error_message.as_deref().unwrap_or("no message")
    );
    match code {
        // The record itself is wrong (its body, its size): it will not run next time either.
        Some(400 | 413 | 422) => LineResult::Refused { class: FailureClass::InvalidRequest, reason },
        // Throttling, timeouts, server errors: the request may run in a later job.
        _ => LineResult::Retry { reason },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn states_cover_every_documented_status() {
        let running = ["Submitted", "Validating", "Scheduled", "InProgress", "Stopping"];
        assert!(running.iter().all(|s| state(s) == Some(State::Running)));
        assert_eq!(state("Completed"), Some(State::Completed));
        // The service model: PartiallyCompleted ran out of time while running (some records
        // answered); Expired never began before its timeout (none). Both end the job early.
        assert_eq!(state("PartiallyCompleted"), Some(State::OutOfTime));
        assert_eq!(state("Expired"), Some(State::NeverStarted));
        assert_eq!(state("Stopped"), Some(State::Stopped));
        assert_eq!(state("Failed"), Some(State::Failed));
        assert_eq!(state("Paused"), None);
    }

    /// Bedrock refused `tool_choice.disable_parallel_tool_use` for Claude 3.5 Sonnet v2 with
    /// "extraneous key [disable_parallel_tool_use] is not permitted" (anthropic-sdk-python#739).
    #[test]
    fn records_carry_only_the_keys_bedrock_documents_for_claude() {
        let registry = crate::domain::schema::Registry::builtin();
        let schema = registry.get(crate::domain::schema::BUILTIN_CODE_REVIEW).unwrap();
        let view = schema.view(crate::domain::schema::Dialect::AnthropicTool).unwrap().document.clone();
        let record = record(&crate::providers::probe_member(), &schema, &view, 64);
        let input = record["modelInput"].as_object().unwrap();
        let documented = ["anthropic_version", "max_tokens", "messages", "system", "tools", "tool_choice"];
        assert!(input.keys().all(|k| documented.contains(&k.as_str())), "{input:?}");
        let choice: Vec<&String> = input["tool_choice"].as_object().unwrap().keys().collect();
        assert_eq!(choice, ["name", "type"], "{choice:?}");
    }

    #[test]
    fn error_names_and_classes() {
        assert_eq!(error_name("ThrottlingException:http://internal"), "ThrottlingException");
        assert_eq!(error_name("com.amazon.bedrock#ValidationException"), "ValidationException");
        assert_eq!(classify("ThrottlingException"), Some(ErrorClass::RateLimited));
        assert_eq!(classify("ServiceQuotaExceededException"), Some(ErrorClass::Budget));
        assert_eq!(classify("AccessDeniedException"), Some(ErrorClass::Auth));
        assert_eq!(classify("ValidationException"), Some(ErrorClass::InvalidRequest));
        assert_eq!(classify("SomethingNew"), None);
    }

    #[test]
    fn names_and_tokens_follow_the_documented_patterns() {
        let name = job_name("cpb-0123456789abcdef0123456789abcdef").unwrap();
        assert!(name.len() <= 63, "{name}");
        assert!(job_name("cpb_bad").is_none());
        assert!(is_valid_token("cpb-0123"));
        assert!(!is_valid_token("-x") && !is_valid_token("x-") && !is_valid_token("a_b") && !is_valid_token(""));
    }

    #[test]
    fn output_records_answers_and_errors() {
        let ok = r#"{"recordId":"r1","modelInput":{},"modelOutput":{"id":"m","model":"claude","stop_reason":"tool_use",
            "content":[{"type":"tool_use","name":"t","input":{"findings":[]}}],"usage":{"input_tokens":7,"output_tokens":3}}}"#;
        let (id, result) = parse_line(&ok.replace('\n', " ")).unwrap();
        assert_eq!(id, "r1");
        let LineResult::Answer { output, usage } = result else { panic!("{result:?}") };
        assert_eq!(output, r#"{"findings":[]}"#);
        assert_eq!(usage.map(|u| (u.input_tokens, u.output_tokens)), Some((7, 3)));
        let bad =
            r#"{"recordId":"r2","modelInput":{},"error":{"errorCode":400,"errorMessage":"Malformed input request"}}"#;
        assert!(matches!(parse_line(bad).unwrap().1, LineResult::Refused { .. }));
        let busy = r#"{"recordId":"r3","modelInput":{},"error":{"errorCode":429,"errorMessage":"Too many requests"}}"#;
        assert!(matches!(parse_line(busy).unwrap().1, LineResult::Retry { .. }));
        assert!(parse_line(r#"{"recordId":"r4"}"#).is_err());
        assert!(parse_line("{not json").is_err());
    }
}
