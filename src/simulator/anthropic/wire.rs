//! Anthropic Message Batches objects as they appear on the wire (PROVIDERS.md §2), and the
//! create body's checks. Field names and enum strings are the protocol, spelled here once.

use std::collections::HashSet;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

/// A batch holds at most 100,000 requests or 256 MB, whichever comes first.
pub(super) const MAX_REQUESTS: usize = 100_000;
pub(super) const MAX_BODY_BYTES: usize = 256 * 1000 * 1000;
const MAX_CUSTOM_ID_CHARS: usize = 64;
pub(super) const DEFAULT_LIST_LIMIT: usize = 20;
pub(super) const MAX_LIST_LIMIT: usize = 1000;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum ProcessingStatus {
    InProgress,
    Canceling,
    Ended,
}

/// Non-processing counts stay 0 until the whole batch ends; the sum is always the total.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct RequestCounts {
    pub processing: u64,
    pub succeeded: u64,
    pub errored: u64,
    pub canceled: u64,
    pub expired: u64,
}

/// `MessageBatch`; timestamps are RFC 3339 strings.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct MessageBatch {
    pub id: String,
    #[serde(rename = "type")]
    pub kind: String,
    pub processing_status: ProcessingStatus,
    pub request_counts: RequestCounts,
    pub ended_at: Option<String>,
    pub created_at: String,
    pub expires_at: String,
    pub archived_at: Option<String>,
    pub cancel_initiated_at: Option<String>,
    pub results_url: Option<String>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(super) struct BatchPage {
    pub data: Vec<MessageBatch>,
    pub has_more: bool,
    pub first_id: Option<String>,
    pub last_id: Option<String>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub(super) struct DeletedBatch {
    pub id: String,
    #[serde(rename = "type")]
    pub kind: String,
}

#[derive(Clone, Debug, Default, Deserialize)]
pub(super) struct ListQuery {
    pub after_id: Option<String>,
    pub before_id: Option<String>,
    pub limit: Option<String>,
}

/// One entry of `requests`, checked.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Request {
    pub custom_id: String,
    pub params: Value,
}

/// Parses and checks a create body. The message names the offending field by path
/// (`requests.3.custom_id: …`), as the real API's validation errors do.
pub(super) fn parse_create(body: &[u8]) -> Result<Vec<Request>, String> {
    let Ok(Value::Object(mut top)) = serde_json::from_slice::<Value>(body) else {
        return Err("The request body is not valid JSON.".to_string());
    };
    if let Some(extra) = top.keys().find(|k| *k != "requests") {
        return Err(format!("{extra}: Extra inputs are not permitted"));
    }
    let Some(Value::Array(items)) = top.remove("requests") else {
        return Err("requests: Field required (a list of {custom_id, params})".to_string());
    };
    if items.is_empty() || items.len() > MAX_REQUESTS {
        return Err(format!("requests: a batch holds 1 to {MAX_REQUESTS} requests, not {}", items.len()));
    }
    let mut seen = HashSet::with_capacity(items.len());
    let mut requests = Vec::with_capacity(items.len());
    for (index, item) in items.into_iter().enumerate() {
        let at = |field: &str, problem: &str| format!("requests.{index}.{field}: {problem}");
        let Value::Object(mut item) = item else {
            return Err(format!("requests.{index}: Input should be an object"));
        };
        if let Some(extra) = item.keys().find(|k| !matches!(k.as_str(), "custom_id" | "params")) {
            return Err(at(extra, "Extra inputs are not permitted"));
        }
        let Some(Value::String(custom_id)) = item.remove("custom_id") else {
            return Err(at("custom_id", "Field required"));
        };
        check_custom_id(&custom_id).map_err(|problem| at("custom_id", problem))?;
        if !seen.insert(custom_id.clone()) {
            return Err(at("custom_id", "custom_id must be unique within a batch"));
        }
        let Some(Value::Object(params)) = item.remove("params") else {
            return Err(at("params", "Field required"));
        };
        check_params(&params).map_err(|(field, problem)| at(&format!("params.{field}"), &problem))?;
        requests.push(Request { custom_id, params: Value::Object(params) });
    }
    Ok(requests)
}

fn check_custom_id(id: &str) -> Result<(), &'static str> {
    if id.is_empty() {
        return Err("String should have at least 1 character");
    }
    if id.chars().count() > MAX_CUSTOM_ID_CHARS {
        return Err("String should have at most 64 characters");
    }
    if !id.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-') {
        return Err("String should match pattern '^[a-zA-Z0-9_-]{1,64}$'");
    }
    Ok(())
}

fn check_params(params: &Map<String, Value>) -> Result<(), (&'static str, String)> {
    if params.get("model").and_then(Value::as_str).is_none_or(|m| m.trim().is_empty()) {
        return Err(("model", "Field required".to_string()));
    }
    match params.get("max_tokens").and_then(Value::as_u64) {
        Some(n) if n >= 1 => {}
        _ => return Err(("max_tokens", "Input should be an integer of at least 1".to_string())),
    }
    if params.get("messages").and_then(Value::as_array).is_none_or(Vec::is_empty) {
        return Err(("messages", "Field required (at least one message)".to_string()));
    }
    if params.get("stream").and_then(Value::as_bool) == Some(true) {
        return Err(("stream", "Streaming is not supported in batches".to_string()));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn body(requests: Value) -> Vec<u8> {
        json!({ "requests": requests }).to_string().into_bytes()
    }

    fn params() -> Value {
        json!({"model": "m", "max_tokens": 10, "messages": [{"role": "user", "content": "x"}]})
    }

    #[test]
    fn a_valid_body_parses_in_order() {
        let parsed = parse_create(&body(json!([
            {"custom_id": "a-1", "params": params()},
            {"custom_id": "b_2", "params": params()},
        ])))
        .unwrap();
        let ids: Vec<_> = parsed.iter().map(|r| r.custom_id.as_str()).collect();
        assert_eq!(ids, ["a-1", "b_2"]);
    }

    #[test]
    fn each_problem_names_its_field() {
        let mut no_tokens = params();
        no_tokens["max_tokens"] = json!(0);
        let mut streaming = params();
        streaming["stream"] = json!(true);
        let cases = [
            (body(json!([])), "requests:"),
            (
                body(json!([{"custom_id": "a".repeat(65), "params": params()}])),
                "requests.0.custom_id: String should have at most 64",
            ),
            (body(json!([{"custom_id": "a b", "params": params()}])), "requests.0.custom_id: String should match"),
            (
                body(json!([{"custom_id": "a", "params": params()}, {"custom_id": "a", "params": params()}])),
                "requests.1.custom_id: custom_id must be unique",
            ),
            (body(json!([{"custom_id": "a", "params": no_tokens}])), "requests.0.params.max_tokens"),
            (body(json!([{"custom_id": "a", "params": streaming}])), "requests.0.params.stream"),
            (
                body(json!([{"custom_id": "a", "params": {"model": "m", "max_tokens": 1}}])),
                "requests.0.params.messages",
            ),
            (body(json!([{"custom_id": "a"}])), "requests.0.params: Field required"),
            (body(json!([{"custom_id": "a", "params": params(), "x": 1}])), "requests.0.x: Extra inputs"),
            (json!({"requests": [], "metadata": {}}).to_string().into_bytes(), "metadata: Extra inputs"),
            (b"{".to_vec(), "not valid JSON"),
        ];
        for (body, want) in cases {
            let got = parse_create(&body).unwrap_err();
            assert!(got.starts_with(want) || got.contains(want), "{got:?} should mention {want:?}");
        }
    }
}
