//! The console's form posts: each checks the session's CSRF token, then makes the same
//! service call as its API endpoint, with the same access rule (admin actions need an
//! admin session; cancel reaches only the caller's own tenant), and redirects back.

use super::form::FormBody;
use axum::extract::{Path, State};
use axum::response::Redirect;
use serde::Deserialize;

use super::layout::Problem;
use super::viewer::Viewer;
use crate::domain::identity::ExtractionId;
use crate::domain::lifecycle::FailureClass;
use crate::service::Service;
use crate::store::RetryFilter;

type Done = Result<Redirect, Problem>;

#[derive(Debug, Deserialize)]
pub(super) struct Csrf {
    csrf: Option<String>,
}

fn id_of(raw: &str) -> Result<ExtractionId, Problem> {
    raw.parse().map_err(|e| Problem::new(axum::http::StatusCode::BAD_REQUEST, format!("{raw:?}: {e}")))
}

fn back_to(id: &ExtractionId) -> Redirect {
    Redirect::to(&format!("/ui/extractions/{}", id.to_hex()))
}

pub(super) async fn retry(
    State(service): State<Service>,
    viewer: Viewer,
    Path(raw): Path<String>,
    FormBody(form): FormBody<Csrf>,
) -> Done {
    viewer.check_csrf(form.csrf.as_deref())?;
    viewer.require_admin()?;
    let id = id_of(&raw)?;
    service.retry(id).await?;
    Ok(back_to(&id))
}

pub(super) async fn cancel(
    State(service): State<Service>,
    viewer: Viewer,
    Path(raw): Path<String>,
    FormBody(form): FormBody<Csrf>,
) -> Done {
    viewer.check_csrf(form.csrf.as_deref())?;
    let id = id_of(&raw)?;
    let record = service.get(id).await?;
    if viewer.caller().may_reach(&record.tenant).is_err() {
        return Err(crate::service::Error::NotFound(id).into());
    }
    service.cancel(id).await?;
    Ok(back_to(&id))
}

#[derive(Debug, Deserialize)]
pub(super) struct RetryMatching {
    csrf: Option<String>,
    tenant: Option<String>,
    schema: Option<String>,
    failure_class: Option<String>,
}

pub(super) async fn retry_matching(
    State(service): State<Service>,
    viewer: Viewer,
    FormBody(form): FormBody<RetryMatching>,
) -> Done {
    viewer.check_csrf(form.csrf.as_deref())?;
    viewer.require_admin()?;
    let given = |v: Option<String>| v.filter(|v| !v.trim().is_empty());
    let failure_class = match given(form.failure_class) {
        None => None,
        Some(c) => Some(FailureClass::ALL.into_iter().find(|f| f.as_str() == c).ok_or_else(|| {
            Problem::new(axum::http::StatusCode::BAD_REQUEST, format!("{c:?} is not a failure class"))
        })?),
    };
    let tenant = given(form.tenant);
    let schema = given(form.schema);
    let filter = RetryFilter { tenant: tenant.clone(), schema: schema.clone(), failure_class };
    service.retry_failed(filter, None).await?;
    let query = super::extractions::url_pairs(&[
        ("state", Some("pending")),
        ("tenant", tenant.as_deref()),
        ("schema", schema.as_deref()),
    ]);
    Ok(Redirect::to(&format!("/ui/extractions?{query}")))
}

async fn set_paused(service: &Service, viewer: &Viewer, name: &str, csrf: Option<&str>, paused: bool) -> Done {
    viewer.check_csrf(csrf)?;
    viewer.require_admin()?;
    // The console is a browser: on a server without tokens a pause is refused here as it
    // is from any page (`browser.rs`), since nobody had to prove who they are.
    if paused && matches!(viewer.caller(), crate::http::access::Caller::Open) {
        return Err(crate::http::ApiError::from(crate::http::refusal::Refusal::TokenRequired).into());
    }
    service.set_provider_paused(name, paused).await?;
    Ok(Redirect::to("/ui"))
}

pub(super) async fn pause(
    State(service): State<Service>,
    viewer: Viewer,
    Path(name): Path<String>,
    FormBody(form): FormBody<Csrf>,
) -> Done {
    set_paused(&service, &viewer, &name, form.csrf.as_deref(), true).await
}

pub(super) async fn resume(
    State(service): State<Service>,
    viewer: Viewer,
    Path(name): Path<String>,
    FormBody(form): FormBody<Csrf>,
) -> Done {
    set_paused(&service, &viewer, &name, form.csrf.as_deref(), false).await
}

pub(super) async fn redeliver(
    State(service): State<Service>,
    viewer: Viewer,
    Path(seq): Path<u64>,
    FormBody(form): FormBody<Csrf>,
) -> Done {
    viewer.check_csrf(form.csrf.as_deref())?;
    viewer.require_admin()?;
    service.redeliver(seq).await?;
    Ok(Redirect::to("/ui/dead-letters"))
}

pub(super) async fn enable_sink(
    State(service): State<Service>,
    viewer: Viewer,
    Path(name): Path<String>,
    FormBody(form): FormBody<Csrf>,
) -> Done {
    viewer.check_csrf(form.csrf.as_deref())?;
    viewer.require_admin()?;
    service.enable_sink(&name).await?;
    Ok(Redirect::to("/ui/dead-letters"))
}
