//! Route handlers: decode the request, call the service, shape the response.

use axum::extract::State;
use axum::http::StatusCode;
use axum::{Extension, Json};
use serde::Deserialize;
use serde_json::{Value, json};

use super::auth::CallerExt;
use super::error::ApiError;
use super::extract::{IdPath, JsonBody, QueryParams};
use super::views;
use crate::lifecycle::StateName;
use crate::service::{IntakeRequest, ResultRequest, Service, WorkerUsage};
use crate::store::{ClaimRequest, ListFilter, PostOutcome, Usage};

pub type Reply = Result<(StatusCode, Json<Value>), ApiError>;

pub fn ok(body: Value) -> Reply {
    Ok((StatusCode::OK, Json(body)))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct IntakeBody {
    tenant: String,
    source_id: String,
    schema: String,
    content: String,
    #[serde(default)]
    metadata: Option<Value>,
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

pub async fn intake(
    State(service): State<Service>,
    Extension(caller): CallerExt,
    JsonBody(body): JsonBody<IntakeBody>,
) -> Reply {
    caller.may_reach(&body.tenant)?;
    let outcome = service.intake(body.into()).await?;
    crate::failpoint::hit("after-commit-before-ack");
    let status = if outcome.created { StatusCode::CREATED } else { StatusCode::OK };
    let body = json!({
        "extraction_id": outcome.record.id.to_hex(),
        "state": outcome.record.state.name().as_str(),
        "created": outcome.created,
    });
    Ok((status, Json(body)))
}

pub async fn get(State(service): State<Service>, Extension(caller): CallerExt, IdPath(id): IdPath) -> Reply {
    let record = service.get(id).await?;
    caller.may_reach(&record.tenant)?;
    ok(views::extraction(&record))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ListQuery {
    tenant: Option<String>,
    state: Option<String>,
    limit: Option<usize>,
    after: Option<String>,
}

pub async fn list(
    State(service): State<Service>,
    Extension(caller): CallerExt,
    QueryParams(mut q): QueryParams<ListQuery>,
) -> Reply {
    if let Some(own) = caller.tenant_scope() {
        if let Some(asked) = &q.tenant {
            caller.may_reach(asked)?;
        }
        q.tenant = Some(own.to_string());
    }
    let state = match q.state.as_deref() {
        None => None,
        Some(s) => Some(StateName::parse(s).ok_or_else(|| {
            ApiError::bad_request(
                "invalid_query",
                format!("state {s:?} is not one of pending, claimed, committed, failed"),
            )
        })?),
    };
    let after = match q.after.as_deref() {
        None | Some("") => 0,
        Some(c) => c.parse().map_err(|_| {
            ApiError::bad_request("invalid_query", format!("after {c:?} is not a cursor returned as `next`"))
        })?,
    };
    let filter = ListFilter { tenant: q.tenant, state, limit: q.limit.unwrap_or(100), after };
    let page = service.list(filter).await?;
    let items: Vec<Value> = page.records.iter().map(views::extraction).collect();
    ok(json!({ "extractions": items, "next": page.next.map(|n| n.to_string()) }))
}

pub async fn findings(State(service): State<Service>, Extension(caller): CallerExt, IdPath(id): IdPath) -> Reply {
    caller.may_reach(&service.get(id).await?.tenant)?;
    let findings = service.findings(id).await?;
    let items: Vec<Value> = findings.iter().map(views::finding).collect();
    ok(json!({ "findings": items }))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClaimBody {
    worker: String,
    limit: usize,
    lease_seconds: u64,
    #[serde(default)]
    schema: Option<String>,
}

pub async fn claim(State(service): State<Service>, JsonBody(body): JsonBody<ClaimBody>) -> Reply {
    let request = ClaimRequest {
        worker: body.worker,
        limit: body.limit,
        lease_ms: body.lease_seconds.saturating_mul(1000),
        schema: body.schema,
    };
    let grants = service.claim(request).await?;
    let items: Vec<Value> = grants.iter().map(views::grant).collect();
    ok(json!({ "claims": items }))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UsageBody {
    model: String,
    input_tokens: u64,
    output_tokens: u64,
    #[serde(default)]
    cached_input_tokens: u64,
    #[serde(default)]
    reasoning_tokens: u64,
    /// What the worker's provider said the call cost, in micro-dollars.
    #[serde(default)]
    cost_micros: Option<u64>,
    #[serde(default)]
    request_id: Option<String>,
    /// The provider the worker called; `external` when absent.
    #[serde(default)]
    provider: Option<String>,
    #[serde(default)]
    latency_ms: Option<u64>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ResultBody {
    lease_token: String,
    output: Value,
    #[serde(default)]
    usage: Option<UsageBody>,
}

pub async fn post_result(
    State(service): State<Service>,
    IdPath(id): IdPath,
    JsonBody(body): JsonBody<ResultBody>,
) -> Reply {
    let usage = body.usage.map(|u| WorkerUsage {
        provider: u.provider.unwrap_or_else(|| "external".to_string()),
        latency_ms: u.latency_ms,
        usage: Usage {
            model: u.model,
            input_tokens: u.input_tokens,
            output_tokens: u.output_tokens,
            cached_input_tokens: u.cached_input_tokens,
            reasoning_tokens: u.reasoning_tokens,
            provider_cost_micros: u.cost_micros,
            request_id: u.request_id,
            ..Usage::default()
        },
    });
    let request = ResultRequest { lease_token: body.lease_token, output: body.output, usage };
    let outcome = service.post_result(id, request).await?;
    crate::failpoint::hit("after-commit-before-ack");
    let (findings, replay) = match outcome {
        PostOutcome::Committed { findings } => (findings, false),
        PostOutcome::Replay { findings } => (findings, true),
        other => {
            tracing::error!(?other, "post_result returned an outcome the service should have mapped");
            return Err(ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "internal", "unexpected outcome"));
        }
    };
    ok(json!({ "state": "committed", "findings": findings, "replay": replay }))
}

pub async fn retry(State(service): State<Service>, IdPath(id): IdPath) -> Reply {
    ok(views::extraction(&service.retry(id).await?))
}

pub async fn stats(State(service): State<Service>) -> Reply {
    let now = crate::clock::now_ms();
    let counts = service.counts_by_state().await?;
    let by_state: serde_json::Map<String, Value> =
        counts.iter().map(|c| (c.state.as_str().to_string(), json!(c.count))).collect();
    let oldest: serde_json::Map<String, Value> = counts
        .iter()
        .filter(|c| !matches!(c.state, StateName::Committed | StateName::Failed))
        .filter_map(|c| Some((c.state.as_str().to_string(), json!(now.saturating_sub(c.oldest_since_ms?) / 1000))))
        .collect();
    let total: u64 = counts.iter().map(|c| c.count).sum();
    ok(json!({
        "extractions": by_state,
        "total": total,
        "oldest_age_seconds": oldest,
        "providers": service.provider_health(),
        "last_backup_at": service.last_backup_ms().map(crate::clock::format_ms),
    }))
}

pub async fn metrics(State(service): State<Service>) -> axum::response::Response {
    use axum::response::IntoResponse;
    match crate::metrics::render(&service).await {
        Some(text) => ([(axum::http::header::CONTENT_TYPE, "text/plain; version=0.0.4")], text).into_response(),
        None => ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "metrics_unavailable", "metrics are not available")
            .into_response(),
    }
}

pub async fn healthz(State(service): State<Service>) -> Reply {
    let schemas: Vec<&str> = service.registry().names().collect();
    ok(json!({ "status": "ok", "schemas": schemas, "providers": service.provider_health() }))
}
