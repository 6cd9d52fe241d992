//! The registered schemas, as a worker needs them to answer without out-of-band knowledge.

use axum::extract::State;
use axum::http::StatusCode;
use serde::Serialize;
use serde_json::Value;
use utoipa::ToSchema;

use super::error::{ApiError, ErrorBody, Reply, ok};
use super::extract::NamePath;
use super::openapi::{Forbidden, ServerError, Unauthenticated};
use crate::service::Service;

/// One registered schema: what the model is asked, how often an invalid answer is asked
/// again, and the JSON Schema 2020-12 document its output must satisfy.
#[derive(Debug, Serialize, ToSchema)]
pub(super) struct SchemaView {
    /// `name@version`.
    name: String,
    instructions: String,
    /// Re-asks an answer that fails validation or grounding gets (`x-commitpoint-reask`);
    /// a provider may override it.
    reask: u32,
    #[schema(value_type = Object)]
    json_schema: Value,
}

/// A registered schema by its `name@version`.
#[utoipa::path(get, path = "/v1/schemas/{name}", operation_id = "get_schema", tag = "extractions",
    params(("name" = String, Path, description = "`name@version`, e.g. `code-review@1`")),
    security(("bearer" = [])),
    responses(
        (status = 200, description = "The schema", body = SchemaView),
        (status = 400, description = "`invalid_path`: the name is not UTF-8 once percent-decoded", body = ErrorBody),
        (status = 401, response = Unauthenticated),
        (status = 403, response = Forbidden),
        (status = 404, description = "`unknown_schema`: no schema of that name is registered", body = ErrorBody),
        (status = 500, response = ServerError),
    ))]
pub(super) async fn get(State(service): State<Service>, NamePath(name): NamePath) -> Reply<SchemaView> {
    let schema = service.registry().get(&name).map_err(|_| {
        let known = service.registry().names().collect::<Vec<_>>().join(", ");
        ApiError::new(
            StatusCode::NOT_FOUND,
            "unknown_schema",
            format!("no schema {name:?} is registered (registered: {known})"),
        )
    })?;
    ok(SchemaView {
        name: schema.name().to_string(),
        instructions: schema.instructions(),
        reask: schema.reask_limit(),
        json_schema: schema.document().clone(),
    })
}
