//! The one mapping from errors to HTTP: status, stable code, message, optional details,
//! in one body shape. Handlers return `ApiError`: the layers' errors map here, and a
//! handler builds one itself only for a condition no lower layer knows (a bad webhook
//! signature, an unknown backup name, metrics that are unavailable).

use axum::Json;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::Serialize;
use serde_json::{Value, json};
use utoipa::ToSchema;

use super::body::BodyError;
use super::refusal::Refusal;
use crate::domain::lifecycle::TransitionError;
use crate::{domain::schema, service, store};

#[derive(Debug)]
pub(crate) struct ApiError {
    status: StatusCode,
    code: &'static str,
    message: String,
    details: Option<Value>,
    challenge: bool,
    /// Seconds for a `Retry-After` header.
    retry_after: Option<u64>,
}

impl ApiError {
    pub(crate) fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> Self {
        Self { status, code, message: message.into(), details: None, challenge: false, retry_after: None }
    }

    /// 429 with `Retry-After`: too many wrong tokens or logins from this address.
    pub(crate) fn rate_limited(wait: std::time::Duration) -> Self {
        let seconds = wait.as_secs() + u64::from(wait.subsec_nanos() > 0);
        Self {
            retry_after: Some(seconds),
            ..Self::new(
                StatusCode::TOO_MANY_REQUESTS,
                "rate_limited",
                format!("too many wrong tokens from this address; try again in {seconds} s"),
            )
        }
    }

    /// The `Retry-After` seconds, for the console's pages.
    pub(crate) fn retry_after(&self) -> Option<u64> {
        self.retry_after
    }

    /// The status and message, for the console's HTML error pages (the same mapping).
    pub(crate) fn status(&self) -> StatusCode {
        self.status
    }

    pub(crate) fn message(&self) -> &str {
        &self.message
    }

    /// 401 with the `WWW-Authenticate: Bearer` challenge.
    pub(crate) fn unauthenticated(message: impl Into<String>) -> Self {
        Self { challenge: true, ..Self::new(StatusCode::UNAUTHORIZED, "unauthenticated", message) }
    }

    fn with_retry_after(mut self, seconds: u64) -> Self {
        self.retry_after = Some(seconds);
        self
    }

    fn with_details(mut self, details: Value) -> Self {
        self.details = Some(details);
        self
    }

    pub(crate) fn bad_request(code: &'static str, message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, code, message)
    }

    pub(crate) fn not_found_route() -> Self {
        Self::new(StatusCode::NOT_FOUND, "not_found", "no such endpoint; see docs/API.md")
    }

    pub(crate) fn method_not_allowed() -> Self {
        Self::new(StatusCode::METHOD_NOT_ALLOWED, "method_not_allowed", "this endpoint does not accept that method")
    }

    /// Past the connection cap: only `/healthz` is answered.
    pub(crate) fn overloaded() -> Self {
        Self::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "overloaded",
            "the server is at its connection limit (server.max_connections); retry shortly",
        )
    }
}

impl From<BodyError> for ApiError {
    fn from(e: BodyError) -> Self {
        let message = e.to_string();
        match e {
            BodyError::TooLarge { .. } => Self::new(StatusCode::PAYLOAD_TOO_LARGE, "payload_too_large", message),
            BodyError::TimedOut(_) => Self::new(StatusCode::REQUEST_TIMEOUT, "body_timeout", message),
            BodyError::UnsupportedEncoding(_) => {
                Self::new(StatusCode::UNSUPPORTED_MEDIA_TYPE, "unsupported_encoding", message)
            }
            BodyError::NotJson(_) => Self::new(StatusCode::UNSUPPORTED_MEDIA_TYPE, "unsupported_media_type", message),
            BodyError::BadGzip(_) => Self::bad_request("malformed_encoding", message),
            BodyError::Unreadable(_) => Self::bad_request("unreadable_body", message),
        }
    }
}

