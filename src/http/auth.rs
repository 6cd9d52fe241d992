//! The authentication layers of the route groups (`routes.rs` decides which route is in
//! which group). Tenant scoping of individual records happens in the handlers, which know
//! the record.

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::header;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use super::error::ApiError;
use crate::http::access::{AccessPolicy, Caller, Denied};

/// The layer of tenant routes (see `routes.rs`): any valid token; the handlers scope
/// records by the caller it leaves in the request.
pub(super) async fn any_caller(State(policy): State<Arc<AccessPolicy>>, request: Request, next: Next) -> Response {
    admit(&policy, request, next, |_| Ok(())).await
}

/// The layer of admin routes (see `routes.rs`): the admin token only.
pub(super) async fn admin_only(State(policy): State<Arc<AccessPolicy>>, request: Request, next: Next) -> Response {
    admit(&policy, request, next, Caller::require_admin).await
}

/// The layer of public routes: nothing is refused, but a caller whose token is valid is
/// left in the request, so `/healthz` can show details to the admin alone.
pub(super) async fn recognise(State(policy): State<Arc<AccessPolicy>>, mut request: Request, next: Next) -> Response {
    let authorization = request.headers().get(header::AUTHORIZATION).and_then(|v| v.to_str().ok());
    if let Ok(caller) = policy.identify(authorization) {
        request.extensions_mut().insert(caller);
    }
    next.run(request).await
}

async fn admit(
    policy: &AccessPolicy,
    mut request: Request,
    next: Next,
    allowed: impl Fn(&Caller) -> Result<(), Denied>,
) -> Response {
    let authorization = request.headers().get(header::AUTHORIZATION).and_then(|v| v.to_str().ok());
    let caller = match policy.identify(authorization) {
        Ok(caller) => caller,
        Err(denied) => return ApiError::from(denied).into_response(),
    };
    if let Err(denied) = allowed(&caller) {
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
pub(super) type CallerExt = axum::Extension<Caller>;
