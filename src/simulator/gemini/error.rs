//! Every error the Gemini dialect returns, in Google's one shape (`google.rpc.Status`, AIP-193):
//! `{"error":{"code","message","status","details":[…]}}`. The words of the answers
//! Gemini users see most are the real ones (quoted in public issue threads of
//! google-gemini/gemini-cli and of SDKs, checked 2026-12): a missing key is 403
//! `PERMISSION_DENIED`, a wrong one 400 `INVALID_ARGUMENT` with `ErrorInfo.reason`
//! `API_KEY_INVALID`; a rate limit is 429 `RESOURCE_EXHAUSTED` whose `RetryInfo.retryDelay`
//! says how long to wait (no `Retry-After` header); an overloaded model is 503 `UNAVAILABLE`.

use axum::Json;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

use crate::simulator::faults::Injected;

const ERROR_INFO: &str = "type.googleapis.com/google.rpc.ErrorInfo";
const RETRY_INFO: &str = "type.googleapis.com/google.rpc.RetryInfo";
const QUOTA_FAILURE: &str = "type.googleapis.com/google.rpc.QuotaFailure";

#[derive(Debug)]
pub(in crate::simulator) struct GoogleError {
    pub status: StatusCode,
    /// The canonical code's name (`INVALID_ARGUMENT`, `NOT_FOUND`, …).
    pub code: &'static str,
    pub message: String,
    pub details: Vec<Value>,
}

impl GoogleError {
    pub(in crate::simulator) fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> Self {
        Self { status, code, message: message.into(), details: Vec::new() }
    }

    pub(in crate::simulator) fn invalid(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, "INVALID_ARGUMENT", message)
    }

    pub(in crate::simulator) fn not_found(message: impl Into<String>) -> Self {
        Self::new(StatusCode::NOT_FOUND, "NOT_FOUND", message)
    }

    pub(in crate::simulator) fn failed_precondition(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, "FAILED_PRECONDITION", message)
    }

    fn detail(mut self, detail: Value) -> Self {
        self.details.push(detail);
        self
    }

    pub(in crate::simulator) fn missing_key() -> Self {
        Self::new(
            StatusCode::FORBIDDEN,
            "PERMISSION_DENIED",
            "Method doesn't allow unregistered callers (callers without established identity). \
             Please use API Key or other form of API consumer identity to call this API.",
        )
    }

    pub(in crate::simulator) fn bad_key(suffix: &str) -> Self {
        Self::invalid(format!("API key not valid. Please pass a valid API key.{suffix}")).detail(json!({
            "@type": ERROR_INFO, "reason": "API_KEY_INVALID", "domain": "googleapis.com",
            "metadata": {"service": "generativelanguage.googleapis.com"},
        }))
    }

    /// The Gemini answer to an injected request-level fault.
    pub(in crate::simulator) fn injected(fault: Injected) -> Self {
        const TAG: &str = " (SIMULATED fault)";
        let quota = |quota_id: &str| {
            json!({"@type": QUOTA_FAILURE, "violations": [{
                "quotaMetric": "generativelanguage.googleapis.com/generate_content_requests",
                "quotaId": quota_id,
            }]})
        };
        let exhausted =
            |message: &str| Self::new(StatusCode::TOO_MANY_REQUESTS, "RESOURCE_EXHAUSTED", format!("{message}{TAG}"));
        match fault {
            Injected::Unauthorized => Self::bad_key(TAG),
            // A per-day quota, as the real service answers it: the `QuotaFailure` names the
            // day, yet `RetryInfo` still says seconds ("Please retry in 36.4s", a captured body
            // in diegosouzapw/OmniRoute#9504; the same in google-gemini/gemini-cli#22486).
            // `retry_after_secs: 0` leaves `RetryInfo` out, as bodies that only point at
            // billing do (python-genai#1427).
            Injected::InsufficientQuota { retry_after_secs } => {
                let spent = exhausted("You exceeded your current quota, please check your plan and billing details.")
                    .detail(quota("GenerateRequestsPerDayPerProjectPerModel-FreeTier"));
                match retry_after_secs {
                    0 => spent,
                    secs => spent.detail(json!({"@type": RETRY_INFO, "retryDelay": format!("{secs}s")})),
                }
            }
            Injected::RateLimited { retry_after_secs } => exhausted("Resource has been exhausted (e.g. check quota).")
                .detail(quota("GenerateRequestsPerMinutePerProjectPerModel"))
                .detail(json!({"@type": RETRY_INFO, "retryDelay": format!("{retry_after_secs}s")})),
            Injected::Overloaded { retry_after_secs } => Self::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "UNAVAILABLE",
                format!("The model is overloaded. Please try again later.{TAG}"),
            )
            .detail(json!({"@type": RETRY_INFO, "retryDelay": format!("{retry_after_secs}s")})),
            Injected::ServerError { .. } => Self::new(
                StatusCode::INTERNAL_SERVER_ERROR,
                "INTERNAL",
                format!(
                    "An internal error has occurred. Please retry or report in \
                         https://developers.generativeai.google/guide/troubleshooting{TAG}"
                ),
            ),
        }
    }

    pub(in crate::simulator) fn body(&self) -> Value {
        let mut error = json!({"code": self.status.as_u16(), "message": self.message, "status": self.code});
        if !self.details.is_empty() {
            error["details"] = Value::Array(self.details.clone());
        }
        json!({"error": error})
    }
}

impl IntoResponse for GoogleError {
    fn into_response(self) -> Response {
        (self.status, Json(self.body())).into_response()
    }
}
