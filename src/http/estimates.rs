//! `POST /v1/estimates`: the cost of sources at each configured provider, before any is
//! sent (`service::estimates`; the rules in `engine::ledger::estimate`).

use axum::Extension;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::auth::CallerExt;
use super::error::{ErrorBody, Reply, ok};
use super::extract::JsonBody;
use super::openapi::{BadRequest, Forbidden, ServerError, StoreUnavailable, Unauthenticated};
use super::whole;
use crate::engine::ledger::estimate::OutputBasis;
use crate::service::{EstimateRequest, Service, TenantEstimate, estimate_sources};

/// Either `items` (each source's id and content length) or `count` and `bytes` (their
/// number and total content length).
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({"tenant": "acme", "schema": "code-review@1",
    "items": [{"source_id": "src/lib.rs", "bytes": 5120}]}))]
pub(super) struct EstimateBody {
    #[schema(pattern = "^[A-Za-z0-9._-]{1,128}$")]
    tenant: String,
    /// A registered schema name.
    schema: String,
    /// One configured provider; without it, every configured provider.
    #[serde(default)]
    provider: Option<String>,
    #[serde(default)]
    #[schema(max_items = 100000)]
    items: Option<Vec<EstimateItem>>,
    #[serde(default, deserialize_with = "whole::option_u64")]
    #[schema(minimum = 1)]
    count: Option<u64>,
    #[serde(default, deserialize_with = "whole::option_u64")]
    bytes: Option<u64>,
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct EstimateItem {
    source_id: String,
    /// The content's length in bytes (UTF-8).
    #[serde(deserialize_with = "whole::u64")]
    bytes: u64,
}

/// What an estimate's output tokens rest on: the tenant's mean output per fresh answer at
/// that provider over 30 days, else the provider's output budget (the most an answer may use).
#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "snake_case")]
#[allow(dead_code, reason = "describes OutputBasis's serialisation; never built")]
pub(super) enum OutputBasisView {
    History,
    Budget,
}

#[derive(Debug, Serialize, ToSchema)]
pub(super) struct ProviderEstimate {
    provider: String,
    #[schema(required = true)]
    model: Option<String>,
    /// Through a batch API, so at the configured batch discount.
    batch: bool,
    input_tokens: u64,
    output_tokens: u64,
    #[schema(value_type = OutputBasisView)]
    output_basis: OutputBasis,
    /// Null when no `[[prices]]` row prices the model: what it costs cannot be told.
    #[schema(required = true)]
    cost_micros: Option<u64>,
    /// Whether the cost fits what is left of the tenant's budget this period; null
    /// without a budget or a cost.
    #[schema(required = true)]
    covered_by_budget: Option<bool>,
}

#[derive(Debug, Serialize, ToSchema)]
pub(super) struct BudgetView {
    limit_micros: u64,
    spent_micros: u64,
    /// Reserved for work already with a provider.
    reserved_micros: u64,
    /// Limit less spend and reservations.
    remaining_micros: u64,
}

#[derive(Debug, Serialize, ToSchema)]
pub(super) struct EstimateReply {
    tenant: String,
    schema: String,
    /// One per source.
    requests: u64,
    /// The provider routing sends this tenant's and schema's new work to, if any.
    #[schema(required = true)]
    routed_to: Option<String>,
    /// The tenant's budget this period; null without one.
    #[schema(required = true)]
    budget: Option<BudgetView>,
    estimates: Vec<ProviderEstimate>,
}

impl EstimateReply {
    fn new(e: TenantEstimate) -> Self {
        let budget = e.budget;
        Self {
            tenant: e.tenant,
            schema: e.schema,
            requests: e.requests,
            routed_to: e.routed_to,
            budget: budget.map(|b| BudgetView {
                limit_micros: b.limit_micros,
                spent_micros: b.spent_micros,
                reserved_micros: b.reserved_micros,
                remaining_micros: b.remaining_micros(),
            }),
            estimates: e
                .estimates
                .into_iter()
                .map(|p| ProviderEstimate {
                    covered_by_budget: budget.and_then(|b| b.covers(p.cost_micros)),
                    provider: p.provider,
                    model: p.model,
                    batch: p.batch,
                    input_tokens: p.input_tokens,
                    output_tokens: p.output_tokens,
                    output_basis: p.output_basis,
                    cost_micros: p.cost_micros,
                })
                .collect(),
        }
    }
}

/// What sources would cost at each configured provider, before any is sent (a tenant
/// token asks for its own tenant only).
#[utoipa::path(post, path = "/v1/estimates", tag = "costs", request_body = EstimateBody,
    security(("bearer" = [])),
    responses(
        (status = 200, description = "One estimate per provider", body = EstimateReply),
        (status = 400, response = BadRequest),
        (status = 401, response = Unauthenticated),
        (status = 403, response = Forbidden),
        (status = 422, description = "`invalid_input` (`details.field` names it: neither or both of `items` and `count`, an unknown provider) or `unknown_schema`", body = ErrorBody),
        (status = 500, response = ServerError),
        (status = 503, response = StoreUnavailable),
    ))]
pub(super) async fn estimate(
    axum::extract::State(service): axum::extract::State<Service>,
    Extension(caller): CallerExt,
    JsonBody(body): JsonBody<EstimateBody>,
) -> Reply<EstimateReply> {
    caller.may_reach(&body.tenant)?;
    let items = body.items.map(|items| items.into_iter().map(|i| (i.source_id, i.bytes)).collect());
    let sources = estimate_sources(items, body.count, body.bytes)?;
    let request = EstimateRequest { tenant: body.tenant, schema: body.schema, provider: body.provider, sources };
    ok(EstimateReply::new(service.estimate(request).await?))
}
