//! The OpenAI chat completions wire format (`POST /chat/completions` with a strict
//! `json_schema` response format; PROVIDERS.md §1.8, §1.12). The generic batch contract
//! carries the same request body in its items, so it builds and reads them here too.

use serde_json::{Value, json};

use crate::domain::batch::{BatchMember, LineResult, Usage};
use crate::domain::lifecycle::FailureClass;
use crate::domain::schema::{Dialect, Schema};

/// The body of one chat completion asking for `member` to be extracted under `schema`.
/// `max_tokens` is the configured default; a member's raised budget wins over it.
pub(crate) fn request_body(member: &BatchMember, schema: &Schema, model: &str, max_tokens: Option<u32>) -> Value {
    let mut body = json!({
        "model": model,
        "messages": [
            {"role": "system", "content": schema.instructions()},
            {"role": "user", "content": format!("source_id: {}\n\n{}", member.source_id, member.content)},
        ],
        "response_format": {
            "type": "json_schema",
            "json_schema": {
                "name": response_format_name(schema.name()),
                "schema": schema.provider_schema(Dialect::OpenAiStrict),
                "strict": true,
            },
        },
    });
    // Local servers often default to a short completion, which truncates the JSON.
    if let Some(max) = member.output_budget.or(max_tokens) {
        body["max_tokens"] = max.into();
    }
    body
}

/// Longest excerpt of a refusal kept in the failure reason.
const MAX_REFUSAL_CHARS: usize = 200;

/// Why a completion's first choice can never be committed, whatever its content says:
/// `finish_reason: "length"` (cut off at the output budget: the content may be cut JSON,
/// or a valid-looking prefix), a `message.refusal`, or `finish_reason: "content_filter"`
/// (the content was withheld). OpenAI API reference, `CreateChatCompletionResponse`
/// `choices[].finish_reason` and `message.refusal`; Structured Outputs guide, "Refusals".
pub(crate) fn unusable(choice: &Value) -> Option<(FailureClass, String)> {
    let refusal = choice["message"]["refusal"].as_str().filter(|r| !r.trim().is_empty());
    if let Some(refusal) = refusal {
        let excerpt: String = refusal.chars().take(MAX_REFUSAL_CHARS).collect();
        return Some((FailureClass::Refused, format!("the model refused: {excerpt}")));
    }
    match choice["finish_reason"].as_str() {
        Some("length") => Some((
            FailureClass::Truncated,
            "finish_reason \"length\": the answer was cut off at its output token budget".to_string(),
        )),
        Some("content_filter") => Some((
            FailureClass::Refused,
            "finish_reason \"content_filter\": the provider's content filter withheld the answer".to_string(),
        )),
        _ => None,
    }
}

/// `json_schema.name` allows `[a-zA-Z0-9_-]{1,64}`; ours look like `code-review@1`.
fn response_format_name(schema: &str) -> String {
    let name: String =
        schema.chars().map(|c| if c.is_ascii_alphanumeric() || c == '-' { c } else { '_' }).take(64).collect();
    if name.is_empty() { "extraction".to_string() } else { name }
}

/// What a successful completion body means for its member. `request_id` overrides the
/// completion's own `id` when the carrier knows a better one (the generic contract's).
/// A truncated or refused answer is `Unusable`: paid for, never committed.
pub(crate) fn parse_completion(body: &Value, request_id: Option<String>) -> Result<LineResult, String> {
    let choice = &body["choices"][0];
    let unusable = unusable(choice);
    let output = match (choice["message"]["content"].as_str(), &unusable) {
        (Some(content), _) => content.to_string(),
        (None, Some(_)) => String::new(),
        (None, None) => return Err("a completion without choices[0].message.content".to_string()),
    };
    let request_id = request_id.or_else(|| body["id"].as_str().map(str::to_string));
    let usage = body.get("usage").filter(|u| u.is_object()).map(|u| Usage {
        model: body["model"].as_str().unwrap_or_default().to_string(),
        input_tokens: u["prompt_tokens"].as_u64().unwrap_or(0),
        output_tokens: u["completion_tokens"].as_u64().unwrap_or(0),
        cached_input_tokens: u["prompt_tokens_details"]["cached_tokens"].as_u64().unwrap_or(0),
        reasoning_tokens: u["completion_tokens_details"]["reasoning_tokens"].as_u64().unwrap_or(0),
        request_id: request_id.clone(),
        ..Usage::default()
    });
    // Without token counts the request id still ties the answer to the provider's logs.
    let usage = usage.or_else(|| {
        request_id.map(|id| Usage {
            model: body["model"].as_str().unwrap_or_default().to_string(),
            request_id: Some(id),
            ..Usage::default()
        })
    });
    Ok(match unusable {
        Some((class, reason)) => LineResult::Unusable { class, reason, usage },
        None => LineResult::Answer { output, usage },
    })
}

