//! The external workers' side: claiming leases and posting results under them.

use axum::Extension;
use axum::extract::State;
use axum::http::StatusCode;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use utoipa::ToSchema;

use super::auth::CallerExt;
use super::error::{ApiError, ErrorBody};
use super::error::{Reply, ok};
use super::extract::{IdPath, JsonBody};
use super::openapi::{
    BadRequest, BodyTimeout, Forbidden, PayloadTooLarge, ServerError, StoreUnavailable, Unauthenticated,
    UnsupportedEncoding,
};
use super::views::{self, ClaimGrant};
use super::whole;
use crate::domain::batch::Usage;
use crate::http::access::{Caller, Denied};
use crate::service::{ResultRequest, Service, WorkerPricing, WorkerUsage};
use crate::store::{ClaimRequest, PostOutcome, WorkScope};

/// Asks for work: leases on expired claims first, then pending extractions.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({"worker": "w-1", "limit": 10, "lease_seconds": 300, "schema": "code-review@1"}))]
pub(super) struct ClaimBody {
    /// 1–256 bytes of UTF-8, no control characters (`maxLength` counts characters).
    #[schema(min_length = 1, max_length = 256, pattern = "^[^\\u0000-\\u001F\\u007F-\\u009F]+$")]
    worker: String,
    #[serde(deserialize_with = "whole::usize")]
    #[schema(minimum = 1, maximum = 1000)]
    limit: usize,
    #[serde(deserialize_with = "whole::u64")]
    #[schema(minimum = 1, maximum = 86400)]
    lease_seconds: u64,
    /// Only extractions of this registered schema.
    #[serde(default)]
    schema: Option<String>,
    /// The model this worker calls. With it, each pending source the claim takes is
    /// reserved against its tenant's budget at the most that model may charge for it (list
    /// price from `[[prices]]`), and a tenant whose budget cannot cover its next source
    /// waits; without it nothing is reserved, and only a spent budget holds a tenant back.
    #[serde(default)]
    priced_as: Option<PricedAs>,
}

/// A `[[prices]]` row's provider and model, and the output one answer may use.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct PricedAs {
    provider: String,
    model: String,
    #[serde(deserialize_with = "whole::u32")]
    #[schema(minimum = 1, maximum = 1000000)]
    max_output_tokens: u32,
}

#[derive(Debug, Serialize, ToSchema)]
pub(super) struct ClaimsPage {
    /// Empty when there is no work.
    claims: Vec<ClaimGrant>,
}

/// Hands out leases; a live lease is never handed out twice.
#[utoipa::path(post, path = "/v1/claims", tag = "workers", request_body = ClaimBody,
    security(("bearer" = [])),
    responses(
        (status = 200, description = "The leases granted", body = ClaimsPage),
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
pub(super) async fn claim(
    State(service): State<Service>,
    Extension(caller): CallerExt,
    JsonBody(body): JsonBody<ClaimBody>,
) -> Reply<ClaimsPage> {
    let scope = caller.work_scope();
    if let (Some(schema), Caller::Worker(worker)) = (&body.schema, &caller)
        && !scope.covers_schema(schema)
    {
        return Err(Denied::OutsideScope { worker: worker.name.clone(), what: format!("schema {schema:?}") }.into());
    }
    let request = ClaimRequest {
        worker: body.worker,
        limit: body.limit,
        lease_ms: body.lease_seconds.saturating_mul(1000),
        schema: body.schema,
        estimate: None,
        scope,
    };
    let pricing = body.priced_as.map(|p| WorkerPricing {
        provider: p.provider,
        model: p.model,
        max_output_tokens: p.max_output_tokens,
    });
    let grants = service.claim(request, pricing).await?;
    let registry = service.registry();
    let instructions = |schema: &str| registry.get(schema).ok().map(|s| s.instructions());
    ok(ClaimsPage { claims: grants.iter().map(|g| views::grant(g, instructions(&g.record.schema))).collect() })
}

/// What the worker's model call used, for the cost ledger.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct UsageBody {
    /// At most 256 bytes of UTF-8, no control characters (as `provider` and `request_id`).
    #[schema(max_length = 256)]
    model: String,
    #[serde(deserialize_with = "whole::u64")]
    #[schema(maximum = 18446744073709551615_u64)]
    input_tokens: u64,
    #[serde(deserialize_with = "whole::u64")]
    #[schema(maximum = 18446744073709551615_u64)]
    output_tokens: u64,
    #[serde(default, deserialize_with = "whole::u64")]
    #[schema(maximum = 18446744073709551615_u64)]
    cached_input_tokens: u64,
    #[serde(default, deserialize_with = "whole::u64")]
    #[schema(maximum = 18446744073709551615_u64)]
    reasoning_tokens: u64,
    /// What the worker's provider said the call cost, in micro-dollars.
    #[serde(default, deserialize_with = "whole::option_u64")]
    #[schema(maximum = 18446744073709551615_u64)]
    cost_micros: Option<u64>,
    #[serde(default)]
    #[schema(max_length = 256)]
    request_id: Option<String>,
    /// The provider the worker called; `external` when absent.
    #[serde(default)]
    #[schema(max_length = 256)]
    provider: Option<String>,
    #[serde(default, deserialize_with = "whole::option_u64")]
    #[schema(maximum = 18446744073709551615_u64)]
    latency_ms: Option<u64>,
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({"lease_token": "lt-1-…", "output": {"findings": []},
    "usage": {"model": "gpt-4.1-mini", "input_tokens": 812, "output_tokens": 95}}))]
