//! Every error the simulator returns, in OpenAI's one shape:
//! `{"error":{"message","type","param","code"}}` (type always set; param/code nullable),
//! except the Azure front end's own refusals, `{"error":{"code","message"}}` (`azure`).

use axum::Json;
use axum::http::{HeaderMap, HeaderName, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::json;

#[derive(Debug)]
pub struct ApiError {
    pub status: StatusCode,
    pub kind: &'static str,
    pub message: String,
    pub param: Option<String>,
    pub code: Option<String>,
    /// Extra response headers (rate-limit hints); few and rare, so a small list.
    pub headers: Vec<(&'static str, String)>,
}

impl ApiError {
    pub fn new(status: StatusCode, kind: &'static str, message: impl Into<String>) -> Self {
        Self { status, kind, message: message.into(), param: None, code: None, headers: Vec::new() }
    }

    pub fn invalid(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, "invalid_request_error", message)
    }

    pub fn not_found(message: impl Into<String>) -> Self {
        Self::new(StatusCode::NOT_FOUND, "invalid_request_error", message)
    }

    /// Azure's own 400s carry only a code and a message (the bodies quoted in
    /// Azure/azure-sdk-for-net#44710 and Azure/azure-sdk-for-java#47401).
    pub fn azure(code: &str, message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, AZURE_KIND, message).code(code)
    }

    pub fn server(message: impl Into<String>) -> Self {
        Self::new(StatusCode::INTERNAL_SERVER_ERROR, "server_error", message)
    }

    pub fn param(mut self, param: &str) -> Self {
        self.param = Some(param.to_string());
        self
    }

    pub fn code(mut self, code: &str) -> Self {
        self.code = Some(code.to_string());
        self
    }

    /// `name` must be a lowercase header name (a constant at every call site).
    pub fn header(mut self, name: &'static str, value: String) -> Self {
        self.headers.push((name, value));
        self
    }

    #[cfg(test)]
    pub fn header_value(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(n, _)| *n == name).map(|(_, v)| v.as_str())
    }
}

/// The kind of an Azure-shaped error, which has no `type` field.
const AZURE_KIND: &str = "";

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = if self.kind == AZURE_KIND {
            json!({"error": {"code": self.code, "message": self.message}})
        } else {
            json!({"error": {
                "message": self.message,
                "type": self.kind,
                "param": self.param,
                "code": self.code,
            }})
        };
        let mut headers = HeaderMap::new();
        for (name, value) in self.headers {
            // Values are built from numbers and fixed text; an unencodable one is dropped
            // rather than turning an injected fault into a different failure.
            if let (Ok(name), Ok(value)) = (HeaderName::try_from(name), HeaderValue::try_from(value)) {
                headers.insert(name, value);
            }
        }
        (self.status, headers, Json(body)).into_response()
    }
}
