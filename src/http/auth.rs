//! Authentication on every request, and the routes only the admin may call. Tenant
//! scoping of individual records happens in the handlers, which know the record.

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{Method, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use super::error::ApiError;
use crate::access::{AccessPolicy, Caller, Denied};

/// Liveness, metrics and the API description stay readable without a token (they expose no tenant data), so
/// probes and scrapers on the host need no secret. Webhooks authenticate by signature.
pub(super) fn is_public(path: &str) -> bool {
    path == "/healthz" || path == "/metrics" || path == "/openapi.json" || path.starts_with("/v1/webhooks/")
}

/// Work distribution, results, operator actions and whole-store views are admin-only.
fn is_admin_only(method: &Method, path: &str) -> bool {
    path.starts_with("/v1/claims")
        || path.starts_with("/v1/admin/")
        || path.starts_with("/v1/outbox")
        || path == "/v1/stats"
        || (method == Method::POST && (path.ends_with("/result") || path.ends_with("/retry")))
}

pub async fn authenticate(State(policy): State<Arc<AccessPolicy>>, mut request: Request, next: Next) -> Response {
    let path = request.uri().path().to_string();
    let authorization = request.headers().get(header::AUTHORIZATION).and_then(|v| v.to_str().ok());
    if is_public(&path) {
        // `/healthz` answers everyone, but shows details only to a caller it recognises.
        if path == "/healthz"
            && let Ok(caller) = policy.identify(authorization)
        {
            request.extensions_mut().insert(caller);
        }
        return next.run(request).await;
    }
    let caller = match policy.identify(authorization) {
        Ok(caller) => caller,
        Err(denied) => return ApiError::from(denied).into_response(),
    };
    if is_admin_only(request.method(), &path)
        && let Err(denied) = caller.require_admin()
    {
        return ApiError::from(denied).into_response();
    }
    request.extensions_mut().insert(caller);
    next.run(request).await
}

impl From<Denied> for ApiError {
    fn from(denied: Denied) -> Self {
        match denied {
            Denied::Unauthenticated => ApiError::unauthenticated(denied.to_string()),
            Denied::AdminOnly | Denied::OtherTenant(_) => {
                ApiError::new(axum::http::StatusCode::FORBIDDEN, "forbidden", denied.to_string())
            }
        }
    }
}

/// The caller, for handlers that scope by tenant.
pub type CallerExt = axum::Extension<Caller>;
