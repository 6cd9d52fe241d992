//! `POST /v1/chat/completions`, synchronous: what `commitpoint provider check` and the
//! chat adapter call. It refuses what the real endpoint refuses, at request time: an
//! unknown model (404 `model_not_found`, "The model `<m>` does not exist or you do not
//! have access to it.") and a `response_format` strict mode rejects (400, see `strict`).

use std::sync::Arc;

use axum::Json;
use axum::extract::State;
use rand::SeedableRng;
use rand::rngs::StdRng;
use serde_json::{Value, json};

use super::error::ApiError;
use super::model;
use super::output::{batch_salt, random_id};
use super::state::{Shared, unix_now};
use super::strict;

pub async fn complete(State(shared): State<Arc<Shared>>, Json(body): Json<Value>) -> Result<Json<Value>, ApiError> {
    let Some(model_name) = body.get("model").and_then(Value::as_str).map(str::to_string) else {
        return Err(ApiError::invalid("you must provide a model parameter").param("model"));
    };
    if shared.lock().faults.missing_models.contains(&model_name) {
        return Err(ApiError::not_found(format!(
            "The model `{model_name}` does not exist or you do not have access to it."
        ))
        .code("model_not_found"));
    }
    if body.get("messages").and_then(Value::as_array).is_none_or(Vec::is_empty) {
        return Err(ApiError::invalid("Missing required parameter: 'messages'.")
            .param("messages")
            .code("missing_required_parameter"));
    }
    strict::check_body(&body).map_err(|r| ApiError::invalid(r.message).param(&r.param).code(r.code))?;
    let reply = model::respond(&body, false);
    let mut rng = StdRng::seed_from_u64(shared.seed ^ batch_salt(&shared.next_request_id()));
    Ok(Json(json!({
        "id": random_id(&mut rng, "chatcmpl-", 29),
        "object": "chat.completion",
        "created": unix_now(),
        "model": model_name,
        "choices": [{
            "index": 0,
            "message": {"role": "assistant", "content": reply.content, "refusal": null},
            "logprobs": null,
            "finish_reason": "stop",
        }],
        "usage": {
            "prompt_tokens": reply.prompt_tokens,
            "completion_tokens": reply.completion_tokens,
            "total_tokens": reply.prompt_tokens + reply.completion_tokens,
        },
    })))
}
