//! The generic REST batch contract on the wire (PROVIDERS.md §4): the `{ok, data, error,
//! metadata}` envelope, canonical JSON request bodies, the error-code table, and result
//! items. Field names the contract leaves unconfirmed come from [`GenericFields`].

use reqwest::header::HeaderMap;
use serde::Deserialize;
use serde_json::{Value, json};

use super::GenericFields;
use crate::domain::batch::{BatchMember, LineResult, Usage};
use crate::domain::lifecycle::FailureClass;
use crate::domain::schema::Schema;
use crate::providers::chat::wire as chat;
use crate::providers::{ErrorClass, FailureCause, JobPhase, ResultLine, classify_status};

pub(crate) const BATCH_KEY_METADATA: &str = "commitpoint_batch_key";

/// The envelope around every response.
#[derive(Debug, Deserialize)]
pub(crate) struct Envelope {
    pub ok: bool,
    #[serde(default)]
    pub data: Value,
    #[serde(default)]
    pub error: Option<ErrorObject>,
    #[serde(default)]
    pub metadata: Option<Metadata>,
}

/// `error`: `code` and `message` are relied on by every client seen; `hint` and
/// `retryable` are UNCONFIRMED and read when present.
#[derive(Debug, Default, Deserialize)]
pub(crate) struct ErrorObject {
    #[serde(default)]
    pub code: Option<String>,
    #[serde(default)]
    pub message: Option<String>,
    #[serde(default)]
    pub hint: Option<String>,
    #[serde(default)]
    pub retryable: Option<bool>,
}

impl ErrorObject {
    /// An `error` value wherever it sits (an item, a failed batch's status): the object,
    /// or a bare string as its message; anything else is an error that says nothing.
    pub(crate) fn read(error: &Value) -> Self {
        serde_json::from_value(error.clone())
            .unwrap_or_else(|_| ErrorObject { message: error.as_str().map(str::to_string), ..ErrorObject::default() })
    }

    pub(crate) fn describe(&self) -> String {
        let mut text =
            format!("{}: {}", self.code.as_deref().unwrap_or("error"), self.message.as_deref().unwrap_or("no message"));
        if let Some(hint) = &self.hint {
            text.push_str(&format!(" (hint: {hint})"));
        }
        text
    }
}

#[derive(Debug, Default, Deserialize)]
pub(crate) struct Metadata {
    #[serde(default)]
    pub cost_usd: Option<f64>,
    #[serde(default)]
    pub request_id: Option<String>,
}

/// The submit body: every batch item is an OpenAI-compatible chat completion body under
/// `capability`, tagged with our custom id so results join on it.
pub(crate) fn submit_body(
    batch_key: &str,
    members: &[BatchMember],
    schema: &Schema,
    config: &super::GenericConfig,
) -> Value {
    let requests: Vec<Value> = members
        .iter()
        .map(|member| {
            let mut item = json!({
                "capability": config.capability,
                "body": chat::request_body(member, schema, &config.model, config.max_tokens, chat::BudgetField::MaxTokens),
            });
            item[config.fields.item_id.as_str()] = member.id.to_hex().into();
            item
        })
        .collect();
    json!({
        "requests": requests,
        "batch_timeout": config.batch_timeout,
        "metadata": {BATCH_KEY_METADATA: batch_key},
        "idempotency_key": batch_key,
    })
}

/// The contract's canonical JSON: object keys sorted, no insignificant whitespace,
/// UTF-8, one trailing newline. Sorted here rather than trusting the map's order, which
/// a serde_json feature elsewhere in the build could change.
pub(crate) fn canonical(value: &Value) -> Vec<u8> {
    let mut out = Vec::with_capacity(1024);
    write_canonical(value, &mut out);
    out.push(b'\n');
    out
}

fn write_canonical(value: &Value, out: &mut Vec<u8>) {
    match value {
        Value::Object(map) => {
            let mut entries: Vec<_> = map.iter().collect();
            entries.sort_by(|a, b| a.0.cmp(b.0));
            out.push(b'{');
            for (i, (key, value)) in entries.into_iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                write_scalar(&Value::String(key.clone()), out);
                out.push(b':');
                write_canonical(value, out);
            }
            out.push(b'}');
        }
        Value::Array(items) => {
            out.push(b'[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                write_canonical(item, out);
            }
            out.push(b']');
        }
        scalar => write_scalar(scalar, out),
    }
}

