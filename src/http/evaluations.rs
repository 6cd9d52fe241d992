//! `/v1/evaluations`: provider bake-offs over a frozen set (docs/EVALUATIONS.md). Admin
//! only: a set may span tenants, and every trial is paid for.

use axum::Json;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};

use super::browser::NotFromBrowser;
use super::error::{ApiError, ErrorBody, Reply, ok};
use super::extract::{JsonBody, NamePath, QueryParams};
use super::openapi::{BadRequest, Forbidden, ServerError, StoreUnavailable, Unauthenticated};
use super::whole;
use crate::domain::clock::format_ms;
use crate::engine::evaluation::report;
use crate::service::{EvaluationRequest, EvaluationStatus, SampleState, SelectRequest, Service};

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({"name": "gpt-vs-claude", "schema": "code-review@1",
    "select": {"sample": 200, "state": "committed", "seed": 7}, "candidates": ["openai", "anthropic"]}))]
pub(super) struct EvaluationBody {
    /// 1-64 letters, digits, `-`, `_` or `.`, but not `.` or `..`; never reused.
    #[schema(pattern = "^[A-Za-z0-9._-]{1,64}$")]
    name: String,
    /// Draw only this tenant's extractions.
    #[serde(default)]
    tenant: Option<String>,
    /// A registered schema: the set is drawn from its extractions.
    schema: String,
    select: SelectBody,
    /// `[providers.<name>]` tables to try, 1 to 8.
    #[schema(min_items = 1, max_items = 8)]
    candidates: Vec<String>,
    /// Trial spend (micro-dollars) past which no more trial batches are sent.
    #[serde(default, deserialize_with = "whole::option_u64")]
    #[schema(minimum = 1)]
    budget_micros: Option<u64>,
}

/// Which extractions: listed ids, or a seeded sample.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(untagged, deny_unknown_fields)]
pub(super) enum SelectBody {
    Ids {
        #[schema(min_items = 1, max_items = 100000)]
        ids: Vec<String>,
    },
    Sample {
        /// How many to draw (fewer when fewer exist).
        #[serde(deserialize_with = "whole::u32")]
        #[schema(minimum = 1, maximum = 100000)]
        sample: u32,
        #[serde(default = "committed")]
        state: StateBody,
        /// The same seed over the same store draws the same set.
        #[serde(default, deserialize_with = "whole::u64")]
        seed: u64,
    },
}

fn committed() -> StateBody {
    StateBody::Committed
}

#[derive(Debug, Clone, Copy, Deserialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub(super) enum StateBody {
    Committed,
    Pending,
    Any,
}

#[derive(Debug, Serialize, ToSchema)]
pub(super) struct CandidateView {
    name: String,
    /// Members not sent to it yet.
    not_sent: u64,
    /// Sent, no answer yet.
    waiting: u64,
    /// Answered, or ended without an answer.
    finished: u64,
    spent_micros: u64,
}

#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub(super) enum EvaluationState {
    /// Trials are still being sent or read.
    Running,
    /// Every candidate has an outcome for every member.
    Done,
    /// The trials have cost `budget_micros`: nothing is waiting and no more are sent.
    BudgetReached,
    /// No more trials are sent; jobs already sent are still read.
    Cancelled,
}

#[derive(Debug, Serialize, ToSchema)]
pub(super) struct EvaluationView {
    name: String,
    #[schema(required = true)]
    tenant: Option<String>,
    schema: String,
    /// How the members were chosen.
    selection: String,
    members: u64,
    state: EvaluationState,
    candidates: Vec<CandidateView>,
    #[schema(required = true)]
    budget_micros: Option<u64>,
    /// Trial spend so far, over every candidate (the ledger's `evaluation` entries).
    spent_micros: u64,
    created_at: String,
    #[schema(required = true)]
    cancelled_at: Option<String>,
}

fn view(status: EvaluationStatus) -> EvaluationView {
    let state = if !status.record.is_running() {
        EvaluationState::Cancelled
    } else if status.done() {
        EvaluationState::Done
    } else if status.budget_reached() {
        EvaluationState::BudgetReached
    } else {
        EvaluationState::Running
    };
    let r = &status.record;
    EvaluationView {
        name: r.name.clone(),
        tenant: r.tenant.clone(),
        schema: r.schema.clone(),
        selection: r.selection.clone(),
        members: r.members.len() as u64,
        state,
        budget_micros: r.budget_micros,
        spent_micros: status.spent_micros,
        created_at: format_ms(r.created_at_ms),
        cancelled_at: r.cancelled_at_ms.map(format_ms),
        candidates: status
            .candidates
            .into_iter()
            .map(|c| CandidateView {
                name: c.candidate,
                not_sent: c.not_sent,
                waiting: c.waiting,
                finished: c.finished,
                spent_micros: c.spent_micros,
            })
            .collect(),
    }
}

