//! Every error the Anthropic dialect returns, in Anthropic's one shape:
//! `{"type":"error","error":{"type","message"},"request_id"}`. The request id is only known
//! to the middleware, so the body is written there (see [`ErrorBody::render`]).

use axum::Json;
use axum::http::{HeaderMap, HeaderName, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::json;

use crate::simulator::faults::Injected;

#[derive(Debug)]
pub(super) struct AnthropicError {
    pub status: StatusCode,
    pub kind: &'static str,
    pub message: String,
    /// Extra response headers (rate-limit hints).
    pub headers: Vec<(&'static str, String)>,
}

/// Carried in the response extensions so the middleware can re-render with the request id.
#[derive(Clone, Debug)]
pub(super) struct ErrorBody {
    pub kind: &'static str,
    pub message: String,
}

impl ErrorBody {
    pub(super) fn render(&self, request_id: Option<&str>) -> serde_json::Value {
        json!({"type": "error", "error": {"type": self.kind, "message": self.message}, "request_id": request_id})
    }
}

impl AnthropicError {
    pub(super) fn new(status: StatusCode, kind: &'static str, message: impl Into<String>) -> Self {
        Self { status, kind, message: message.into(), headers: Vec::new() }
    }

    pub(super) fn invalid(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, "invalid_request_error", message)
    }

    pub(super) fn not_found(message: impl Into<String>) -> Self {
        Self::new(StatusCode::NOT_FOUND, "not_found_error", message)
    }

    /// `name` must be a lowercase header name (a constant at every call site).
    pub(super) fn header(mut self, name: &'static str, value: String) -> Self {
        self.headers.push((name, value));
        self
    }

    /// The Anthropic answer to an injected request-level fault.
    pub(super) fn injected(fault: Injected, now: std::time::SystemTime) -> Self {
        let retry = |error: Self, secs: u32| error.header("retry-after", secs.to_string());
        match fault {
            Injected::Unauthorized => Self::new(
                StatusCode::UNAUTHORIZED,
                "authentication_error",
                "invalid x-api-key (SIMULATED fault: unauthorized_next)",
            ),
            // What Anthropic answers once prepaid credit is gone (observed 400, not 402).
            Injected::InsufficientQuota { .. } => Self::invalid(
                "Your credit balance is too low to access the Anthropic API. Please go to Plans & Billing \
                 to upgrade or purchase credits. (SIMULATED fault: insufficient_quota_next)",
            ),
            Injected::RateLimited { retry_after_secs } => {
                let reset = super::lifecycle::rfc3339(now + std::time::Duration::from_secs(retry_after_secs.into()));
                retry(
                    Self::new(
                        StatusCode::TOO_MANY_REQUESTS,
                        "rate_limit_error",
                        "Number of request tokens has exceeded your per-minute rate limit. \
                         (SIMULATED fault: rate_limit_next)",
                    ),
                    retry_after_secs,
                )
                .header("anthropic-ratelimit-requests-limit", "50".to_string())
                .header("anthropic-ratelimit-requests-remaining", "0".to_string())
                .header("anthropic-ratelimit-requests-reset", reset)
            }
            Injected::Overloaded { retry_after_secs } => retry(
                Self::new(overloaded_status(), "overloaded_error", "Overloaded (SIMULATED fault: overloaded_next)"),
                retry_after_secs,
            ),
            Injected::ServerError { .. } => Self::new(
                StatusCode::INTERNAL_SERVER_ERROR,
                "api_error",
                "Internal server error (SIMULATED fault: server_error_next)",
            ),
        }
    }
}

/// 529 is Anthropic's own status for API-wide overload; it has no `StatusCode` constant.
fn overloaded_status() -> StatusCode {
    StatusCode::from_u16(529).unwrap_or(StatusCode::SERVICE_UNAVAILABLE)
}

impl IntoResponse for AnthropicError {
    fn into_response(self) -> Response {
        let body = ErrorBody { kind: self.kind, message: self.message };
        let mut headers = HeaderMap::new();
        for (name, value) in self.headers {
            if let (Ok(name), Ok(value)) = (HeaderName::try_from(name), HeaderValue::try_from(value)) {
                headers.insert(name, value);
            }
        }
        let mut response = (self.status, headers, Json(body.render(None))).into_response();
        response.extensions_mut().insert(body);
        response
    }
}
