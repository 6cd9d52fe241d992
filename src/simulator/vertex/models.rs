//! `POST v1/projects/{p}/locations/{l}/publishers/google/models/{model}:countTokens`, the
//! free call that proves a publisher model answers for a project and location
//! (`LlmUtilityService.CountTokens`, googleapis `llm_utility_service.proto`). The answer is
//! `CountTokensResponse` in proto3 JSON: `totalTokens`, `totalBillableCharacters`,
//! `promptTokensDetails`. A model in `missing_models` is Vertex's 404 for a publisher model
//! the project cannot use, in its own words (docs/PROVIDERS.md, "Vertex AI").

use std::sync::Arc;

use axum::Json;
use axum::body::Bytes;
use axum::extract::{Path, State};
use serde_json::{Value, json};

use crate::domain::batch::approx_tokens;
use crate::simulator::gemini::error::GoogleError;
use crate::simulator::state::Shared;

pub(super) async fn call(
    State(shared): State<Arc<Shared>>,
    Path((project, location, call)): Path<(String, String, String)>,
    body: Bytes,
) -> Result<Json<Value>, GoogleError> {
    let Some(model) = call.strip_suffix(":countTokens") else {
        return Err(GoogleError::not_found(format!("Unknown method on publishers/google/models/{call}")));
    };
    if shared.lock().faults.missing_models.iter().any(|m| m == model) {
        return Err(GoogleError::not_found(format!(
            "Publisher Model `projects/{project}/locations/{location}/publishers/google/models/{model}` was not \
             found or your project does not have access to it. Please ensure you are using a valid model version. \
             For more information, see: https://cloud.google.com/vertex-ai/generative-ai/docs/learn/model-versions"
        )));
    }
    let body: Value = serde_json::from_slice(&body)
        .map_err(|e| GoogleError::invalid(format!("Invalid JSON payload received. {e}")))?;
    let text = counted_text(&body)?;
    let tokens = approx_tokens(text.len() as u64);
    shared.lock().stats.tokens_counted += 1;
    Ok(Json(json!({
        "totalTokens": tokens,
        "totalBillableCharacters": text.chars().filter(|c| !c.is_whitespace()).count(),
        "promptTokensDetails": [{"modality": "TEXT", "tokenCount": tokens}],
    })))
}

/// The text of `contents` and `systemInstruction`; a request without contents counts nothing
/// and is refused as the service refuses an empty prompt.
fn counted_text(body: &Value) -> Result<String, GoogleError> {
    let contents = body.get("contents").and_then(Value::as_array).filter(|c| !c.is_empty());
    let contents = contents.ok_or_else(|| GoogleError::invalid("Request contains an invalid argument."))?;
    let mut text = String::new();
    let turns = contents.iter().chain(body.get("systemInstruction"));
    for part in turns.filter_map(|turn| turn.get("parts").and_then(Value::as_array)).flatten() {
        text.push_str(part.get("text").and_then(Value::as_str).unwrap_or_default());
    }
    Ok(text)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn contents_and_the_system_instruction_are_counted() {
        let body = json!({"contents": [{"role": "user", "parts": [{"text": "abcd"}]}],
            "systemInstruction": {"parts": [{"text": "efgh"}]}});
        assert_eq!(counted_text(&body).unwrap(), "abcdefgh");
        assert!(counted_text(&json!({"contents": []})).is_err());
        assert!(counted_text(&json!({})).is_err());
    }
}
