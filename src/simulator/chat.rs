//! `POST /v1/chat/completions`, answered synchronously by the same simulated model, so a
//! synchronous provider (commitpoint's `[providers.chat]`) runs against the simulator with
//! the same knobs as a batch: request-level faults (429, 5xx, 401, slow answers) come from
//! the guard in front of every route; the model-level ones (`refuse_every`,
//! `truncate_every`, `invalid_output_every`) count calls the way a batch counts its lines.
//! It refuses what the real endpoint refuses, at request time: an unknown model (404
//! `model_not_found`, "The model `<m>` does not exist or you do not have access to it.")
//! and a `response_format` strict mode rejects (400, see `strict`).

use std::sync::Arc;

use axum::Json;
use axum::body::Bytes;
use axum::extract::State;
use axum::extract::rejection::BytesRejection;
use rand::SeedableRng;
use rand::rngs::StdRng;
use serde_json::Value;

use super::error::ApiError;
use super::model;
use super::output::{batch_salt, completion};
use super::state::{Shared, unix_now};
use super::strict;

pub(super) async fn completions(
    State(shared): State<Arc<Shared>>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Json<Value>, ApiError> {
    let body = body.map_err(|e| ApiError::invalid(e.body_text()))?;
    let request: Value = serde_json::from_slice(&body)
        .map_err(|e| ApiError::invalid(format!("We could not parse the JSON body of your request: {e}")))?;
    let Some(model_name) = request.get("model").and_then(Value::as_str) else {
        return Err(missing("model"));
    };
    if shared.lock().faults.missing_models.iter().any(|m| m == model_name) {
        return Err(ApiError::not_found(format!(
            "The model `{model_name}` does not exist or you do not have access to it."
        ))
        .code("model_not_found"));
    }
    if request.get("messages").and_then(Value::as_array).is_none_or(Vec::is_empty) {
        return Err(missing("messages"));
    }
    strict::check_body(&request).map_err(|r| ApiError::invalid(r.message).param(&r.param).code(r.code))?;
    if request.get("max_completion_tokens").or_else(|| request.get("max_tokens")).is_some()
        && model::output_budget(&request).is_none_or(|n| n == 0)
    {
        return Err(ApiError::invalid("Invalid 'max_completion_tokens': expected an integer of at least 1.")
            .param("max_completion_tokens"));
    }
    let (behaviour, seed, call) = {
        let ask = model::ask(&request);
        let mut guard = shared.lock();
        let inner = &mut *guard;
        inner.stats.chat_completions += 1;
        let call = inner.stats.chat_completions;
        let position = usize::try_from(call).unwrap_or(usize::MAX);
        (inner.attempts.behaviour(&inner.faults, position, &ask), inner.seed, call)
    };
    let reply = model::respond(&request, behaviour);
    {
        let mut inner = shared.lock();
        inner.stats.lines_truncated += u64::from(reply.finish_reason == "length");
        inner.stats.lines_refused += u64::from(reply.refusal.is_some());
    }
    let mut rng = StdRng::seed_from_u64(seed ^ batch_salt(&format!("chat-{call}")));
    Ok(Json(completion(&mut rng, model_name, &reply, unix_now())))
}

fn missing(param: &str) -> ApiError {
    ApiError::invalid(format!("Missing required parameter: '{param}'.")).param(param)
}
