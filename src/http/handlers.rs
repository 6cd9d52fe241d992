//! Route handlers: decode the request, call the service, shape the response. Each one
//! carries its OpenAPI description (`GET /openapi.json`), checked against the router.

use std::collections::BTreeMap;

use axum::extract::State;
use axum::http::StatusCode;
use axum::{Extension, Json};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use utoipa::{IntoParams, ToSchema};

use super::admin::ProviderStatus;
use super::auth::CallerExt;
use super::error::{ApiError, ErrorBody, Reply, ok};
use super::extract::{IdPath, JsonBody, QueryParams};
use super::openapi::{
    BadRequest, BodyTimeout, Forbidden, InvalidInput, PayloadTooLarge, ServerError, StoreUnavailable, Unauthenticated,
    UnsupportedEncoding,
};
use super::views::{self, Extraction, Finding, StateView};
use crate::domain::identity::{ExtractionId, IdPrefix, ParsePrefixError};
use crate::domain::lifecycle::StateName;
use crate::http::access::Caller;
use crate::service::{IntakeRequest, Service};

/// A new source to extract from. Its identity is (tenant, source_id, content, schema).
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({"tenant": "acme", "source_id": "PR-17", "schema": "code-review@1",
    "content": "fn main() {}", "metadata": {"repo": "x"}}))]
pub struct IntakeBody {
    #[schema(pattern = "^[A-Za-z0-9._-]{1,128}$")]
    tenant: String,
    /// 1–1024 bytes of UTF-8, no control characters. `maxLength` counts characters, so a
    /// value within it can still be over in bytes (refused with 422).
    #[schema(min_length = 1, max_length = 1024, pattern = "^[^\\u0000-\\u001F\\u007F-\\u009F]+$")]
    source_id: String,
    /// A registered schema name (see `GET /healthz`).
    schema: String,
    #[schema(min_length = 1)]
    content: String,
    /// Returned with the record and with claims.
    #[serde(default)]
    #[schema(value_type = Option<Object>)]
    metadata: Option<Value>,
}

#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct IntakeReply {
    #[schema(pattern = "^[0-9a-f]{64}$")]
    extraction_id: String,
    state: StateView,
    /// False when the identity already existed (nothing was written).
    created: bool,
}

impl IntakeReply {
    pub(crate) fn new(outcome: &crate::store::IntakeOutcome) -> Self {
        Self {
            extraction_id: outcome.record.id.to_hex(),
            state: StateView::of(&outcome.record.state),
            created: outcome.created,
        }
    }
}

impl From<IntakeBody> for IntakeRequest {
    fn from(body: IntakeBody) -> Self {
        Self {
            tenant: body.tenant,
            source_id: body.source_id,
            schema: body.schema,
            content: body.content,
            metadata: body.metadata,
        }
    }
}

/// Takes a source in exactly once.
#[utoipa::path(post, path = "/v1/extractions", tag = "extractions", request_body = IntakeBody,
    security(("bearer" = [])),
    responses(
        (status = 201, description = "A new identity, durable", body = IntakeReply),
        (status = 200, description = "The identity exists; nothing was written", body = IntakeReply),
        (status = 400, response = BadRequest),
        (status = 401, response = Unauthenticated),
        (status = 403, response = Forbidden),
        (status = 408, response = BodyTimeout),
        (status = 413, response = PayloadTooLarge),
        (status = 415, response = UnsupportedEncoding),
        (status = 422, description = "`invalid_input` (`details.field` names it) or `unknown_schema`", body = ErrorBody),
        (status = 500, response = ServerError),
        (status = 503, response = StoreUnavailable),
    ))]
pub(crate) async fn intake(
    State(service): State<Service>,
    Extension(caller): CallerExt,
    JsonBody(body): JsonBody<IntakeBody>,
) -> Reply<IntakeReply> {
    caller.may_reach(&body.tenant)?;
    let outcome = service.intake(body.into()).await?;
    crate::domain::failpoint::hit("after-commit-before-ack");
    let status = if outcome.created { StatusCode::CREATED } else { StatusCode::OK };
    Ok((status, Json(IntakeReply::new(&outcome))))
}

