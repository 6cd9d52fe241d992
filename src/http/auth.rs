//! The authentication layers of the route groups (`routes.rs` decides which route is in
//! which group). Tenant scoping of individual records happens in the handlers, which know
//! the record.

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::header;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use super::conn::Peer;
use super::error::ApiError;
use super::guesses::Via;
use crate::http::access::{Access, Caller, Denied, Refused};

/// The layer of tenant routes (see `routes.rs`): the admin's or a tenant's token; the
/// handlers scope records by the caller it leaves in the request.
pub(super) async fn tenant_or_admin(State(access): State<Arc<Access>>, request: Request, next: Next) -> Response {
    admit(&access, request, next, Caller::require_not_worker).await
}

/// The layer of routes every token may call (the registered schemas).
pub(super) async fn any_caller(State(access): State<Arc<Access>>, request: Request, next: Next) -> Response {
    admit(&access, request, next, |_| Ok(())).await
}

/// The layer of worker routes: the admin's or a worker's token; the handlers check a
/// worker's scope against the work.
pub(super) async fn worker_or_admin(State(access): State<Arc<Access>>, request: Request, next: Next) -> Response {
    admit(&access, request, next, Caller::require_worker).await
}

/// The layer of admin routes (see `routes.rs`): the admin token only.
pub(super) async fn admin_only(State(access): State<Arc<Access>>, request: Request, next: Next) -> Response {
    admit(&access, request, next, Caller::require_admin).await
}

/// The layer of public routes: nothing is refused, but a caller whose token is valid is
/// left in the request, so `/healthz` can show details to the admin alone.
pub(super) async fn recognise(State(access): State<Arc<Access>>, mut request: Request, next: Next) -> Response {
    // A wrong token here is a guess like any other (`/healthz` shows details to the admin).
    if let Ok(caller) = access.authenticate(authorization(&request), client(&request), Via::Token) {
        request.extensions_mut().insert(caller);
    }
    next.run(request).await
}

fn authorization(request: &Request) -> Option<&str> {
    request.headers().get(header::AUTHORIZATION).map(|v| v.to_str().unwrap_or("<not text>"))
}

/// The client's address, which wrong tokens are counted by.
pub(super) fn client(request: &Request) -> Option<std::net::IpAddr> {
    request.extensions().get::<Peer>().map(|p| p.remote.ip())
}

async fn admit(
    access: &Access,
    mut request: Request,
    next: Next,
    allowed: impl Fn(&Caller) -> Result<(), Denied>,
) -> Response {
    let caller = match access.authenticate(authorization(&request), client(&request), Via::Token) {
        Ok(caller) => caller,
        Err(refused) => return ApiError::from(refused).into_response(),
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
            Denied::Unauthenticated | Denied::InvalidToken => ApiError::unauthenticated(denied.to_string()),
            Denied::AdminOnly
            | Denied::OtherTenant(_)
            | Denied::WorkersOnly
            | Denied::NotForWorkers
            | Denied::OutsideScope { .. } => {
                ApiError::new(axum::http::StatusCode::FORBIDDEN, "forbidden", denied.to_string())
            }
        }
    }
}

impl From<Refused> for ApiError {
    fn from(refused: Refused) -> Self {
        match refused {
            Refused::Denied(denied) => denied.into(),
            Refused::Throttled(wait) => ApiError::rate_limited(wait),
        }
    }
}

/// The caller, for handlers that scope by tenant.
pub(super) type CallerExt = axum::Extension<Caller>;
