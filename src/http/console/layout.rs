//! The page shell (navigation, the session's logout form) and the HTML error page every
//! console refusal renders, with the status the JSON API would answer.

use axum::http::StatusCode;
use axum::response::{Html, IntoResponse, Response};
use maud::{DOCTYPE, Markup, html};

use super::viewer::Viewer;
use crate::http::ApiError;
use crate::http::access::Caller;

/// A console refusal: rendered as a page with its status.
#[derive(Debug)]
pub(super) struct Problem {
    pub(super) status: StatusCode,
    pub(super) message: String,
    /// `Retry-After` seconds, as the API's answer would carry.
    retry_after: Option<u64>,
}

impl Problem {
    pub(super) fn new(status: StatusCode, message: impl Into<String>) -> Self {
        Self { status, message: message.into(), retry_after: None }
    }

    pub(super) fn forbidden(message: impl Into<String>) -> Self {
        Self::new(StatusCode::FORBIDDEN, message)
    }
}

impl From<ApiError> for Problem {
    fn from(e: ApiError) -> Self {
        Self { retry_after: e.retry_after(), ..Self::new(e.status(), e.message()) }
    }
}

impl From<crate::service::Error> for Problem {
    fn from(e: crate::service::Error) -> Self {
        ApiError::from(e).into()
    }
}

impl From<crate::http::access::Denied> for Problem {
    fn from(e: crate::http::access::Denied) -> Self {
        Self::forbidden(e.to_string())
    }
}

impl IntoResponse for Problem {
    fn into_response(self) -> Response {
        let title = self.status.canonical_reason().unwrap_or("Error");
        let body = shell(
            title,
            None,
            html! {
                h1 { (self.status.as_u16()) " " (title) }
                p.problem { (self.message) }
                p { a href="/ui" { "Back to the overview" } }
            },
        );
        let mut response = (self.status, body).into_response();
        if let Some(seconds) = self.retry_after {
            response.headers_mut().insert(axum::http::header::RETRY_AFTER, axum::http::HeaderValue::from(seconds));
        }
        response
    }
}

pub(super) type PageResult = Result<Html<String>, Problem>;

/// A whole page: head, navigation for who is looking, and `content`.
pub(super) fn page(title: &str, viewer: &Viewer, content: Markup) -> Html<String> {
    shell(title, Some(viewer), content)
}

fn shell(title: &str, viewer: Option<&Viewer>, content: Markup) -> Html<String> {
    let markup = html! {
        (DOCTYPE)
        html lang="en" {
            head {
                meta charset="utf-8";
                meta name="viewport" content="width=device-width, initial-scale=1";
                title { (title) " · commitpoint" }
                link rel="stylesheet" href=(super::assets::CSS_PATH);
                script src=(super::assets::JS_PATH) defer {}
            }
            body {
                header.top {
                    a.brand href="/ui" { "commitpoint" }
                    @if let Some(viewer) = viewer {
                        nav {
                            @if viewer.is_admin() { a href="/ui" { "Overview" } }
                            a href="/ui/extractions" { "Extractions" }
                            @if viewer.is_admin() { a href="/ui/batches" { "Batches" } }
                            @if viewer.is_admin() { a href="/ui/evaluations" { "Evaluations" } }
                            a href="/ui/costs" { "Costs" }
                            @if viewer.is_admin() { a href="/ui/dead-letters" { "Dead letters" } }
                        }
                        span.who {
                            (match &viewer.session.caller {
                                Caller::Open => "open (loopback)".to_string(),
                                Caller::Admin => "admin".to_string(),
                                Caller::Tenant(t) => format!("tenant {t}"),
                                Caller::Worker(w) => format!("worker {}", w.name),
                            })
                        }
                        @if !matches!(viewer.session.caller, Caller::Open) {
                            form.inline method="post" action="/ui/logout" {
                                (viewer.csrf_field())
                                button type="submit" { "Log out" }
                            }
                        }
                    }
                }
                main { (content) }
            }
        }
    };
    Html(markup.into_string())
}

/// A Unix ms time as RFC 3339 (UTC).
pub(super) fn when(ms: u64) -> String {
    crate::domain::clock::format_ms(ms)
}

/// A duration in seconds as the largest two units (`3h 12m`).
pub(super) fn age(seconds: u64) -> String {
    let (d, h, m, s) = (seconds / 86_400, seconds / 3600 % 24, seconds / 60 % 60, seconds % 60);
    match (d, h, m) {
        (0, 0, 0) => format!("{s}s"),
        (0, 0, _) => format!("{m}m {s}s"),
        (0, _, _) => format!("{h}h {m}m"),
        _ => format!("{d}d {h}h"),
    }
}

pub(super) use crate::engine::ledger::dollars;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ages_and_money_read_well() {
        assert_eq!(age(42), "42s");
        assert_eq!(age(3 * 3600 + 12 * 60 + 5), "3h 12m");
        assert_eq!(age(2 * 86_400 + 3600), "2d 1h");
        assert_eq!(dollars(1_234_567), "$1.234567");
    }
}
