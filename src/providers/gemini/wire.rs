//! Gemini Batch API wire types (docs/PROVIDERS.md, "Gemini"), private to this adapter:
//! the request each member becomes, the batch `Operation`, result lines and the error
//! body (`google.rpc.Status`).

use std::time::Duration;

use reqwest::header::HeaderMap;
use serde::Deserialize;
use serde_json::{Value, json};

use crate::domain::batch::{BatchMember, LineResult, Usage};
use crate::domain::lifecycle::FailureClass;
use crate::domain::schema::Schema;
use crate::providers::{ErrorClass, ProviderError, classify_status, parse_retry_after, truncate};

/// One `GenerateContentRequest`: the instructions as the system instruction, the member
/// as the user turn (the same text every adapter sends), and the schema's Gemini view as
/// `responseJsonSchema`, which needs `responseMimeType: application/json`.
pub(crate) fn request(
    member: &BatchMember,
    schema: &Schema,
    json_schema: &Value,
    max_output_tokens: Option<u32>,
) -> Value {
    let mut generation = json!({"responseMimeType": "application/json", "responseJsonSchema": json_schema});
    if let Some(max) = max_output_tokens {
        generation["maxOutputTokens"] = json!(max);
    }
    let mut contents = vec![json!({
        "role": "user",
        "parts": [{"text": format!("source_id: {}\n\n{}", member.source_id, member.content)}],
    })];
    // A re-ask: the refused answer as the model's turn, then the issues as the user's.
    if let Some(previous) = &member.previous_attempt {
        contents.push(json!({"role": "model", "parts": [{"text": previous.output}]}));
        contents.push(json!({"role": "user", "parts": [{"text": previous.feedback()}]}));
    }
    json!({
        "systemInstruction": {"parts": [{"text": schema.instructions()}]},
        "contents": contents,
        "generationConfig": generation,
    })
}

/// An entry of `inputConfig.requests.requests`: the key travels in the request metadata.
pub(crate) fn inline_entry(key: &str, request: Value) -> Value {
    json!({"request": request, "metadata": {"key": key}})
}

/// A line of the JSONL input file: the key beside the request.
pub(crate) fn file_line(key: &str, request: Value) -> Value {
    json!({"key": key, "request": request})
}

/// The `batchGenerateContent` body around an input config.
pub(crate) fn create_body(display_name: &str, input_config: Value) -> Value {
    json!({"batch": {"displayName": display_name, "inputConfig": input_config}})
}

