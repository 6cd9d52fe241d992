//! The stylesheet and the script, compiled into the binary: the console needs no network
//! and no build chain. Their paths carry the package version, so they can be cached for
//! a year and a new release still loads its own.

use axum::extract::Path;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};

const CSS: &str = include_str!("assets/console.css");
const JS: &str = include_str!("assets/console.js");

pub(super) const CSS_PATH: &str = concat!("/ui/assets/console-", env!("CARGO_PKG_VERSION"), ".css");
pub(super) const JS_PATH: &str = concat!("/ui/assets/console-", env!("CARGO_PKG_VERSION"), ".js");

pub(super) async fn serve(Path(file): Path<String>) -> Response {
    let (body, kind) = match format!("/ui/assets/{file}") {
        path if path == CSS_PATH => (CSS, "text/css; charset=utf-8"),
        path if path == JS_PATH => (JS, "text/javascript; charset=utf-8"),
        _ => return super::layout::Problem::new(StatusCode::NOT_FOUND, "no such asset").into_response(),
    };
    let mut response = body.into_response();
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(kind));
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("public, max-age=31536000, immutable"));
    response
}
