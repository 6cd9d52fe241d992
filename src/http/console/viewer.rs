//! Who is looking: the session cookie, verified, as an extractor. Without a valid
//! session a page redirects to the login form and a form post is refused (403), so a
//! cross-site post can never act with an operator's rights.

use std::sync::Arc;

use axum::extract::FromRequestParts;
use axum::http::request::Parts;
use axum::http::{Method, StatusCode, header};
use axum::response::{IntoResponse, Redirect, Response};
use maud::{Markup, html};

use super::Console;
use super::layout::Problem;
use super::session::{COOKIE, Session, SessionKey, cookie_value};
use crate::http::access::Caller;

#[derive(Debug, Clone)]
pub(super) struct Viewer {
    pub(super) session: Session,
    pub(super) console: Arc<Console>,
    key: SessionKey,
}

impl Viewer {
    pub(super) fn is_admin(&self) -> bool {
        self.session.caller.require_admin().is_ok()
    }

    /// Admin pages and actions only (the API's admin group).
    pub(super) fn require_admin(&self) -> Result<(), Problem> {
        Ok(self.session.caller.require_admin()?)
    }

    pub(super) fn csrf(&self) -> String {
        self.key.csrf(&self.session)
    }

    /// The hidden field every form carries.
    pub(super) fn csrf_field(&self) -> Markup {
        html! { input type="hidden" name="csrf" value=(self.csrf()); }
    }

    /// Refuses a post whose CSRF token is missing or not this session's.
    pub(super) fn check_csrf(&self, presented: Option<&str>) -> Result<(), Problem> {
        match presented {
            Some(token) if self.key.csrf_matches(&self.session, token) => Ok(()),
            _ => Err(Problem::forbidden("the form's CSRF token is missing or stale; reload the page and try again")),
        }
    }

    /// The tenant this viewer is confined to, if any.
    pub(super) fn tenant_scope(&self) -> Option<&str> {
        self.session.caller.tenant_scope()
    }

    pub(super) fn caller(&self) -> &Caller {
        &self.session.caller
    }

    /// Ends this session: its cookie is refused from now on, wherever it was copied to.
    pub(super) fn end(&self) {
        self.console.ended.end(&self.session.id, self.session.expires_ms, crate::domain::clock::now_ms());
    }
}

/// Why a request has no viewer.
#[derive(Debug)]
pub(super) enum NoSession {
    Login,
    Refused,
    Misconfigured,
}

impl IntoResponse for NoSession {
    fn into_response(self) -> Response {
        match self {
            NoSession::Login => Redirect::to("/ui/login").into_response(),
            NoSession::Refused => {
                Problem::new(StatusCode::FORBIDDEN, "no console session: log in at /ui/login first").into_response()
            }
            NoSession::Misconfigured => {
                Problem::new(StatusCode::INTERNAL_SERVER_ERROR, "the console is not set up on this router")
                    .into_response()
            }
        }
    }
}

impl<S: Send + Sync> FromRequestParts<S> for Viewer {
    type Rejection = NoSession;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, Self::Rejection> {
        let console = parts.extensions.get::<Arc<Console>>().cloned().ok_or(NoSession::Misconfigured)?;
        let cookies = parts.headers.get_all(header::COOKIE).iter().filter_map(|v| v.to_str().ok());
        let now = crate::domain::clock::now_ms();
        let key = console.key();
        let session = cookie_value(cookies, COOKIE).and_then(|value| key.verify(value, now));
        match session.filter(|s| !console.ended.contains(&s.id)) {
            Some(session) => Ok(Viewer { session, console, key }),
            None if parts.method == Method::GET || parts.method == Method::HEAD => Err(NoSession::Login),
            None => Err(NoSession::Refused),
        }
    }
}
