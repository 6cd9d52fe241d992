//! Request extractors whose every rejection is a JSON error body, never axum's plain text.

use axum::body::Bytes;
use axum::extract::{FromRequest, FromRequestParts, Path, Query, Request};
use axum::http::StatusCode;
use axum::http::request::Parts;
use serde::de::DeserializeOwned;

use super::body::{self, BodyError, BodyLimits};
use super::error::ApiError;
use crate::domain::identity::ExtractionId;

/// A JSON body, which must say so: `Content-Type: application/json` (or a `+json` type).
/// A page on another site can send `text/plain` or a form without a CORS preflight, never
/// JSON, so this is what keeps it from planting work (415 otherwise, before a byte is
/// read). Syntax errors (including invalid UTF-8) are 400, well-formed JSON of the wrong
/// shape is 422, an oversized body is 413.
#[derive(Debug)]
pub(crate) struct JsonBody<T>(pub T);

impl<S: Send + Sync, T: DeserializeOwned> FromRequest<S> for JsonBody<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, Self::Rejection> {
        check_json(req.headers())?;
        let RawBody(bytes) = RawBody::from_request(req, state).await?;
        serde_json::from_slice(&bytes).map(JsonBody).map_err(|e| {
            if e.is_data() {
                ApiError::new(StatusCode::UNPROCESSABLE_ENTITY, "invalid_input", e.to_string())
            } else {
                ApiError::bad_request("malformed_json", format!("the body is not valid JSON: {e}"))
            }
        })
    }
}

fn check_json(headers: &axum::http::HeaderMap) -> Result<(), BodyError> {
    let value = headers.get(axum::http::header::CONTENT_TYPE);
    let text = value.and_then(|v| v.to_str().ok()).unwrap_or("");
    let essence = text.split(';').next().unwrap_or("").trim();
    let (kind, subtype) = essence.split_once('/').unwrap_or((essence, ""));
    let json = kind.eq_ignore_ascii_case("application")
        && (subtype.eq_ignore_ascii_case("json")
            || subtype.len() > 5
                && subtype.get(subtype.len() - 5..).is_some_and(|suffix| suffix.eq_ignore_ascii_case("+json")));
    if json {
        Ok(())
    } else {
        Err(BodyError::NotJson(if value.is_some() { text.to_string() } else { "(none)".into() }))
    }
}

/// The body bytes, decoded, within the route's [`BodyLimits`], with JSON rejections.
#[derive(Debug)]
pub(super) struct RawBody(pub Bytes);

impl<S: Send + Sync> FromRequest<S> for RawBody {
    type Rejection = ApiError;

    async fn from_request(req: Request, _state: &S) -> Result<Self, Self::Rejection> {
        let limits = req.extensions().get::<BodyLimits>().copied().unwrap_or_default();
        let (parts, body) = req.into_parts();
        let bytes = body::read(&parts.headers, body, limits.max_bytes, "--max-body-bytes").await?;
        Ok(RawBody(bytes))
    }
}

/// Query parameters with a JSON rejection.
#[derive(Debug)]
pub(crate) struct QueryParams<T>(pub T);

impl<S: Send + Sync, T: DeserializeOwned> FromRequestParts<S> for QueryParams<T> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        Query::<T>::from_request_parts(parts, state)
            .await
            .map(|Query(q)| QueryParams(q))
            .map_err(|e| ApiError::bad_request("invalid_query", e.body_text()))
    }
}

/// An extraction id from the path, as 64 lowercase hex characters.
#[derive(Debug)]
pub(crate) struct IdPath(pub ExtractionId);

impl<S: Send + Sync> FromRequestParts<S> for IdPath {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        let Path(raw) = Path::<String>::from_request_parts(parts, state)
            .await
            .map_err(|e| ApiError::bad_request("invalid_id", e.body_text()))?;
        raw.parse().map(IdPath).map_err(|e| ApiError::bad_request("invalid_id", format!("{raw:?}: {e}")))
    }
}

/// A name from the path (tenant, provider, sink, webhook, backup), with a JSON rejection.
#[derive(Debug)]
pub(super) struct NamePath(pub String);

impl<S: Send + Sync> FromRequestParts<S> for NamePath {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        Path::<String>::from_request_parts(parts, state)
            .await
            .map(|Path(name)| NamePath(name))
            .map_err(|e| ApiError::bad_request("invalid_path", e.body_text()))
    }
}

/// An outbox event id from the path: a decimal number.
#[derive(Debug)]
pub(super) struct SeqPath(pub u64);

impl<S: Send + Sync> FromRequestParts<S> for SeqPath {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        let Path(raw) = Path::<String>::from_request_parts(parts, state)
            .await
            .map_err(|e| ApiError::bad_request("invalid_id", e.body_text()))?;
        raw.parse().ok().filter(|_| raw.bytes().all(|b| b.is_ascii_digit())).map(SeqPath).ok_or_else(|| {
            ApiError::bad_request("invalid_id", format!("{raw:?} is not an event id (a decimal number)"))
        })
    }
}
