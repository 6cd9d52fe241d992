//! Admin endpoints: online backup, fetching or removing a finished backup file, and
//! pausing providers.

use axum::Json;
use axum::body::Body;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::Serialize;
use tokio_util::io::ReaderStream;
use utoipa::ToSchema;

use super::browser::NotFromBrowser;
use super::error::{ApiError, ErrorBody};
use super::error::{Reply, ok};
use super::extract::NamePath;
use super::openapi::{BadRequest, Forbidden, ServerError, StoreUnavailable, Unauthenticated};
use crate::domain::health::ProviderHealth;
use crate::service::{ProviderView, Service};

#[derive(Debug, Serialize, ToSchema)]
pub(super) struct BackupCreated {
    #[schema(pattern = "^commitpoint-[A-Za-z0-9-]*(\\.[A-Za-z0-9-]+)*\\.redb$")]
    name: String,
    /// Where the file is on the server.
    path: String,
    bytes: u64,
    /// Rows copied, over every table.
    entries: u64,
    /// Where to `GET` (or `DELETE`) it.
    download: String,
}

/// Takes a consistent snapshot while the server keeps serving.
#[utoipa::path(post, path = "/v1/admin/backup", tag = "admin",
    security(("bearer" = [])),
    responses(
        (status = 201, description = "The snapshot is durable under `DATA_DIR/backups/`", body = BackupCreated),
        (status = 401, response = Unauthenticated),
        (status = 403, response = Forbidden),
        (status = 409, description = "`target_exists`: a backup of that name (its millisecond) exists; ask again", body = ErrorBody),
        (status = 422, description = "`invalid_input`: this server has no backup directory", body = ErrorBody),
        (status = 500, response = ServerError),
        (status = 503, response = StoreUnavailable),
    ))]
pub(super) async fn backup(_: NotFromBrowser, State(service): State<Service>) -> Reply<BackupCreated> {
    let report = service.backup().await?;
    let name = report.path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let body = BackupCreated {
        download: format!("/v1/admin/backups/{name}"),
        path: report.path.display().to_string(),
        bytes: report.bytes,
        entries: report.entries,
        name,
    };
    Ok((StatusCode::CREATED, Json(body)))
}

/// Streams a finished backup file.
#[utoipa::path(get, path = "/v1/admin/backups/{name}", tag = "admin",
    params(("name" = String, Path, pattern = "^commitpoint-[A-Za-z0-9-]*(\\.[A-Za-z0-9-]+)*\\.redb$",
        description = "A `name` returned by `POST /v1/admin/backup`")),
    security(("bearer" = [])),
    responses(
        (status = 200, description = "The redb file", body = [u8], content_type = "application/octet-stream"),
        (status = 400, response = BadRequest),
        (status = 401, response = Unauthenticated),
        (status = 403, response = Forbidden),
        (status = 404, description = "`not_found`: no backup with that name", body = ErrorBody),
        (status = 422, description = "`invalid_input`: not a backup name", body = ErrorBody),
    ))]
pub(super) async fn download(State(service): State<Service>, NamePath(name): NamePath) -> Result<Response, ApiError> {
    let path = service.backup_path(&name)?;
    let file = tokio::fs::File::open(&path).await.map_err(|_| not_found(&name))?;
    let len = file.metadata().await.map(|m| m.len()).unwrap_or(0);
    let headers =
        [(header::CONTENT_TYPE, "application/octet-stream".to_string()), (header::CONTENT_LENGTH, len.to_string())];
    Ok((headers, Body::from_stream(ReaderStream::new(file))).into_response())
}

/// Removes a finished backup file.
#[utoipa::path(delete, path = "/v1/admin/backups/{name}", tag = "admin",
    params(("name" = String, Path, pattern = "^commitpoint-[A-Za-z0-9-]*(\\.[A-Za-z0-9-]+)*\\.redb$",
        description = "A `name` returned by `POST /v1/admin/backup`")),
    security(("bearer" = [])),
    responses(
        (status = 204, description = "Removed"),
        (status = 400, response = BadRequest),
        (status = 401, response = Unauthenticated),
        (status = 403, response = Forbidden),
        (status = 404, description = "`not_found`: no backup with that name", body = ErrorBody),
        (status = 422, description = "`invalid_input`: not a backup name", body = ErrorBody),
    ))]
pub(super) async fn remove(State(service): State<Service>, NamePath(name): NamePath) -> Result<StatusCode, ApiError> {
    let path = service.backup_path(&name)?;
    tokio::fs::remove_file(&path).await.map_err(|_| not_found(&name))?;
    Ok(StatusCode::NO_CONTENT)
}

fn not_found(name: &str) -> ApiError {
    ApiError::new(StatusCode::NOT_FOUND, "not_found", format!("no backup named {name:?}"))
}