/// One extraction.
#[utoipa::path(get, path = "/v1/extractions/{id}", operation_id = "get_extraction", tag = "extractions",
    params(("id" = String, Path, pattern = "^[0-9a-f]{64}$", description = "The extraction id")),
    security(("bearer" = [])),
    responses(
        (status = 200, description = "The record", body = Extraction),
        (status = 400, response = BadRequest),
        (status = 401, response = Unauthenticated),
        (status = 404, description = "`not_found`: no extraction with that id (or another tenant's)", body = ErrorBody),
        (status = 500, response = ServerError),
        (status = 503, response = StoreUnavailable),
    ))]
pub(crate) async fn get(
    State(service): State<Service>,
    Extension(caller): CallerExt,
    IdPath(id): IdPath,
) -> Reply<Extraction> {
    let record = service.get(id).await?;
    visible(&caller, &record.tenant, id)?;
    let retired = service.retired(vec![record.seq]).await?;
    let fields = service.output_fields(&record).await?;
    ok(views::extraction_retained(&record, retired.get(&record.seq).copied().unwrap_or(0)).with_output_fields(fields))
}

/// Another tenant's extraction answers exactly as a missing one does, so a tenant token
/// cannot learn which ids exist.
pub(super) fn visible(caller: &Caller, tenant: &str, id: ExtractionId) -> Result<(), ApiError> {
    match caller.may_reach(tenant) {
        Ok(()) => Ok(()),
        Err(_) => Err(crate::service::Error::NotFound(id).into()),
    }
}

#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub(crate) struct ListQuery {
    /// Only this tenant's extractions (a tenant token always sees only its own).
    #[param(pattern = "^[A-Za-z0-9._-]{1,128}$")]
    tenant: Option<String>,
    #[param(inline, value_type = StateView, required = false)]
    state: Option<String>,
    /// Page size, 1–1000 (default 100).
    #[param(minimum = 1, maximum = 1000)]
    limit: Option<usize>,
    /// The `next` of the previous page of this same listing (an opaque string).
    #[param(pattern = "^[0-9a-f]*$", max_length = 160)]
    after: Option<String>,
    /// Only each source's current revision (the newest intake of its tenant, source id and
    /// schema name), whatever its state.
    latest: Option<bool>,
    /// `intake` (the default: oldest first) or `newest` (newest intake first). A `next`
    /// continues the order it came from.
    #[param(inline, value_type = ExtractionOrder, required = false)]
    order: Option<ExtractionOrder>,
    /// The extractions whose id starts with these 4–64 hex characters, in id order (as
    /// the console shows ids, 12 characters), instead of a listing in intake order: taken
    /// with `tenant` and `limit` only, on one page.
    #[param(pattern = "^[0-9a-f]{4,64}$")]
    id_prefix: Option<String>,
}

#[derive(Debug, Clone, Copy, Deserialize, ToSchema, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub(crate) enum ExtractionOrder {
    Intake,
    Newest,
}

#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct ExtractionPage {
    extractions: Vec<Extraction>,
    /// Pass as `after` for the following page; null on the last page. Opaque: it is valid
    /// only for the listing (filters, caller's tenant) that returned it.
    next: Option<String>,
}

/// Extractions in intake order (or newest first), a page at a time.
#[utoipa::path(get, path = "/v1/extractions", operation_id = "list_extractions", tag = "extractions", params(ListQuery),
    security(("bearer" = [])),
    responses(
        (status = 200, description = "A page of records", body = ExtractionPage),
        (status = 400, description = "`invalid_query`, or `invalid_cursor`: `after` is not a `next` of this listing", body = ErrorBody),
        (status = 401, response = Unauthenticated),
        (status = 403, response = Forbidden),
        (status = 422, response = InvalidInput),
        (status = 500, response = ServerError),
        (status = 503, response = StoreUnavailable),
    ))]
