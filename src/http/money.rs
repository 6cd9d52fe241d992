//! Cost endpoints: a tenant's totals over a range, and one extraction's attempts.

use std::collections::BTreeMap;

use axum::Extension;
use axum::extract::State;
use serde::{Deserialize, Serialize};
use utoipa::openapi::RefOr;
use utoipa::openapi::schema::{AnyOfBuilder, KnownFormat, ObjectBuilder, Schema, SchemaFormat, Type};
use utoipa::{IntoParams, ToSchema};

use super::auth::CallerExt;
use super::error::ErrorBody;
use super::error::{Reply, ok};
use super::extract::{IdPath, NamePath, QueryParams};
use super::openapi::{BadRequest, Forbidden, ServerError, StoreUnavailable, Unauthenticated};
use super::time::parse_time;
use crate::engine::ledger::{Bucket, CostQuery, CostReport, GroupBy, Split};
use crate::service::Service;
use crate::store::{ChargeKind, CostSource, LedgerRecord};

#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub(super) struct CostsQuery {
    /// Start of the range: a UTC date (`2026-11-01`) or an RFC 3339 time; default: the
    /// start of the current UTC month.
    #[param(inline, value_type = DateOrTime, required = false)]
    from: Option<String>,
    /// End of the range (exclusive); default: now.
    #[param(inline, value_type = DateOrTime, required = false)]
    to: Option<String>,
    #[param(inline, value_type = GroupByView, required = false)]
    group_by: Option<GroupBy>,
}

/// A date (`2026-11-01`, UTC midnight) or an RFC 3339 date-time: either format, which
/// the derive cannot say of one string.
#[derive(Debug)]
pub(super) struct DateOrTime;

impl utoipa::PartialSchema for DateOrTime {
    fn schema() -> RefOr<Schema> {
        let string =
            |format| ObjectBuilder::new().schema_type(Type::String).format(Some(SchemaFormat::KnownFormat(format)));
        AnyOfBuilder::new().item(string(KnownFormat::Date)).item(string(KnownFormat::DateTime)).into()
    }
}

impl ToSchema for DateOrTime {}

/// How `groups` is keyed.
#[derive(Debug, ToSchema)]
#[schema(as = GroupBy)]
#[serde(rename_all = "lowercase")]
#[allow(dead_code, reason = "describes a query string; never built")]
pub(super) enum GroupByView {
    Day,
    Model,
    Provider,
}

/// Attempts, tokens and cost of one kind of ledger entry.
#[derive(Debug, Serialize, ToSchema)]
pub(super) struct CostBucket {
    attempts: u64,
    input_tokens: u64,
    output_tokens: u64,
    cost_micros: u64,
    /// Paid attempts whose model has no `[[prices]]` row and whose provider reported no
    /// cost: booked at $0, so `cost_micros` is short of the bill by what they really cost.
    unpriced_attempts: u64,
}

impl From<&Bucket> for CostBucket {
    fn from(b: &Bucket) -> Self {
        let Bucket { attempts, input_tokens, output_tokens, cost_micros, unpriced_attempts } = *b;
        Self { attempts, input_tokens, output_tokens, cost_micros, unpriced_attempts }
    }
}

/// Fresh work, replays (cost 0), validation failures and unusable answers.
#[derive(Debug, Serialize, ToSchema)]
pub(super) struct CostSplit {
    fresh: CostBucket,
    replay: CostBucket,
    failed_validation: CostBucket,
    /// Paid answers that were truncated or refused by the model: never committed.
    unusable: CostBucket,
    /// Trials of evaluations: paid, committed only when promoted (then not charged again).
    evaluation: CostBucket,
}

impl CostSplit {
    fn of(split: &Split) -> Self {
        Self {
            fresh: (&split.fresh).into(),
            replay: (&split.replay).into(),
            failed_validation: (&split.failed_validation).into(),
            unusable: (&split.unusable).into(),
            evaluation: (&split.evaluation).into(),
        }
    }
}

#[derive(Debug, Serialize, ToSchema)]
pub(super) struct TenantCosts {
    tenant: String,
    from: String,
    to: String,
    from_ms: u64,
    to_ms: u64,
    #[serde(flatten)]
    totals: CostSplit,
    /// Fresh, failed-validation, unusable and evaluation cost: what the tenant is charged.
    charged_micros: u64,
    /// Paid attempts of every kind booked at $0 for want of a price: while it is not 0,
    /// `charged_micros` is short of the bill.
    unpriced_attempts: u64,
    /// Charges on the range's UTC days (whole days) whose ledger entries were removed by
    /// an erasure of the tenant (`DELETE /v1/tenants/{tenant}`): billed, not in `charged_micros`.
    erased_micros: u64,
    /// With `group_by`: the split per day, model or provider.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(required = false)]
    groups: Option<BTreeMap<String, CostSplit>>,
}

impl TenantCosts {
    fn new(report: &CostReport) -> Self {
        Self {
            tenant: report.tenant.clone(),
            from: crate::domain::clock::format_ms(report.from_ms),
            to: crate::domain::clock::format_ms(report.to_ms),
            from_ms: report.from_ms,
            to_ms: report.to_ms,
            totals: CostSplit::of(&report.totals),
            charged_micros: report.charged_micros,
            unpriced_attempts: report.totals.unpriced_attempts(),
            erased_micros: report.erased_micros,
            groups: report
                .groups
                .as_ref()
                .map(|groups| groups.iter().map(|(key, s)| (key.clone(), CostSplit::of(s))).collect()),
        }
    }
}

