//! What every request passes before its route, written as one hand-made service rather
//! than a stack of `from_fn` layers: each of those boxes a future and clones the service
//! beneath it on every call, and on intake (a small body, a fast commit) that was a sixth
//! of the HTTP path's instructions. In order:
//!
//! * the connection's [`Peer`] goes on the request (`access.rs` counts failed logins by it);
//! * a reserve connection (past `server.max_connections`) answers `/healthz` only;
//! * a foreign `Host` or a cross-site write is refused (`browser.rs`) before anything runs;
//! * the body gets its whole-body deadline (`body.rs`), whoever reads it;
//! * every answer is marked `Cache-Control: no-store` unless its handler set a policy.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::http::{HeaderValue, Request, header};
use axum::response::{IntoResponse, Response};
use axum::routing::future::RouteFuture;
use tower::Service;

use super::ApiError;
use super::body::Deadline;
use super::browser::{self, HostNames};
use super::conn::Peer;

/// The router behind the checks every request passes. Cheap to clone: one per connection.
#[derive(Clone)]
pub(crate) struct Front {
    routes: Router,
    hosts: Arc<HostNames>,
    body_deadline: Duration,
    peer: Option<Peer>,
    health_only: bool,
}

impl Front {
    pub(super) fn new(routes: Router, hosts: HostNames, body_deadline: Duration) -> Self {
        Self { routes, hosts: Arc::new(hosts), body_deadline, peer: None, health_only: false }
    }

    /// The service of one connection, whose requests came from `peer`.
    pub(super) fn for_connection(&self, peer: Peer) -> Self {
        Self { peer: Some(peer), ..self.clone() }
    }

    /// The same, answering `/healthz` only: for a connection past the cap.
    pub(super) fn health_only(mut self) -> Self {
        self.health_only = true;
        self
    }

    fn refusal(&self, request: &Request<Body>) -> Option<ApiError> {
        if self.health_only && request.uri().path() != "/healthz" {
            return Some(ApiError::overloaded());
        }
        browser::check(&self.hosts, request).err().map(ApiError::from)
    }
}

impl<B> Service<Request<B>> for Front
where
    B: http_body::Body<Data = Bytes> + Send + Unpin + 'static,
    B::Error: Into<axum::BoxError>,
{
    type Response = Response;
    type Error = Infallible;
    type Future = FrontFuture;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request<B>) -> FrontFuture {
        let deadline = self.body_deadline;
        let mut request = request.map(|body| Body::new(Deadline::new(body, deadline)));
        if let Some(peer) = self.peer {
            request.extensions_mut().insert(peer);
        }
        match self.refusal(&request) {
            Some(refusal) => FrontFuture::Answered(Some(refusal.into_response())),
            None => FrontFuture::Routed(self.routes.call(request)),
        }
    }
}

/// A route's answer, or the refusal given in its place; either way marked `no-store`.
pub(crate) enum FrontFuture {
    Answered(Option<Response>),
    Routed(RouteFuture<Infallible>),
}

impl Future for FrontFuture {
    type Output = Result<Response, Infallible>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        // Both variants are `Unpin` (a route's future is boxed inside axum).
        let mut response = match self.get_mut() {
            // Polled again after it answered (a caller's contract breach): an empty answer, no panic.
            Self::Answered(answer) => answer.take().unwrap_or_default(),
            Self::Routed(routed) => match Pin::new(routed).poll(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(Ok(response)) => response,
                Poll::Ready(Err(never)) => match never {},
            },
        };
        response.headers_mut().entry(header::CACHE_CONTROL).or_insert(HeaderValue::from_static("no-store"));
        Poll::Ready(Ok(response))
    }
}