pub(crate) async fn list(
    State(service): State<Service>,
    Extension(caller): CallerExt,
    QueryParams(mut q): QueryParams<ListQuery>,
) -> Reply<ExtractionPage> {
    if let Some(own) = caller.tenant_scope() {
        if let Some(asked) = &q.tenant {
            caller.may_reach(asked)?;
        }
        q.tenant = Some(own.to_string());
    }
    let limit = q.limit.unwrap_or(100);
    if let Some(prefix) = &q.id_prefix {
        let prefix: IdPrefix =
            prefix.parse().map_err(|e: ParsePrefixError| ApiError::bad_request("invalid_query", e.to_string()))?;
        if q.state.is_some() || q.after.is_some() || q.latest.is_some() || q.order.is_some() {
            return Err(ApiError::bad_request("invalid_query", "id_prefix is taken with tenant and limit only"));
        }
        let records = service.with_id_prefix(prefix, q.tenant, limit).await?;
        let retired = service.retired(records.iter().map(|r| r.seq).collect()).await?;
        let view = |r: &crate::store::ExtractionRecord| {
            views::extraction_retained(r, retired.get(&r.seq).copied().unwrap_or(0))
        };
        return ok(ExtractionPage { extractions: records.iter().map(view).collect(), next: None });
    }
    let state = match q.state.as_deref() {
        None => None,
        Some(s) => Some(StateName::parse(s).ok_or_else(|| {
            ApiError::bad_request(
                "invalid_query",
                format!("state {s:?} is not one of pending, claimed, committed, failed, submitted, ready, cancelled"),
            )
        })?),
    };
    let newest_first = q.order == Some(ExtractionOrder::Newest);
    let (records, next) =
        service.list_page(q.tenant, state, q.latest.unwrap_or(false), newest_first, limit, q.after.as_deref()).await?;
    let retired = service.retired(records.iter().map(|r| r.seq).collect()).await?;
    let view =
        |r: &crate::store::ExtractionRecord| views::extraction_retained(r, retired.get(&r.seq).copied().unwrap_or(0));
    ok(ExtractionPage { extractions: records.iter().map(view).collect(), next })
}

#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub(crate) struct FindingsQuery {
    /// Page size, 1–1000 (default 1000).
    #[param(minimum = 1, maximum = 1000)]
    limit: Option<usize>,
    /// The `next` of the previous page of this extraction's findings (an opaque string).
    #[param(pattern = "^[0-9a-f]*$", max_length = 160)]
    after: Option<String>,
}

#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct FindingsPage {
    findings: Vec<Finding>,
    /// Pass as `after` for the following page; null on the last page.
    next: Option<String>,
}

/// The committed findings of one extraction (empty until it commits), in key order, a
/// page at a time.
#[utoipa::path(get, path = "/v1/extractions/{id}/findings", tag = "extractions",
    params(("id" = String, Path, pattern = "^[0-9a-f]{64}$", description = "The extraction id"), FindingsQuery),
    security(("bearer" = [])),
    responses(
        (status = 200, description = "Each finding with its key", body = FindingsPage),
        (status = 400, description = "`invalid_id`, `invalid_query`, or `invalid_cursor`: `after` is not a `next` of this extraction's findings", body = ErrorBody),
        (status = 401, response = Unauthenticated),
        (status = 404, description = "`not_found`: no extraction with that id (or another tenant's)", body = ErrorBody),
        (status = 422, response = InvalidInput),
        (status = 500, response = ServerError),
        (status = 503, response = StoreUnavailable),
    ))]
pub(crate) async fn findings(
    State(service): State<Service>,
    Extension(caller): CallerExt,
    IdPath(id): IdPath,
    QueryParams(q): QueryParams<FindingsQuery>,
) -> Reply<FindingsPage> {
    visible(&caller, &service.get(id).await?.tenant, id)?;
    let limit = q.limit.unwrap_or(crate::service::MAX_FINDINGS_PAGE);
    let (findings, next) = service.findings_page(id, limit, q.after.as_deref()).await?;
    ok(FindingsPage { findings: findings.iter().map(views::finding).collect(), next })
}

/// Moves a failed extraction back to pending (`attempts` + 1).
#[utoipa::path(post, path = "/v1/extractions/{id}/retry", operation_id = "retry_extraction", tag = "extractions",
    params(("id" = String, Path, pattern = "^[0-9a-f]{64}$", description = "The extraction id")),
    security(("bearer" = [])),
    responses(
        (status = 200, description = "The record, pending again", body = Extraction),
        (status = 400, response = BadRequest),
        (status = 401, response = Unauthenticated),
        (status = 403, response = Forbidden),
        (status = 404, description = "`not_found`: no extraction with that id", body = ErrorBody),
        (status = 409, description = "`illegal_transition`: the extraction is not failed", body = ErrorBody),
        (status = 500, response = ServerError),
        (status = 503, response = StoreUnavailable),
    ))]