/// A long-running operation whose `metadata` is the batch (`GenerateContentBatch`).
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct Operation {
    #[serde(default)]
    pub name: String,
    #[serde(default)]
    pub metadata: Option<Batch>,
    #[serde(default)]
    pub error: Option<Status>,
    /// The REST guide reads the output here once done; the SDK reads `metadata.output`.
    #[serde(default)]
    pub response: Option<Output>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct Batch {
    #[serde(default)]
    pub display_name: Option<String>,
    #[serde(default)]
    pub state: Option<String>,
    #[serde(default)]
    pub output: Option<Output>,
    #[serde(default)]
    pub input_config: Option<InputConfig>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct InputConfig {
    #[serde(default)]
    pub file_name: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct Output {
    #[serde(default)]
    pub responses_file: Option<String>,
    #[serde(default)]
    pub inlined_responses: Option<Inlined>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct Inlined {
    #[serde(default)]
    pub inlined_responses: Vec<Value>,
}

impl Operation {
    pub(crate) fn state(&self) -> &str {
        self.metadata.as_ref().and_then(|b| b.state.as_deref()).unwrap_or("BATCH_STATE_UNSPECIFIED")
    }

    pub(crate) fn display_name(&self) -> Option<&str> {
        self.metadata.as_ref().and_then(|b| b.display_name.as_deref())
    }

    /// The uploaded input file and the responses file, whichever the batch has.
    pub(crate) fn files(&self) -> Vec<String> {
        let input = self.metadata.as_ref().and_then(|b| b.input_config.as_ref()).and_then(|c| c.file_name.clone());
        let output = self.output().and_then(|o| o.responses_file.clone());
        input.into_iter().chain(output).collect()
    }

    pub(crate) fn output(&self) -> Option<&Output> {
        self.metadata.as_ref().and_then(|b| b.output.as_ref()).or(self.response.as_ref())
    }
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct ListPage {
    #[serde(default)]
    pub operations: Vec<Operation>,
    #[serde(default)]
    pub next_page_token: Option<String>,
}

/// `google.rpc.Status`: the error body's `error`, a failed batch's `error`, and a failed
/// request's entry in the results. An HTTP error body names its status (`"status":
/// "RESOURCE_EXHAUSTED"`, with the HTTP code in `code`); a failed request's entry is bare,
/// only the integer gRPC code (`{"code": 3, "message": …}`: python-genai `JobError`).
#[derive(Debug, Clone, Default, Deserialize)]
pub(crate) struct Status {
    #[serde(default)]
    pub code: Option<i64>,
    #[serde(default)]
    pub message: Option<String>,
    #[serde(default)]
    pub status: Option<String>,
    #[serde(default)]
    pub details: Vec<Value>,
}

/// The canonical gRPC code names (google.rpc.Code), by number.
const GRPC_CODES: [&str; 17] = [
    "OK",
    "CANCELLED",
    "UNKNOWN",
    "INVALID_ARGUMENT",
    "DEADLINE_EXCEEDED",
    "NOT_FOUND",
    "ALREADY_EXISTS",
    "PERMISSION_DENIED",
    "RESOURCE_EXHAUSTED",
    "FAILED_PRECONDITION",
    "ABORTED",
    "OUT_OF_RANGE",
    "UNIMPLEMENTED",
    "INTERNAL",
    "UNAVAILABLE",
    "DATA_LOSS",
    "UNAUTHENTICATED",
];

#[derive(Debug, Deserialize)]
pub(crate) struct ErrorBody {
    pub error: Status,
}

/// Where a batch stands, by its state name. The API enum is `BATCH_STATE_*`; the batch
/// guide and the SDKs say `JOB_STATE_*` for the same states, so both are read.
pub(crate) enum State {
    Running,
    Succeeded,
    Failed,
    Cancelled,
    Expired,
}

pub(crate) fn state(name: &str) -> Option<State> {
    let short = name.strip_prefix("BATCH_STATE_").or_else(|| name.strip_prefix("JOB_STATE_"))?;
    Some(match short {
        "UNSPECIFIED" | "PENDING" | "RUNNING" | "QUEUED" => State::Running,
        "SUCCEEDED" => State::Succeeded,
        "FAILED" => State::Failed,
        "CANCELLED" => State::Cancelled,
        "EXPIRED" => State::Expired,
        _ => return None,
    })
}

impl Status {
    /// Its status name: the one it gives, else the gRPC name of a bare per-request code.
    pub(crate) fn name(&self) -> Option<&str> {
        self.status.as_deref().or_else(|| {
            let code = usize::try_from(self.code?).ok()?;
            GRPC_CODES.get(code).copied()
        })
    }

    pub(crate) fn describe(&self) -> String {
        let name = self.name().unwrap_or("UNKNOWN");
        format!("{name}: {}", self.message.as_deref().unwrap_or("no message"))
    }

    fn detail(&self, type_suffix: &str) -> impl Iterator<Item = &Value> {
        self.details.iter().filter(move |d| d["@type"].as_str().is_some_and(|t| t.ends_with(type_suffix)))
    }

    /// `google.rpc.RetryInfo.retryDelay`, a protobuf Duration in JSON ("30s", "1.5s").
    pub(crate) fn retry_delay(&self) -> Option<Duration> {
        let text = self.detail("google.rpc.RetryInfo").find_map(|d| d["retryDelay"].as_str())?;
        let secs: f64 = text.trim().strip_suffix('s')?.parse().ok()?;
        Duration::try_from_secs_f64(secs).ok()
    }

    /// A bad key is answered 400 `INVALID_ARGUMENT` with `ErrorInfo.reason` `API_KEY_INVALID`.
    pub(crate) fn is_bad_key(&self) -> bool {
        self.detail("google.rpc.ErrorInfo").any(|d| d["reason"] == "API_KEY_INVALID")
    }

    /// A per-day quota (`QuotaFailure` naming a `...PerDay...` quota) does not come back
    /// within any wait worth making: it is spent budget, not a rate limit.
    pub(crate) fn is_daily_quota(&self) -> bool {
        self.detail("google.rpc.QuotaFailure")
            .any(|d| d["violations"].as_array().is_some_and(|v| v.iter().any(|v| quota_id(v).contains("PerDay"))))
    }
}

/// How an HTTP error answer from a Google API (Gemini, Vertex AI) sorts into our classes.
/// Google's canonical codes first (AIP-193 `google.rpc.Code` as the `status` string), the
/// HTTP status for the rest. A bad key is a 400 at Gemini, and a location or billing
/// precondition is nothing a retry fixes: both stop calls until an operator acts.
pub(crate) fn classify(status: u16, headers: &HeaderMap, parsed: Option<&Status>) -> ErrorClass {
    let code = parsed.and_then(|s| s.status.as_deref()).unwrap_or_default();
    match (status, code) {
        _ if parsed.is_some_and(Status::is_bad_key) => ErrorClass::Auth,
        (_, "UNAUTHENTICATED" | "PERMISSION_DENIED") => ErrorClass::Auth,
        (400, "FAILED_PRECONDITION") => ErrorClass::Auth,
        // A per-day quota is spent budget, unless the answer says when to come back: the real
        // service sends `RetryInfo` of seconds with per-day violations too, and that wait
        // is honoured (a 15-minute pause would only idle for nothing).
        (429, _) if parsed.is_some_and(|s| s.is_daily_quota() && s.retry_delay().is_none()) => ErrorClass::Budget,
        _ => classify_status(status, headers, None),
    }
}

/// A Google API's non-2xx answer as our error: the class from its `google.rpc.Status`
/// (else the HTTP status), its words, and the delay it asked for (`RetryInfo`, else
/// `Retry-After`). `what` prefixes the message (the call, for a storage refusal); `hint`
/// ends it (what the adapter knows an operator can do about it).
pub(crate) fn refusal(
    provider: &'static str,
    status: u16,
    headers: &HeaderMap,
    body: &str,
    what: &str,
    hint: &str,
) -> ProviderError {
    let parsed = serde_json::from_str::<ErrorBody>(body).ok().map(|b| b.error);
    let class = classify(status, headers, parsed.as_ref());
    let message = parsed.as_ref().map_or_else(|| truncate(body), Status::describe);
    let mut failure = ProviderError::new(provider, class, Some(status), &format!("{what}{status} {message}{hint}"));
    failure.retry_after = parsed
        .as_ref()
        .and_then(Status::retry_delay)
        .or_else(|| parse_retry_after(headers, crate::domain::clock::now()));
    failure
}

fn quota_id(violation: &Value) -> &str {
    violation["quotaId"].as_str().or_else(|| violation["subject"].as_str()).unwrap_or_default()
}

/// A result whose key may be missing (see `keyless`).
pub(crate) type Row = (Option<String>, LineResult);

/// A line of the responses file: `{"key", "response"}` or `{"key", "error"}`.
pub(crate) fn file_row(line: &str) -> Result<Row, String> {
    let value: Value = serde_json::from_str(line).map_err(|e| format!("unreadable result line: {e}"))?;
    Ok((value["key"].as_str().map(str::to_string), result_of(&value)?))
}

/// An entry of `inlinedResponses`: `{"response"|"error", "metadata": {"key"}}`.
pub(crate) fn inline_row(entry: &Value) -> Result<Row, String> {
    Ok((entry["metadata"]["key"].as_str().map(str::to_string), result_of(entry)?))
}

#[cfg(test)]
fn keyed(row: Result<Row, String>) -> Result<(String, LineResult), String> {
    let (key, result) = row?;
    Ok((key.ok_or("a result without its key")?, result))
}

#[cfg(test)]
fn parse_file_line(line: &str) -> Result<(String, LineResult), String> {
    keyed(file_row(line))
}

#[cfg(test)]
fn parse_inline(entry: &Value) -> Result<(String, LineResult), String> {
    keyed(inline_row(entry))
}

fn result_of(value: &Value) -> Result<LineResult, String> {
    if let Some(error) = value.get("error").filter(|e| e.is_object()) {
        let status: Status = serde_json::from_value(error.clone()).map_err(|e| format!("unreadable error: {e}"))?;
        return Ok(errored(&status));
    }
    match value.get("response") {
        Some(response) if response.is_object() => Ok(answer(response)),
        _ => Err("a result with neither response nor error".to_string()),
    }
}

/// Longest excerpt of a declining text kept in the failure reason.
const MAX_REFUSAL_CHARS: usize = 200;

/// `finishReason` decides first (API reference `FinishReason`): `MAX_TOKENS` is a cut-off
/// answer, never committed even if it would validate; the safety, recitation, blocklist
/// and similar reasons are the model declining. A prompt blocked before any candidate
/// (`promptFeedback.blockReason`) declined too. Each is `Unusable`: billed, never committed.
pub(crate) fn answer(response: &Value) -> LineResult {
    let usage = usage(response);
    let candidate = &response["candidates"][0];
    let unusable = |class, reason| LineResult::Unusable { class, reason, usage: usage.clone() };
    if candidate.is_null() {
        let blocked = response["promptFeedback"]["blockReason"].as_str().unwrap_or("no candidates");
        return unusable(FailureClass::Refused, format!("the prompt was blocked ({blocked})"));
    }
    let text: String = candidate["content"]["parts"]
        .as_array()
        .map(|parts| parts.iter().filter(|p| p["thought"] != true).filter_map(|p| p["text"].as_str()).collect())
        .unwrap_or_default();
    match candidate["finishReason"].as_str().unwrap_or_default() {
        "STOP" => {}
        // No reason (or the unspecified one) means the model has not stopped: what text there
        // is may be cut anywhere, so it is billed, never committed, and sent again as a cut-off
        // answer is.
        "" | "FINISH_REASON_UNSPECIFIED" => {
            return unusable(FailureClass::Truncated, "no finishReason: the model had not finished".to_string());
        }
        "MAX_TOKENS" => {
            return unusable(
                FailureClass::Truncated,
                "finishReason MAX_TOKENS: the answer was cut off at its output token budget".to_string(),
            );
        }
        other => {
            let said: String = text.chars().take(MAX_REFUSAL_CHARS).collect();
            let said = if said.trim().is_empty() { String::new() } else { format!(": {said}") };
            return unusable(FailureClass::Refused, format!("finishReason {other}: the model declined{said}"));
        }
    }
    if text.trim().is_empty() {
        return unusable(FailureClass::Refused, "the model answered with no text".to_string());
    }
    LineResult::Answer { output: text.trim().to_string(), usage }
}

/// `usageMetadata`: `promptTokenCount` includes the cached part; thinking is billed as
/// output (`thoughtsTokenCount` beside `candidatesTokenCount`).
fn usage(response: &Value) -> Option<Usage> {
    let meta = response.get("usageMetadata")?;
    let count = |name: &str| meta[name].as_u64().unwrap_or(0);
    let thoughts = count("thoughtsTokenCount");
    Some(Usage {
        model: response["modelVersion"].as_str().unwrap_or_default().to_string(),
        input_tokens: count("promptTokenCount").saturating_add(count("toolUsePromptTokenCount")),
        output_tokens: count("candidatesTokenCount").saturating_add(thoughts),
        cached_input_tokens: count("cachedContentTokenCount"),
        reasoning_tokens: thoughts,
        request_id: response["responseId"].as_str().map(str::to_string),
        ..Usage::default()
    })
}

/// A request the batch could not run: its own fault for `INVALID_ARGUMENT` and the like,
/// the account's for a denied permission (neither helped by sending it again); otherwise
/// (quota, overload, internal, an unknown code) it may run next time.
pub(crate) fn errored(status: &Status) -> LineResult {
    let reason = status.describe();
    match status.name().unwrap_or_default() {
        "INVALID_ARGUMENT" | "FAILED_PRECONDITION" | "OUT_OF_RANGE" | "NOT_FOUND" | "UNIMPLEMENTED" => {
            LineResult::Refused { class: FailureClass::InvalidRequest, reason }
        }
        "PERMISSION_DENIED" | "UNAUTHENTICATED" => LineResult::Refused { class: FailureClass::Auth, reason },
        _ => LineResult::Retry { reason },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn line(candidate: &str) -> String {
        format!(
            r#"{{"key":"k1","response":{{"candidates":[{candidate}],"usageMetadata":{{"promptTokenCount":120,"candidatesTokenCount":30,"cachedContentTokenCount":100,"thoughtsTokenCount":7,"totalTokenCount":157}},"modelVersion":"gemini-x","responseId":"resp_1"}}}}"#
        )
    }

    #[test]
    fn an_answer_joins_its_text_and_counts_thoughts_as_output() {
        let (key, result) = parse_file_line(&line(
            r#"{"content":{"role":"model","parts":[{"text":"thinking","thought":true},{"text":"{\"findings\":"},{"text":"[]}"}]},"finishReason":"STOP"}"#,
        ))
        .unwrap();
        assert_eq!(key, "k1");
        let LineResult::Answer { output, usage } = result else { panic!("{result:?}") };
        assert_eq!(output, r#"{"findings":[]}"#);
        let usage = usage.unwrap();
        assert_eq!((usage.input_tokens, usage.output_tokens, usage.cached_input_tokens), (120, 37, 100));
        assert_eq!((usage.reasoning_tokens, usage.model.as_str()), (7, "gemini-x"));
        assert_eq!(usage.request_id.as_deref(), Some("resp_1"));
    }

    #[test]
    fn finish_reasons_and_blocked_prompts_are_unusable_but_billed() {
        let cut = line(r#"{"content":{"parts":[{"text":"{\"findings\":[]}"}]},"finishReason":"MAX_TOKENS"}"#);
        let LineResult::Unusable { class, usage, .. } = parse_file_line(&cut).unwrap().1 else { panic!() };
        assert_eq!(class, FailureClass::Truncated);
        assert_eq!(usage.unwrap().output_tokens, 37);
        for unfinished in [
            r#"{"content":{"parts":[{"text":"{\"findings\":[]}"}]}}"#,
            r#"{"content":{"parts":[{"text":"{\"findings\":[]}"}]},"finishReason":"FINISH_REASON_UNSPECIFIED"}"#,
        ] {
            let LineResult::Unusable { class, reason, usage } = parse_file_line(&line(unfinished)).unwrap().1 else {
                panic!("{unfinished}")
            };
            assert_eq!(class, FailureClass::Truncated, "never complete: {unfinished}");
            assert!(reason.contains("no finishReason") && usage.is_some(), "{reason}");
        }
        let safety = line(r#"{"content":{"parts":[{"text":"no"}]},"finishReason":"SAFETY"}"#);
        let LineResult::Unusable { class, reason, .. } = parse_file_line(&safety).unwrap().1 else { panic!() };
        assert_eq!(class, FailureClass::Refused);
        assert!(reason.contains("SAFETY"), "{reason}");
        let blocked = r#"{"key":"k","response":{"promptFeedback":{"blockReason":"PROHIBITED_CONTENT"},"usageMetadata":{"promptTokenCount":9}}}"#;
        let LineResult::Unusable { reason, usage, .. } = parse_file_line(blocked).unwrap().1 else { panic!() };
        assert!(reason.contains("PROHIBITED_CONTENT"));
        assert_eq!(usage.unwrap().input_tokens, 9);
    }

    #[test]
    fn error_entries_inline_and_in_files() {
        let invalid = json!({"error": {"code": 400, "message": "bad schema", "status": "INVALID_ARGUMENT"},
            "metadata": {"key": "a"}});
        let (key, result) = parse_inline(&invalid).unwrap();
        assert_eq!(key, "a");
        assert!(matches!(result, LineResult::Refused { class: FailureClass::InvalidRequest, .. }));
        let busy = r#"{"key":"b","error":{"code":429,"message":"later","status":"RESOURCE_EXHAUSTED"}}"#;
        assert!(matches!(parse_file_line(busy).unwrap().1, LineResult::Retry { .. }));
        for bad in ["{", "[]", r#"{"response":{}}"#, r#"{"key":"a"}"#, r#"{"key":"a","response":"x"}"#] {
            assert!(parse_file_line(bad).is_err(), "{bad}");
        }
        assert!(parse_inline(&json!({"response": {}})).is_err(), "no key, no join");
    }

    /// The real per-request shape: a bare integer gRPC code, no status name.
    #[test]
    fn bare_grpc_codes_are_classified_by_their_names() {
        let class = |code: i64| {
            let line = format!(r#"{{"key":"k","error":{{"code":{code},"message":"m"}}}}"#);
            match parse_file_line(&line).unwrap().1 {
                LineResult::Refused { class, reason } => Some((class, reason)),
                LineResult::Retry { .. } => None,
                other => panic!("{other:?}"),
            }
        };
        let (invalid, reason) = class(3).expect("refused");
        assert_eq!(invalid, FailureClass::InvalidRequest);
        assert_eq!(reason, "INVALID_ARGUMENT: m");
        assert_eq!(class(9).map(|c| c.0), Some(FailureClass::InvalidRequest), "FAILED_PRECONDITION");
        assert_eq!(class(7).map(|c| c.0), Some(FailureClass::Auth), "PERMISSION_DENIED");
        for retryable in [4, 8, 13, 14, 2, 99, -1] {
            assert_eq!(class(retryable), None, "code {retryable} may run next time");
        }
        let named = Status { code: Some(429), status: Some("RESOURCE_EXHAUSTED".into()), ..Status::default() };
        assert_eq!(named.name(), Some("RESOURCE_EXHAUSTED"), "an HTTP body's code is HTTP's, its name wins");
    }

    #[test]
    fn status_details_give_retry_delays_bad_keys_and_daily_quotas() {
        let status: Status = serde_json::from_value(json!({"code": 429, "status": "RESOURCE_EXHAUSTED",
            "details": [
                {"@type": "type.googleapis.com/google.rpc.QuotaFailure",
                 "violations": [{"quotaId": "GenerateRequestsPerMinutePerProjectPerModel"}]},
                {"@type": "type.googleapis.com/google.rpc.RetryInfo", "retryDelay": "1.5s"}]}))
        .unwrap();
        assert_eq!(status.retry_delay(), Some(Duration::from_millis(1500)));
        assert!(!status.is_daily_quota() && !status.is_bad_key());
        let daily: Status = serde_json::from_value(json!({"details": [
            {"@type": "type.googleapis.com/google.rpc.QuotaFailure",
             "violations": [{"quotaId": "GenerateRequestsPerDayPerProjectPerModel-FreeTier"}]}]}))
        .unwrap();
        assert!(daily.is_daily_quota());
        let key: Status = serde_json::from_value(json!({"details": [
            {"@type": "type.googleapis.com/google.rpc.ErrorInfo", "reason": "API_KEY_INVALID"}]}))
        .unwrap();
        assert!(key.is_bad_key());
        assert_eq!(Status::default().retry_delay(), None);
    }

    #[test]
    fn both_spellings_of_the_states() {
        for (name, running) in
            [("BATCH_STATE_PENDING", true), ("JOB_STATE_RUNNING", true), ("BATCH_STATE_EXPIRED", false)]
        {
            assert_eq!(matches!(state(name), Some(State::Running)), running, "{name}");
        }
        assert!(matches!(state("JOB_STATE_SUCCEEDED"), Some(State::Succeeded)));
        assert!(state("BATCH_STATE_PAUSED").is_none() && state("done").is_none());
    }

    fn google_status(body: Value) -> Status {
        serde_json::from_value(body).unwrap()
    }

    #[test]
    fn google_codes_sort_into_our_classes() {
        let none = HeaderMap::new();
        let bad_key = google_status(json!({"code": 400, "status": "INVALID_ARGUMENT",
            "details": [{"@type": "type.googleapis.com/google.rpc.ErrorInfo", "reason": "API_KEY_INVALID"}]}));
        assert_eq!(classify(400, &none, Some(&bad_key)), ErrorClass::Auth);
        let invalid = google_status(json!({"code": 400, "status": "INVALID_ARGUMENT"}));
        assert_eq!(classify(400, &none, Some(&invalid)), ErrorClass::InvalidRequest);
        let location = google_status(json!({"code": 400, "status": "FAILED_PRECONDITION"}));
        assert_eq!(classify(400, &none, Some(&location)), ErrorClass::Auth);
        let busy = google_status(json!({"code": 429, "status": "RESOURCE_EXHAUSTED"}));
        assert_eq!(classify(429, &none, Some(&busy)), ErrorClass::RateLimited);
        let daily = google_status(json!({"code": 429, "status": "RESOURCE_EXHAUSTED", "details": [
            {"@type": "type.googleapis.com/google.rpc.QuotaFailure",
             "violations": [{"quotaId": "GenerateRequestsPerDayPerProjectPerModel"}]}]}));
        assert_eq!(classify(429, &none, Some(&daily)), ErrorClass::Budget);
        let daily_but_soon = google_status(json!({"code": 429, "status": "RESOURCE_EXHAUSTED", "details": [
            {"@type": "type.googleapis.com/google.rpc.QuotaFailure",
             "violations": [{"quotaId": "GenerateRequestsPerDayPerProjectPerModel-FreeTier"}]},
            {"@type": "type.googleapis.com/google.rpc.RetryInfo", "retryDelay": "36s"}]}));
        assert_eq!(classify(429, &none, Some(&daily_but_soon)), ErrorClass::RateLimited);
        assert_eq!(classify(403, &none, None), ErrorClass::Auth);
        assert_eq!(classify(404, &none, None), ErrorClass::Gone);
        assert_eq!(classify(503, &none, None), ErrorClass::Transient);
    }
}