fn write_scalar(value: &Value, out: &mut Vec<u8>) {
    // Serialising a string, number, bool or null into a Vec cannot fail.
    let _ = serde_json::to_writer(&mut *out, value);
}

/// Sorts a failure into a class, in this order:
///
/// 1. a code that names the provider's own condition (Auth, Budget, RateLimited, Gone)
///    decides, whatever else the body says;
/// 2. the error's `retryable` flag (as `GET /v1/discovery` publishes per code): `true` is
///    Transient (RateLimited on 429); `false` is never retried: Auth on 401/403, Budget on
///    402/429, otherwise InvalidRequest;
/// 3. any other code in the table below;
/// 4. the HTTP status as for every provider ([`classify_status`]); an `ok:false` answer
///    on a 2xx with nothing recognisable is Protocol.
///
/// | code (case and `-`/`.` separators ignored) | class | source |
/// |---|---|---|
/// | `INSUFFICIENT_CREDIT` | Budget | confirmed (402, docs) |
/// | `INSUFFICIENT_QUOTA`, `QUOTA_EXCEEDED`, `BUDGET_EXCEEDED`, `SPENDING_LIMIT_REACHED`, `PAYMENT_REQUIRED` | Budget | assumed |
/// | `UNAUTHORIZED`, `UNAUTHENTICATED`, `INVALID_API_KEY`, `FORBIDDEN`, `PERMISSION_DENIED` | Auth | assumed |
/// | `RATE_LIMITED`, `RATE_LIMIT_EXCEEDED`, `TOO_MANY_REQUESTS`, `OVERLOADED` | RateLimited | assumed |
/// | `NOT_FOUND`, `BATCH_NOT_FOUND`, `BATCH_EXPIRED` | Gone | assumed |
/// | `INTERNAL_ERROR`, `UPSTREAM_ERROR`, `VENDOR_ERROR`, `SERVICE_UNAVAILABLE`, `TIMEOUT`, `UPSTREAM_TIMEOUT` | Transient | assumed |
/// | `INVALID_REQUEST`, `INVALID_PARAMS`, `INVALID_PARAMETER`, `VALIDATION_ERROR`, `BAD_REQUEST`, `UNSUPPORTED_CAPABILITY`, `PAYLOAD_TOO_LARGE`, `IDEMPOTENCY_KEY_REUSED` | InvalidRequest | assumed |
pub(crate) fn classify(status: Option<u16>, headers: &HeaderMap, error: Option<&ErrorObject>) -> ErrorClass {
    let code = error.and_then(|e| e.code.as_deref());
    let by_code = code.and_then(code_class);
    match (by_code, error.and_then(|e| e.retryable)) {
        (Some(class @ (ErrorClass::Auth | ErrorClass::Budget | ErrorClass::RateLimited | ErrorClass::Gone)), _) => {
            class
        }
        (_, Some(true)) if status == Some(429) => ErrorClass::RateLimited,
        (_, Some(true)) => ErrorClass::Transient,
        (_, Some(false)) => match status {
            Some(401 | 403) => ErrorClass::Auth,
            Some(402 | 429) => ErrorClass::Budget,
            _ => ErrorClass::InvalidRequest,
        },
        (Some(class), None) => class,
        (None, None) => match status {
            Some(status) if !(200..300).contains(&status) => classify_status(status, headers, code),
            _ => ErrorClass::Protocol,
        },
    }
}