pub(super) struct ResultBody {
    /// The lease token from the claim: 1–256 bytes, no control characters.
    #[schema(min_length = 1, max_length = 256, pattern = "^[^\\u0000-\\u001F\\u007F-\\u009F]+$")]
    lease_token: String,
    /// The model's output, validated against the extraction's schema.
    output: Value,
    #[serde(default)]
    usage: Option<UsageBody>,
    /// `false` fails an invalid output's extraction now (`validation_failed`) instead of
    /// sending it back to be asked again (`reasked`); default `true`.
    #[serde(default)]
    reask: Option<bool>,
}

#[derive(Debug, Clone, Copy, Serialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub(super) enum CommittedState {
    Committed,
}

#[derive(Debug, Serialize, ToSchema)]
pub(super) struct ResultReply {
    state: CommittedState,
    /// How many findings the output holds.
    findings: u64,
    /// True when the extraction was already committed: nothing was written.
    replay: bool,
}

/// Commits a worker's output under its lease (the fencing token decides, not the clock).
#[utoipa::path(post, path = "/v1/extractions/{id}/result", tag = "workers", request_body = ResultBody,
    params(("id" = String, Path, pattern = "^[0-9a-f]{64}$", description = "The extraction id")),
    security(("bearer" = [])),
    responses(
        (status = 200, description = "Committed now, or already (`replay`)", body = ResultReply),
        (status = 400, response = BadRequest),
        (status = 401, response = Unauthenticated),
        (status = 403, response = Forbidden),
        (status = 404, description = "`not_found`: no extraction with that id (or none a scoped worker token may take)", body = ErrorBody),
        (status = 409, description = "`stale_lease` (not the current lease) or `illegal_transition` (failed: retry it first)", body = ErrorBody),
        (status = 408, response = BodyTimeout),
        (status = 413, response = PayloadTooLarge),
        (status = 415, response = UnsupportedEncoding),
        (status = 422, description = "`invalid_input`; `reasked`: the output fails the schema or its grounding rules (`details.issues`) and the extraction goes back to the queue to be asked again (`details.reask` counts re-asks; the next claim carries `previous_attempt`); or `validation_failed`: the same with no re-ask left, the extraction is now failed", body = ErrorBody),
        (status = 500, response = ServerError),
        (status = 503, response = StoreUnavailable),
    ))]
