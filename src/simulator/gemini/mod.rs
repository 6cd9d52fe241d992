//! The simulator's Gemini API batch mode dialect (docs/PROVIDERS.md, "Gemini"): batches
//! created by `POST v1beta/models/{model}:batchGenerateContent` with inline requests or an
//! uploaded JSONL file, read as long-running operations at `v1beta/batches/{id}`, listed
//! with `pageToken` paging, cancelled with `:cancel`; results inline in the batch or in a
//! responses file at `download/v1beta/files/{id}:download?alt=media`. The synchronous
//! `:generateContent` answers `commitpoint provider check`.
//!
//! Authentication is `x-goog-api-key` (or the `key` query parameter) when a key is
//! configured. Faults map to Google's answers (see `error`): 429 `RESOURCE_EXHAUSTED` with
//! `RetryInfo`, a daily quota's 429 for `insufficient_quota_next`, 503 `UNAVAILABLE`, 500
//! `INTERNAL`, 400 `API_KEY_INVALID`. Creation is not idempotent, so
//! `drop_after_create_next` leaves a client only the batch list (and the display name it
//! chose) to find what it created.

pub(super) mod error;
mod files;
mod handlers;
mod lifecycle;
pub(super) mod model;
mod results;
mod store;

use std::sync::Arc;

use axum::Router;
use axum::extract::{DefaultBodyLimit, Request, State};
use axum::http::StatusCode;
use axum::middleware::{self, Next};
use axum::response::Response;
use axum::routing::{get, post};

pub(super) use store::Store;

use super::state::Shared;
use error::GoogleError;

pub(super) fn router(shared: Arc<Shared>) -> Router {
    Router::new()
        .route(
            "/v1beta/models/{call}",
            // The handler refuses bodies over Google's 20 MiB payload limit in its words.
            post(handlers::models).layer(DefaultBodyLimit::max(handlers::MAX_INLINE_BODY * 2)),
        )
        .route("/v1beta/batches", get(handlers::list))
        .route("/v1beta/batches/{id}", get(handlers::get).delete(handlers::delete).post(handlers::action))
        .route("/v1beta/files/{id}", axum::routing::delete(files::delete))
        .route("/upload/v1beta/files", post(files::upload).layer(DefaultBodyLimit::disable()))
        .route("/download/v1beta/files/{call}", get(files::download))
        .route("/_sim/stats", get(super::sim_stats))
        .route("/_sim/faults", get(super::sim_get_faults).post(super::sim_set_faults))
        .fallback(|request: Request| async move {
            GoogleError::not_found(format!("Not found: {} {}", request.method(), request.uri().path()))
        })
        .method_not_allowed_fallback(|request: Request| async move {
            GoogleError::new(
                StatusCode::METHOD_NOT_ALLOWED,
                "INVALID_ARGUMENT",
                format!("Method {} is not allowed on {}", request.method(), request.uri().path()),
            )
        })
        .layer(middleware::from_fn_with_state(Arc::clone(&shared), guard))
        .with_state(shared)
}

/// In front of every request: the delay, the key check and at most one injected fault.
async fn guard(State(shared): State<Arc<Shared>>, request: Request, next: Next) -> Response {
    super::admit_then_run(&shared, request, next, admit).await
}

fn admit(shared: &Shared, request: &Request) -> Result<(), GoogleError> {
    if let Some(key) = &shared.api_key {
        let header = request.headers().get("x-goog-api-key").and_then(|v| v.to_str().ok()).map(str::to_string);
        // A key in the query is never percent-encoded in practice (`[A-Za-z0-9_-]`).
        let query_key = request
            .uri()
            .query()
            .and_then(|q| q.split('&').find_map(|pair| pair.strip_prefix("key=")).map(str::to_string));
        match header.or(query_key) {
            None => return Err(GoogleError::missing_key()),
            Some(sent) if sent != *key => return Err(GoogleError::bad_key("")),
            Some(_) => {}
        }
    }
    match super::take_request_fault(shared, request.uri().path()) {
        Some(fault) => Err(GoogleError::injected(fault)),
        None => Ok(()),
    }
}
