//! The OpenAI chat completions wire format (`POST /chat/completions` with a strict
//! `json_schema` response format; PROVIDERS.md §1.8, §1.12), shared by every adapter that
//! speaks it: the chat adapter sends it directly, an OpenAI batch line's `body` is one
//! request and its `response.body` one completion, and the generic batch contract carries
//! the same bodies in its items. Reading a completion (refusal, truncation, usage) or an
//! OpenAI-style error body is therefore written once, here.

use serde_json::{Value, json};

use crate::domain::batch::{BatchMember, LineResult, Usage};
use crate::domain::lifecycle::FailureClass;
use crate::domain::schema::{Dialect, Schema};

/// The field that carries the output budget. OpenAI's own API wants
/// `max_completion_tokens` (newer models refuse the deprecated `max_tokens`); local
/// servers and the generic contract read `max_tokens`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum BudgetField {
    MaxTokens,
    MaxCompletionTokens,
}

impl BudgetField {
    fn key(self) -> &'static str {
        match self {
            BudgetField::MaxTokens => "max_tokens",
            BudgetField::MaxCompletionTokens => "max_completion_tokens",
        }
    }
}

/// The body of one chat completion asking for `member` to be extracted under `schema`.
/// `max_tokens` is the configured default; a member's raised budget wins over it. None is
/// sent without either. A re-ask continues the conversation: the refused answer as the
/// assistant's turn, then a user turn listing its issues.
pub(crate) fn request_body(
    member: &BatchMember,
    schema: &Schema,
    model: &str,
    max_tokens: Option<u32>,
    field: BudgetField,
) -> Value {
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
    if let (Some(previous), Some(messages)) = (&member.previous_attempt, body["messages"].as_array_mut()) {
        messages.push(json!({"role": "assistant", "content": previous.output}));
        messages.push(json!({"role": "user", "content": previous.feedback()}));
    }
    // Local servers often default to a short completion, which truncates the JSON.
    if let Some(max) = member.output_budget.or(max_tokens) {
        body[field.key()] = max.into();
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
/// A truncated or refused answer is `Unusable`: paid for, never committed. Without token
/// counts the request id still ties the answer to the provider's logs.
pub(crate) fn parse_completion(body: &Value, request_id: Option<String>) -> Result<LineResult, String> {
    let request_id = request_id.or_else(|| body["id"].as_str().map(str::to_string));
    let usage = match body.get("usage").filter(|u| u.is_object()) {
        Some(counts) => Some(token_usage(body, counts, request_id)),
        None => request_id.map(|id| Usage { model: model(body), request_id: Some(id), ..Usage::default() }),
    };
    with_usage(body, usage)
}

/// The completion in an OpenAI batch output line (`response.body`): the line's own
/// `request_id` names it, and it carries usage only where the body has a `usage` field.
pub(crate) fn parse_batch_completion(body: &Value, request_id: Option<String>) -> Result<LineResult, String> {
    let usage = body.get("usage").map(|counts| token_usage(body, counts, request_id));
    with_usage(body, usage)
}

fn with_usage(body: &Value, usage: Option<Usage>) -> Result<LineResult, String> {
    let choice = &body["choices"][0];
    let unusable = unusable(choice);
    let output = match (choice["message"]["content"].as_str(), &unusable) {
        (Some(content), _) => content.to_string(),
        (None, Some(_)) => String::new(),
        (None, None) => return Err("a completion without choices[0].message.content".to_string()),
    };
    Ok(match unusable {
        Some((class, reason)) => LineResult::Unusable { class, reason, usage },
        None => LineResult::Answer { output, usage },
    })
}

/// A `usage` object's counts; a count it lacks is 0.
fn token_usage(body: &Value, counts: &Value, request_id: Option<String>) -> Usage {
    Usage {
        model: model(body),
        input_tokens: counts["prompt_tokens"].as_u64().unwrap_or(0),
        output_tokens: counts["completion_tokens"].as_u64().unwrap_or(0),
        cached_input_tokens: counts["prompt_tokens_details"]["cached_tokens"].as_u64().unwrap_or(0),
        reasoning_tokens: counts["completion_tokens_details"]["reasoning_tokens"].as_u64().unwrap_or(0),
        request_id,
        ..Usage::default()
    }
}

fn model(body: &Value) -> String {
    body["model"].as_str().unwrap_or_default().to_string()
}

/// What an OpenAI-style error body says: `{"error":{"message","type","code",…}}`, or
/// `{"error":"text"}` as some compatible servers send. Read field by field, so a body
/// with one odd field still gives up the others; anything else reads as empty.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub(crate) struct ErrorParts {
    /// `code`, else `type`: the machine-readable part.
    pub code: Option<String>,
    pub message: Option<String>,
}

impl ErrorParts {
    pub(crate) fn read(body: &Value) -> Self {
        let error = &body["error"];
        let text = |v: &Value| v.as_str().map(str::to_string);
        Self {
            code: text(&error["code"]).or_else(|| text(&error["type"])),
            message: text(&error["message"]).or_else(|| text(error)),
        }
    }

    pub(crate) fn parse(body: &str) -> Self {
        serde_json::from_str::<Value>(body).map(|v| Self::read(&v)).unwrap_or_default()
    }
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
        let parts = ErrorParts::parse(body);
        assert_eq!(parts.message.as_deref(), Some("model not found"));
        assert_eq!(parts.code.as_deref(), Some("invalid_request_error"));
        assert_eq!(ErrorParts::parse(r#"{"error":"Unauthorized"}"#).message.as_deref(), Some("Unauthorized"));
        assert_eq!(ErrorParts::parse("upstream went away"), ErrorParts::default());
        assert_eq!(ErrorParts::parse("<html>").code, None);
        let odd = ErrorParts::parse(r#"{"error":{"message":7,"code":"rate_limit_exceeded"}}"#);
        assert_eq!((odd.code.as_deref(), odd.message), (Some("rate_limit_exceeded"), None));
    }

    #[test]
    fn a_batch_line_names_its_completion_by_the_line_and_reports_usage_only_when_given() {
        let bare = json!({"id": "chatcmpl-1", "model": "m", "choices": [{"message": {"content": "{}"}}]});
        let LineResult::Answer { usage, .. } = parse_batch_completion(&bare, Some("req_1".into())).unwrap() else {
            panic!()
        };
        assert!(usage.is_none(), "no usage field, no charge");
        let LineResult::Answer { usage, .. } = parse_completion(&bare, None).unwrap() else { panic!() };
        assert_eq!(usage.unwrap().request_id.as_deref(), Some("chatcmpl-1"));
        let counted =
            json!({"id": "chatcmpl-1", "choices": [{"message": {"content": "{}"}}], "usage": {"prompt_tokens": 3}});
        let LineResult::Answer { usage, .. } = parse_batch_completion(&counted, None).unwrap() else { panic!() };
        let usage = usage.unwrap();
        assert_eq!((usage.input_tokens, usage.request_id), (3, None), "only the line's request_id names it");
    }

    #[test]
    fn the_budget_goes_in_the_field_the_api_reads() {
        use crate::domain::identity::ExtractionId;
        use crate::domain::schema::{BUILTIN_CODE_REVIEW, Registry};
        let schema = Registry::builtin().get(BUILTIN_CODE_REVIEW).unwrap();
        let member = BatchMember {
            id: ExtractionId([1; 32]),
            source_id: "s".into(),
            content: "c".into(),
            output_budget: None,
            previous_attempt: None,
        };
        let body = request_body(&member, &schema, "m", Some(10), BudgetField::MaxCompletionTokens);
        assert_eq!((body["max_completion_tokens"].as_u64(), body.get("max_tokens")), (Some(10), None));
        let body = request_body(&member, &schema, "m", Some(10), BudgetField::MaxTokens);
        assert_eq!((body["max_tokens"].as_u64(), body.get("max_completion_tokens")), (Some(10), None));
    }

    #[test]
    fn response_format_names_are_sanitised() {
        assert_eq!(response_format_name("code-review@1"), "code-review_1");
        assert_eq!(response_format_name(""), "extraction");
        assert_eq!(response_format_name(&"x".repeat(100)).len(), 64);
    }
}
