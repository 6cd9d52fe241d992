//! The simulator's Mistral batch dialect (docs/PROVIDERS.md, "Mistral"): files uploaded
//! with `POST /v1/files` (`purpose = batch`), jobs at `/v1/batch/jobs` (create, list with
//! `page`/`page_size`, get, `/cancel`), results in the job's `output_file` and `error_file`
//! at `GET /v1/files/{id}/content`; `POST /v1/chat/completions` answers `commitpoint
//! provider check`. Request bodies are checked as Mistral's strict API checks them (see
//! `body`).
//!
//! Authentication is `Authorization: Bearer <key>` when a key is configured. Faults map to
//! Mistral's answers (see `error`): 429 `rate_limited` code `1300`, a capacity 429, 500,
//! and the gateway's 401. Creation is not idempotent, so `drop_after_create_next` leaves a
//! client only the job list (and the metadata it gave the job) to find what it created.

mod body;
mod error;
mod files;
mod jobs;
mod lifecycle;
mod results;
mod store;

use std::sync::Arc;

use axum::Router;
use axum::extract::{DefaultBodyLimit, Request, State};
use axum::http::{StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::Response;
use axum::routing::{get, post};

pub(super) use store::Store;

use super::state::Shared;
use error::MistralError;

pub(super) fn router(shared: Arc<Shared>) -> Router {
    Router::new()
        .route("/v1/files", post(files::upload).layer(DefaultBodyLimit::disable()))
        .route("/v1/files/{id}", axum::routing::delete(files::delete))
        .route("/v1/files/{id}/content", get(files::content))
        .route("/v1/batch/jobs", post(jobs::create).get(jobs::list))
        .route("/v1/batch/jobs/{id}", get(jobs::get))
        .route("/v1/batch/jobs/{id}/cancel", post(jobs::cancel))
        .route("/v1/chat/completions", post(jobs::chat))
        .route("/_sim/stats", get(super::sim_stats))
        .route("/_sim/faults", get(super::sim_get_faults).post(super::sim_set_faults))
        .fallback(|request: Request| async move {
            MistralError::not_found(format!("Not found: {} {}", request.method(), request.uri().path()))
        })
        .method_not_allowed_fallback(|request: Request| async move {
            MistralError::api(
                StatusCode::METHOD_NOT_ALLOWED,
                "invalid_request_error",
                format!("Method {} is not allowed on {}", request.method(), request.uri().path()),
                None,
            )
        })
        .layer(middleware::from_fn_with_state(Arc::clone(&shared), guard))
        .with_state(shared)
}

/// In front of every request: the delay, the key check and at most one injected fault.
async fn guard(State(shared): State<Arc<Shared>>, request: Request, next: Next) -> Response {
    super::admit_then_run(&shared, request, next, admit).await
}

fn admit(shared: &Shared, request: &Request) -> Result<(), MistralError> {
    if let Some(key) = &shared.api_key {
        let sent = request
            .headers()
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "));
        if sent != Some(key.as_str()) {
            return Err(MistralError::unauthorized(shared.next_request_id()));
        }
    }
    match super::take_request_fault(shared, request.uri().path()) {
        Some(fault) => Err(MistralError::injected(fault, shared.next_request_id())),
        None => Ok(()),
    }
}