/// A provider's health: pauses, the last error, and what its scheduler did.
#[derive(Debug, Serialize, ToSchema)]
pub(super) struct ProviderStatus {
    name: String,
    /// Unix ms until which calls (or only new submissions) are paused.
    paused_until_ms: Option<u64>,
    pause_submissions_only: bool,
    pause_reason: Option<String>,
    /// Paused by an operator (persisted): no new submissions; known jobs are still polled.
    operator_paused: bool,
    last_error: Option<String>,
    batches_formed: u64,
    batches_submitted: u64,
    /// Jobs found at the provider by batch key instead of resubmitted.
    batches_recovered: u64,
    batches_closed: u64,
    rate_limited: u64,
    lines_ingested: u64,
    malformed_lines: u64,
    members_requeued: u64,
    /// Unix ms until which new submissions wait for room at the provider.
    held_until_ms: Option<u64>,
    hold_reason: Option<String>,
    /// Work waiting only because it is under the provider's minimum job size (Bedrock:
    /// 100 records), and when it is failed (or sent to the provider's
    /// `min_batch_fallback`) unless more arrives.
    waiting_for_minimum: Option<String>,
    /// Intents under the minimum handed to the provider's `min_batch_fallback`.
    batches_handed_over: u64,
    /// Failed batches whose members went back to the queue as the same attempt.
    batches_returned: u64,
    /// Failed batches that blamed no member; their members' attempts were counted.
    batches_failed: u64,
    /// 404s on polls of live jobs, tolerated until the job is declared gone.
    polls_not_found: u64,
    /// Files deleted at the provider after ingestion.
    files_deleted: u64,
    /// Answers cut off at their output budget (finish_reason `length`, stop_reason `max_tokens`).
    truncated: u64,
    /// Truncated answers sent back once with a larger output budget.
    budget_retries: u64,
    /// Answers the model declined (failed `refused`).
    model_refusals: u64,
    /// Extractions failed `attempts_exhausted` instead of another requeue.
    attempts_exhausted: u64,
    /// Terms driving this provider that ended without a shutdown (a lapsed lease or a
    /// takeover by another instance; PostgreSQL only).
    driver_terms_lost: u64,
}

impl From<&ProviderHealth> for ProviderStatus {
    fn from(h: &ProviderHealth) -> Self {
        // No `..`: a new health field fails to compile here until the API shows it.
        let ProviderHealth {
            name,
            paused_until_ms,
            pause_submissions_only,
            pause_reason,
            operator_paused,
            last_error,
            batches_formed,
            batches_submitted,
            batches_recovered,
            batches_closed,
            rate_limited,
            lines_ingested,
            malformed_lines,
            members_requeued,
            held_until_ms,
            hold_reason,
            waiting_for_minimum,
            batches_handed_over,
            batches_returned,
            batches_failed,
            polls_not_found,
            files_deleted,
            truncated,
            budget_retries,
            model_refusals,
            attempts_exhausted,
            driver_terms_lost,
        } = h.clone();
        Self {
            name,
            paused_until_ms,
            pause_submissions_only,
            pause_reason,
            operator_paused,
            last_error,
            batches_formed,
            batches_submitted,
            batches_recovered,
            batches_closed,
            rate_limited,
            lines_ingested,
            malformed_lines,
            members_requeued,
            held_until_ms,
            hold_reason,
            waiting_for_minimum,
            batches_handed_over,
            batches_returned,
            batches_failed,
            polls_not_found,
            files_deleted,
            truncated,
            budget_retries,
            model_refusals,
            attempts_exhausted,
            driver_terms_lost,
        }
    }
}

/// A provider with the batch jobs it still has in flight.
#[derive(Debug, Serialize, ToSchema)]
pub(super) struct ProviderEntry {
    #[serde(flatten)]
    status: ProviderStatus,
    open_batches: u64,
}

impl From<ProviderView> for ProviderEntry {
    fn from(v: ProviderView) -> Self {
        Self { status: (&v.health).into(), open_batches: v.open_batches }
    }
}

#[derive(Debug, Serialize, ToSchema)]
pub(super) struct ProviderList {
    providers: Vec<ProviderEntry>,
}

/// The built-in providers with their health and open batches.
#[utoipa::path(get, path = "/v1/admin/providers", tag = "admin",
    security(("bearer" = [])),
    responses(
        (status = 200, description = "Every configured provider", body = ProviderList),
        (status = 401, response = Unauthenticated),
        (status = 403, response = Forbidden),
        (status = 500, response = ServerError),
        (status = 503, response = StoreUnavailable),
    ))]
pub(super) async fn providers(State(service): State<Service>) -> Reply<ProviderList> {
    ok(ProviderList { providers: service.providers().await?.into_iter().map(ProviderEntry::from).collect() })
}

/// Stops new submissions to a provider (persisted); its known jobs are still polled.
#[utoipa::path(post, path = "/v1/admin/providers/{name}/pause", tag = "admin",
    params(("name" = String, Path, description = "The provider's name")),
    security(("bearer" = [])),
    responses(
        (status = 200, description = "The provider, paused", body = ProviderEntry),
        (status = 400, response = BadRequest),
        (status = 401, response = Unauthenticated),
        (status = 403, response = Forbidden),
        (status = 404, description = "`unknown_provider`: no provider with that name", body = ErrorBody),
        (status = 500, response = ServerError),
        (status = 503, response = StoreUnavailable),
    ))]
pub(super) async fn pause(
    _: NotFromBrowser,
    State(service): State<Service>,
    NamePath(name): NamePath,
) -> Reply<ProviderEntry> {
    ok(service.set_provider_paused(&name, true).await?.into())
}

/// Lets a paused provider take new submissions again.
#[utoipa::path(post, path = "/v1/admin/providers/{name}/resume", tag = "admin",
    params(("name" = String, Path, description = "The provider's name")),
    security(("bearer" = [])),
    responses(
        (status = 200, description = "The provider, resumed", body = ProviderEntry),
        (status = 400, response = BadRequest),
        (status = 401, response = Unauthenticated),
        (status = 403, response = Forbidden),
        (status = 404, description = "`unknown_provider`: no provider with that name", body = ErrorBody),
        (status = 500, response = ServerError),
        (status = 503, response = StoreUnavailable),
    ))]
pub(super) async fn resume(State(service): State<Service>, NamePath(name): NamePath) -> Reply<ProviderEntry> {
    ok(service.set_provider_paused(&name, false).await?.into())
}
