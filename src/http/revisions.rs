//! The revisions of a source (`GET /v1/sources/{tenant}/{source_id}`) and the findings
//! diff between two revisions (`GET /v1/extractions/{id}/diff`).

use axum::Extension;
use axum::extract::{Path, State};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use utoipa::{IntoParams, ToSchema};

use super::auth::CallerExt;
use super::error::{ApiError, ErrorBody, Reply, ok};
use super::extract::{IdPath, QueryParams};
use super::handlers::visible;
use super::openapi::{Forbidden, InvalidInput, ServerError, StoreUnavailable, Unauthenticated};
use super::views::{self, Extraction};
use crate::service::{Against, Service};
use crate::store::schema_family;

#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub(super) struct SourceQuery {
    /// The schema name (`code-review`); a version (`code-review@2`) is accepted and
    /// ignored: every version of a name is one list of revisions.
    schema: String,
}

/// A source's revisions under one schema name.
#[derive(Debug, Serialize, ToSchema)]
pub(super) struct SourceView {
    tenant: String,
    source_id: String,
    /// The schema name, without a version.
    schema: String,
    /// The current revision: the one with the newest intake, in whatever state it is.
    current: Extraction,
    /// The newest committed revision, which nothing superseded (what `latest=true`
    /// exports); null before any revision committed.
    #[schema(pattern = "^[0-9a-f]{64}$")]
    latest_committed: Option<String>,
    /// Every revision, oldest intake first, each with its `superseded_by`.
    revisions: Vec<Extraction>,
}

/// The revisions of one source: the current one (newest intake), the newest committed
/// one, and every revision with its state and `superseded_by` link.
#[utoipa::path(get, path = "/v1/sources/{tenant}/{source_id}", tag = "extractions",
    params(
        ("tenant" = String, Path, pattern = "^[A-Za-z0-9._-]{1,128}$"),
        ("source_id" = String, Path, description = "The source id, percent-encoded"),
        SourceQuery,
    ),
    security(("bearer" = [])),
    responses(
        (status = 200, description = "The source's revisions", body = SourceView),
        (status = 400, description = "`invalid_query` or `invalid_path`", body = ErrorBody),
        (status = 401, response = Unauthenticated),
        (status = 403, response = Forbidden),
        (status = 404, description = "`unknown_source`: no extraction of that source under that schema name", body = ErrorBody),
        (status = 422, response = InvalidInput),
        (status = 500, response = ServerError),
        (status = 503, response = StoreUnavailable),
    ))]
pub(super) async fn source(
    State(service): State<Service>,
    Extension(caller): CallerExt,
    path: Result<Path<(String, String)>, axum::extract::rejection::PathRejection>,
    QueryParams(q): QueryParams<SourceQuery>,
) -> Reply<SourceView> {
    let Path((tenant, source_id)) = path.map_err(|e| ApiError::bad_request("invalid_path", e.body_text()))?;
    caller.may_reach(&tenant)?;
    let source = service.source(&tenant, &source_id, &q.schema).await?;
    ok(SourceView {
        schema: schema_family(&q.schema).to_string(),
        current: views::extraction(&source.current),
        latest_committed: source.latest_committed().map(|r| r.id.to_hex()),
        revisions: source.revisions.iter().map(views::extraction).collect(),
        tenant,
        source_id,
    })
}

#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub(super) struct DiffQuery {
    /// `previous` (the default: the newest committed revision of the same source with an
    /// older intake) or another revision's id.
    #[param(pattern = "^(previous|[0-9a-f]{64})$")]
    against: Option<String>,
}

#[derive(Debug, Serialize, ToSchema)]
pub(super) struct DiffCountsView {
    introduced: u64,
    resolved: u64,
    unchanged: u64,
}

