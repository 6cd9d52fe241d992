//! The operator console at `/ui`: server-rendered HTML (maud) over the same service calls
//! the JSON API makes, with its stylesheet and one small script embedded in the binary.
//! It authenticates once with a token (`session.rs`), then by a signed cookie; every
//! form carries a CSRF token; every answer carries a strict Content-Security-Policy.

mod actions;
mod assets;
mod extractions;
mod layout;
mod login;
mod operations;
mod overview;
mod session;
mod svg;
mod viewer;

use std::sync::Arc;

use axum::Router;
use axum::http::{HeaderValue, header};
use axum::routing::{get, post};

use crate::http::access::AccessPolicy;
use crate::service::Service;
use session::SessionKey;

/// What every console handler needs besides the service.
#[derive(Debug)]
pub(super) struct Console {
    policy: Arc<AccessPolicy>,
    key: SessionKey,
}

/// No script or style but our own files, no framing, forms post only here.
const CSP: &str = "default-src 'none'; style-src 'self'; script-src 'self'; img-src 'self' data:; \
     form-action 'self'; frame-ancestors 'none'; base-uri 'none'";

pub(super) fn router(service: &Service, policy: Arc<AccessPolicy>) -> Router<Service> {
    let key = SessionKey::new(service.store().cursor_key().derive("console session"), policy.fingerprint());
    let console = Arc::new(Console { policy, key });
    Router::new()
        .route("/ui", get(overview::show))
        .route("/ui/", get(overview::show))
        .route("/ui/login", get(login::form).post(login::submit))
        .route("/ui/logout", post(login::logout))
        .route("/ui/extractions", get(extractions::list))
        .route("/ui/extractions/{id}", get(extractions::detail))
        .route("/ui/extractions/{id}/retry", post(actions::retry))
        .route("/ui/extractions/{id}/cancel", post(actions::cancel))
        .route("/ui/retry", post(actions::retry_matching))
        .route("/ui/batches", get(operations::batches))
        .route("/ui/costs", get(operations::costs))
        .route("/ui/dead-letters", get(operations::dead_letters))
        .route("/ui/dead-letters/{seq}/redeliver", post(actions::redeliver))
        .route("/ui/providers/{name}/pause", post(actions::pause))
        .route("/ui/providers/{name}/resume", post(actions::resume))
        .route("/ui/sinks/{name}/enable", post(actions::enable_sink))
        .route("/ui/assets/{file}", get(assets::serve))
        .layer(axum::middleware::map_response(secure_headers))
        .layer(axum::Extension(console))
}

async fn secure_headers(mut response: axum::response::Response) -> axum::response::Response {
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_SECURITY_POLICY, HeaderValue::from_static(CSP));
    headers.insert(header::X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff"));
    headers.insert(header::REFERRER_POLICY, HeaderValue::from_static("same-origin"));
    headers.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    if !headers.contains_key(header::CACHE_CONTROL) {
        headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    }
    response
}
