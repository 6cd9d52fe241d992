//! The simulator's Amazon Bedrock batch inference dialect (docs/PROVIDERS.md, "Amazon
//! Bedrock"): the control plane's JSON REST routes (`POST /model-invocation-job`, `GET
//! /model-invocation-job/{jobIdentifier}`, `POST …/stop`, `GET /model-invocation-jobs`, and
//! the model lookups `provider check` makes, `GET /foundation-models/{id}` and `GET
//! /inference-profiles/{id}`), each refused unless SigV4-signed for service `bedrock`,
//! over a REAL S3 (an S3-compatible server at `s3_endpoint`): the job reads its JSONL input
//! from there and writes `{output}/{job id}/{input name}.out` and `manifest.json.out` back.
//!
//! Only the shape of the `Authorization` header is checked (algorithm, credential scope
//! ending `/bedrock/aws4_request`, signed headers, a 64-hex signature), and the access key
//! id when a key is configured: the simulator holds no secret to recompute a signature.
//!
//! Faults: `rate_limit_next` (429 `ThrottlingException`), `server_error_next` (500
//! `InternalServerException`), `unauthorized_next` (403 `AccessDeniedException`),
//! `insufficient_quota_next` (`ServiceQuotaExceededException`), `drop_after_create_next`
//! (the job is created, the connection dropped), `expire_batches` (the job ends `Expired`:
//! it never began, nothing is written), `partial_batches` (it ends `PartiallyCompleted`:
//! it ran out of time with the first half of its records answered), `failed_line_every` and
//! `malformed_line_every` on the output records, `fail_batch_validation` (`Failed`),
//! `missing_models` (the model lookups refuse those ids as Bedrock refuses unknown ones).

mod constraints;
mod jobs;
mod models;

use std::sync::Arc;

use axum::Json;
use axum::Router;
use axum::extract::{Request, State};
use axum::http::{HeaderName, HeaderValue, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde_json::json;

pub(super) use jobs::Job;

use super::faults::Injected;
use super::state::Shared;

/// Bedrock's default "minimum number of records per batch inference job" quota.
pub(super) const MIN_RECORDS: usize = 100;
/// Bedrock's default "records per batch inference job" quota.
pub(super) const MAX_RECORDS: usize = 50_000;

pub(super) fn router(shared: Arc<Shared>) -> Router {
    Router::new()
        .route("/model-invocation-job", post(jobs::create))
        .route("/model-invocation-jobs", get(jobs::list))
        .route("/model-invocation-job/{id}", get(jobs::get))
        .route("/model-invocation-job/{id}/stop", post(jobs::stop))
        .route("/foundation-models/{id}", get(models::foundation_model))
        .route("/inference-profiles/{id}", get(models::inference_profile))
        .route("/_sim/stats", get(super::sim_stats))
        .route("/_sim/faults", get(super::sim_get_faults).post(super::sim_set_faults))
        .fallback(|request: Request| async move {
            AwsError::new(StatusCode::NOT_FOUND, "UnknownOperationException", request.uri().path().to_string())
        })
        .layer(middleware::from_fn_with_state(Arc::clone(&shared), guard))
        .with_state(shared)
}

/// A refused call as Bedrock answers it: the error type in `x-amzn-ErrorType`, and
/// `{"message": …}` in the body.
#[derive(Debug)]
pub(super) struct AwsError {
    status: StatusCode,
    kind: &'static str,
    message: String,
}

impl AwsError {
    pub(super) fn new(status: StatusCode, kind: &'static str, message: impl Into<String>) -> Self {
        Self { status, kind, message: message.into() }
    }

    pub(super) fn validation(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, "ValidationException", message)
    }

    pub(super) fn not_found(message: impl Into<String>) -> Self {
        Self::new(StatusCode::NOT_FOUND, "ResourceNotFoundException", message)
    }

    fn injected(fault: Injected) -> Self {
        match fault {
            Injected::Unauthorized => Self::new(
                StatusCode::FORBIDDEN,
                "AccessDeniedException",
                "You don't have access to the model with the specified model ID. (SIMULATED fault: unauthorized_next)",
            ),
            Injected::InsufficientQuota { .. } => Self::new(
                StatusCode::BAD_REQUEST,
                "ServiceQuotaExceededException",
                "The number of in-progress batch inference jobs exceeds the quota. (SIMULATED fault)",
            ),
            Injected::RateLimited { .. } => Self::new(
                StatusCode::TOO_MANY_REQUESTS,
                "ThrottlingException",
                "Too many requests, please wait before trying again. (SIMULATED fault: rate_limit_next)",
            ),
            Injected::Overloaded { .. } => Self::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "ServiceUnavailableException",
                "The service is temporarily unavailable. (SIMULATED fault: overloaded_next)",
            ),
            Injected::ServerError { .. } => Self::new(
                StatusCode::INTERNAL_SERVER_ERROR,
                "InternalServerException",
                "An internal server error occurred. (SIMULATED fault: server_error_next)",
            ),
        }
    }
}

