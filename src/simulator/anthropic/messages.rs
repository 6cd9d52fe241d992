//! `POST /v1/messages`, synchronous: what `commitpoint provider check` calls. Refused at
//! request time, as the real endpoint does: an unknown model (404 `not_found_error`,
//! "model: <m>") and a request the model cannot run (400 `invalid_request_error`, e.g. a
//! tool `input_schema` with a combinator at its root).

use std::sync::Arc;

use axum::Json;
use axum::extract::State;
use rand::SeedableRng;
use rand::rngs::StdRng;
use serde_json::{Value, json};

use super::error::AnthropicError;
use super::model;
use crate::simulator::faults::{Behaviour, Flaw};
use crate::simulator::output::{batch_salt, random_id};
use crate::simulator::state::Shared;

pub(super) async fn create(
    State(shared): State<Arc<Shared>>,
    Json(params): Json<Value>,
) -> Result<Json<Value>, AnthropicError> {
    let Some(model_name) = params.get("model").and_then(Value::as_str).map(str::to_string) else {
        return Err(AnthropicError::invalid("model: Field required"));
    };
    if shared.lock().faults.missing_models.contains(&model_name) {
        return Err(AnthropicError::not_found(format!("model: {model_name}")));
    }
    if params.get("max_tokens").and_then(Value::as_u64).is_none_or(|m| m == 0) {
        return Err(AnthropicError::invalid("max_tokens: Field required"));
    }
    let mut rng = StdRng::seed_from_u64(shared.seed ^ batch_salt(&shared.next_request_id()));
    let answer =
        model::respond(&params, Behaviour::Answer { flaw: Flaw::None }, &mut rng).map_err(AnthropicError::invalid)?;
    Ok(Json(json!({
        "id": random_id(&mut rng, "msg_", 24),
        "type": "message",
        "role": "assistant",
        "model": model_name,
        "content": answer.content,
        "stop_reason": answer.stop_reason,
        "stop_sequence": null,
        "usage": {"input_tokens": answer.input_tokens, "output_tokens": answer.output_tokens},
    })))
}