/// A tenant's costs over a range (a tenant token reads its own tenant only).
#[utoipa::path(get, path = "/v1/tenants/{tenant}/costs", tag = "costs",
    params(("tenant" = String, Path, pattern = "^[A-Za-z0-9._-]{1,128}$"), CostsQuery),
    security(("bearer" = [])),
    responses(
        (status = 200, description = "Totals, optionally grouped", body = TenantCosts),
        (status = 400, response = BadRequest),
        (status = 401, response = Unauthenticated),
        (status = 403, response = Forbidden),
        (status = 422, description = "`invalid_input`: a bad tenant, or `from` not before `to`", body = ErrorBody),
        (status = 500, response = ServerError),
        (status = 503, response = StoreUnavailable),
    ))]
pub(super) async fn tenant_costs(
    State(service): State<Service>,
    Extension(caller): CallerExt,
    NamePath(tenant): NamePath,
    QueryParams(q): QueryParams<CostsQuery>,
) -> Reply<TenantCosts> {
    caller.may_reach(&tenant)?;
    let now = crate::domain::clock::now_ms();
    // Without a range: the current UTC month so far.
    let from_ms = match &q.from {
        Some(text) => parse_time("from", text)?,
        None => crate::engine::ledger::Budgets::default().period_start_day(now) * crate::store::store_day_ms(),
    };
    let to_ms = match &q.to {
        Some(text) => parse_time("to", text)?,
        None => now + 1,
    };
    let report = service.costs(CostQuery { tenant, from_ms, to_ms, group_by: q.group_by }).await?;
    ok(TenantCosts::new(&report))
}

#[derive(Debug, Serialize, ToSchema)]
pub(super) struct ExtractionCosts {
    #[schema(pattern = "^[0-9a-f]{64}$")]
    extraction_id: String,
    tenant: String,
    charged_micros: u64,
    attempts: Vec<LedgerEntry>,
}

/// One extraction's ledger entries.
#[utoipa::path(get, path = "/v1/extractions/{id}/costs", tag = "costs",
    params(("id" = String, Path, pattern = "^[0-9a-f]{64}$", description = "The extraction id")),
    security(("bearer" = [])),
    responses(
        (status = 200, description = "Every ledger entry of the extraction", body = ExtractionCosts),
        (status = 400, response = BadRequest),
        (status = 401, response = Unauthenticated),
        (status = 404, description = "`not_found`: no extraction with that id (or another tenant's)", body = ErrorBody),
        (status = 500, response = ServerError),
        (status = 503, response = StoreUnavailable),
    ))]
pub(super) async fn extraction_costs(
    State(service): State<Service>,
    Extension(caller): CallerExt,
    IdPath(id): IdPath,
) -> Reply<ExtractionCosts> {
    let (tenant, entries) = service.extraction_costs(id).await?;
    super::handlers::visible(&caller, &tenant, id)?;
    ok(ExtractionCosts {
        extraction_id: id.to_hex(),
        tenant,
        // Worker-reported costs are any u64: saturate like every other ledger total.
        charged_micros: entries.iter().fold(0u64, |sum, e| sum.saturating_add(e.cost_micros)),
        attempts: entries.iter().map(entry).collect(),
    })
}

#[derive(Debug, Clone, Copy, Serialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub(super) enum ChargeKindView {
    Fresh,
    /// A re-posted result or a re-fetched result line: tokens counted, cost 0.
    Replay,
    FailedValidation,
    /// A paid answer cut off at its output budget or refused by the model: never committed.
    Unusable,
    /// A trial of an evaluation: paid, never committed by itself.
    Evaluation,
}

#[derive(Debug, Clone, Copy, Serialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub(super) enum CostSourceView {
    PriceTable,
    Provider,
    Unpriced,
}

#[derive(Debug, Serialize, ToSchema)]
pub(super) struct LedgerEntry {
    kind: ChargeKindView,
    attempt: u32,
    provider: String,
    model: String,
    job_id: Option<String>,
    request_id: Option<String>,
    input_tokens: u64,
    cached_input_tokens: u64,
    cache_write_tokens: u64,
    output_tokens: u64,
    reasoning_tokens: u64,
    latency_ms: Option<u64>,
    cost_micros: u64,
    list_cost_micros: u64,
    cost_source: CostSourceView,
    at: String,
}

pub(super) fn entry(e: &LedgerRecord) -> LedgerEntry {
    LedgerEntry {
        kind: match e.kind {
            ChargeKind::Fresh => ChargeKindView::Fresh,
            ChargeKind::Replay => ChargeKindView::Replay,
            ChargeKind::FailedValidation => ChargeKindView::FailedValidation,
            ChargeKind::Unusable => ChargeKindView::Unusable,
            ChargeKind::Evaluation => ChargeKindView::Evaluation,
        },
        attempt: e.attempt,
        provider: e.provider.clone(),
        model: e.usage.model.clone(),
        job_id: e.job_id.clone(),
        request_id: e.usage.request_id.clone(),
        input_tokens: e.usage.input_tokens,
        cached_input_tokens: e.usage.cached_input_tokens,
        cache_write_tokens: e.usage.cache_write_tokens,
        output_tokens: e.usage.output_tokens,
        reasoning_tokens: e.usage.reasoning_tokens,
        latency_ms: e.latency_ms,
        cost_micros: e.cost_micros,
        list_cost_micros: e.list_cost_micros,
        cost_source: match e.cost_source {
            CostSource::PriceTable => CostSourceView::PriceTable,
            CostSource::Provider => CostSourceView::Provider,
            CostSource::Unpriced => CostSourceView::Unpriced,
        },
        at: crate::domain::clock::format_ms(e.at_ms),
    }
}
