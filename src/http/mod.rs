//! The HTTP API (JSON everywhere; errors as `{"error":{"code","message"}}`).

mod admin;
mod auth;
mod delivery;
mod error;
mod extract;
pub(crate) mod handlers;
mod money;
mod views;

use std::sync::Arc;

use axum::Router;
use axum::extract::DefaultBodyLimit;
use axum::routing::{get, post};

pub use error::ApiError;

use crate::access::AccessPolicy;
use crate::service::Service;

pub fn router(service: Service, max_body_bytes: usize, access: Arc<AccessPolicy>) -> Router {
    Router::new()
        .route("/healthz", get(handlers::healthz))
        .route("/metrics", get(handlers::metrics))
        .route("/v1/extractions", post(handlers::intake).get(handlers::list))
        .route("/v1/extractions/{id}", get(handlers::get))
        .route("/v1/extractions/{id}/findings", get(handlers::findings))
        .route("/v1/extractions/{id}/result", post(handlers::post_result))
        .route("/v1/extractions/{id}/retry", post(handlers::retry))
        .route("/v1/claims", post(handlers::claim))
        .route("/v1/extractions/{id}/costs", get(money::extraction_costs))
        .route("/v1/tenants/{tenant}/costs", get(money::tenant_costs))
        .route("/v1/webhooks/{name}", post(delivery::receive))
        .route("/v1/outbox", get(delivery::list))
        .route("/v1/outbox/{id}/redeliver", post(delivery::redeliver))
        .route("/v1/admin/sinks/{name}/enable", post(delivery::enable_sink))
        .route("/v1/stats", get(handlers::stats))
        .route("/v1/admin/backup", post(admin::backup))
        .route("/v1/admin/providers", get(admin::providers))
        .route("/v1/admin/providers/{name}/pause", post(admin::pause))
        .route("/v1/admin/providers/{name}/resume", post(admin::resume))
        .route("/v1/admin/backups/{name}", get(admin::download).delete(admin::remove))
        .fallback(|| async { ApiError::not_found_route() })
        .method_not_allowed_fallback(|| async { ApiError::method_not_allowed() })
        .layer(axum::middleware::from_fn_with_state(access, auth::authenticate))
        .layer(DefaultBodyLimit::max(max_body_bytes))
        .with_state(service)
}
