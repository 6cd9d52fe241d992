//! Every error the Mistral dialect returns, in the shapes Mistral's users quote (sources in
//! docs/PROVIDERS.md, "Mistral"): the API's own
//! `{"object":"error","message","type","param":null,"code"}` (400 `invalid_request_error`,
//! 400 `invalid_model` code `1500`, 429 `rate_limited` code `1300`), the same with
//! `message: {"detail":[…]}` for a 422 validation error (`extra_forbidden`, "Extra inputs
//! are not permitted"), and the gateway's `{"message":"Unauthorized","request_id"}` for a
//! bad key. Mistral sends no `Retry-After`; its rate-limit state is in `x-ratelimit-*`.

use axum::Json;
use axum::http::{HeaderName, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

use crate::simulator::faults::Injected;

const TAG: &str = " (SIMULATED fault)";

#[derive(Debug)]
pub(super) struct MistralError {
    pub status: StatusCode,
    pub body: Value,
    headers: Vec<(&'static str, String)>,
}

impl MistralError {
    /// The API's own shape; `code` is a string of digits where Mistral sends one.
    pub(super) fn api(status: StatusCode, kind: &str, message: impl Into<String>, code: Option<&str>) -> Self {
        let body = json!({"object": "error", "message": message.into(), "type": kind, "param": null, "code": code});
        Self { status, body, headers: Vec::new() }
    }

    pub(super) fn invalid(message: impl Into<String>) -> Self {
        Self::api(StatusCode::BAD_REQUEST, "invalid_request_error", message, None)
    }

    pub(super) fn not_found(message: impl Into<String>) -> Self {
        Self::api(StatusCode::NOT_FOUND, "invalid_request_error", message, None)
    }

    pub(super) fn invalid_model(model: &str) -> Self {
        Self::api(StatusCode::BAD_REQUEST, "invalid_model", format!("Invalid model: {model}"), Some("1500"))
    }

    /// 422 for fields the request schema does not have, one `detail` entry each.
    pub(super) fn extra_forbidden(fields: &[(Vec<String>, Value)]) -> Self {
        let detail: Vec<Value> = fields
            .iter()
            .map(|(loc, input)| {
                json!({"type": "extra_forbidden", "loc": loc, "msg": "Extra inputs are not permitted", "input": input})
            })
            .collect();
        let body = json!({"object": "error", "message": {"detail": detail}, "type": "invalid_request_error",
            "param": null, "code": null});
        Self { status: StatusCode::UNPROCESSABLE_ENTITY, body, headers: Vec::new() }
    }

    pub(super) fn unauthorized(request_id: String) -> Self {
        Self {
            status: StatusCode::UNAUTHORIZED,
            body: json!({"message": "Unauthorized", "request_id": request_id}),
            headers: Vec::new(),
        }
    }

    /// The answer to an injected request-level fault.
    pub(super) fn injected(fault: Injected, request_id: String) -> Self {
        match fault {
            Injected::Unauthorized => Self::unauthorized(request_id),
            // A spent monthly limit is answered 429 like a rate limit (vanna-ai/vanna#177):
            // the words are the only difference a client sees.
            Injected::InsufficientQuota { .. } => Self::api(
                StatusCode::TOO_MANY_REQUESTS,
                "rate_limited",
                format!("Monthly usage limit exceeded{TAG}"),
                Some("1300"),
            ),
            Injected::RateLimited { retry_after_secs } => {
                let mut e = Self::api(
                    StatusCode::TOO_MANY_REQUESTS,
                    "rate_limited",
                    format!("Rate limit exceeded{TAG}"),
                    Some("1300"),
                );
                e.headers.push(("x-ratelimit-limit-req-minute", "60".to_string()));
                e.headers.push(("x-ratelimit-remaining-req-minute", "0".to_string()));
                // Not a header Mistral is known to send; the knob's delay reaches clients
                // that honour it, and tests can see whether one did.
                e.headers.push(("retry-after", retry_after_secs.to_string()));
                e
            }
            // Capacity, typed `invalid_request_error` with no code (continuedev/continue#6185):
            // only the 429 status says it is worth waiting for.
            Injected::Overloaded { .. } => Self::api(
                StatusCode::TOO_MANY_REQUESTS,
                "invalid_request_error",
                format!("Service tier capacity exceeded for this model.{TAG}"),
                None,
            ),
            Injected::ServerError { .. } => Self::api(
                StatusCode::INTERNAL_SERVER_ERROR,
                "internal_server_error",
                format!("Internal server error{TAG}"),
                None,
            ),
        }
    }
}

impl IntoResponse for MistralError {
    fn into_response(self) -> Response {
        let mut response = (self.status, Json(self.body)).into_response();
        for (name, value) in self.headers {
            if let (Ok(name), Ok(value)) = (HeaderName::try_from(name), HeaderValue::try_from(value)) {
                response.headers_mut().insert(name, value);
            }
        }
        response
    }
}