/// The message of an OpenAI-style error body (`{"error":{"message",…}}`), or the body itself.
pub(crate) fn error_message(body: &str) -> String {
    let parsed: Option<Value> = serde_json::from_str(body).ok();
    let message = parsed.as_ref().and_then(|v| v["error"]["message"].as_str().or_else(|| v["error"].as_str()));
    match message {
        Some(message) => message.chars().take(300).collect(),
        None => body.chars().take(300).collect(),
    }
}

/// The machine code of an OpenAI-style error body (`code`, else `type`).
pub(crate) fn error_code(body: &str) -> Option<String> {
    let parsed: Value = serde_json::from_str(body).ok()?;
    let error = &parsed["error"];
    error["code"].as_str().or_else(|| error["type"].as_str()).map(str::to_string)
}

/// A member the server will never answer as asked.
pub(crate) fn refused(reason: String) -> LineResult {
    LineResult::Refused { class: FailureClass::InvalidRequest, reason }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn usage_carries_cache_reasoning_and_the_completion_id() {
        let body: Value = serde_json::from_str(
            r#"{"id":"chatcmpl-1","object":"chat.completion","created":1,"model":"qwen2.5",
                "choices":[{"index":0,"message":{"role":"assistant","content":"{\"findings\":[]}"},"finish_reason":"stop","logprobs":null}],
                "usage":{"prompt_tokens":40,"completion_tokens":9,"total_tokens":49,
                         "prompt_tokens_details":{"cached_tokens":32},"completion_tokens_details":{"reasoning_tokens":4}}}"#,
        )
        .unwrap();
        let LineResult::Answer { output, usage } = parse_completion(&body, None).unwrap() else { panic!() };
        assert_eq!(output, r#"{"findings":[]}"#);
        let usage = usage.unwrap();
        assert_eq!(usage.model, "qwen2.5");
        assert_eq!((usage.input_tokens, usage.output_tokens), (40, 9));
        assert_eq!((usage.cached_input_tokens, usage.reasoning_tokens), (32, 4));
        assert_eq!(usage.request_id.as_deref(), Some("chatcmpl-1"));
        let LineResult::Answer { usage, .. } = parse_completion(&body, Some("req-9".into())).unwrap() else { panic!() };
        assert_eq!(usage.unwrap().request_id.as_deref(), Some("req-9"));
    }

    #[test]
    fn refusals_and_truncations_are_unusable_and_empty_messages_are_errors() {
        let refusal = json!({"choices": [{"message": {"content": null, "refusal": "I'm sorry, I cannot help with that."},
            "finish_reason": "stop"}], "usage": {"prompt_tokens": 9, "completion_tokens": 8}});
        let LineResult::Unusable { class, reason, usage } = parse_completion(&refusal, None).unwrap() else { panic!() };
        assert_eq!(class, FailureClass::Refused);
        assert!(reason.contains("I'm sorry"), "{reason}");
        assert_eq!(usage.unwrap().output_tokens, 8, "a refusal is paid for");
        // Cut off at the budget: even content that parses (and might validate) is unusable.
        for content in [r#"{"findings":[]}"#, r#"{"findings":[{"rule":"no-unw"#] {
            let cut = json!({"choices": [{"message": {"content": content, "refusal": null}, "finish_reason": "length"}],
                "usage": {"prompt_tokens": 9, "completion_tokens": 100}});
            let result = parse_completion(&cut, None).unwrap();
            assert!(matches!(result, LineResult::Unusable { class: FailureClass::Truncated, .. }), "{result:?}");
        }
        let filtered = json!({"choices": [{"message": {"content": null}, "finish_reason": "content_filter"}]});
        let result = parse_completion(&filtered, None).unwrap();
        assert!(matches!(result, LineResult::Unusable { class: FailureClass::Refused, .. }), "{result:?}");
        let empty_refusal =
            json!({"choices": [{"message": {"content": "{}", "refusal": ""}, "finish_reason": "stop"}]});
        assert!(matches!(parse_completion(&empty_refusal, None).unwrap(), LineResult::Answer { .. }));
        assert!(parse_completion(&json!({"choices": []}), None).is_err());
        assert!(parse_completion(&json!("text"), None).is_err());
    }

    #[test]
    fn error_bodies_are_read_leniently() {
        let body = r#"{"error":{"message":"model not found","type":"invalid_request_error","param":null,"code":null}}"#;
        assert_eq!(error_message(body), "model not found");
        assert_eq!(error_code(body).as_deref(), Some("invalid_request_error"));
        assert_eq!(error_message(r#"{"error":"Unauthorized"}"#), "Unauthorized");
        assert_eq!(error_message("upstream went away"), "upstream went away");
        assert_eq!(error_code("<html>"), None);
    }

    #[test]
    fn response_format_names_are_sanitised() {
        assert_eq!(response_format_name("code-review@1"), "code-review_1");
        assert_eq!(response_format_name(""), "extraction");
        assert_eq!(response_format_name(&"x".repeat(100)).len(), 64);
    }
}
