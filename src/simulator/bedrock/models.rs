//! The control plane's records of models, as `provider check` reads them (docs/PROVIDERS.md,
//! "Amazon Bedrock"): `GET /foundation-models/{modelIdentifier}` (`GetFoundationModel`, a
//! foundation model's id or ARN) and `GET /inference-profiles/{inferenceProfileIdentifier}`
//! (`GetInferenceProfile`, a profile's id or ARN). A foundation model id is
//! `provider.model[:version]` with one dot; a system-defined profile id puts a geography
//! before one (`us.anthropic.…`). Every such id exists unless it, or the model a profile
//! routes to, is in `missing_models`. `GetFoundationModel` does not take a profile id and
//! refuses it like an unknown model: 400 `ValidationException` "Could not find model with
//! identifier <id>". An unknown profile is a 404 `ResourceNotFoundException`.

use std::sync::Arc;

use axum::Json;
use axum::extract::{Path, State};
use serde_json::{Value, json};

use super::AwsError;
use super::jobs::{ACCOUNT, REGION};
use crate::simulator::state::Shared;

pub(super) async fn foundation_model(
    State(shared): State<Arc<Shared>>,
    Path(identifier): Path<String>,
) -> Result<Json<Value>, AwsError> {
    let prefix = format!("arn:aws:bedrock:{REGION}::foundation-model/");
    let id = identifier.strip_prefix(&prefix).unwrap_or(&identifier);
    let unknown = || AwsError::validation(format!("Could not find model with identifier {identifier}"));
    if !is_foundation_id(id) || missing(&shared, id) {
        return Err(unknown());
    }
    shared.lock().stats.models_looked_up += 1;
    let provider = id.split('.').next().unwrap_or_default();
    Ok(Json(json!({"modelDetails": {
        "modelArn": format!("{prefix}{id}"),
        "modelId": id,
        "modelName": id,
        "providerName": provider,
        "inputModalities": ["TEXT"],
        "outputModalities": ["TEXT"],
        "responseStreamingSupported": true,
        "customizationsSupported": [],
        "inferenceTypesSupported": ["ON_DEMAND"],
        "modelLifecycle": {"status": "ACTIVE"},
    }})))
}

pub(super) async fn inference_profile(
    State(shared): State<Arc<Shared>>,
    Path(identifier): Path<String>,
) -> Result<Json<Value>, AwsError> {
    let account = format!("arn:aws:bedrock:{REGION}:{ACCOUNT}:");
    let (kind, id) = match identifier.strip_prefix(&account).and_then(|r| r.split_once('/')) {
        Some((kind @ ("inference-profile" | "application-inference-profile"), id)) => (kind, id),
        _ => ("inference-profile", identifier.as_str()),
    };
    let unknown = || AwsError::not_found(format!("Inference profile {identifier} not found."));
    let routes_to = if kind == "application-inference-profile" {
        // An application profile's own id says nothing of its model: the simulator's routes
        // to the one the job names.
        Some(id)
    } else {
        id.split_once('.').map(|(_, model)| model).filter(|model| is_foundation_id(model))
    };
    let Some(model) = routes_to else { return Err(unknown()) };
    if missing(&shared, id) || missing(&shared, model) {
        return Err(unknown());
    }
    shared.lock().stats.models_looked_up += 1;
    Ok(Json(json!({
        "inferenceProfileName": id,
        "inferenceProfileArn": format!("{account}{kind}/{id}"),
        "inferenceProfileId": id,
        "models": [{"modelArn": format!("arn:aws:bedrock:{REGION}::foundation-model/{model}")}],
        "status": "ACTIVE",
        "type": if kind == "inference-profile" { "SYSTEM_DEFINED" } else { "APPLICATION" },
    })))
}

/// `provider.model[:version]`: one dot in the name.
fn is_foundation_id(id: &str) -> bool {
    let name = id.split(':').next().unwrap_or(id);
    name.matches('.').count() == 1 && !name.starts_with('.') && !name.ends_with('.')
}

fn missing(shared: &Shared, id: &str) -> bool {
    shared.lock().faults.missing_models.iter().any(|m| m == id)
}