pub(crate) async fn retry(State(service): State<Service>, IdPath(id): IdPath) -> Reply<Extraction> {
    ok(views::extraction(&service.retry(id).await?))
}

#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct Stats {
    /// Count of extractions by state name.
    extractions: BTreeMap<String, u64>,
    total: u64,
    /// Age of the oldest extraction in each unfinished state, in seconds.
    oldest_age_seconds: BTreeMap<String, u64>,
    providers: Vec<ProviderStatus>,
    /// The last successful backup since the store was created.
    last_backup_at: Option<String>,
    store: StoreView,
    outbox: OutboxStatus,
    /// Tenants with a budget: spend this period, the budget, and whether work is held.
    budgets: Vec<BudgetStatus>,
    /// Each tenant's work, one entry per (tenant, schema) with any extraction, ordered by
    /// tenant then schema.
    tenants: Vec<TenantDepthView>,
}

/// One tenant's work under one schema.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct TenantDepthView {
    tenant: String,
    schema: String,
    /// Count by state name (states with none are left out).
    extractions: BTreeMap<String, u64>,
    total: u64,
    /// How long the next pending item of this tenant and schema (the oldest in intake
    /// order) has waited, in seconds; absent without pending work.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(required = false)]
    oldest_pending_age_seconds: Option<u64>,
}

impl TenantDepthView {
    pub(crate) fn of(depth: &crate::store::TenantDepth, now_ms: u64) -> Self {
        Self {
            tenant: depth.tenant.clone(),
            schema: depth.schema.clone(),
            extractions: depth.counts.iter().map(|(s, n)| (s.as_str().to_string(), *n)).collect(),
            total: depth.counts.iter().map(|(_, n)| n).sum(),
            oldest_pending_age_seconds: depth.oldest_pending_since_ms.map(|since| now_ms.saturating_sub(since) / 1000),
        }
    }
}

#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct StoreView {
    /// `redb` or `postgres`.
    backend: String,
    /// This server as the other instances see it: `host:pid`.
    instance: String,
    /// For each provider this server configures, the instance driving its batches now;
    /// null while none does (on PostgreSQL, between a driver's end and a takeover).
    drivers: BTreeMap<String, Option<String>>,
}

#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct OutboxStatus {
    pending: u64,
    dead: u64,
    /// When the oldest undelivered event was created.
    oldest_pending_at: Option<String>,
}

#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct BudgetStatus {
    tenant: String,
    spent_micros: u64,
    /// Reserved against the budget for batch members with a provider, not yet charged.
    reserved_micros: u64,
    reserved_members: u64,
    budget_micros: u64,
    /// Spend reached the budget: no new work goes out.
    held: bool,
    /// Work waiting because its next source's estimate does not fit what is left.
    waiting: Option<BudgetWait>,
}

/// Why a budgeted tenant's work waits.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct BudgetWait {
    /// The estimate of its oldest waiting source.
    needed_micros: u64,
    /// Budget less spend and reservations.
    left_micros: u64,
}

/// Counts by state, the oldest unfinished work, and the providers' health.
#[utoipa::path(get, path = "/v1/stats", tag = "operations",
    security(("bearer" = [])),
    responses(
        (status = 200, description = "Counts from the state index", body = Stats),
        (status = 401, response = Unauthenticated),
        (status = 403, response = Forbidden),
        (status = 500, response = ServerError),
        (status = 503, response = StoreUnavailable),
    ))]
