//! Cancelling an extraction (its tenant or an operator) and retrying failed extractions
//! in bulk (operators).

use axum::Extension;
use axum::extract::State;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::auth::CallerExt;
use super::error::{ErrorBody, Reply, ok};
use super::extract::{IdPath, JsonBody};
use super::handlers::visible;
use super::openapi::{
    BadRequest, BodyTimeout, Forbidden, PayloadTooLarge, ServerError, StoreUnavailable, Unauthenticated,
    UnsupportedEncoding,
};
use super::views::{self, Extraction};
use crate::domain::lifecycle::FailureClass;
use crate::service::Service;
use crate::store::RetryFilter;

/// Stops an extraction for good: `pending`, `failed`, `claimed` or `submitted` becomes
/// `cancelled`. A worker's or a provider batch's later answer is charged but never
/// committed. Cancelling a cancelled extraction answers it again.
#[utoipa::path(post, path = "/v1/extractions/{id}/cancel", tag = "extractions",
    params(("id" = String, Path, pattern = "^[0-9a-f]{64}$", description = "The extraction id")),
    security(("bearer" = [])),
    responses(
        (status = 200, description = "The record, cancelled", body = Extraction),
        (status = 400, response = BadRequest),
        (status = 401, response = Unauthenticated),
        (status = 404, description = "`not_found`: no extraction with that id (or another tenant's)", body = ErrorBody),
        (status = 409, description = "`illegal_transition`: the extraction is committed, or `ready` (its answer is \
            in and being committed)", body = ErrorBody),
        (status = 500, response = ServerError),
        (status = 503, response = StoreUnavailable),
    ))]
pub(super) async fn cancel(
    State(service): State<Service>,
    Extension(caller): CallerExt,
    IdPath(id): IdPath,
) -> Reply<Extraction> {
    visible(&caller, &service.get(id).await?.tenant, id)?;
    ok(views::extraction(&service.cancel(id).await?))
}

/// Which failed extractions to retry; every field left out matches anything.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({"tenant": "acme", "failure_class": "validation", "limit": 1000}))]
pub(super) struct BulkRetryBody {
    #[schema(pattern = "^[A-Za-z0-9._-]{1,128}$")]
    tenant: Option<String>,
    /// A registered schema name.
    schema: Option<String>,
    #[schema(value_type = Option<FailureClassView>)]
    failure_class: Option<FailureClassView>,
    /// Retry at most this many (default: every match).
    #[serde(default, deserialize_with = "super::whole::option_u64")]
    #[schema(minimum = 1)]
    limit: Option<u64>,
}

/// The failure classes (see docs/API.md).
#[derive(Debug, Clone, Copy, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum FailureClassView {
    RateLimited,
    Transient,
    Auth,
    InvalidRequest,
    Validation,
    Gone,
    Truncated,
    Refused,
    AttemptsExhausted,
}

impl From<FailureClassView> for FailureClass {
    fn from(v: FailureClassView) -> Self {
        use FailureClassView as V;
        match v {
            V::RateLimited => Self::RateLimited,
            V::Transient => Self::Transient,
            V::Auth => Self::Auth,
            V::InvalidRequest => Self::InvalidRequest,
            V::Validation => Self::Validation,
            V::Gone => Self::Gone,
            V::Truncated => Self::Truncated,
            V::Refused => Self::Refused,
            V::AttemptsExhausted => Self::AttemptsExhausted,
        }
    }
}

#[derive(Debug, Serialize, ToSchema)]
pub(super) struct BulkRetryReply {
    /// How many failed extractions are pending again.
    retried: u64,
}

/// Moves every matching failed extraction back to pending (`attempts` + 1), in intake
/// order, a bounded number per transaction.
#[utoipa::path(post, path = "/v1/admin/retry", operation_id = "retry_failed", tag = "admin", request_body = BulkRetryBody,
    security(("bearer" = [])),
    responses(
        (status = 200, description = "How many were retried", body = BulkRetryReply),
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
pub(super) async fn retry(
    State(service): State<Service>,
    JsonBody(body): JsonBody<BulkRetryBody>,
) -> Reply<BulkRetryReply> {
    let filter = RetryFilter {
        tenant: body.tenant,
        schema: body.schema,
        failure_class: body.failure_class.map(FailureClass::from),
    };
    ok(BulkRetryReply { retried: service.retry_failed(filter, body.limit).await? })
}