impl IntoResponse for AwsError {
    fn into_response(self) -> Response {
        let mut response = (self.status, Json(json!({"message": self.message}))).into_response();
        response.headers_mut().insert(HeaderName::from_static("x-amzn-errortype"), HeaderValue::from_static(self.kind));
        response
    }
}

async fn guard(State(shared): State<Arc<Shared>>, request: Request, next: Next) -> Response {
    let mut response = super::admit_then_run(&shared, request, next, admit).await;
    let id = shared.next_request_id();
    if let Ok(value) = HeaderValue::from_str(&id) {
        response.headers_mut().insert(HeaderName::from_static("x-amzn-requestid"), value);
    }
    response
}

fn admit(shared: &Shared, request: &Request) -> Result<(), AwsError> {
    let header = request.headers().get("authorization").and_then(|v| v.to_str().ok());
    let key = check_sigv4(header, request.headers().contains_key("x-amz-date"))?;
    if let Some(expected) = &shared.api_key
        && key != expected
    {
        return Err(AwsError::new(
            StatusCode::FORBIDDEN,
            "UnrecognizedClientException",
            "The security token included in the request is invalid.",
        ));
    }
    match super::take_request_fault(shared, request.uri().path()) {
        Some(fault) => Err(AwsError::injected(fault)),
        None => Ok(()),
    }
}

/// The access key id of a well-formed SigV4 `Authorization` header for Bedrock.
fn check_sigv4(header: Option<&str>, has_date: bool) -> Result<&str, AwsError> {
    let missing =
        || AwsError::new(StatusCode::FORBIDDEN, "MissingAuthenticationTokenException", "Missing Authentication Token");
    let header = header.ok_or_else(missing)?;
    let refuse = |why: &str| {
        AwsError::new(
            StatusCode::FORBIDDEN,
            "InvalidSignatureException",
            format!("Invalid SigV4 Authorization header: {why}"),
        )
    };
    let rest =
        header.strip_prefix("AWS4-HMAC-SHA256 ").ok_or_else(|| refuse("the algorithm must be AWS4-HMAC-SHA256"))?;
    let part = |name: &str| rest.split(',').map(str::trim).find_map(|p| p.strip_prefix(name));
    let credential = part("Credential=").ok_or_else(|| refuse("no Credential"))?;
    let scope: Vec<&str> = credential.split('/').collect();
    let [key, date, region, service, terminator] = scope[..] else {
        return Err(refuse("a malformed credential scope"));
    };
    if service != "bedrock" || terminator != "aws4_request" || date.len() != 8 || region.is_empty() || key.is_empty() {
        return Err(refuse("the credential scope must be <key>/<yyyymmdd>/<region>/bedrock/aws4_request"));
    }
    let signed = part("SignedHeaders=").ok_or_else(|| refuse("no SignedHeaders"))?;
    if !signed.split(';').any(|h| h == "host") || !signed.split(';').any(|h| h == "x-amz-date") || !has_date {
        return Err(refuse("host and x-amz-date must be signed"));
    }
    let signature = part("Signature=").ok_or_else(|| refuse("no Signature"))?;
    if signature.len() != 64 || !signature.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(refuse("the signature must be 64 hex digits"));
    }
    Ok(key)
}

#[cfg(test)]
mod tests {
    use super::check_sigv4;

    #[test]
    fn sigv4_headers() {
        let sig = "a".repeat(64);
        let good = format!(
            "AWS4-HMAC-SHA256 Credential=AKID/20261201/us-east-1/bedrock/aws4_request, \
             SignedHeaders=content-type;host;x-amz-date, Signature={sig}"
        );
        assert_eq!(check_sigv4(Some(&good), true).unwrap(), "AKID");
        assert!(check_sigv4(Some(&good), false).is_err(), "x-amz-date missing");
        assert!(check_sigv4(Some(&good.replace("/bedrock/", "/s3/")), true).is_err());
        assert!(check_sigv4(Some("Bearer x"), true).is_err());
        assert!(check_sigv4(None, true).is_err());
        assert!(check_sigv4(Some(&good.replace(&sig, "xyz")), true).is_err());
    }
}
