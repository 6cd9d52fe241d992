//! `GET /v1/export`: a tenant's committed extractions as NDJSON, streamed from one read
//! snapshot (the body is fed by `export_feed`). Each export takes a place under the
//! server's and the tenant's caps first, held until its walk ends.

use axum::Extension;
use axum::extract::State;
use axum::http::header;
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};

use super::auth::CallerExt;
use super::error::{ApiError, ErrorBody};
use super::extract::QueryParams;
use super::money::DateOrTime;
use super::openapi::{Forbidden, Unauthenticated};
use super::time::parse_time;
use super::views::{self, Finding};
use crate::domain::clock::format_ms;
use crate::domain::schema::Registry;
use crate::service::Service;
use crate::store::{ExportFilter, Exported};

#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub(super) struct ExportQuery {
    /// The tenant to export (a tenant token may name only its own).
    #[param(pattern = "^[A-Za-z0-9._-]{1,128}$")]
    tenant: String,
    /// Only extractions of this registered schema.
    schema: Option<String>,
    /// Committed at or after this time: a UTC date (`2026-11-01`) or an RFC 3339 time.
    #[param(inline, value_type = DateOrTime, required = false)]
    since: Option<String>,
    /// Committed before this time (exclusive).
    #[param(inline, value_type = DateOrTime, required = false)]
    until: Option<String>,
    /// Only each source's newest committed revision: leaves out every extraction a newer
    /// revision superseded (as of the export's snapshot).
    latest: Option<bool>,
}

/// One line of the export: a committed extraction and its findings.
#[derive(Debug, Serialize, ToSchema)]
pub(super) struct ExportLine {
    #[schema(pattern = "^[0-9a-f]{64}$")]
    extraction_id: String,
    tenant: String,
    source_id: String,
    schema: String,
    committed_at: String,
    findings: Vec<Finding>,
    /// What the committed output holds besides its findings array; null once retention
    /// dropped the raw result.
    #[schema(value_type = Option<Object>)]
    output_fields: Option<serde_json::Value>,
}

/// A tenant's committed extractions, one JSON object per line, in commit order.
#[utoipa::path(get, path = "/v1/export", tag = "extractions", params(ExportQuery),
    security(("bearer" = [])),
    responses(
        (status = 200, description = "One `ExportLine` per committed extraction, newline-delimited, in commit \
            order, from one consistent snapshot. A failure after the first byte cuts the stream short \
            (the chunked body does not end properly), as does a client that takes no data for \
            `server.stream_stall_timeout`, or an erasure of the tenant while the export runs.",
            body = ExportLine, content_type = "application/x-ndjson"),
        (status = 400, description = "`invalid_query`: a parameter is missing or malformed", body = ErrorBody),
        (status = 401, response = Unauthenticated),
        (status = 403, response = Forbidden),
        (status = 422, description = "`unknown_schema`, or `invalid_input`: `until` is not after `since`", body = ErrorBody),
        (status = 429, description = "`too_many_exports`: the tenant already runs `server.max_exports_per_tenant` \
            exports; `Retry-After` says when to try again", body = ErrorBody),
        (status = 503, description = "`exports_busy`: the server already runs `server.max_exports` exports; \
            `Retry-After` says when to try again", body = ErrorBody),
    ))]
pub(super) async fn export(
    State(service): State<Service>,
    Extension(caller): CallerExt,
    QueryParams(q): QueryParams<ExportQuery>,
) -> Result<Response, ApiError> {
    caller.may_reach(&q.tenant)?;
    let since_ms = q.since.as_deref().map(|t| parse_time("since", t)).transpose()?.unwrap_or(0);
    let until_ms = q.until.as_deref().map(|t| parse_time("until", t)).transpose()?.unwrap_or(u64::MAX);
    let filter =
        ExportFilter { tenant: q.tenant, schema: q.schema, since_ms, until_ms, latest: q.latest.unwrap_or(false) };
    service.check_export(&filter)?;
    let permit = service.start_export(&filter.tenant)?;
    let registry = service.registry().clone();
    let (sink, body) = super::export_feed::feed(permit, Box::new(move |buf, item| write_line(&registry, buf, item)));
    let store = service.store().clone();
    tokio::spawn(async move {
        // A store error cuts the body short (the feed never hands over its end).
        if let Err(e) = store.export_to(filter, sink).await {
            tracing::error!(error = %crate::store::error_chain(&e), "export stopped by a store error");
        }
    });
    Ok(([(header::CONTENT_TYPE, "application/x-ndjson")], body).into_response())
}

fn write_line(registry: &Registry, buf: &mut Vec<u8>, item: &Exported) {
    let r = &item.record;
    let output_fields = item.output_json.as_deref().and_then(|output| registry.output_fields(&r.schema, output));
    let line = ExportLine {
        extraction_id: r.id.to_hex(),
        tenant: r.tenant.clone(),
        source_id: r.source_id.clone(),
        schema: r.schema.clone(),
        committed_at: format_ms(item.committed_at_ms),
        findings: item.findings.iter().map(views::finding).collect(),
        output_fields,
    };
    // Serializing plain strings and JSON values into a Vec cannot fail.
    if serde_json::to_writer(&mut *buf, &line).is_ok() {
        buf.push(b'\n');
    }
}