/// The findings of `extraction_id` compared with those of `against`, by each finding's
/// canonical identity (its identifying fields), not its per-extraction key.
#[derive(Debug, Serialize, ToSchema)]
pub(super) struct DiffView {
    #[schema(pattern = "^[0-9a-f]{64}$")]
    extraction_id: String,
    #[schema(pattern = "^[0-9a-f]{64}$")]
    against: String,
    schema: String,
    against_schema: String,
    counts: DiffCountsView,
    /// Identities only `extraction_id` has, each as its identifying fields: an object
    /// from each identity pointer (without its leading `/`) to the finding's value.
    #[schema(value_type = Vec<Object>)]
    introduced: Vec<Value>,
    /// Identities only `against` has.
    #[schema(value_type = Vec<Object>)]
    resolved: Vec<Value>,
    /// Identities both have.
    #[schema(value_type = Vec<Object>)]
    unchanged: Vec<Value>,
}

/// The findings diff between two committed revisions of one source. Across schema
/// versions (`code-review@1` → `@2`) it is offered only when both versions identify
/// findings by the same fields; otherwise it is a re-extraction, not comparable (409).
#[utoipa::path(get, path = "/v1/extractions/{id}/diff", tag = "extractions",
    params(("id" = String, Path, pattern = "^[0-9a-f]{64}$", description = "The extraction id"), DiffQuery),
    security(("bearer" = [])),
    responses(
        (status = 200, description = "Introduced, resolved and unchanged findings", body = DiffView),
        (status = 400, description = "`invalid_id` or `invalid_query`", body = ErrorBody),
        (status = 401, response = Unauthenticated),
        (status = 404, description = "`not_found`: no extraction with that id or `against` id (or another tenant's)", body = ErrorBody),
        (status = 409, description = "`not_comparable`: not committed, no older committed revision, another source, \
            or schema versions that identify findings differently", body = ErrorBody),
        (status = 500, response = ServerError),
        (status = 503, response = StoreUnavailable),
    ))]
pub(super) async fn diff(
    State(service): State<Service>,
    Extension(caller): CallerExt,
    IdPath(id): IdPath,
    QueryParams(q): QueryParams<DiffQuery>,
) -> Reply<DiffView> {
    visible(&caller, &service.get(id).await?.tenant, id)?;
    let against = match q.against.as_deref() {
        None | Some("previous") => Against::Previous,
        Some(other) => Against::Id(
            other.parse().map_err(|e| ApiError::bad_request("invalid_query", format!("against {other:?}: {e}")))?,
        ),
    };
    // Another tenant's revision must answer as a missing one does, not as "not comparable",
    // or the diff tells a tenant which ids exist elsewhere.
    if let Against::Id(other) = against {
        visible(&caller, &service.get(other).await?.tenant, other)?;
    }
    let d = service.revision_diff(id, against).await?;
    let pointers = service.registry().get(&d.to.schema).map(|s| s.identity_pointers().to_vec()).unwrap_or_default();
    let values = |ids: &[String]| ids.iter().map(|i| identity_fields(&pointers, i)).collect();
    let counts = d.diff.counts();
    ok(DiffView {
        extraction_id: d.to.id.to_hex(),
        against: d.from.id.to_hex(),
        schema: d.to.schema.clone(),
        against_schema: d.from.schema.clone(),
        counts: DiffCountsView {
            introduced: counts.introduced,
            resolved: counts.resolved,
            unchanged: counts.unchanged,
        },
        introduced: values(&d.diff.introduced),
        resolved: values(&d.diff.resolved),
        unchanged: values(&d.diff.unchanged),
    })
}

/// A canonical identity (a JSON array of the identifying values, in pointer order) as an
/// object keyed by pointer; the array itself if it does not match the pointers.
fn identity_fields(pointers: &[String], identity: &str) -> Value {
    match serde_json::from_str::<Value>(identity) {
        Ok(Value::Array(values)) if values.len() == pointers.len() => {
            Value::Object(pointers.iter().map(|p| p.strip_prefix('/').unwrap_or(p).to_string()).zip(values).collect())
        }
        Ok(other) => other,
        Err(_) => Value::String(identity.to_string()),
    }
}
