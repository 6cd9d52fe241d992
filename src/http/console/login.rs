//! `/ui/login`: the token is asked for once and checked by the API's own access policy;
//! a session cookie follows. The form itself carries a CSRF token bound to a nonce
//! cookie. Without an admin token (a loopback-only server) the console is open and the
//! login page hands out an open session at once.

use std::sync::Arc;

use super::form::FormBody;
use axum::Extension;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{Html, IntoResponse, Redirect, Response};
use maud::html;
use serde::Deserialize;

use super::Console;
use super::layout::Problem;
use super::session::{LOGIN_COOKIE, clear_cookie, cookie_value, set_cookie, set_login_cookie};
use super::viewer::Viewer;
use crate::http::ApiError;
use crate::http::access::{Caller, Refused};
use crate::http::conn::Peer;
use crate::http::guesses::Via;

pub(super) async fn form(Extension(console): Extension<Arc<Console>>) -> Response {
    if console.access.policy().is_open() {
        return start(&console, Caller::Open);
    }
    login_page(&console, StatusCode::OK, None)
}

#[derive(Debug, Deserialize)]
pub(super) struct LoginForm {
    #[serde(default)]
    token: String,
    csrf: Option<String>,
}

pub(super) async fn submit(
    Extension(console): Extension<Arc<Console>>,
    peer: Option<Extension<Peer>>,
    headers: HeaderMap,
    FormBody(form): FormBody<LoginForm>,
) -> Response {
    let cookies = headers.get_all(header::COOKIE).iter().filter_map(|v| v.to_str().ok());
    let now = crate::domain::clock::now_ms();
    let fresh = match (cookie_value(cookies, LOGIN_COOKIE), form.csrf.as_deref()) {
        (Some(cookie), Some(csrf)) => console.key().login_csrf_matches(cookie, csrf, now),
        _ => false,
    };
    if !fresh {
        return Problem::forbidden("the login form's CSRF token is missing or stale; open /ui/login again")
            .into_response();
    }
    let who = peer.map(|Extension(p)| p.remote.ip());
    match console.access.authenticate(Some(&format!("Bearer {}", form.token)), who, Via::Login) {
        Ok(Caller::Worker(_)) => login_page(
            &console,
            StatusCode::FORBIDDEN,
            Some("A worker token only claims work and posts results; it cannot open the console."),
        ),
        Ok(caller) => start(&console, caller),
        Err(Refused::Denied(_)) => {
            login_page(&console, StatusCode::UNAUTHORIZED, Some("That token is not valid here."))
        }
        Err(refused @ Refused::Throttled(_)) => Problem::from(ApiError::from(refused)).into_response(),
    }
}

#[derive(Debug, Deserialize)]
pub(super) struct LogoutForm {
    csrf: Option<String>,
}

pub(super) async fn logout(viewer: Viewer, FormBody(form): FormBody<LogoutForm>) -> Result<Response, Problem> {
    viewer.check_csrf(form.csrf.as_deref())?;
    // Clearing the cookie is for this browser; ending the session is for every copy of it.
    viewer.end();
    Ok(([(header::SET_COOKIE, clear_cookie())], Redirect::to("/ui/login")).into_response())
}

fn start(console: &Console, caller: Caller) -> Response {
    let home = if caller.require_admin().is_ok() { "/ui" } else { "/ui/extractions" };
    let (value, _) = console.key().issue(caller, crate::domain::clock::now_ms());
    ([(header::SET_COOKIE, set_cookie(&value))], Redirect::to(home)).into_response()
}

fn login_page(console: &Console, status: StatusCode, error: Option<&str>) -> Response {
    let (nonce, csrf) = console.key().issue_login(crate::domain::clock::now_ms());
    let page = html! {
        (maud::DOCTYPE)
        html lang="en" {
            head {
                meta charset="utf-8";
                meta name="viewport" content="width=device-width, initial-scale=1";
                title { "Log in · commitpoint" }
                link rel="stylesheet" href=(super::assets::CSS_PATH);
            }
            body {
                main.login {
                    h1 { "commitpoint console" }
                    @if let Some(error) = error { p.problem id="login-error" { (error) } }
                    form method="post" action="/ui/login" {
                        input type="hidden" name="csrf" value=(csrf);
                        label for="token" { "Admin or tenant token" }
                        input type="password" id="token" name="token" autocomplete="current-password" required autofocus;
                        button type="submit" id="login" { "Log in" }
                    }
                }
            }
        }
    };
    (status, [(header::SET_COOKIE, set_login_cookie(&nonce))], Html(page.into_string())).into_response()
}
