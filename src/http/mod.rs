//! The HTTP API (JSON everywhere; errors as `{"error":{"code","message"}}`), described by
//! the OpenAPI document it serves at `/openapi.json`.

mod admin;
mod auth;
mod body;
mod conn;
mod delivery;
mod error;
mod extract;
pub(crate) mod handlers;
mod log_limit;
mod money;
mod openapi;
#[cfg(test)]
mod openapi_tests;
mod time;
mod views;
mod whole;
mod workers;

use std::sync::Arc;

use axum::{Extension, Router};
use utoipa::OpenApi;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

pub use body::BodyLimits;
pub use conn::serve;
pub use error::ApiError;

use crate::access::AccessPolicy;
use crate::service::Service;

pub fn router(service: Service, body: BodyLimits, access: Arc<AccessPolicy>) -> Router {
    let (routes, doc) = documented_routes().split_for_parts();
    let schema_names: Vec<String> = service.registry().names().map(str::to_string).collect();
    let document = openapi::Served(openapi::finish(doc, &schema_names).to_string().into());
    routes
        .fallback(|| async { ApiError::not_found_route() })
        .method_not_allowed_fallback(|| async { ApiError::method_not_allowed() })
        .layer(Extension(document))
        .layer(axum::middleware::from_fn_with_state(access, auth::authenticate))
        .layer(Extension(body))
        .with_state(service)
}

/// Every route, each registered with its OpenAPI description. One `routes!` per path:
/// the macro serves all the handlers it is given on every path among them.
fn documented_routes() -> OpenApiRouter<Service> {
    OpenApiRouter::with_openapi(openapi::ApiDoc::openapi())
        .routes(routes!(openapi::document))
        .routes(routes!(handlers::healthz))
        .routes(routes!(handlers::metrics))
        .routes(routes!(handlers::intake, handlers::list))
        .routes(routes!(handlers::get))
        .routes(routes!(handlers::findings))
        .routes(routes!(workers::post_result))
        .routes(routes!(handlers::retry))
        .routes(routes!(workers::claim))
        .routes(routes!(money::extraction_costs))
        .routes(routes!(money::tenant_costs))
        .routes(routes!(delivery::receive))
        .routes(routes!(delivery::list))
        .routes(routes!(delivery::redeliver))
        .routes(routes!(delivery::enable_sink))
        .routes(routes!(handlers::stats))
        .routes(routes!(admin::backup))
        .routes(routes!(admin::providers))
        .routes(routes!(admin::pause))
        .routes(routes!(admin::resume))
        .routes(routes!(admin::download, admin::remove))
}