impl From<Refusal> for ApiError {
    fn from(e: Refusal) -> Self {
        let message = e.to_string();
        match e {
            Refusal::UnknownHost(_) => Self::new(StatusCode::MISDIRECTED_REQUEST, "unknown_host", message),
            Refusal::CrossSite(_) => Self::new(StatusCode::FORBIDDEN, "cross_site", message),
            Refusal::TokenRequired => Self::new(StatusCode::FORBIDDEN, "token_required", message),
        }
    }
}

/// The body of every error response.
#[derive(Debug, Serialize, ToSchema)]
#[schema(example = json!({"error": {"code": "not_found", "message": "no extraction with id 3f…"}}))]
pub(super) struct ErrorBody {
    error: ErrorDetail,
}

#[derive(Debug, Serialize, ToSchema)]
pub(super) struct ErrorDetail {
    /// A stable, machine-readable code such as `invalid_input` or `stale_lease`.
    code: &'static str,
    /// What went wrong and what to do about it.
    message: String,
    /// More about some errors: `field` for `invalid_input`, `issues` for `validation_failed` and `reasked` (which also gives `reask`).
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Object, required = false)]
    details: Option<Value>,
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = ErrorBody { error: ErrorDetail { code: self.code, message: self.message, details: self.details } };
        let mut response = (self.status, Json(body)).into_response();
        if self.challenge {
            response
                .headers_mut()
                .insert(axum::http::header::WWW_AUTHENTICATE, axum::http::HeaderValue::from_static("Bearer"));
        }
        if let Some(seconds) = self.retry_after {
            response.headers_mut().insert(axum::http::header::RETRY_AFTER, axum::http::HeaderValue::from(seconds));
        }
        response
    }
}

impl From<service::Error> for ApiError {
    fn from(e: service::Error) -> Self {
        use service::Error as E;
        let message = e.to_string();
        match e {
            E::InvalidInput { field, .. } => Self::new(StatusCode::UNPROCESSABLE_ENTITY, "invalid_input", message)
                .with_details(json!({ "field": field })),
            E::Schema(schema::Error::Unknown(_) | schema::Error::BadName(_)) => {
                Self::new(StatusCode::UNPROCESSABLE_ENTITY, "unknown_schema", message)
            }
            E::Schema(_) => Self::new(StatusCode::INTERNAL_SERVER_ERROR, "schema_unavailable", message),
            E::NotFound(_) => Self::new(StatusCode::NOT_FOUND, "not_found", message),
            E::InvalidCursor => Self::new(StatusCode::BAD_REQUEST, "invalid_cursor", message),
            E::TooManyFindings { count, max } => {
                Self::new(StatusCode::UNPROCESSABLE_ENTITY, "too_many_findings", message)
                    .with_details(json!({ "count": count, "max": max }))
            }
            E::UnknownProvider(_) => Self::new(StatusCode::NOT_FOUND, "unknown_provider", message),
            E::UnknownWebhook(_) => Self::new(StatusCode::NOT_FOUND, "unknown_webhook", message),
            E::UnknownEvaluation(_) => Self::new(StatusCode::NOT_FOUND, "unknown_evaluation", message),
            E::EvaluationExists(_) => Self::new(StatusCode::CONFLICT, "evaluation_exists", message),
            E::UnknownEvent(_) => Self::new(StatusCode::NOT_FOUND, "unknown_event", message),
            E::Transition(t) => transition(&t, message),
            E::ValidationFailed { issues, .. } => {
                Self::new(StatusCode::UNPROCESSABLE_ENTITY, "validation_failed", message)
                    .with_details(json!({ "issues": issues }))
            }
            E::Reasked { issues, reask, .. } => Self::new(StatusCode::UNPROCESSABLE_ENTITY, "reasked", message)
                .with_details(json!({ "issues": issues, "reask": reask })),
            E::MetadataTooLarge { bytes, max } => {
                Self::new(StatusCode::PAYLOAD_TOO_LARGE, "metadata_too_large", message)
                    .with_details(json!({ "field": "metadata", "bytes": bytes, "max": max }))
            }
            E::TooManyExports { cap, limit } => {
                let (status, code) = match cap {
                    service::ExportCap::Tenant => (StatusCode::TOO_MANY_REQUESTS, "too_many_exports"),
                    service::ExportCap::Server => (StatusCode::SERVICE_UNAVAILABLE, "exports_busy"),
                };
                Self::new(status, code, message)
                    .with_details(json!({ "limit": limit }))
                    .with_retry_after(EXPORT_RETRY_AFTER_SECONDS)
            }
            E::UnknownSource { .. } => Self::new(StatusCode::NOT_FOUND, "unknown_source", message),
            E::NotComparable(_) => Self::new(StatusCode::CONFLICT, "not_comparable", message),
            E::Store(s) => storage(&s),
        }
    }
}