pub(crate) async fn stats(State(service): State<Service>) -> Reply<Stats> {
    let now = crate::domain::clock::now_ms();
    let counts = service.counts_by_state().await?;
    let extractions = counts.iter().map(|c| (c.state.as_str().to_string(), c.count)).collect();
    let oldest_age_seconds = counts
        .iter()
        .filter(|c| !c.state.is_terminal())
        .filter_map(|c| Some((c.state.as_str().to_string(), now.saturating_sub(c.oldest_since_ms?) / 1000)))
        .collect();
    ok(Stats {
        extractions,
        total: counts.iter().map(|c| c.count).sum(),
        oldest_age_seconds,
        providers: service.provider_health().iter().map(ProviderStatus::from).collect(),
        last_backup_at: service.last_backup_ms().map(crate::domain::clock::format_ms),
        store: {
            let status = service.store_status().await?;
            StoreView {
                backend: status.backend.to_string(),
                instance: status.instance.to_string(),
                drivers: status.drivers.into_iter().map(|d| (d.provider, d.instance)).collect(),
            }
        },
        outbox: {
            let (pending, dead, oldest) = service.outbox_counts().await?;
            OutboxStatus { pending, dead, oldest_pending_at: oldest.map(crate::domain::clock::format_ms) }
        },
        budgets: service
            .budget_status()
            .await?
            .into_iter()
            .map(|line| BudgetStatus {
                waiting: line
                    .waiting
                    .map(|w| BudgetWait { needed_micros: w.needed_micros, left_micros: w.left_micros }),
                tenant: line.tenant,
                spent_micros: line.spent_micros,
                reserved_micros: line.reserved_micros,
                reserved_members: line.reserved_members,
                budget_micros: line.limit_micros,
                held: line.held,
            })
            .collect(),
        tenants: service.depth_by_tenant().await?.iter().map(|d| TenantDepthView::of(d, now)).collect(),
    })
}

/// Prometheus text exposition (no token needed).
#[utoipa::path(get, path = "/metrics", tag = "operations",
    responses(
        (status = 200, description = "Prometheus text format 0.0.4", body = String, content_type = "text/plain"),
        (status = 503, description = "`metrics_unavailable`: the exporter is not installed", body = ErrorBody),
    ))]
pub(crate) async fn metrics(State(service): State<Service>) -> axum::response::Response {
    use axum::response::IntoResponse;
    match crate::http::metrics::render(&service).await {
        Some(text) => ([(axum::http::header::CONTENT_TYPE, "text/plain; version=0.0.4")], text).into_response(),
        None => ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "metrics_unavailable", "metrics are not available")
            .into_response(),
    }
}

#[derive(Debug, Clone, Copy, Serialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub(crate) enum HealthStatus {
    Ok,
    /// A background task failed; the process is shutting down to be restarted.
    Failed,
    /// The store does not answer reads (see `reason`); the process keeps running.
    Unavailable,
}

#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct Health {
    status: HealthStatus,
    /// The background tasks that failed (only when `status` is `failed`). Their causes
    /// are in the server log, not here: this answer needs no token.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    failed_tasks: Vec<String>,
    /// Why the store is not ready (only when `status` is `unavailable`).
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(required = false)]
    reason: Option<String>,
    /// The registered schema names (admin token, or a server without tokens).
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(required = false)]
    schemas: Option<Vec<String>>,
    /// The providers' health (admin token, or a server without tokens).
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(required = false)]
    providers: Option<Vec<ProviderStatus>>,
}

/// How long `/healthz` waits for its store read: well under a probe's usual timeout.
const READINESS_DEADLINE: std::time::Duration = std::time::Duration::from_secs(2);

/// Liveness and readiness for anyone; the registered schemas and the providers' health (whose errors
/// come from outside) only for the admin token, or on a server without tokens.
#[utoipa::path(get, path = "/healthz", tag = "operations",
    responses(
        (status = 200, description = "The server is up", body = Health),
        (status = 503, description = "A background task (a scheduler, outbox delivery, HTTP) failed \
            (`status` `failed`; `failed_tasks` names it and the process is exiting to be restarted), or the \
            store did not answer a read within 2 s (`status` `unavailable`; `reason` says why)", body = Health),
    ))]
pub(crate) async fn healthz(State(service): State<Service>, caller: Option<CallerExt>) -> Reply<Health> {
    let details = caller.is_some_and(|Extension(c)| c.require_admin().is_ok());
    let failed_tasks = service.failed_tasks();
    let mut reason = None;
    let (code, status) = if !failed_tasks.is_empty() {
        (StatusCode::SERVICE_UNAVAILABLE, HealthStatus::Failed)
    } else if let Err(unready) = service.check_store(READINESS_DEADLINE).await {
        reason = Some(unready.to_string());
        (StatusCode::SERVICE_UNAVAILABLE, HealthStatus::Unavailable)
    } else {
        (StatusCode::OK, HealthStatus::Ok)
    };
    let health = Health {
        status,
        failed_tasks,
        reason,
        schemas: details.then(|| service.registry().names().map(str::to_string).collect()),
        providers: details.then(|| service.provider_health().iter().map(ProviderStatus::from).collect()),
    };
    Ok((code, Json(health)))
}
