//! What Mistral refuses in a chat completion body before running it. Since its API was
//! made strict, a field the request schema does not have is refused with 422
//! `extra_forbidden` ("Extra inputs are not permitted"), one `detail` per field, where
//! OpenAI-compatible clients most often trip on `max_completion_tokens` and `store`
//! (editor-code-assistant/eca#231, Gitlawb/openclaude#739). The fields are those of
//! `ChatCompletionRequest` in client-python (`docs/models/chatcompletionrequest.md`), and
//! of its `ResponseFormat` and `JSONSchema` (`name`, `description`, `schema`, `strict`).

use serde_json::Value;

use super::error::MistralError;

const REQUEST_FIELDS: [&str; 22] = [
    "model",
    "temperature",
    "top_p",
    "max_tokens",
    "stream",
    "stop",
    "random_seed",
    "metadata",
    "messages",
    "response_format",
    "tools",
    "tool_choice",
    "presence_penalty",
    "frequency_penalty",
    "n",
    "prediction",
    "parallel_tool_calls",
    "reasoning_effort",
    "prompt_mode",
    "guardrails",
    "prompt_cache_key",
    "safe_prompt",
];
const RESPONSE_FORMAT_FIELDS: [&str; 2] = ["type", "json_schema"];
const JSON_SCHEMA_FIELDS: [&str; 4] = ["name", "description", "schema", "strict"];

/// Every field the request schema does not know, with its `loc`, or the missing pieces a
/// request cannot run without. `in_batch`: a batch line's body may leave `model` out.
pub(super) fn check(body: &Value, in_batch: bool) -> Result<(), MistralError> {
    let Some(fields) = body.as_object() else {
        return Err(MistralError::invalid("The request body must be a JSON object."));
    };
    let mut extra = Vec::new();
    let mut unknown = |object: &Value, allowed: &[&str], at: &[&str]| {
        for (key, value) in object.as_object().into_iter().flatten() {
            if !allowed.contains(&key.as_str()) {
                let mut loc: Vec<String> = ["body"].iter().chain(at).map(|s| (*s).to_string()).collect();
                loc.push(key.clone());
                extra.push((loc, value.clone()));
            }
        }
    };
    unknown(body, &REQUEST_FIELDS, &[]);
    if let Some(format) = fields.get("response_format") {
        unknown(format, &RESPONSE_FORMAT_FIELDS, &["response_format"]);
        if let Some(schema) = format.get("json_schema") {
            unknown(schema, &JSON_SCHEMA_FIELDS, &["response_format", "json_schema"]);
        }
    }
    if !extra.is_empty() {
        return Err(MistralError::extra_forbidden(&extra));
    }
    if !in_batch && fields.get("model").and_then(Value::as_str).is_none_or(str::is_empty) {
        return Err(MistralError::invalid("model: field required"));
    }
    if fields.get("messages").and_then(Value::as_array).is_none_or(Vec::is_empty) {
        return Err(MistralError::invalid("messages: field required"));
    }
    if fields.get("max_tokens").is_some_and(|m| m.as_u64().is_none_or(|n| n == 0)) {
        return Err(MistralError::invalid("max_tokens: Input should be greater than or equal to 1"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn openai_only_fields_are_refused_with_their_loc() {
        let body = json!({"model": "m", "messages": [{"role": "user", "content": "x"}],
            "max_completion_tokens": 100, "store": false,
            "response_format": {"type": "json_schema", "json_schema": {"name": "n", "schema": {}, "strict": true}}});
        let refused = check(&body, false).unwrap_err();
        assert_eq!(refused.status.as_u16(), 422);
        let detail = refused.body["message"]["detail"].as_array().unwrap();
        assert_eq!(detail.len(), 2, "{detail:?}");
        assert!(detail.iter().all(|d| d["type"] == "extra_forbidden" && d["loc"][0] == "body"));
        let mut ok = body;
        ok.as_object_mut().unwrap().retain(|k, _| k != "max_completion_tokens" && k != "store");
        assert!(check(&ok, false).is_ok());
        ok["response_format"]["json_schema"]["additionalProperties"] = json!(false);
        let nested = check(&ok, false).unwrap_err();
        assert_eq!(
            nested.body["message"]["detail"][0]["loc"],
            json!(["body", "response_format", "json_schema", "additionalProperties"])
        );
    }

    #[test]
    fn a_batch_line_may_leave_the_model_to_the_job() {
        let body = json!({"messages": [{"role": "user", "content": "x"}], "max_tokens": 5});
        assert!(check(&body, true).is_ok());
        assert!(check(&body, false).is_err());
        assert!(check(&json!({"messages": [], "max_tokens": 5}), true).is_err());
        assert!(check(&json!({"messages": [{"role": "user"}], "max_tokens": 0}), true).is_err());
    }
}
