//! OpenAI Batch API wire types (PROVIDERS.md §1), private to this adapter.

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use crate::domain::batch::{BatchMember, LineResult};
use crate::domain::lifecycle::FailureClass;
use crate::domain::schema::Schema;
use crate::providers::chat::wire::{self as chat, BudgetField};

pub(crate) const ENDPOINT: &str = "/v1/chat/completions";
pub(crate) const BATCH_KEY_METADATA: &str = "commitpoint_batch_key";

/// One JSONL input line (`BatchRequestInput`) whose body is the chat completion the
/// chat adapter would send, with the budget as `max_completion_tokens`.
pub(crate) fn input_line(
    member: &BatchMember,
    schema: &Schema,
    model: &str,
    max_completion_tokens: Option<u32>,
) -> Value {
    json!({
        "custom_id": member.id.to_hex(),
        "method": "POST",
        "url": ENDPOINT,
        "body": chat::request_body(member, schema, model, max_completion_tokens, BudgetField::MaxCompletionTokens),
    })
}

#[derive(Debug, Serialize)]
pub(crate) struct CreateBatch<'a> {
    pub input_file_id: &'a str,
    pub endpoint: &'a str,
    pub completion_window: &'static str,
    /// Left out for a platform that refused it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub metadata: Option<std::collections::BTreeMap<&'static str, &'a str>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub output_expires_after: Option<ExpiresAfter>,
}

/// `{"anchor": "created_at", "seconds": N}`: when the batch's output files expire.
#[derive(Debug, Serialize)]
pub(crate) struct ExpiresAfter {
    pub anchor: &'static str,
    pub seconds: u64,
}

/// A Unix time in seconds, or an RFC 3339 text (Azure's dated API versions answer
/// `created_at` as `2024-07-19T17:13:57.2491382+00:00`); anything else reads as unknown,
/// which a lookup treats as "not known to be older", never as a failure.
pub(crate) fn unix_time<'de, D: serde::Deserializer<'de>>(deserializer: D) -> Result<Option<u64>, D::Error> {
    Ok(match Option::<Value>::deserialize(deserializer)? {
        Some(Value::Number(n)) => n.as_u64(),
        Some(Value::String(text)) => parse_rfc3339(&text),
        _ => None,
    })
}

fn parse_rfc3339(text: &str) -> Option<u64> {
    let utc = text.strip_suffix("+00:00").map_or_else(|| text.to_string(), |t| format!("{t}Z"));
    // humantime takes at most nine fractional digits, which Azure's seven fit.
    let at = humantime::parse_rfc3339(&utc).ok()?;
    at.duration_since(std::time::UNIX_EPOCH).ok().map(|d| d.as_secs())
}

#[derive(Debug, Deserialize)]
pub(crate) struct FileObject {
    pub id: String,
}

#[derive(Debug, Deserialize)]
pub(crate) struct Batch {
    pub id: String,
    pub status: String,
    #[serde(default)]
    pub input_file_id: Option<String>,
    #[serde(default)]
    pub output_file_id: Option<String>,
    #[serde(default)]
    pub error_file_id: Option<String>,
    #[serde(default, deserialize_with = "unix_time")]
    pub created_at: Option<u64>,
    #[serde(default)]
    pub metadata: Option<std::collections::BTreeMap<String, String>>,
    #[serde(default)]
    pub errors: Option<BatchErrors>,
}

#[derive(Debug, Deserialize)]
pub(crate) struct BatchErrors {
    #[serde(default)]
    pub data: Vec<BatchError>,
}

#[derive(Debug, Deserialize)]
pub(crate) struct BatchError {
    #[serde(default)]
    pub code: Option<String>,
    #[serde(default)]
    pub message: Option<String>,
    /// The input line at fault (1-based), when the error is about one line.
    #[serde(default)]
    pub line: Option<u64>,
}

#[derive(Debug, Deserialize)]
pub(crate) struct BatchList {
    pub data: Vec<Batch>,
    /// Absent where the platform lists every batch at once (Groq's list has no pages).
    #[serde(default)]
    pub has_more: bool,
    #[serde(default)]
    pub last_id: Option<String>,
}

