//! Tenant erasure (admin): `DELETE /v1/tenants/{tenant}`.

use axum::extract::State;
use serde::Serialize;
use utoipa::ToSchema;

use super::browser::NotFromBrowser;
use super::error::ErrorBody;
use super::error::{Reply, ok};
use super::extract::NamePath;
use super::openapi::{BadRequest, Forbidden, ServerError, StoreUnavailable, Unauthenticated};
use crate::service::Service;
use crate::store::ErasureReport;

/// What one erasure removed. A second erasure of the same tenant answers zeros.
#[derive(Debug, Serialize, ToSchema)]
pub(super) struct TenantErased {
    tenant: String,
    extractions: u64,
    contents: u64,
    findings: u64,
    raw_results: u64,
    /// Provider answers that were staged and not yet committed.
    staged_answers: u64,
    /// Ledger entries removed; their charges stay in the tenant's per-day spend totals.
    ledger_entries: u64,
    outbox_events: u64,
    webhook_deliveries: u64,
    /// Batches not yet sent to a provider that had only this tenant's work, closed unsent.
    intents_closed: u64,
}

/// Erases a tenant: its extractions with their contents, findings, raw results and staged
/// answers, its ledger entries, outbox events and webhook delivery ids. Per-day spend
/// totals stay (with no source identifiers), so budgets and invoices still add up. Work in
/// flight at a provider is never committed: its late answer names an extraction that no
/// longer exists and is dropped without a charge. Idempotent.
#[utoipa::path(delete, path = "/v1/tenants/{tenant}", tag = "admin",
    params(("tenant" = String, Path, pattern = "^[A-Za-z0-9._-]{1,128}$")),
    security(("bearer" = [])),
    responses(
        (status = 200, description = "Erased; the counts of what was removed", body = TenantErased),
        (status = 400, response = BadRequest),
        (status = 401, response = Unauthenticated),
        (status = 403, response = Forbidden),
        (status = 422, description = "`invalid_input`: not a tenant name", body = ErrorBody),
        (status = 500, response = ServerError),
        (status = 503, response = StoreUnavailable),
    ))]
pub(super) async fn erase(
    _: NotFromBrowser,
    State(service): State<Service>,
    NamePath(tenant): NamePath,
) -> Reply<TenantErased> {
    let r: ErasureReport = service.erase_tenant(tenant.clone()).await?;
    ok(TenantErased {
        tenant,
        extractions: r.extractions,
        contents: r.contents,
        findings: r.findings,
        raw_results: r.raw_results,
        staged_answers: r.staged_answers,
        ledger_entries: r.ledger_entries,
        outbox_events: r.outbox_events,
        webhook_deliveries: r.webhook_deliveries,
        intents_closed: r.intents_closed,
    })
}
