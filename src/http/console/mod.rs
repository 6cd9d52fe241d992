//! The operator console at `/ui`: server-rendered HTML (maud) over the same service calls
//! the JSON API makes, with its stylesheet and one small script embedded in the binary.
//! It authenticates once with a token (`session.rs`), then by a signed cookie; every
//! form carries a CSRF token; every answer carries a strict Content-Security-Policy.

mod actions;
mod assets;
mod batches;
mod ended;
mod evaluations;
mod extractions;
mod form;
mod layout;
mod login;
mod operations;
mod overview;
mod session;
mod svg;
mod viewer;

use std::sync::Arc;

use axum::Router;
use axum::handler::Handler;
use axum::http::{HeaderValue, Method, header};
use axum::routing::{get, post};

use crate::http::access::Access;
use crate::service::Service;
use session::SessionKey;

/// What every console handler needs besides the service.
#[derive(Debug)]
pub(super) struct Console {
    access: Arc<Access>,
    /// The store's own console secret, which session keys are derived from.
    secret: [u8; 32],
    ended: ended::Ended,
}

impl Console {
    /// The key sessions are signed with now: it changes with the tokens and the epoch.
    fn key(&self) -> SessionKey {
        SessionKey::new(self.secret, self.access.policy().fingerprint(), self.ended.epoch())
    }
}

/// No script or style but our own files, no framing, forms post only here.
/// `connect-src 'self'`: the script's quiet refresh reads the same page again.
const CSP: &str = "default-src 'none'; style-src 'self'; script-src 'self'; img-src 'self' data:; \
     connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'";

pub(super) fn router(service: &Service, access: Arc<Access>) -> Router<Service> {
    let secret = service.store().cursor_key().derive("console session");
    let console = Arc::new(Console { access, secret, ended: ended::Ended::default() });
    routes().router.layer(axum::middleware::map_response(secure_headers)).layer(axum::Extension(console))
}

/// Every console route as (method, path), from the same calls that build the router.
#[cfg(feature = "fuzzing")]
pub(super) fn table() -> Vec<(Method, &'static str)> {
    routes().table
}

fn routes() -> Routes {
    Routes::default()
        .get("/ui", overview::show)
        .get("/ui/", overview::show)
        .get("/ui/login", login::form)
        .post("/ui/login", login::submit)
        .post("/ui/logout", login::logout)
        .get("/ui/extractions", extractions::list)
        .get("/ui/extractions/{id}", extractions::detail)
        .post("/ui/extractions/{id}/retry", actions::retry)
        .post("/ui/extractions/{id}/cancel", actions::cancel)
        .post("/ui/retry", actions::retry_matching)
        .get("/ui/batches", batches::list)
        .get("/ui/batches/{seq}", batches::detail)
        .get("/ui/evaluations", evaluations::list)
        .get("/ui/evaluations/{name}", evaluations::detail)
        .post("/ui/evaluations/{name}/promote", evaluations::promote)
        .post("/ui/evaluations/{name}/cancel", evaluations::cancel)
        .get("/ui/costs", operations::costs)
        .get("/ui/dead-letters", operations::dead_letters)
        .post("/ui/dead-letters/{seq}/redeliver", actions::redeliver)
        .post("/ui/providers/{name}/pause", actions::pause)
        .post("/ui/providers/{name}/resume", actions::resume)
        .post("/ui/sinks/{name}/enable", actions::enable_sink)
        .get("/ui/assets/{file}", assets::serve)
}

/// The console's router and the list of what it routes, grown together, so that a test
/// can reach every route (the API's list is its OpenAPI document).
#[derive(Default)]
struct Routes {
    router: Router<Service>,
    table: Vec<(Method, &'static str)>,
}

impl Routes {
    fn get<H: Handler<T, Service>, T: 'static>(mut self, path: &'static str, handler: H) -> Self {
        self.table.push((Method::GET, path));
        self.router = self.router.route(path, get(handler));
        self
    }

    fn post<H: Handler<T, Service>, T: 'static>(mut self, path: &'static str, handler: H) -> Self {
        self.table.push((Method::POST, path));
        self.router = self.router.route(path, post(handler));
        self
    }
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
