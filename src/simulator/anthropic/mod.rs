//! The simulator's Anthropic Message Batches dialect (PROVIDERS.md §2): one POST carries
//! every request inline, the batch goes `in_progress → ended` (or `canceling → ended`),
//! and the results JSONL is served at `results_url` once it has ended. Requests that force
//! a tool call are answered by the rule-based reviewer with a `tool_use` block.
//!
//! Authentication is `x-api-key` (when a key is configured) plus a required
//! `anthropic-version`. The request-level faults map to Anthropic's answers: 429
//! `rate_limit_error` and 529 `overloaded_error` with `retry-after`, 500 `api_error`, 401
//! `authentication_error`, and the credit-balance 400 for `insufficient_quota_next`.
//! Anthropic has no idempotency key, so `drop_after_create_next` leaves a client only
//! the batch list to find what it created.

mod error;
mod handlers;
mod lifecycle;
mod messages;
pub(super) mod model;
mod results;
mod wire;

use std::sync::Arc;

use axum::extract::{DefaultBodyLimit, Request, State};
use axum::http::{HeaderName, HeaderValue, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};

pub(super) use lifecycle::Record;

use super::SIM_PREFIX;
use super::state::Shared;
use error::{AnthropicError, ErrorBody};

pub(super) const API_VERSION_HEADER: &str = "anthropic-version";

pub(super) fn router(shared: Arc<Shared>) -> Router {
    Router::new()
        .route(
            "/v1/messages/batches",
            // The create handler reports bodies over the Batch API's 256 MB as `request_too_large`.
            post(handlers::create).layer(DefaultBodyLimit::max(wire::MAX_BODY_BYTES)).get(handlers::list),
        )
        .route("/v1/messages/batches/{id}", get(handlers::retrieve).delete(handlers::delete))
        .route("/v1/messages/batches/{id}/cancel", post(handlers::cancel))
        .route("/v1/messages/batches/{id}/results", get(handlers::results))
        .route("/v1/messages", post(messages::create))
        .route("/_sim/stats", get(super::sim_stats))
        .route("/_sim/faults", get(super::sim_get_faults).post(super::sim_set_faults))
        .fallback(|request: Request| async move {
            AnthropicError::not_found(format!("Not found: {} {}", request.method(), request.uri().path()))
        })
        .method_not_allowed_fallback(|request: Request| async move {
            AnthropicError::new(
                StatusCode::METHOD_NOT_ALLOWED,
                "invalid_request_error",
                format!("Method {} is not allowed on {}", request.method(), request.uri().path()),
            )
        })
        .layer(middleware::from_fn_with_state(Arc::clone(&shared), guard))
        .with_state(shared)
}

/// In front of every request: request id, and for API requests the delay, the header
/// checks and at most one injected request-level fault.
async fn guard(State(shared): State<Arc<Shared>>, request: Request, next: Next) -> Response {
    let request_id = shared.next_request_id();
    let mut response = if request.uri().path().starts_with(SIM_PREFIX) {
        next.run(request).await
    } else {
        let delay = shared.lock().faults.delay();
        if !delay.is_zero() {
            tokio::time::sleep(delay).await;
        }
        match admit(&shared, &request) {
            Ok(()) => next.run(request).await,
            Err(error) => error.into_response(),
        }
    };
    // Error bodies carry the request id too; only the middleware knows it.
    if let Some(body) = response.extensions_mut().remove::<ErrorBody>() {
        let (mut parts, _) = response.into_parts();
        parts.headers.remove(header::CONTENT_LENGTH);
        let rendered = Json(body.render(Some(&request_id))).into_response();
        let (rendered_parts, rendered_body) = rendered.into_parts();
        parts.headers.extend(rendered_parts.headers);
        response = Response::from_parts(parts, rendered_body);
    }
    let headers = response.headers_mut();
    if let Ok(value) = HeaderValue::try_from(request_id) {
        headers.insert(HeaderName::from_static("request-id"), value);
    }
    headers.insert(
        HeaderName::from_static("x-commitpoint-simulator"),
        HeaderValue::from_static("SIMULATED provider, not a real model"),
    );
    response
}

fn admit(shared: &Shared, request: &Request) -> Result<(), AnthropicError> {
    let header = |name: &str| request.headers().get(name).and_then(|v| v.to_str().ok());
    if let Some(key) = &shared.api_key {
        match header("x-api-key") {
            None => {
                return Err(AnthropicError::new(
                    StatusCode::UNAUTHORIZED,
                    "authentication_error",
                    "x-api-key header is required",
                ));
            }
            Some(sent) if sent != key => {
                return Err(AnthropicError::new(StatusCode::UNAUTHORIZED, "authentication_error", "invalid x-api-key"));
            }
            Some(_) => {}
        }
    }
    if header(API_VERSION_HEADER).is_none_or(|v| v.trim().is_empty()) {
        return Err(AnthropicError::invalid("anthropic-version: header is required"));
    }
    match super::take_request_fault(shared, request.uri().path()) {
        Some(fault) => Err(AnthropicError::injected(fault, crate::domain::clock::now())),
        None => Ok(()),
    }
}