fn code_class(code: &str) -> Option<ErrorClass> {
    let code = code.trim().to_ascii_uppercase().replace(['-', '.', ' '], "_");
    let class = match code.as_str() {
        "INSUFFICIENT_CREDIT"
        | "INSUFFICIENT_QUOTA"
        | "QUOTA_EXCEEDED"
        | "BUDGET_EXCEEDED"
        | "SPENDING_LIMIT_REACHED"
        | "PAYMENT_REQUIRED" => ErrorClass::Budget,
        "UNAUTHORIZED" | "UNAUTHENTICATED" | "INVALID_API_KEY" | "FORBIDDEN" | "PERMISSION_DENIED" => ErrorClass::Auth,
        "RATE_LIMITED" | "RATE_LIMIT_EXCEEDED" | "TOO_MANY_REQUESTS" | "OVERLOADED" => ErrorClass::RateLimited,
        "NOT_FOUND" | "BATCH_NOT_FOUND" | "BATCH_EXPIRED" => ErrorClass::Gone,
        "INTERNAL_ERROR"
        | "UPSTREAM_ERROR"
        | "VENDOR_ERROR"
        | "SERVICE_UNAVAILABLE"
        | "TIMEOUT"
        | "UPSTREAM_TIMEOUT" => ErrorClass::Transient,
        "INVALID_REQUEST"
        | "INVALID_PARAMS"
        | "INVALID_PARAMETER"
        | "VALIDATION_ERROR"
        | "BAD_REQUEST"
        | "UNSUPPORTED_CAPABILITY"
        | "PAYLOAD_TOO_LARGE"
        | "IDEMPOTENCY_KEY_REUSED" => ErrorClass::InvalidRequest,
        _ => return None,
    };
    Some(class)
}

/// Where a batch stands, from the status `data`.
pub(crate) fn phase(data: &Value, fields: &GenericFields) -> Result<JobPhase, String> {
    let state = data
        .pointer(&fields.state)
        .and_then(Value::as_str)
        .ok_or_else(|| format!("the status has no string at {}", fields.state))?;
    let is = |names: &[String]| names.iter().any(|n| n.eq_ignore_ascii_case(state));
    let states = &fields.states;
    if is(&states.running) {
        Ok(JobPhase::Running)
    } else if is(&states.completed) {
        Ok(JobPhase::Completed)
    } else if is(&states.expired) {
        Ok(JobPhase::Expired)
    } else if is(&states.cancelled) {
        Ok(JobPhase::Cancelled)
    } else if is(&states.failed) {
        // A generic job's failure names no item: nothing accuses a member.
        Ok(JobPhase::Failed {
            reason: crate::providers::redact(&failure_reason(data)),
            cause: FailureCause::Unattributed,
        })
    } else {
        Err(format!("unknown batch state {state:?}"))
    }
}

fn failure_reason(data: &Value) -> String {
    let error = &data["error"];
    // A bare string is the whole reason, without the `code: ` prefix `describe` adds.
    if let Some(text) = error.as_str() {
        return text.to_string();
    }
    let parsed = ErrorObject::read(error);
    if parsed.code.is_some() || parsed.message.is_some() {
        return parsed.describe();
    }
    data["message"].as_str().map_or_else(|| "the provider failed the batch".to_string(), str::to_string)
}

/// The provider's figure in US dollars as micro-dollars; nothing for nonsense.
pub(crate) fn cost_micros(usd: f64) -> Option<u64> {
    (usd.is_finite() && usd >= 0.0).then(|| (usd * 1_000_000.0).round() as u64)
}

/// One result item, whichever way it arrived, into (custom id, what it means).
pub(crate) fn parse_item(item: &Value, fields: &GenericFields) -> Result<ResultLine, String> {
    let custom_id = item
        .get(&fields.item_id)
        .and_then(Value::as_str)
        .ok_or_else(|| format!("a result item without a string {:?}", fields.item_id))?
        .to_string();
    let present = |pointer: &str| item.pointer(pointer).filter(|v| !v.is_null());
    if let Some(error) = present(&fields.item_error) {
        return Ok((custom_id, item_failure(&ErrorObject::read(error))));
    }
    let response = present(&fields.item_response)
        .ok_or_else(|| format!("result item {custom_id} has neither answer nor error"))?;
    let request_id = present(&fields.item_request_id).and_then(Value::as_str).map(str::to_string);
    let cost = present(&fields.item_cost_usd).and_then(Value::as_f64).and_then(cost_micros);
    let result = match chat::parse_completion(response, request_id.clone())? {
        LineResult::Answer { output, usage } => {
            LineResult::Answer { output, usage: with_cost(usage, cost, request_id) }
        }
        // A truncated or refused answer is paid for all the same.
        LineResult::Unusable { class, reason, usage } => {
            LineResult::Unusable { class, reason, usage: with_cost(usage, cost, request_id) }
        }
        other => other,
    };
    Ok((custom_id, result))
}

