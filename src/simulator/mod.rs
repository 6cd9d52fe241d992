//! A **simulated** LLM batch provider: it speaks the OpenAI Batch API, the Anthropic
//! Message Batches or the Gemini batch mode wire protocol (one per instance, see [`Dialect`]) over real HTTP on loopback, but the "model" behind it is a deterministic rule-based code
//! reviewer, not a language model. It lets the demo and the tests drive the whole
//! lifecycle (upload → create → poll → download → commit) with no API key, and inject the
//! failures a real provider produces (429s, 5xx, dropped connections, expired batches,
//! torn or duplicated output lines, schema-violating answers).
//!
//! # Layout
//!
//! - `wire`: the OpenAI JSON objects, spelled once.
//! - `files` / `batches`: the `/v1` handlers; `lifecycle`: status from elapsed time;
//!   `output`: the output and error JSONL; `input`: input-file checks.
//! - `chat`: a synchronous `POST /v1/chat/completions` on the same model and knobs, for
//!   commitpoint's synchronous chat provider.
//! - `model`: the deterministic reviewer; `answer`: what is answered for the schema a
//!   request carries (the reviewer for `code-review@1`, else an `instance` of the schema,
//!   `pattern` for its regexes) and the misbehave-first knobs' per-source attempts.
//! - `anthropic`: the Message Batches dialect (its own routes, lifecycle and error shape,
//!   sharing the model, the faults, the statistics and the listener).
//! - `gemini`: the Gemini batch mode dialect, likewise (operations, File API uploads,
//!   `google.rpc.Status` errors).
//! - `mistral`: the Mistral batch dialect, likewise (`/v1/batch/jobs`, its error bodies
//!   and its strict request checks).
//! - `vertex`: the Vertex AI batch prediction dialect (jobs over a real Cloud Storage,
//!   an OAuth token endpoint).
//! - `faults`: the fault knobs ([`Faults`]).
//! - `state`: shared memory and [`Stats`]; `net`: a listener that can drop a connection.
//!
//! Simulator-only endpoints (both dialects) live under `/_sim`: `GET /_sim/stats`, `GET|POST /_sim/faults`.

mod answer;
mod anthropic;
mod batches;
mod bedrock;
mod chat;
mod error;
mod faults;
mod files;
mod files_list;
mod gemini;
mod input;
mod instance;
mod lifecycle;
mod mistral;
mod model;
mod net;
mod output;
mod pattern;
mod state;
pub mod strict;
mod variant;
mod vertex;
mod wire;

#[cfg(test)]
mod tests;

