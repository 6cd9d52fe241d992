//! Anthropic Message Batches wire types (PROVIDERS.md §2), private to this adapter.

use serde::Deserialize;
use serde_json::{Value, json};

use crate::domain::batch::{BatchMember, LineResult, Usage};
use crate::domain::lifecycle::FailureClass;
use crate::domain::schema::Schema;

pub(crate) const API_VERSION: &str = "2023-06-01";
/// A batch holds at most 100,000 requests or 256 MB, whichever comes first (§2.5).
pub(crate) const MAX_REQUESTS: usize = 100_000;
pub(crate) const MAX_BODY_BYTES: usize = 256 * 1000 * 1000;
const MAX_CUSTOM_ID_LEN: usize = 64;

/// `custom_id` must be 1–64 characters; the charset rule is only known from third parties,
/// so we hold ourselves to the stricter `[a-zA-Z0-9_-]` (a hex extraction id always passes).
pub(crate) fn is_valid_custom_id(id: &str) -> bool {
    (1..=MAX_CUSTOM_ID_LEN).contains(&id.len())
        && id.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

/// Tool names are `[a-zA-Z0-9_-]{1,64}`; ours come from schema names like `code-review@1`.
pub(crate) fn tool_name(schema: &str) -> String {
    let name: String =
        schema.chars().map(|c| if c.is_ascii_alphanumeric() || c == '-' { c } else { '_' }).take(64).collect();
    if name.is_empty() { "extract".to_string() } else { name }
}

/// One entry of `requests`: the member's text, answered by a forced call of the one tool
/// whose `input_schema` is the provider schema, so the tool input is the extraction.
pub(crate) fn request(
    member: &BatchMember,
    schema: &Schema,
    input_schema: &Value,
    model: &str,
    max_tokens: u32,
) -> Value {
    let mut params = params(member, schema, input_schema, max_tokens);
    params["model"] = json!(model);
    json!({"custom_id": member.id.to_hex(), "params": params})
}

/// The Messages body without `model`: the part every host of Claude takes as is (Bedrock
/// names the model in the job and wants `anthropic_version` in the body instead). A
/// re-ask continues the conversation with the refused answer as the assistant's text turn
/// (not a `tool_use` block: that would need a `tool_result` answer, and a cut or non-JSON
/// answer is no tool input) and a user turn listing its issues; turns still alternate.
pub(crate) fn params(member: &BatchMember, schema: &Schema, input_schema: &Value, max_tokens: u32) -> Value {
    let tool = tool_name(schema.name());
    let mut params = json!({
        "max_tokens": max_tokens,
        "system": schema.instructions(),
        "messages": [
            // Same user turn as the OpenAI adapter, so both providers see the same prompt.
            {"role": "user", "content": format!("source_id: {}\n\n{}", member.source_id, member.content)},
        ],
        "tools": [{
            "name": tool,
            "description": format!(
                "Record the extraction for `{}`. The input is the whole answer and must satisfy the schema.",
                schema.name()
            ),
            "input_schema": input_schema,
        }],
        "tool_choice": {"type": "tool", "name": tool, "disable_parallel_tool_use": true},
    });
    if let (Some(previous), Some(messages)) = (&member.previous_attempt, params["messages"].as_array_mut()) {
        messages.push(json!({"role": "assistant", "content": previous.output}));
        messages.push(json!({"role": "user", "content": previous.feedback()}));
    }
    params
}

/// A Messages response (as Bedrock returns it in `modelOutput`) read the way a batch's
/// succeeded result is read here.
pub(crate) fn parse_message(message: Value) -> Result<LineResult, String> {
    let message: Message = serde_json::from_value(message).map_err(|e| format!("unreadable message: {e}"))?;
    Ok(answer(message))
}

#[derive(Debug, Deserialize)]
pub(crate) struct MessageBatch {
    pub id: String,
    pub processing_status: String,
    #[serde(default)]
    pub request_counts: RequestCounts,
    #[serde(default)]
    pub created_at: Option<String>,
    #[serde(default)]
    pub cancel_initiated_at: Option<String>,
    #[serde(default)]
    pub results_url: Option<String>,
}

/// Non-processing counts stay 0 until the batch ends; the sum is always the request count.
#[derive(Debug, Default, Deserialize)]
pub(crate) struct RequestCounts {
    #[serde(default)]
    pub processing: u64,
    #[serde(default)]
    pub succeeded: u64,
    #[serde(default)]
    pub errored: u64,
    #[serde(default)]
    pub canceled: u64,
    #[serde(default)]
    pub expired: u64,
}

impl RequestCounts {
    pub(crate) fn total(&self) -> u64 {
        // Saturating: the counts are the provider's numbers, not ours to trust.
        [self.succeeded, self.errored, self.canceled, self.expired]
            .into_iter()
            .fold(self.processing, u64::saturating_add)
    }
}

#[derive(Debug, Deserialize)]
pub(crate) struct BatchPage {
    pub data: Vec<MessageBatch>,
    #[serde(default)]
    pub has_more: bool,
    #[serde(default)]
    pub last_id: Option<String>,
}

/// `{"type":"error","error":{"type":…,"message":…},"request_id":…}` (§2.6).
#[derive(Debug, Deserialize)]
pub(crate) struct ErrorBody {
    pub error: ErrorDetail,
    #[serde(default)]
    pub request_id: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
pub(crate) struct ErrorDetail {
    #[serde(default, rename = "type")]
    pub kind: Option<String>,
    #[serde(default)]
    pub message: Option<String>,
}

impl ErrorDetail {
    /// Anthropic reports an exhausted prepaid balance as a 400 `invalid_request_error`
    /// whose message names the credit balance (observed bodies, anthropics/claude-code
    /// issues); `billing_error` is the documented type. Neither is the request's fault.
    pub(crate) fn is_budget(&self) -> bool {
        let kind = self.kind.as_deref().unwrap_or_default();
        let message = self.message.as_deref().unwrap_or_default().to_ascii_lowercase();
        kind == "billing_error" || (kind == "invalid_request_error" && message.contains("credit balance"))
    }
}

#[derive(Debug, Deserialize)]
struct ResultLineWire {
    custom_id: String,
    result: ResultWire,
}

#[derive(Debug, Deserialize)]
#[serde(tag = "type", rename_all = "lowercase")]
enum ResultWire {
    Succeeded { message: Message },
    Errored { error: ErrorBody },
    Canceled,
    Expired,
}

#[derive(Debug, Deserialize)]
struct Message {
    #[serde(default)]
    id: Option<String>,
    #[serde(default)]
    model: Option<String>,
    #[serde(default)]
    content: Vec<Value>,
    #[serde(default)]
    stop_reason: Option<String>,
    #[serde(default)]
    usage: Option<UsageWire>,
}

#[derive(Debug, Deserialize)]
struct UsageWire {
    #[serde(default)]
    input_tokens: u64,
    #[serde(default)]
    output_tokens: u64,
    #[serde(default)]
    cache_creation_input_tokens: Option<u64>,
    #[serde(default)]
    cache_read_input_tokens: Option<u64>,
}

#[derive(Debug, Deserialize)]
struct IdOnly {
    custom_id: String,
}

/// The custom id of a result line, without interpreting its result.
pub(crate) fn custom_id(line: &str) -> Option<String> {
    serde_json::from_str::<IdOnly>(line).ok().map(|l| l.custom_id)
}

/// Parses one results line into (custom_id, what it means for the member).
pub(crate) fn parse_line(line: &str) -> Result<(String, LineResult), String> {
    let parsed: ResultLineWire = serde_json::from_str(line).map_err(|e| format!("unreadable result line: {e}"))?;
    let result = match parsed.result {
        ResultWire::Succeeded { message } => answer(message),
        ResultWire::Errored { error } => errored(&error),
        ResultWire::Canceled => LineResult::Retry { reason: "the batch was canceled before this request ran".into() },
        ResultWire::Expired => LineResult::Retry { reason: "the batch expired before this request ran".into() },
    };
    Ok((parsed.custom_id, result))
}

/// Longest excerpt of a declining text kept in the failure reason.
const MAX_REFUSAL_CHARS: usize = 200;

/// The tool input is the extraction. The `stop_reason` decides first (Messages API
/// reference `stop_reason`; "Handling stop reasons" guide): `max_tokens` — and
/// `model_context_window_exceeded`, which the guide says to treat the same way — is a
/// truncated answer whose tool input may be cut short, never committed even if it would
/// validate; `refusal` is the model declining. A message without a call of the forced tool
/// declined too. Each is `Unusable`: paid for (its usage is charged), never committed.
fn answer(message: Message) -> LineResult {
    let usage = message.usage.map(|u| {
        let cached = u.cache_read_input_tokens.unwrap_or(0);
        let written = u.cache_creation_input_tokens.unwrap_or(0);
        Usage {
            model: message.model.clone().unwrap_or_default(),
            // Anthropic's `input_tokens` excludes cache reads and writes; ours counts every
            // prompt token, with the cached and cache-written parts also kept apart.
            input_tokens: u.input_tokens.saturating_add(cached).saturating_add(written),
            output_tokens: u.output_tokens,
            cached_input_tokens: cached,
            cache_write_tokens: written,
            // Message results carry no request id; the message id is what support can trace.
            request_id: message.id.clone(),
            ..Usage::default()
        }
    });
    let stop = message.stop_reason.as_deref().unwrap_or("unknown");
    let text: Vec<&str> =
        message.content.iter().filter(|b| b["type"] == "text").filter_map(|b| b["text"].as_str()).collect();
    let said = || {
        let text: String = text.join(" ").chars().take(MAX_REFUSAL_CHARS).collect();
        if text.trim().is_empty() { String::new() } else { format!(": {text}") }
    };
    let unusable = |class, reason| LineResult::Unusable { class, reason, usage: usage.clone() };
    match stop {
        "max_tokens" | "model_context_window_exceeded" => {
            return unusable(
                FailureClass::Truncated,
                format!("stop_reason \"{stop}\": the answer was cut off at its output token budget"),
            );
        }
        "refusal" => {
            return unusable(FailureClass::Refused, format!("stop_reason \"refusal\": the model declined{}", said()));
        }
        _ => {}
    }
    match message.content.iter().find(|b| b["type"] == "tool_use") {
        Some(call) => LineResult::Answer { output: call["input"].to_string(), usage },
        None => unusable(
            FailureClass::Refused,
            format!("the model did not call the forced tool (stop_reason \"{stop}\"){}", said()),
        ),
    }
}

fn errored(body: &ErrorBody) -> LineResult {
    let kind = body.error.kind.as_deref().unwrap_or("unknown");
    let reason = format!("{kind}: {}", body.error.message.as_deref().unwrap_or("no message"));
    match kind {
        _ if body.error.is_budget() => LineResult::Retry { reason },
        "invalid_request_error" | "request_too_large" => {
            LineResult::Refused { class: FailureClass::InvalidRequest, reason }
        }
        // Overload, rate limits, server errors, auth hiccups: the request may run next time.
        _ => LineResult::Retry { reason },
    }
}

/// Milliseconds since the Unix epoch of an RFC 3339 timestamp such as
/// `2024-08-20T18:37:24.100435Z` or `2024-08-20T20:37:24+02:00`.
pub(crate) fn unix_ms(text: &str) -> Option<u64> {
    let b = text.as_bytes();
    let num = |range: std::ops::Range<usize>| num_of(text.get(range)?);
    if b.len() < 20 || b[4] != b'-' || b[7] != b'-' || !matches!(b[10], b'T' | b't' | b' ') || b[13] != b':' {
        return None;
    }
    let (year, month, day) = (num(0..4)?, num(5..7)?, num(8..10)?);
    let (hour, minute, second) = (num(11..13)?, num(14..16)?, num(17..19)?);
    if b[16] != b':' || !(1..=12).contains(&month) || !(1..=31).contains(&day) || hour > 23 || minute > 59 {
        return None;
    }
    let mut rest = &text[19..];
    let mut millis = 0;
    if let Some(fraction) = rest.strip_prefix('.') {
        let digits = fraction.bytes().take_while(u8::is_ascii_digit).count();
        if digits == 0 {
            return None;
        }
        let padded = format!("{:0<3}", &fraction[..digits.min(3)]);
        millis = padded.parse::<i64>().ok()?;
        rest = &fraction[digits..];
    }
    let offset_secs = match rest {
        "Z" | "z" => 0,
        _ if rest.len() == 6 && matches!(rest.as_bytes()[0], b'+' | b'-') && rest.as_bytes()[3] == b':' => {
            let sign = if rest.starts_with('-') { -1 } else { 1 };
            sign * (num_of(rest.get(1..3)?)? * 3600 + num_of(rest.get(4..6)?)? * 60)
        }
        _ => return None,
    };
    let secs = days_from_civil(year, month, day) * 86_400 + hour * 3600 + minute * 60 + second.min(60) - offset_secs;
    u64::try_from(secs * 1000 + millis).ok()
}

fn num_of(text: &str) -> Option<i64> {
    text.bytes().all(|c| c.is_ascii_digit()).then(|| text.parse().ok())?
}

/// Days from 1970-01-01 to a proleptic Gregorian date (March-based era arithmetic).
fn days_from_civil(year: i64, month: i64, day: i64) -> i64 {
    let year = if month <= 2 { year - 1 } else { year };
    let era = year.div_euclid(400);
    let year_of_era = year - era * 400;
    let shifted_month = (month + 9) % 12;
    let day_of_year = (153 * shifted_month + 2) / 5 + day - 1;
    let day_of_era = year_of_era * 365 + year_of_era / 4 - year_of_era / 100 + day_of_year;
    era * 146_097 + day_of_era - 719_468
}

#[cfg(test)]
mod tests {
    use super::*;

    fn succeeded(content: &str, usage: &str) -> String {
        format!(
            r#"{{"custom_id":"abc","result":{{"type":"succeeded","message":{{"id":"msg_1","type":"message","role":"assistant","model":"claude-x","content":{content},"stop_reason":"tool_use","stop_sequence":null,"usage":{usage}}}}}}}"#
        )
    }

    #[test]
    fn a_tool_call_is_the_answer_and_usage_counts_every_prompt_token() {
        let line = succeeded(
            r#"[{"type":"text","text":"Here you go"},{"type":"tool_use","id":"toolu_1","name":"code-review_1","input":{"findings":[]}}]"#,
            r#"{"input_tokens":100,"output_tokens":20,"cache_creation_input_tokens":30,"cache_read_input_tokens":400,"service_tier":"batch"}"#,
        );
        let (id, result) = parse_line(&line).unwrap();
        assert_eq!(id, "abc");
        let LineResult::Answer { output, usage } = result else { panic!("{result:?}") };
        assert_eq!(serde_json::from_str::<Value>(&output).unwrap(), json!({"findings": []}));
        let usage = usage.unwrap();
        assert_eq!(usage.model, "claude-x");
        assert_eq!((usage.input_tokens, usage.output_tokens), (530, 20));
        assert_eq!((usage.cached_input_tokens, usage.cache_write_tokens), (400, 30));
        assert_eq!(usage.request_id.as_deref(), Some("msg_1"));
    }

    #[test]
    fn null_cache_counts_and_missing_tool_calls_are_refusals() {
        let line = succeeded(
            r#"[{"type":"text","text":"I cannot help with that."}]"#,
            r#"{"input_tokens":7,"output_tokens":3,"cache_creation_input_tokens":null,"cache_read_input_tokens":null}"#,
        );
        let LineResult::Unusable { class, reason, usage } = parse_line(&line).unwrap().1 else { panic!() };
        assert_eq!(class, FailureClass::Refused);
        assert!(reason.contains("did not call the forced tool") && reason.contains("I cannot help"), "{reason}");
        assert_eq!(usage.unwrap().input_tokens, 7, "a refusal is still charged");
        let empty = succeeded("[]", r#"{"input_tokens":1,"output_tokens":0}"#);
        let LineResult::Unusable { class, .. } = parse_line(&empty).unwrap().1 else { panic!() };
        assert_eq!(class, FailureClass::Refused);
    }

    fn stopped(content: &str, stop_reason: &str) -> String {
        succeeded(content, r#"{"input_tokens":7,"output_tokens":4096}"#)
            .replace("\"tool_use\",\"stop_sequence\"", &format!("\"{stop_reason}\",\"stop_sequence\""))
    }

    #[test]
    fn max_tokens_is_truncated_even_with_a_tool_call_that_would_validate() {
        let call = r#"[{"type":"tool_use","id":"toolu_1","name":"code-review_1","input":{"findings":[]}}]"#;
        for stop in ["max_tokens", "model_context_window_exceeded"] {
            let LineResult::Unusable { class, usage, .. } = parse_line(&stopped(call, stop)).unwrap().1 else {
                panic!("{stop}")
            };
            assert_eq!(class, FailureClass::Truncated, "{stop}");
            assert_eq!(usage.unwrap().output_tokens, 4096);
        }
        // A refusal mid-way through the tool call: its partial input is no answer either.
        let refusal = stopped(call, "refusal");
        let LineResult::Unusable { class, reason, .. } = parse_line(&refusal).unwrap().1 else { panic!() };
        assert_eq!(class, FailureClass::Refused);
        assert!(reason.contains("stop_reason \"refusal\""), "{reason}");
        assert!(matches!(parse_line(&stopped(call, "tool_use")).unwrap().1, LineResult::Answer { .. }));
    }

    #[test]
    fn errored_canceled_and_expired_lines() {
        let errored = |kind: &str, message: &str| {
            format!(
                r#"{{"custom_id":"a","result":{{"type":"errored","error":{{"type":"error","error":{{"type":"{kind}","message":"{message}"}},"request_id":"req_1"}}}}}}"#
            )
        };
        let refused = parse_line(&errored("invalid_request_error", "bad tool")).unwrap().1;
        assert!(matches!(refused, LineResult::Refused { class: FailureClass::InvalidRequest, .. }));
        for (kind, message) in [
            ("overloaded_error", "Overloaded"),
            ("api_error", "x"),
            ("billing_error", "x"),
            ("invalid_request_error", "Your credit balance is too low to access the Anthropic API."),
        ] {
            assert!(matches!(parse_line(&errored(kind, message)).unwrap().1, LineResult::Retry { .. }), "{kind}");
        }
        for kind in ["canceled", "expired"] {
            let line = format!(r#"{{"custom_id":"a","result":{{"type":"{kind}"}}}}"#);
            assert!(matches!(parse_line(&line).unwrap().1, LineResult::Retry { .. }));
        }
    }

    #[test]
    fn garbage_is_an_error_not_a_panic() {
        assert!(parse_line("{\"custom_id\":").is_err());
        assert!(parse_line("[]").is_err());
        assert!(parse_line(r#"{"custom_id":"a"}"#).is_err());
        assert!(parse_line(r#"{"custom_id":"a","result":{"type":"pending"}}"#).is_err());
        assert!(parse_line(r#"{"custom_id":"a","result":{"type":"succeeded"}}"#).is_err());
        assert_eq!(custom_id(r#"{"custom_id":"a","result":{"type":"pending"}}"#).as_deref(), Some("a"));
        assert_eq!(custom_id("{"), None);
    }

    #[test]
    fn custom_ids_and_tool_names() {
        assert!(is_valid_custom_id(&"ab01".repeat(16)));
        assert!(!is_valid_custom_id(&"a".repeat(65)));
        assert!(!is_valid_custom_id(""));
        assert!(!is_valid_custom_id("a b"));
        assert_eq!(tool_name("code-review@1"), "code-review_1");
        assert_eq!(tool_name(""), "extract");
    }

    #[test]
    fn rfc3339_timestamps() {
        assert_eq!(unix_ms("1970-01-01T00:00:00Z"), Some(0));
        assert_eq!(unix_ms("2024-08-20T18:37:24.100435Z"), Some(1_724_179_044_100));
        assert_eq!(unix_ms("2024-08-20T20:37:24.1+02:00"), Some(1_724_179_044_100));
        assert_eq!(unix_ms("2000-02-29T12:00:00Z"), Some(951_825_600_000));
        for bad in ["", "2024-08-20", "2024-13-20T00:00:00Z", "2024-08-20T18:37:24", "2024-08-20T18:37:24.Z", "x"] {
            assert_eq!(unix_ms(bad), None, "{bad}");
        }
    }
}