#[derive(Debug, Deserialize)]
struct OutputLine {
    custom_id: String,
    #[serde(default)]
    response: Option<LineResponse>,
    #[serde(default)]
    error: Option<LineError>,
}

#[derive(Debug, Deserialize)]
struct LineResponse {
    status_code: u16,
    #[serde(default)]
    request_id: Option<String>,
    #[serde(default)]
    body: Value,
}

#[derive(Debug, Deserialize)]
struct LineError {
    #[serde(default)]
    code: Option<String>,
    #[serde(default)]
    message: Option<String>,
}

/// Parses one output or error file line into (custom_id, what it means for the member).
pub(crate) fn parse_line(line: &str) -> Result<(String, LineResult), String> {
    let parsed: OutputLine = serde_json::from_str(line).map_err(|e| format!("unreadable result line: {e}"))?;
    let result = match (parsed.response, parsed.error) {
        // Truncated and refused answers are `Unusable`: paid for and charged, never
        // committed, even when their content would pass validation.
        (Some(response), _) if response.status_code == 200 => {
            chat::parse_batch_completion(&response.body, response.request_id)?
        }
        (Some(response), _) => http_failure(response.status_code, &response.body),
        (None, Some(error)) => line_error(&error),
        (None, None) => return Err(format!("line for {} has neither response nor error", parsed.custom_id)),
    };
    Ok((parsed.custom_id, result))
}

fn http_failure(status: u16, body: &Value) -> LineResult {
    let message = chat::ErrorParts::read(body).message.unwrap_or_else(|| "no message".to_string());
    let reason = format!("provider answered {status} for this request: {message}");
    match status {
        408 | 409 | 429 | 500.. => LineResult::Retry { reason },
        401 | 403 => LineResult::Retry { reason },
        _ => LineResult::Refused { class: FailureClass::InvalidRequest, reason },
    }
}