fn with_cost(usage: Option<Usage>, cost: Option<u64>, request_id: Option<String>) -> Option<Usage> {
    match (usage, cost) {
        (Some(usage), cost) => Some(Usage { provider_cost_micros: cost, ..usage }),
        (None, Some(cost)) => Some(Usage { provider_cost_micros: Some(cost), request_id, ..Usage::default() }),
        (None, None) => None,
    }
}

/// An item the provider did not answer. Items that never ran (expired, cancelled, the
/// batch timed out) and provider-side trouble go back to the queue; the rest are refused.
fn item_failure(error: &ErrorObject) -> LineResult {
    let reason = error.describe();
    let code = error.code.as_deref().unwrap_or_default().to_ascii_uppercase().replace(['-', '.'], "_");
    let never_ran = matches!(
        code.as_str(),
        "EXPIRED" | "CANCELLED" | "CANCELED" | "BATCH_TIMEOUT" | "BATCH_EXPIRED" | "BATCH_CANCELLED"
    );
    if never_ran {
        return LineResult::Retry { reason };
    }
    match classify(None, &HeaderMap::new(), Some(error)) {
        ErrorClass::RateLimited | ErrorClass::Transient | ErrorClass::Gone | ErrorClass::Auth | ErrorClass::Budget => {
            LineResult::Retry { reason }
        }
        ErrorClass::InvalidRequest | ErrorClass::Protocol | ErrorClass::TooLarge => {
            LineResult::Refused { class: FailureClass::InvalidRequest, reason }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn err(code: &str, retryable: Option<bool>) -> ErrorObject {
        ErrorObject { code: Some(code.into()), message: Some("m".into()), hint: None, retryable }
    }

    #[test]
    fn error_codes_flags_and_statuses_classify_in_order() {
        let none = HeaderMap::new();
        let class = |status, e: &ErrorObject| classify(status, &none, Some(e));
        assert_eq!(class(Some(402), &err("INSUFFICIENT_CREDIT", None)), ErrorClass::Budget);
        assert_eq!(class(Some(200), &err("insufficient-credit", Some(false))), ErrorClass::Budget);
        assert_eq!(class(Some(401), &err("UNAUTHORIZED", Some(false))), ErrorClass::Auth);
        assert_eq!(class(Some(429), &err("RATE_LIMITED", Some(true))), ErrorClass::RateLimited);
        assert_eq!(class(Some(404), &err("BATCH_NOT_FOUND", None)), ErrorClass::Gone);
        assert_eq!(class(Some(400), &err("INVALID_PARAMS", Some(false))), ErrorClass::InvalidRequest);
        assert_eq!(class(Some(500), &err("INTERNAL_ERROR", Some(false))), ErrorClass::InvalidRequest, "the flag wins");
        assert_eq!(class(Some(400), &err("SOMETHING_NEW", Some(true))), ErrorClass::Transient, "the flag wins");
        assert_eq!(class(Some(429), &err("SOMETHING_NEW", Some(false))), ErrorClass::Budget);
        assert_eq!(class(Some(503), &err("SOMETHING_NEW", None)), ErrorClass::Transient, "then the status");
        assert_eq!(class(Some(422), &err("SOMETHING_NEW", None)), ErrorClass::InvalidRequest);
        assert_eq!(class(Some(200), &err("SOMETHING_NEW", None)), ErrorClass::Protocol);
        assert_eq!(classify(Some(502), &none, None), ErrorClass::Transient);
        assert_eq!(classify(None, &none, None), ErrorClass::Protocol);
    }

    #[test]
    fn canonical_json_sorts_keys_at_every_depth() {
        let value = json!({"z": 1, "a": {"y": [3, {"c": null, "b": "x\n"}], "x": true}, "m": 1.5});
        assert_eq!(
            String::from_utf8(canonical(&value)).unwrap(),
            "{\"a\":{\"x\":true,\"y\":[3,{\"b\":\"x\\n\",\"c\":null}]},\"m\":1.5,\"z\":1}\n"
        );
    }

    #[test]
    fn states_map_onto_phases() {
        let fields = GenericFields::default();
        let of = |state: &str| phase(&json!({"state": state}), &fields);
        assert_eq!(of("running").unwrap(), JobPhase::Running);
        assert_eq!(of("Completed").unwrap(), JobPhase::Completed);
        assert_eq!(of("complete").unwrap(), JobPhase::Completed);
        assert_eq!(of("expired").unwrap(), JobPhase::Expired);
        assert_eq!(of("canceled").unwrap(), JobPhase::Cancelled);
        assert!(of("paused").is_err());
        assert!(phase(&json!({}), &fields).is_err());
        let failed = phase(&json!({"state": "failed", "error": {"code": "INVALID_PARAMS", "message": "bad"}}), &fields);
        assert_eq!(
            failed.unwrap(),
            JobPhase::Failed { reason: "INVALID_PARAMS: bad".into(), cause: FailureCause::Unattributed }
        );
    }

    #[test]
    fn items_carry_cost_and_request_id_or_map_their_errors() {
        let fields = GenericFields::default();
        let answer = json!({"custom_id": "a", "ok": true, "error": null,
            "data": {"id": "chatcmpl-1", "model": "m", "choices": [{"index": 0, "message": {"content": "{}"}}],
                     "usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}},
            "metadata": {"cost_usd": 0.000125, "request_id": "0190-aa"}});
        let (id, LineResult::Answer { usage: Some(usage), .. }) = parse_item(&answer, &fields).unwrap() else {
            panic!()
        };
        assert_eq!(id, "a");
        assert_eq!((usage.provider_cost_micros, usage.request_id.as_deref()), (Some(125), Some("0190-aa")));
        assert_eq!(usage.input_tokens, 3);

        let expired =
            json!({"custom_id": "b", "ok": false, "data": null, "error": {"code": "EXPIRED", "message": "x"}});
        assert!(matches!(parse_item(&expired, &fields).unwrap().1, LineResult::Retry { .. }));
        let bad = json!({"custom_id": "c", "error": {"code": "INVALID_PARAMS", "message": "x", "retryable": false}});
        assert!(matches!(parse_item(&bad, &fields).unwrap().1, LineResult::Refused { .. }));
        let busy = json!({"custom_id": "d", "error": {"code": "WHATEVER", "message": "x", "retryable": true}});
        assert!(matches!(parse_item(&busy, &fields).unwrap().1, LineResult::Retry { .. }));
        assert!(parse_item(&json!({"custom_id": "e"}), &fields).is_err());
        assert!(parse_item(&json!({"data": {}}), &fields).is_err());
        assert!(parse_item(&json!([1]), &fields).is_err());
    }

    #[test]
    fn truncated_and_refused_items_are_unusable_and_keep_their_cost() {
        let fields = GenericFields::default();
        let item = |finish_reason: &str, message: Value| {
            json!({"custom_id": "a", "ok": true,
                "data": {"id": "chatcmpl-1", "model": "m", "choices": [{"index": 0, "message": message, "finish_reason": finish_reason}],
                         "usage": {"prompt_tokens": 3, "completion_tokens": 512}},
                "metadata": {"cost_usd": 0.0005, "request_id": "0190-bb"}})
        };
        let cut = item("length", json!({"content": "{\"findings\":[]}"}));
        let LineResult::Unusable { class, usage: Some(usage), .. } = parse_item(&cut, &fields).unwrap().1 else {
            panic!()
        };
        assert_eq!(class, FailureClass::Truncated);
        assert_eq!((usage.provider_cost_micros, usage.output_tokens), (Some(500), 512), "paid for all the same");
        let declined = item("stop", json!({"content": null, "refusal": "I'm sorry"}));
        let LineResult::Unusable { class, .. } = parse_item(&declined, &fields).unwrap().1 else { panic!() };
        assert_eq!(class, FailureClass::Refused);
    }

    #[test]
    fn costs_convert_to_micros() {
        assert_eq!(cost_micros(0.0012), Some(1200));
        assert_eq!(cost_micros(-1.0), None);
        assert_eq!(cost_micros(f64::NAN), None);
    }
}
