//! What Bedrock refuses, in its words: the `CreateModelInvocationJob` members the service
//! model constrains (botocore `bedrock` service-2.json: `ModelInvocationJobTimeoutDurationInHours`
//! 24–168, `RoleArn`, `S3Uri`), answered as the standard `ValidationException` ("1 validation
//! error detected: Value '…' at '…' failed to satisfy constraint: …"), and the keys a Claude
//! record body may carry ("Malformed input request: … extraneous key [k] is not permitted",
//! as quoted in anthropic-sdk-python#739 and anthropic-sdk-typescript#592).

use std::sync::LazyLock;

use regex::Regex;
use serde_json::Value;

use super::AwsError;

const ROLE_ARN: &str = r"arn:aws(-[^:]+)?:iam::([0-9]{12})?:role/.+";
const S3_URI: &str = r"s3://[a-z0-9][-.a-z0-9]{1,61}(?:/[-!_*'().a-z0-9A-Z]+(?:/[-!_*'().a-z0-9A-Z]+)*)?/?";

static ROLE_ARN_FULL: LazyLock<Option<Regex>> = LazyLock::new(|| Regex::new(&format!("^(?:{ROLE_ARN})$")).ok());
static S3_URI_FULL: LazyLock<Option<Regex>> = LazyLock::new(|| Regex::new(&format!("^(?:{S3_URI})$")).ok());

/// The top-level keys of Claude's `InvokeModel` body on Bedrock (its model parameters page).
const CLAUDE_KEYS: [&str; 11] = [
    "anthropic_version",
    "anthropic_beta",
    "max_tokens",
    "messages",
    "system",
    "temperature",
    "top_p",
    "top_k",
    "tools",
    "tool_choice",
    "stop_sequences",
];
const TOOL_CHOICE_KEYS: [&str; 2] = ["type", "name"];

fn matches(regex: &LazyLock<Option<Regex>>, text: &str) -> bool {
    regex.as_ref().is_some_and(|r| r.is_match(text))
}

/// Every constraint the create's body breaks, reported together as AWS does.
pub(super) fn check(body: &Value) -> Result<(), AwsError> {
    let mut problems = Vec::new();
    let text = |pointer: &str| body.pointer(pointer).and_then(Value::as_str).unwrap_or_default();
    let role = text("/roleArn");
    if !matches(&ROLE_ARN_FULL, role) {
        problems.push(format!(
            "Value '{role}' at 'roleArn' failed to satisfy constraint: Member must satisfy regular expression pattern: {ROLE_ARN}"
        ));
    }
    for (pointer, member) in [
        ("/inputDataConfig/s3InputDataConfig/s3Uri", "inputDataConfig.s3InputDataConfig.s3Uri"),
        ("/outputDataConfig/s3OutputDataConfig/s3Uri", "outputDataConfig.s3OutputDataConfig.s3Uri"),
    ] {
        let uri = text(pointer);
        if uri.len() > 1024 {
            problems.push(format!(
                "Value '{uri}' at '{member}' failed to satisfy constraint: Member must have length less than or equal to 1024"
            ));
        } else if !matches(&S3_URI_FULL, uri) {
            problems.push(format!(
                "Value '{uri}' at '{member}' failed to satisfy constraint: Member must satisfy regular expression pattern: {S3_URI}"
            ));
        }
    }
    if let Some(hours) = body.get("timeoutDurationInHours").and_then(Value::as_i64) {
        let bound = if hours < 24 {
            Some("greater than or equal to 24")
        } else {
            (hours > 168).then_some("less than or equal to 168")
        };
        if let Some(bound) = bound {
            problems.push(format!(
                "Value '{hours}' at 'timeoutDurationInHours' failed to satisfy constraint: Member must have value {bound}"
            ));
        }
    }
    match problems.len() {
        0 => Ok(()),
        1 => Err(AwsError::validation(format!("1 validation error detected: {}", problems[0]))),
        n => Err(AwsError::validation(format!("{n} validation errors detected: {}", problems.join("; ")))),
    }
}

/// A record body key Claude on Bedrock does not take, as the record's 400 error message.
/// `tool_choice.disable_parallel_tool_use` was refused for Claude 3.5 Sonnet v2
/// (anthropic-sdk-python#739) and reported accepted for Claude Opus 4.6 in 2026
/// (vercel/ai#15112): refused here for the Claude 3 generation and earlier.
pub(super) fn extraneous_key(input: &Value, model_id: &str) -> Option<String> {
    let reformat = "is not permitted, please reformat your input and try again.";
    let object = input.as_object()?;
    if let Some(key) = object.keys().find(|k| !CLAUDE_KEYS.contains(&k.as_str())) {
        return Some(format!("Malformed input request: #: extraneous key [{key}] {reformat}"));
    }
    let older = model_id.contains("claude-3") || model_id.contains("claude-v2") || model_id.contains("claude-instant");
    let choice = object.get("tool_choice").and_then(Value::as_object).filter(|_| older)?;
    let key = choice.keys().find(|k| !TOOL_CHOICE_KEYS.contains(&k.as_str()))?;
    Some(format!(
        "Malformed input request: #: subject must not be valid against schema {{\"required\":[\"messages\"]}}#/tool_choice: extraneous key [{key}] {reformat}"
    ))
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn create(role: &str, input: &str, hours: i64) -> Value {
        json!({"roleArn": role, "timeoutDurationInHours": hours,
            "inputDataConfig": {"s3InputDataConfig": {"s3Uri": input}},
            "outputDataConfig": {"s3OutputDataConfig": {"s3Uri": "s3://out-bucket/p/"}}})
    }

    #[test]
    fn create_constraints_in_the_services_words() {
        assert!(check(&create("arn:aws:iam::123456789012:role/r", "s3://in-bucket/p/records.jsonl", 24)).is_ok());
        let refused = check(&create("arn:aws:iam::1:role/r", "s3://in-bucket/a b/x", 200)).unwrap_err();
        assert_eq!(refused.kind, "ValidationException");
        assert!(refused.message.starts_with("3 validation errors detected: "), "{}", refused.message);
        assert!(refused.message.contains("at 'roleArn'") && refused.message.contains("less than or equal to 168"));
        assert!(refused.message.contains("at 'inputDataConfig.s3InputDataConfig.s3Uri'"), "{}", refused.message);
        let short = check(&create("arn:aws:iam::123456789012:role/r", "s3://in-bucket/p/", 1)).unwrap_err();
        assert!(short.message.starts_with("1 validation error detected: Value '1' at 'timeoutDurationInHours'"));
    }

    #[test]
    fn extraneous_keys_by_model_generation() {
        let body = json!({"anthropic_version": "bedrock-2023-05-31", "max_tokens": 5, "messages": [],
            "tool_choice": {"type": "tool", "name": "t", "disable_parallel_tool_use": true}});
        let refused = extraneous_key(&body, "anthropic.claude-3-5-sonnet-20241022-v2:0").unwrap();
        assert!(refused.contains("#/tool_choice: extraneous key [disable_parallel_tool_use] is not permitted"));
        assert_eq!(extraneous_key(&body, "anthropic.claude-opus-4-6-v1"), None);
        let named = json!({"model": "m", "messages": []});
        assert!(extraneous_key(&named, "anthropic.claude-opus-4-6-v1").unwrap().contains("#: extraneous key [model]"));
    }
}