/// Freezes a set of extractions and starts sending it to each candidate as trials.
#[utoipa::path(post, path = "/v1/evaluations", operation_id = "create_evaluation", tag = "evaluations", request_body = EvaluationBody,
    security(("bearer" = [])),
    responses(
        (status = 201, description = "The evaluation, frozen; trials start now", body = EvaluationView),
        (status = 400, response = BadRequest),
        (status = 401, response = Unauthenticated),
        (status = 403, response = Forbidden),
        (status = 404, description = "`unknown_provider`: a candidate is not a configured provider", body = ErrorBody),
        (status = 409, description = "`evaluation_exists`: the name is taken", body = ErrorBody),
        (status = 422, description = "`invalid_input` (`details.field`: the selection is empty, an id is unknown or of another schema or tenant, …) or `unknown_schema`", body = ErrorBody),
        (status = 500, response = ServerError),
        (status = 503, response = StoreUnavailable),
    ))]
pub(super) async fn create(
    _: NotFromBrowser,
    State(service): State<Service>,
    JsonBody(body): JsonBody<EvaluationBody>,
) -> Reply<EvaluationView> {
    let select = match body.select {
        SelectBody::Ids { ids } => SelectRequest::Ids(ids),
        SelectBody::Sample { sample, state, seed } => SelectRequest::Sample {
            count: sample,
            seed,
            state: match state {
                StateBody::Committed => SampleState::Committed,
                StateBody::Pending => SampleState::Pending,
                StateBody::Any => SampleState::Any,
            },
        },
    };
    let request = EvaluationRequest {
        name: body.name,
        tenant: body.tenant,
        schema: body.schema,
        select,
        candidates: body.candidates,
        budget_micros: body.budget_micros,
    };
    let record = service.create_evaluation(request).await?;
    let status = service.evaluation_status(&record.name).await?;
    Ok((StatusCode::CREATED, Json(view(status))))
}

#[derive(Debug, Serialize, ToSchema)]
pub(super) struct EvaluationList {
    evaluations: Vec<EvaluationView>,
}

/// Every evaluation, oldest first, with its progress.
#[utoipa::path(get, path = "/v1/evaluations", operation_id = "list_evaluations", tag = "evaluations",
    security(("bearer" = [])),
    responses(
        (status = 200, description = "The evaluations", body = EvaluationList),
        (status = 401, response = Unauthenticated),
        (status = 403, response = Forbidden),
        (status = 500, response = ServerError),
        (status = 503, response = StoreUnavailable),
    ))]
pub(super) async fn list(State(service): State<Service>) -> Reply<EvaluationList> {
    let evaluations = service.evaluations().await?.into_iter().map(view).collect();
    ok(EvaluationList { evaluations })
}

/// One evaluation's progress per candidate.
#[utoipa::path(get, path = "/v1/evaluations/{name}", operation_id = "get_evaluation", tag = "evaluations",
    params(("name" = String, Path, description = "The evaluation's name")),
    security(("bearer" = [])),
    responses(
        (status = 200, description = "The evaluation", body = EvaluationView),
        (status = 400, response = BadRequest),
        (status = 401, response = Unauthenticated),
        (status = 403, response = Forbidden),
        (status = 404, description = "`unknown_evaluation`", body = ErrorBody),
        (status = 500, response = ServerError),
        (status = 503, response = StoreUnavailable),
    ))]
pub(super) async fn get(State(service): State<Service>, NamePath(name): NamePath) -> Reply<EvaluationView> {
    ok(view(service.evaluation_status(&name).await?))
}

/// Stops sending trials; jobs already at a provider are still read (they are paid for).
#[utoipa::path(post, path = "/v1/evaluations/{name}/cancel", operation_id = "cancel_evaluation", tag = "evaluations",
    params(("name" = String, Path, description = "The evaluation's name")),
    security(("bearer" = [])),
    responses(
        (status = 200, description = "The evaluation, cancelled", body = EvaluationView),
        (status = 400, response = BadRequest),
        (status = 401, response = Unauthenticated),
        (status = 403, response = Forbidden),
        (status = 404, description = "`unknown_evaluation`", body = ErrorBody),
        (status = 500, response = ServerError),
        (status = 503, response = StoreUnavailable),
    ))]
