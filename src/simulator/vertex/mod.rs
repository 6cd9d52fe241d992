//! The simulator's Vertex AI batch prediction dialect (docs/PROVIDERS.md, "Vertex AI"):
//! `batchPredictionJobs` create, get, list (with the `labels.<key>="<value>"` filter) and
//! `:cancel` under `v1/projects/{project}/locations/{location}`, and a publisher model's
//! `:countTokens` (`models`), over a REAL Cloud Storage
//! (a GCS emulator's JSON API at `gcs_endpoint`): a job reads its JSONL input from there
//! and writes `{outputUriPrefix}/prediction-model-{time}/predictions.jsonl` back.
//!
//! Auth is OAuth: `POST /token` is the service account token endpoint (the JWT-bearer
//! grant a key file's `token_uri` names) and `GET /computeMetadata/v1/…/token` the
//! metadata server's (`metadata`: `Metadata-Flavor: Google` required, 403 without it), and
//! every API call needs a bearer token one of them issued. The JWT's shape and claims are checked (RS256 header, issuer, the
//! `cloud-platform` scope, the audience = this token endpoint, a lifetime of at most an
//! hour); its signature is not, as the simulator holds no public key.
//!
//! Errors are Google's one shape, `{"error":{"code","message","status"}}`. Faults:
//! `rate_limit_next` (429 `RESOURCE_EXHAUSTED`), `server_error_next` (500 `INTERNAL`),
//! `unauthorized_next` (401 `UNAUTHENTICATED`), `drop_after_create_next` (the job is
//! created, the connection dropped), `fail_batch_validation` (the job ends
//! `JOB_STATE_FAILED` with a `google.rpc.Status`), `expire_batches` (`JOB_STATE_EXPIRED`,
//! nothing written), `pause_jobs` (`JOB_STATE_PAUSED` while set), `missing_models` (the 404
//! of `:countTokens`), and on the output lines `failed_line_every` (a retryable `status`),
//! `max_input_tokens` (an `INVALID_ARGUMENT` `status`) and `malformed_line_every`.

mod jobs;
mod list;
mod metadata;
mod models;
mod token;

use std::sync::Arc;

use axum::Router;
use axum::extract::{Request, State};
use axum::http::{HeaderName, HeaderValue, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde_json::json;

pub(super) use jobs::Store;

use super::SIM_PREFIX;
use super::gemini::error::GoogleError;
use super::state::Shared;

const ERROR_INFO: &str = "type.googleapis.com/google.rpc.ErrorInfo";
const JOBS: &str = "/v1/projects/{project}/locations/{location}/batchPredictionJobs";
const MODELS: &str = "/v1/projects/{project}/locations/{location}/publishers/google/models/{call}";

pub(super) fn router(shared: Arc<Shared>) -> Router {
    Router::new()
        .route(JOBS, post(jobs::create).get(list::list))
        .route(&format!("{JOBS}/{{job}}"), get(jobs::get).post(jobs::verb))
        .route(MODELS, post(models::call))
        .route(token::PATH, post(token::issue))
        .route(metadata::PATH, get(metadata::token))
        .route("/_sim/stats", get(super::sim_stats))
        .route("/_sim/faults", get(super::sim_get_faults).post(super::sim_set_faults))
        .fallback(|request: Request| async move {
            GoogleError::new(
                StatusCode::NOT_FOUND,
                "NOT_FOUND",
                format!("The requested URL {} was not found on this server.", request.uri().path()),
            )
        })
        .layer(middleware::from_fn_with_state(Arc::clone(&shared), guard))
        .with_state(shared)
}

async fn guard(State(shared): State<Arc<Shared>>, request: Request, next: Next) -> Response {
    let path = request.uri().path().to_string();
    let mut response = if path.starts_with(SIM_PREFIX) || path == token::PATH || path == metadata::PATH {
        next.run(request).await
    } else {
        let delay = shared.lock().faults.delay();
        if !delay.is_zero() {
            tokio::time::sleep(delay).await;
        }
        match admit(&shared, &request) {
            Ok(()) => next.run(request).await,
            Err(error) => error.into_response(),
        }
    };
    response.headers_mut().insert(
        HeaderName::from_static("x-commitpoint-simulator"),
        HeaderValue::from_static("SIMULATED provider, not a real model"),
    );
    response
}

/// A bearer token this simulator's token endpoint issued, then at most one injected fault.
fn admit(shared: &Shared, request: &Request) -> Result<(), GoogleError> {
    let header = request.headers().get("authorization").and_then(|v| v.to_str().ok());
    let token = header.and_then(|h| h.strip_prefix("Bearer "));
    let known = token.and_then(|t| shared.lock().vertex.token_source(t));
    let Some(source) = known else {
        return Err(unauthenticated(if header.is_none() {
            "CREDENTIALS_MISSING"
        } else {
            "ACCESS_TOKEN_TYPE_UNSUPPORTED"
        }));
    };
    if source == jobs::TokenSource::MetadataServer {
        let mut inner = shared.lock();
        inner.stats.calls_with_metadata_tokens += 1;
        if inner.faults.vm_lacks_cloud_platform_scope {
            return Err(scope_insufficient());
        }
    }
    match super::take_request_fault(shared, request.uri().path()) {
        Some(super::faults::Injected::Unauthorized) => Err(unauthenticated("ACCESS_TOKEN_EXPIRED")),
        Some(fault) => {
            let mut error = GoogleError::injected(fault);
            error.details.clear();
            Err(error)
        }
        None => Ok(()),
    }
}

/// Google's answer to a token without a scope the API needs (python-aiplatform#902 for
/// Vertex over gRPC; the REST body as quoted in js-genai#569 and analogdotnow/Analog#296).
fn scope_insufficient() -> GoogleError {
    let mut error =
        GoogleError::new(StatusCode::FORBIDDEN, "PERMISSION_DENIED", "Request had insufficient authentication scopes.");
    error.details.push(json!({"@type": ERROR_INFO, "reason": "ACCESS_TOKEN_SCOPE_INSUFFICIENT",
        "domain": "googleapis.com",
        "metadata": {"service": "aiplatform.googleapis.com", "method": "google.cloud.aiplatform.v1.JobService"}}));
    error
}

/// Google's answer to a call without a valid OAuth token.
fn unauthenticated(reason: &str) -> GoogleError {
    let mut error = GoogleError::new(
        StatusCode::UNAUTHORIZED,
        "UNAUTHENTICATED",
        "Request had invalid authentication credentials. Expected OAuth 2 access token, login cookie or other \
         valid authentication credential. See https://developers.google.com/identity/sign-in/web/devconsole-project.",
    );
    error.details.push(json!({"@type": ERROR_INFO, "reason": reason, "domain": "googleapis.com",
        "metadata": {"service": "aiplatform.googleapis.com", "method": "google.cloud.aiplatform.v1.JobService"}}));
    error
}