use std::net::{Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use axum::extract::rejection::BytesRejection;
use axum::extract::{DefaultBodyLimit, Request, State};
use axum::http::{HeaderName, HeaderValue, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

pub use faults::Faults;
/// The simulator's rule-based stand-in for a model, shared with the demo's workers.
pub use model::{broken_review, review};

/// The JSON the simulated model answers an OpenAI-shaped chat completion body with (a
/// generic contract item's `body`, say): `review` for a code-review-shaped
/// `response_format` schema (or none), an instance of any other schema, drawn from the
/// source in the last `source_id:` user turn. No knobs apply.
pub fn answer_chat_body(body: &serde_json::Value) -> serde_json::Value {
    answer::answer(&model::ask(body), faults::Flaw::None)
}
pub use state::Stats;
pub use variant::{MetadataMode, RateLimitHeaders, Variant};

use error::ApiError;
use net::{ConnHandle, SimListener};
use state::Shared;

/// How long `stop` waits for in-flight requests before cutting them off.
const STOP_GRACE: Duration = Duration::from_secs(5);
const SIM_PREFIX: &str = "/_sim";

/// Which provider's wire protocol the simulator speaks.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Dialect {
    /// OpenAI Batch API: `/v1/files` + `/v1/batches`, base URL ends in `/v1`.
    #[default]
    OpenAi,
    /// Anthropic Message Batches: `/v1/messages/batches`, base URL is the bare origin.
    Anthropic,
    /// Gemini API batch mode: `/v1beta/models/{m}:batchGenerateContent`, `/v1beta/batches`,
    /// the File API; base URL is the bare origin.
    Gemini,
    /// Azure OpenAI: the OpenAI Batch API under `/openai/v1` (and the dated `/openai` with
    /// `?api-version=`), the `api-key` header, Azure's file limits (see [`Variant::azure`]).
    Azure,
    /// Amazon Bedrock batch inference: a SigV4-checked control plane over a real S3.
    Bedrock,
    /// Mistral batch: `/v1/files` and `/v1/batch/jobs`; base URL is the bare origin.
    Mistral,
    /// Vertex AI batch prediction: OAuth bearer tokens from its own `/token`, jobs over a
    /// real Cloud Storage (a GCS emulator).
    Vertex,
}

#[derive(Clone, Debug)]
pub struct SimulatorConfig {
    pub dialect: Dialect,
    pub faults: Faults,
    /// When set, API requests need the key (401 otherwise): `Authorization: Bearer <key>`
    /// for OpenAI, `x-api-key: <key>` for Anthropic.
    pub api_key: Option<String>,
    /// Time from create to `completed`.
    pub complete_after: Duration,
    /// Seeds ids and output-line order, so runs are reproducible.
    pub seed: u64,
    /// How an OpenAI-shaped platform departs from OpenAI (base path, metadata, 429
    /// headers, list paging). `Dialect::Azure` starts from [`Variant::azure`] whatever is here.
    pub variant: Variant,
    /// Where the Bedrock dialect's S3 is (an S3-compatible server) and how to sign for it.
    pub s3: Option<S3Access>,
    /// The Cloud Storage JSON API (a GCS emulator) the Vertex dialect reads and writes.
    pub gcs_endpoint: Option<String>,
}

/// An S3-compatible server the Bedrock dialect reads job input from and writes output to.
#[derive(Clone, Debug)]
pub struct S3Access {
    pub endpoint: String,
    pub access_key_id: String,
    pub secret_access_key: String,
}

impl Default for SimulatorConfig {
    fn default() -> Self {
        Self {
            dialect: Dialect::OpenAi,
            faults: Faults::default(),
            api_key: None,
            complete_after: Duration::from_millis(300),
            seed: 0,
            variant: Variant::default(),
            s3: None,
            gcs_endpoint: None,
        }
    }
}

#[derive(Debug)]
pub struct Simulator {
    addr: SocketAddr,
    dialect: Dialect,
    shared: Arc<Shared>,
    stop: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<std::io::Result<()>>>,
}

impl Simulator {
    pub async fn start(listen: SocketAddr, config: SimulatorConfig) -> std::io::Result<Simulator> {
        let listener = TcpListener::bind(listen).await?;
        let addr = listener.local_addr()?;
        let origin = origin(addr);
        let mut shared = Shared::new(config.api_key, config.complete_after, config.seed, config.faults, origin);
        shared.variant = match config.dialect {
            Dialect::Azure => Variant { azure: true, base_path: variant::AZURE_V1_PATH.to_string(), ..config.variant },
            _ => config.variant,
        };
        shared.s3 = config.s3;
        shared.gcs = config.gcs_endpoint;
        let shared = Arc::new(shared);
        let app = match config.dialect {
            Dialect::OpenAi | Dialect::Azure => router(Arc::clone(&shared)),
            Dialect::Anthropic => anthropic::router(Arc::clone(&shared)),
            Dialect::Gemini => gemini::router(Arc::clone(&shared)),
            Dialect::Bedrock => bedrock::router(Arc::clone(&shared)),
            Dialect::Mistral => mistral::router(Arc::clone(&shared)),
            Dialect::Vertex => vertex::router(Arc::clone(&shared)),
        };
        let app = app.into_make_service_with_connect_info::<ConnHandle>();
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(async move {
            axum::serve(SimListener::new(listener), app)
                .with_graceful_shutdown(async move {
                    let _ = stopped.await;
                })
                .await
        });
        tracing::info!(%addr, dialect = ?config.dialect, "SIMULATED batch provider listening (not a real model)");
        Ok(Simulator { addr, dialect: config.dialect, shared, stop: Some(stop), task: Some(task) })
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    pub fn dialect(&self) -> Dialect {
        self.dialect
    }

    /// The base URL the dialect's adapter expects: `http://127.0.0.1:PORT/v1` for OpenAI,
    /// the bare origin `http://127.0.0.1:PORT` for Anthropic (its adapter adds `/v1/...`).
    pub fn base_url(&self) -> String {
        match self.dialect {
            Dialect::OpenAi | Dialect::Azure => format!("{}{}", origin(self.addr), self.shared.variant.base_path),
            Dialect::Anthropic | Dialect::Gemini | Dialect::Bedrock | Dialect::Mistral | Dialect::Vertex => {
                origin(self.addr)
            }
        }
    }

    /// `http://127.0.0.1:PORT`: what an Azure `endpoint` names (the adapter adds `/openai/…`).
    pub fn origin(&self) -> String {
        origin(self.addr)
    }

    pub fn stats(&self) -> Stats {
        self.shared.lock().stats.clone()
    }

    /// Replaces every knob; remaining counters of the previous faults are discarded.
    pub fn set_faults(&self, faults: Faults) {
        self.shared.lock().faults = faults;
    }

    /// Stops accepting, lets in-flight requests finish (up to a grace period), then returns.
    pub async fn stop(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(mut task) = self.task.take() {
            match tokio::time::timeout(STOP_GRACE, &mut task).await {
                Ok(Ok(Ok(()))) => {}
                Ok(Ok(Err(e))) => tracing::warn!(error = %e, "simulator: server error at stop"),
                Ok(Err(e)) => tracing::warn!(error = %e, "simulator: server task failed"),
                Err(_) => {
                    tracing::warn!("simulator: connections still open after the grace period");
                    task.abort();
                }
            }
        }
        tracing::info!(addr = %self.addr, "SIMULATED provider stopped");
    }
}

impl Drop for Simulator {
    /// A simulator dropped without `stop` still shuts its server down, so tests that
    /// fail half-way do not leak listeners into the next test.
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }
}

/// `http://ip:port`, with a wildcard listen address replaced by loopback so clients can use it.
fn origin(mut addr: SocketAddr) -> String {
    if addr.ip().is_unspecified() {
        addr.set_ip(Ipv4Addr::LOCALHOST.into());
    }
    format!("http://{addr}")
}

/// The Files and Batches API under the variant's base path (Azure: also the dated API
/// one level up, which needs `api-version`).
fn router(shared: Arc<Shared>) -> Router {
    let variant = shared.variant.clone();
    let mut api = Router::new()
        .route(
            "/files",
            // The upload handler enforces the Batch API's own 200 MB limit while reading.
            post(files::upload).layer(DefaultBodyLimit::disable()).get(files_list::list),
        )
        .route("/files/{id}", get(files::retrieve).delete(files::delete))
        .route("/files/{id}/content", get(files::content))
        .route("/batches", post(batches::create).get(batches::list))
        .route("/batches/{id}", get(batches::retrieve))
        .route("/batches/{id}/cancel", post(batches::cancel))
        .route("/chat/completions", post(chat::completions));
    let mut app = Router::new();
    if variant.azure {
        api = api.route("/deployments/{deployment}/chat/completions", post(chat::completions));
        let dated = api.clone().layer(middleware::from_fn(require_api_version));
        app = app.nest(variant::AZURE_DATED_PATH, dated);
    }
    app.nest(&variant.base_path, api)
        .route("/_sim/stats", get(sim_stats))
        .route("/_sim/faults", get(sim_get_faults).post(sim_set_faults))
        .fallback(|request: Request| async move {
            ApiError::not_found(format!("Invalid URL ({} {})", request.method(), request.uri().path()))
        })
        .method_not_allowed_fallback(|request: Request| async move {
            ApiError::new(
                StatusCode::METHOD_NOT_ALLOWED,
                "invalid_request_error",
                format!("Method {} is not allowed on {}", request.method(), request.uri().path()),
            )
        })
        .layer(middleware::from_fn_with_state(Arc::clone(&shared), guard))
        .with_state(shared)
}

/// In front of every request: request id, and for API requests the delay, the API-key
/// check and at most one injected request-level fault (see [`Faults`]).
async fn guard(State(shared): State<Arc<Shared>>, request: Request, next: Next) -> Response {
    let request_id = shared.next_request_id();
    let mut response = if request.uri().path().starts_with(SIM_PREFIX) {
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
    let headers = response.headers_mut();
    if let Ok(value) = HeaderValue::try_from(request_id) {
        headers.insert(HeaderName::from_static("x-request-id"), value);
    }
    headers.insert(
        HeaderName::from_static("x-commitpoint-simulator"),
        HeaderValue::from_static("SIMULATED provider, not a real model"),
    );
    response
}

/// Azure's dated routes answer nothing without an `api-version`.
async fn require_api_version(request: Request, next: Next) -> Response {
    let versioned = request.uri().query().is_some_and(|q| q.split('&').any(|p| p.starts_with("api-version=")));
    if versioned {
        next.run(request).await
    } else {
        ApiError::not_found("Resource not found (the dated API needs ?api-version=)").into_response()
    }
}

fn admit(shared: &Shared, request: &Request) -> Result<(), ApiError> {
    if let Some(key) = &shared.api_key {
        let header_key = |name| request.headers().get(name).and_then(|v: &HeaderValue| v.to_str().ok());
        let bearer = header_key(header::AUTHORIZATION).and_then(|v| v.strip_prefix("Bearer "));
        // Azure takes the resource key in `api-key`, or an Entra ID token as a bearer.
        let sent = if shared.variant.azure {
            header_key(header::HeaderName::from_static("api-key")).or(bearer)
        } else {
            bearer
        };
        match sent {
            None => {
                return Err(ApiError::new(
                    StatusCode::UNAUTHORIZED,
                    "invalid_request_error",
                    "You didn't provide an API key. Send it as 'Authorization: Bearer YOUR_KEY'.",
                ));
            }
            Some(sent) if sent != key => {
                return Err(ApiError::new(
                    StatusCode::UNAUTHORIZED,
                    "invalid_request_error",
                    "Incorrect API key provided.",
                )
                .code("invalid_api_key"));
            }
            Some(_) => {}
        }
    }
    match take_request_fault(shared, request.uri().path()) {
        Some(fault) => {
            let error = shared.variant.restyle(fault.into_error());
            if shared.lock().faults.should_retry_false {
                return Err(error.header("x-should-retry", "false".to_string()));
            }
            Err(error)
        }
        None => Ok(()),
    }
}

/// What every dialect's guard does around its own checks: `/_sim` passes straight
/// through; an API request waits out `slow_ms`, then `admit` may answer it in the
/// dialect's words. Every response is marked SIMULATED.
async fn admit_then_run<E: IntoResponse>(
    shared: &Shared,
    request: Request,
    next: Next,
    admit: impl FnOnce(&Shared, &Request) -> Result<(), E>,
) -> Response {
    let mut response = if request.uri().path().starts_with(SIM_PREFIX) {
        next.run(request).await
    } else {
        let delay = shared.lock().faults.delay();
        if !delay.is_zero() {
            tokio::time::sleep(delay).await;
        }
        match admit(shared, &request) {
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

/// Consumes at most one request-level fault and counts it; both dialects call this.
fn take_request_fault(shared: &Shared, path: &str) -> Option<faults::Injected> {
    let mut inner = shared.lock();
    let served = inner.stats.server_errors;
    let fault = inner.faults.take_request_fault(served)?;
    match fault {
        faults::Injected::RateLimited { .. } | faults::Injected::InsufficientQuota { .. } => {
            inner.stats.rate_limited += 1;
        }
        faults::Injected::Overloaded { .. } => inner.stats.overloaded += 1,
        faults::Injected::ServerError { .. } => inner.stats.server_errors += 1,
        faults::Injected::Unauthorized => {}
    }
    drop(inner);
    tracing::info!(?fault, %path, "SIMULATED fault injected");
    Some(fault)
}

async fn sim_stats(State(shared): State<Arc<Shared>>) -> Json<Stats> {
    Json(shared.lock().stats.clone())
}

async fn sim_get_faults(State(shared): State<Arc<Shared>>) -> Json<Faults> {
    Json(shared.lock().faults.clone())
}

async fn sim_set_faults(
    State(shared): State<Arc<Shared>>,
    body: Result<axum::body::Bytes, BytesRejection>,
) -> Result<Json<Faults>, ApiError> {
    let body = body.map_err(|e| ApiError::invalid(e.body_text()))?;
    let faults: Faults =
        serde_json::from_slice(&body).map_err(|e| ApiError::invalid(format!("Invalid faults JSON: {e}")))?;
    shared.lock().faults = faults.clone();
    tracing::info!(?faults, "SIMULATED provider: faults replaced");
    Ok(Json(faults))
}