pub(super) async fn cancel(
    _: NotFromBrowser,
    State(service): State<Service>,
    NamePath(name): NamePath,
) -> Reply<EvaluationView> {
    ok(view(service.cancel_evaluation(&name).await?))
}

#[derive(Debug, Clone, Copy, Default, Deserialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub(super) enum ReportFormat {
    #[default]
    Json,
    /// One row per candidate.
    Csv,
    /// The side-by-side table `commitpoint eval report` prints.
    Text,
}

#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub(super) struct ReportQuery {
    /// Compare with this candidate's valid answers instead of production's committed findings.
    against: Option<String>,
    #[param(inline)]
    format: Option<ReportFormat>,
}

/// Per candidate: answered, valid, truncated, refused and failed counts and rates;
/// findings per answer; agreement with the reference by finding identity (precision,
/// recall, F1, exact-set rate) with the disagreeing identities; tokens, cost and cost per
/// valid answer; latency from submit to answer.
#[utoipa::path(get, path = "/v1/evaluations/{name}/report", operation_id = "evaluation_report", tag = "evaluations",
    params(("name" = String, Path, description = "The evaluation's name"), ReportQuery),
    security(("bearer" = [])),
    responses(
        (status = 200, description = "The report (JSON; `format=csv` or `format=text` for those)", body = Object,
            content(("application/json"), ("text/csv"), ("text/plain"))),
        (status = 400, response = BadRequest),
        (status = 401, response = Unauthenticated),
        (status = 403, response = Forbidden),
        (status = 404, description = "`unknown_evaluation`", body = ErrorBody),
        (status = 422, description = "`invalid_input`: `against` is not a candidate", body = ErrorBody),
        (status = 500, response = ServerError),
        (status = 503, response = StoreUnavailable),
    ))]
pub(super) async fn report(
    State(service): State<Service>,
    NamePath(name): NamePath,
    QueryParams(q): QueryParams<ReportQuery>,
) -> Result<Response, ApiError> {
    let report = service.evaluation_report(&name, q.against.as_deref()).await?;
    Ok(match q.format.unwrap_or_default() {
        ReportFormat::Json => Json(report).into_response(),
        ReportFormat::Csv => {
            ([(header::CONTENT_TYPE, "text/csv; charset=utf-8")], report::csv(&report)).into_response()
        }
        ReportFormat::Text => {
            ([(header::CONTENT_TYPE, "text/plain; charset=utf-8")], report::table(&report)).into_response()
        }
    })
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct PromoteBody {
    /// The candidate whose valid answers are committed.
    candidate: String,
}

#[derive(Debug, Serialize, ToSchema)]
pub(super) struct PromotionView {
    /// Committed now, from the candidate's trial answers (not charged again).
    committed: u64,
    /// Committed before, by production or an earlier promotion: unchanged.
    already_committed: u64,
    /// Claimed by a worker or in a production batch: left to their own answer.
    in_flight: u64,
    /// Cancelled or erased.
    skipped: u64,
    /// The candidate has no valid answer for them: unchanged.
    no_valid_answer: u64,
    /// The `[routing] rules` entry that sends new work of this schema (and tenant) to the
    /// candidate; the old provider's known jobs are still polled to completion.
    routing_rule: String,
}

/// Commits the candidate's valid answers for the set's members that are not committed
/// yet, exactly once however often it is called, and names the routing change.
#[utoipa::path(post, path = "/v1/evaluations/{name}/promote", operation_id = "promote_evaluation", tag = "evaluations", request_body = PromoteBody,
    params(("name" = String, Path, description = "The evaluation's name")),
    security(("bearer" = [])),
    responses(
        (status = 200, description = "What was committed", body = PromotionView),
        (status = 400, response = BadRequest),
        (status = 401, response = Unauthenticated),
        (status = 403, response = Forbidden),
        (status = 404, description = "`unknown_evaluation`", body = ErrorBody),
        (status = 422, description = "`invalid_input`: not a candidate of the evaluation", body = ErrorBody),
        (status = 500, response = ServerError),
        (status = 503, response = StoreUnavailable),
    ))]
pub(super) async fn promote(
    _: NotFromBrowser,
    State(service): State<Service>,
    NamePath(name): NamePath,
    JsonBody(body): JsonBody<PromoteBody>,
) -> Reply<PromotionView> {
    let outcome = service.promote(&name, &body.candidate).await?;
    let p = outcome.promotion;
    ok(PromotionView {
        committed: p.committed,
        already_committed: p.already_committed,
        in_flight: p.in_flight,
        skipped: p.skipped,
        no_valid_answer: p.no_valid_answer,
        routing_rule: outcome.routing_rule,
    })
}