/// What a refused export is told to wait: exports end when read or when their client
/// stalls, so a place is usually free within seconds.
const EXPORT_RETRY_AFTER_SECONDS: u64 = 5;

fn transition(e: &TransitionError, message: String) -> ApiError {
    let code = match e {
        TransitionError::StaleLease => "stale_lease",
        TransitionError::StaleBatch => "stale_batch",
        TransitionError::LeaseHeld { .. } => "lease_held",
        TransitionError::Illegal { .. } => "illegal_transition",
    };
    ApiError::new(StatusCode::CONFLICT, code, message)
}

fn storage(e: &store::Error) -> ApiError {
    // The full chain goes to the log; the client gets the operator-facing summary.
    tracing::error!(error = %crate::store::error_chain(e), "store error");
    match e {
        store::Error::NotOnBackend { .. } => {
            ApiError::new(StatusCode::NOT_IMPLEMENTED, "not_on_backend", e.to_string())
        }
        store::Error::Halted { .. } | store::Error::Postgres { .. } | store::Error::NotDriving { .. } => {
            ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "store_unavailable", e.to_string())
        }
        store::Error::Closing => ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "shutting_down", e.to_string()),
        store::Error::Conflict { .. } => ApiError::new(StatusCode::CONFLICT, "write_conflict", e.to_string()),
        store::Error::TargetExists { .. } => ApiError::new(StatusCode::CONFLICT, "target_exists", e.to_string()),
        store::Error::Io { .. } => ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "storage_io", e.to_string()),
        store::Error::UnverifiedCopy => {
            ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "store_unverified", e.to_string())
        }
        _ if e.is_corruption() => ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "store_corrupt", e.to_string()),
        _ => ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "internal", "storage failure; see the server log"),
    }
}

/// What a JSON handler answers: a status and a body, or an error mapped once here.
pub(super) type Reply<T> = Result<(StatusCode, Json<T>), ApiError>;

pub(super) fn ok<T>(body: T) -> Reply<T> {
    Ok((StatusCode::OK, Json(body)))
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;

    /// Each store failure a caller must tell apart has its own status and code.
    #[test]
    fn store_failures_keep_their_meaning_over_http() {
        let io = || std::io::Error::other("disk full");
        let cases = [
            (store::Error::Halted { reason: "stopped".into(), cause: None }, 503, "store_unavailable"),
            (store::Error::Closing, 503, "shutting_down"),
            (store::Error::Conflict { reason: "raced".into(), cause: None }, 409, "write_conflict"),
            (store::Error::TargetExists { path: "/b/x.redb".into() }, 409, "target_exists"),
            (store::Error::Io { path: "/b".into(), what: "create it", source: io() }, 500, "storage_io"),
            (store::Error::UnverifiedCopy, 503, "store_unverified"),
            (store::Error::Task { what: "read", reason: "panicked".into() }, 500, "internal"),
            (store::Error::Storage(Box::new(io())), 500, "internal"),
        ];
        for (error, status, code) in cases {
            let mapped = storage(&error);
            assert_eq!((mapped.status.as_u16(), mapped.code), (status, code), "{error}");
        }
        // The cause chain survives the split: the log still names the first failure.
        let halted = store::Error::Halted { reason: "stopped".into(), cause: Some(Arc::new(store::Error::Closing)) };
        assert!(store::error_chain(&halted).contains("shutting down"));
    }
}