fn line_error(error: &LineError) -> LineResult {
    let code = error.code.as_deref().unwrap_or("unknown");
    let reason = format!("{code}: {}", error.message.as_deref().unwrap_or("no message"));
    match code {
        "batch_expired" | "batch_cancelled" | "request_timeout" => LineResult::Retry { reason },
        _ => LineResult::Refused { class: FailureClass::InvalidRequest, reason },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_a_successful_line_with_usage() {
        let line = r#"{"id":"batch_req_1","custom_id":"abc","response":{"status_code":200,"request_id":"req_1","body":{"model":"gpt-4o-mini","choices":[{"index":0,"message":{"role":"assistant","content":"{\"findings\":[]}"},"finish_reason":"stop"}],"usage":{"prompt_tokens":24,"completion_tokens":15,"total_tokens":39}}},"error":null}"#;
        let (id, result) = parse_line(line).unwrap();
        assert_eq!(id, "abc");
        let LineResult::Answer { output, usage } = result else { panic!("{result:?}") };
        assert_eq!(output, r#"{"findings":[]}"#);
        let usage = usage.unwrap();
        assert_eq!((usage.model.as_str(), usage.input_tokens, usage.output_tokens), ("gpt-4o-mini", 24, 15));
    }

    fn line_with(message: &str, finish_reason: &str) -> String {
        format!(
            r#"{{"id":"r","custom_id":"abc","response":{{"status_code":200,"request_id":"req_1","body":{{"model":"gpt-4o-mini","choices":[{{"index":0,"message":{message},"finish_reason":"{finish_reason}"}}],"usage":{{"prompt_tokens":24,"completion_tokens":512,"total_tokens":536}}}}}},"error":null}}"#
        )
    }

    #[test]
    fn a_length_stop_is_truncated_even_when_the_content_validates() {
        let message = r#"{"role":"assistant","content":"{\"findings\":[]}","refusal":null}"#;
        let (_, result) = parse_line(&line_with(message, "length")).unwrap();
        let LineResult::Unusable { class, usage, .. } = result else { panic!("{result:?}") };
        assert_eq!(class, FailureClass::Truncated);
        assert_eq!(usage.unwrap().output_tokens, 512, "a truncated answer is still charged");
        let (_, result) = parse_line(&line_with(message, "stop")).unwrap();
        assert!(matches!(result, LineResult::Answer { .. }), "{result:?}");
    }

    #[test]
    fn a_refusal_is_refused_not_a_validation_failure() {
        let message = r#"{"role":"assistant","content":null,"refusal":"I'm sorry, I cannot help with that."}"#;
        let (_, result) = parse_line(&line_with(message, "stop")).unwrap();
        let LineResult::Unusable { class, reason, usage } = result else { panic!("{result:?}") };
        assert_eq!(class, FailureClass::Refused);
        assert!(reason.contains("cannot help"), "{reason}");
        assert!(usage.is_some());
    }

    #[test]
    fn the_output_budget_is_the_members_own_else_the_default() {
        use crate::domain::identity::ExtractionId;
        use crate::domain::schema::{BUILTIN_CODE_REVIEW, Registry};
        let schema = Registry::builtin().get(BUILTIN_CODE_REVIEW).unwrap();
        let mut member = BatchMember {
            id: ExtractionId([1; 32]),
            source_id: "s".into(),
            content: "c".into(),
            output_budget: None,
            previous_attempt: None,
        };
        assert!(input_line(&member, &schema, "m", None)["body"].get("max_completion_tokens").is_none());
        assert_eq!(input_line(&member, &schema, "m", Some(1000))["body"]["max_completion_tokens"], 1000);
        member.output_budget = Some(2000);
        assert_eq!(input_line(&member, &schema, "m", Some(1000))["body"]["max_completion_tokens"], 2000);
        assert!(input_line(&member, &schema, "m", None)["body"].get("max_tokens").is_none());
    }

    #[test]
    fn error_lines_map_to_retry_or_refusal() {
        let expired = r#"{"id":"r","custom_id":"a","response":null,"error":{"code":"batch_expired","message":"x"}}"#;
        assert!(matches!(parse_line(expired).unwrap().1, LineResult::Retry { .. }));
        let bad = r#"{"id":"r","custom_id":"a","response":{"status_code":400,"request_id":"q","body":{"error":{"message":"bad","type":"invalid_request_error","param":null,"code":null}}},"error":null}"#;
        assert!(matches!(parse_line(bad).unwrap().1, LineResult::Refused { class: FailureClass::InvalidRequest, .. }));
        let busy =
            r#"{"id":"r","custom_id":"a","response":{"status_code":503,"request_id":"q","body":{}},"error":null}"#;
        assert!(matches!(parse_line(busy).unwrap().1, LineResult::Retry { .. }));
    }

    #[test]
    fn garbage_is_an_error_not_a_panic() {
        assert!(parse_line("{\"custom_id\":").is_err());
        assert!(parse_line("[]").is_err());
        assert!(parse_line(r#"{"custom_id":"a"}"#).is_err());
        assert!(parse_line(r#"{"custom_id":"a","response":{"status_code":200,"body":{}}}"#).is_err());
    }

    #[test]
    fn created_at_reads_as_a_number_or_an_azure_timestamp() {
        let batch = |created: &str| -> Batch {
            serde_json::from_str(&format!(r#"{{"id":"b","status":"Validating","created_at":{created}}}"#)).unwrap()
        };
        assert_eq!(batch("1721409237").created_at, Some(1_721_409_237));
        assert_eq!(batch(r#""2024-07-19T17:13:57.2491382+00:00""#).created_at, Some(1_721_409_237));
        assert_eq!(batch(r#""2024-07-19T17:13:57Z""#).created_at, Some(1_721_409_237));
        assert_eq!(batch(r#""yesterday""#).created_at, None);
        assert_eq!(batch("null").created_at, None);
        let list: BatchList = serde_json::from_str(r#"{"object":"list","data":[]}"#).unwrap();
        assert!(!list.has_more, "a list without has_more is the whole list");
    }
}