pub(super) async fn post_result(
    State(service): State<Service>,
    Extension(caller): CallerExt,
    IdPath(id): IdPath,
    JsonBody(body): JsonBody<ResultBody>,
) -> Reply<ResultReply> {
    // The lease token already proves the claim; a scoped token is also held to its scope
    // here, so a token that leaked from another worker's claim is of no use to it.
    in_scope(&service, &caller, id).await?;
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
    let request =
        ResultRequest { lease_token: body.lease_token, output: body.output, usage, reask: body.reask.unwrap_or(true) };
    let outcome = service.post_result(id, request).await?;
    crate::domain::failpoint::hit("after-commit-before-ack");
    let (findings, replay) = match outcome {
        PostOutcome::Committed { findings } => (findings, false),
        PostOutcome::Replay { findings } => (findings, true),
        other => {
            tracing::error!(?other, "post_result returned an outcome the service should have mapped");
            return Err(ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "internal", "unexpected outcome"));
        }
    };
    ok(ResultReply { state: CommittedState::Committed, findings, replay })
}

/// Asks for more time on the current lease.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({"lease_token": "lt-1-…", "lease_seconds": 300}))]
pub(super) struct LeaseBody {
    /// The lease token from the claim: 1–256 bytes, no control characters.
    #[schema(min_length = 1, max_length = 256, pattern = "^[^\\u0000-\\u001F\\u007F-\\u009F]+$")]
    lease_token: String,
    /// How long the lease runs from now, as in a claim.
    #[serde(deserialize_with = "whole::u64")]
    #[schema(minimum = 1, maximum = 86400)]
    lease_seconds: u64,
}

#[derive(Debug, Serialize, ToSchema)]
pub(super) struct LeaseReply {
    /// The same token: an extension never changes it.
    lease_token: String,
    lease_expires_at: String,
}

/// Extends the current lease: the token still fences the work, and its lease now runs
/// `lease_seconds` from now. A worker on a long document heartbeats with this.
#[utoipa::path(post, path = "/v1/extractions/{id}/lease", operation_id = "extend_lease", tag = "workers",
    request_body = LeaseBody,
    params(("id" = String, Path, pattern = "^[0-9a-f]{64}$", description = "The extraction id")),
    security(("bearer" = [])),
    responses(
        (status = 200, description = "The lease's new expiry", body = LeaseReply),
        (status = 400, response = BadRequest),
        (status = 401, response = Unauthenticated),
        (status = 403, response = Forbidden),
        (status = 404, description = "`not_found`: no extraction with that id (or none a scoped worker token may take)", body = ErrorBody),
        (status = 409, description = "`stale_lease` (not the current lease: another worker took over, or the extraction holds no lease) or `illegal_transition` (the extraction is committed, failed or cancelled)", body = ErrorBody),
        (status = 408, response = BodyTimeout),
        (status = 413, response = PayloadTooLarge),
        (status = 415, response = UnsupportedEncoding),
        (status = 422, description = "`invalid_input` (`details.field` names it)", body = ErrorBody),
        (status = 500, response = ServerError),
        (status = 503, response = StoreUnavailable),
    ))]
pub(super) async fn extend_lease(
    State(service): State<Service>,
    Extension(caller): CallerExt,
    IdPath(id): IdPath,
    JsonBody(body): JsonBody<LeaseBody>,
) -> Reply<LeaseReply> {
    // As for results: a scoped worker token is held to its scope even with a valid lease token.
    in_scope(&service, &caller, id).await?;
    let expires_at_ms = service.extend_lease(id, body.lease_token.clone(), body.lease_seconds).await?;
    ok(LeaseReply { lease_token: body.lease_token, lease_expires_at: crate::domain::clock::format_ms(expires_at_ms) })
}

/// Holds a scoped worker token to its scope. Work outside it answers exactly as a missing
/// extraction does: a refusal naming the extraction's tenant and schema would tell the
/// worker that it exists, and whose it is.
async fn in_scope(
    service: &Service,
    caller: &Caller,
    id: crate::domain::identity::ExtractionId,
) -> Result<(), ApiError> {
    if caller.work_scope() == WorkScope::default() {
        return Ok(());
    }
    let record = service.get(id).await?;
    match caller.may_work_on(&record.tenant, &record.schema) {
        Err(Denied::OutsideScope { .. }) => Err(crate::service::Error::NotFound(id).into()),
        other => Ok(other?),
    }
}
