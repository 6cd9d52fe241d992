//! Signed webhook intake and the outbox's dead-letter endpoints.

use axum::Json;
use axum::extract::{Request, State};
use axum::http::StatusCode;
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};

use super::body;
use super::error::{ApiError, ErrorBody};
use super::error::{Reply, ok};
use super::extract::{NamePath, QueryParams, SeqPath};
use super::log_limit::LogLimit;
use super::openapi::{
    BadRequest, BodyTimeout, Forbidden, PayloadTooLarge, ServerError, StoreUnavailable, Unauthenticated,
    UnsupportedEncoding,
};
use super::views::StateView;
use crate::service::Service;
use crate::store::{DeliveryState, OutboxFilter, OutboxKind, OutboxRecord};

const MAX_OUTBOX_PAGE: usize = 1000;

/// Forged deliveries cost the sender nothing; one log line each would let anyone fill the
/// disk, so rejections are logged at most once per interval with a count of the rest.
static REJECTIONS: LogLimit = LogLimit::new(std::time::Duration::from_secs(10));

#[derive(Debug, Serialize, ToSchema)]
pub(super) struct WebhookReceipt {
    #[schema(pattern = "^[0-9a-f]{64}$")]
    extraction_id: String,
    state: StateView,
    created: bool,
    /// True when this delivery id was taken before: nothing was written.
    redelivery: bool,
    delivery_id: String,
}

/// A signed delivery from a configured webhook endpoint (no bearer token: the
/// signature is the authentication).
///
/// `standard` endpoints check `webhook-id`, `webhook-timestamp` and `webhook-signature`
/// (Standard Webhooks); `github` endpoints check `X-Hub-Signature-256` and
/// `X-GitHub-Delivery`. The signature is checked over the raw bytes before the body is
/// parsed, and nothing is stored unless it holds.
#[utoipa::path(post, path = "/v1/webhooks/{name}", tag = "webhooks",
    params(
        ("name" = String, Path, description = "The configured endpoint name"),
        ("webhook-id" = Option<String>, Header, description = "`standard`: the delivery id"),
        ("webhook-timestamp" = Option<String>, Header, description = "`standard`: Unix seconds of the attempt"),
        ("webhook-signature" = Option<String>, Header, description = "`standard`: space-separated `v1,<base64>`"),
        ("x-hub-signature-256" = Option<String>, Header, description = "`github`: `sha256=<hex>`"),
        ("x-github-delivery" = Option<String>, Header, description = "`github`: the delivery id"),
    ),
    request_body(content = Object, description = "The sender's JSON payload, mapped by the endpoint's JSON Pointers"),
    responses(
        (status = 201, description = "First delivery; a new identity", body = WebhookReceipt),
        (status = 200, description = "A redelivery, or the identity existed", body = WebhookReceipt),
        (status = 400, response = BadRequest),
        (status = 401, description = "`bad_signature`: missing or bad signature, or a stale timestamp", body = ErrorBody),
        (status = 404, description = "`unknown_webhook`: no endpoint with that name", body = ErrorBody),
        (status = 408, response = BodyTimeout),
        (status = 413, response = PayloadTooLarge),
        (status = 415, response = UnsupportedEncoding),
        (status = 422, description = "`invalid_payload` (the pointers find nothing usable), `invalid_input` or `unknown_schema`", body = ErrorBody),
        (status = 500, response = ServerError),
        (status = 503, response = StoreUnavailable),
    ))]
pub(super) async fn receive(
    State(service): State<Service>,
    NamePath(name): NamePath,
    request: Request,
) -> Reply<WebhookReceipt> {
    // Nobody is authenticated yet: find the endpoint and check the declared size before
    // reading a byte, so an unknown name or a huge body costs no memory.
    let endpoint = service.webhook(&name)?;
    let (parts, body) = request.into_parts();
    let headers = parts.headers;
    let body = body::read(&headers, body, endpoint.max_body_bytes, "webhooks.max_body_bytes").await?;
    let lookup = |header: &str| headers.get(header).and_then(|v| v.to_str().ok());
    let now_secs = crate::domain::clock::now_ms() / 1000;
    let delivery = endpoint.verify(&lookup, &body, now_secs).map_err(|e| {
        REJECTIONS.warn(|suppressed| {
            tracing::warn!(webhook = %name, error = %e, suppressed, "rejected a webhook delivery");
        });
        ApiError::new(StatusCode::UNAUTHORIZED, "bad_signature", e.to_string())
    })?;
    let request = endpoint
        .map(&body)
        .map_err(|e| ApiError::new(StatusCode::UNPROCESSABLE_ENTITY, "invalid_payload", e.to_string()))?;
    let (outcome, redelivery) = service.intake_delivery(&endpoint.name, &delivery.id, request).await?;
    let status = if outcome.created { StatusCode::CREATED } else { StatusCode::OK };
    let body = WebhookReceipt {
        extraction_id: outcome.record.id.to_hex(),
        state: StateView::of(&outcome.record.state),
        created: outcome.created,
        redelivery,
        delivery_id: delivery.id,
    };
    Ok((status, Json(body)))
}

#[derive(Debug, Clone, Copy, Deserialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub(super) enum OutboxState {
    Pending,
    Dead,
}

#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub(super) struct OutboxQuery {
    /// Which events: still to deliver (default), or given up on.
    #[param(inline)]
    state: Option<OutboxState>,
    /// The `next` of the previous page.
    #[param(maximum = 18446744073709551615_u64)]
    after: Option<u64>,
    /// Page size; clamped to 1–1000 (default 100).
    #[param(maximum = 18446744073709551615_u64)]
    limit: Option<usize>,
}

#[derive(Debug, Serialize, ToSchema)]
pub(super) struct OutboxPage {
    events: Vec<OutboxEvent>,
    /// Pass as `after` for the following page; null on the last page.
    next: Option<u64>,
}

/// Outbox events waiting for delivery, or dead.
#[utoipa::path(get, path = "/v1/outbox", operation_id = "list_outbox", tag = "outbox", params(OutboxQuery),
    security(("bearer" = [])),
    responses(
        (status = 200, description = "A page of events", body = OutboxPage, links(
            ("redeliver" = (operation_id = "redeliver", parameters(("id" = "$response.body#/events/0/id"))))
        )),
        (status = 400, response = BadRequest),
        (status = 401, response = Unauthenticated),
        (status = 403, response = Forbidden),
        (status = 500, response = ServerError),
        (status = 503, response = StoreUnavailable),
    ))]
pub(super) async fn list(
    State(service): State<Service>,
    QueryParams(q): QueryParams<OutboxQuery>,
) -> Reply<OutboxPage> {
    let filter = match q.state {
        None | Some(OutboxState::Pending) => OutboxFilter::Pending,
        Some(OutboxState::Dead) => OutboxFilter::Dead,
    };
    let limit = q.limit.unwrap_or(100).clamp(1, MAX_OUTBOX_PAGE);
    let events = service.outbox(filter, q.after.unwrap_or(0), limit).await?;
    let next = (events.len() == limit).then(|| events.last().map(|e| e.seq)).flatten();
    ok(OutboxPage { events: events.iter().map(event).collect(), next })
}

/// Puts a dead event back to pending.
#[utoipa::path(post, path = "/v1/outbox/{id}/redeliver", tag = "outbox",
    params(("id" = u64, Path, maximum = 18446744073709551615_u64, description = "The event's `id`")),
    security(("bearer" = [])),
    responses(
        (status = 200, description = "The event, pending again", body = OutboxEvent),
        (status = 400, response = BadRequest),
        (status = 401, response = Unauthenticated),
        (status = 403, response = Forbidden),
        (status = 404, description = "`unknown_event`: no event with that id", body = ErrorBody),
        (status = 500, response = ServerError),
        (status = 503, response = StoreUnavailable),
    ))]
pub(super) async fn redeliver(State(service): State<Service>, SeqPath(seq): SeqPath) -> Reply<OutboxEvent> {
    let record = service.redeliver(seq).await?;
    ok(event(&record))
}

#[derive(Debug, Serialize, ToSchema)]
pub(super) struct SinkEnabled {
    sink: String,
    enabled: bool,
}

/// Re-enables a sink that a receiver disabled with 410 Gone.
#[utoipa::path(post, path = "/v1/admin/sinks/{name}/enable", tag = "outbox",
    params(("name" = String, Path, description = "The sink's configured name")),
    security(("bearer" = [])),
    responses(
        (status = 200, description = "The sink takes deliveries again", body = SinkEnabled),
        (status = 400, response = BadRequest),
        (status = 401, response = Unauthenticated),
        (status = 403, response = Forbidden),
        (status = 500, response = ServerError),
        (status = 503, response = StoreUnavailable),
    ))]
pub(super) async fn enable_sink(State(service): State<Service>, NamePath(name): NamePath) -> Reply<SinkEnabled> {
    service.enable_sink(&name).await?;
    ok(SinkEnabled { sink: name, enabled: true })
}

#[derive(Debug, Clone, Copy, Serialize, ToSchema)]
pub(super) enum EventType {
    #[serde(rename = "extraction.committed")]
    Committed,
    #[serde(rename = "extraction.failed")]
    Failed,
    #[serde(rename = "extraction.cancelled")]
    Cancelled,
    #[serde(rename = "extraction.superseded")]
    Superseded,
}

#[derive(Debug, Clone, Copy, Serialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub(super) enum DeliveryStateView {
    Pending,
    Delivered,
    Dead,
}

/// When delivered: `{"at", "status"}`; when dead: `{"reason"}`.
#[derive(Debug, Serialize, ToSchema)]
#[serde(untagged)]
pub(super) enum DeliveryDetail {
    Delivered { at: String, status: u16 },
    Dead { reason: String },
}

#[derive(Debug, Serialize, ToSchema)]
pub(super) struct OutboxEvent {
    id: u64,
    /// The `webhook-id` receivers deduplicate on: the same for every sink and attempt.
    event_id: String,
    #[serde(rename = "type")]
    kind: EventType,
    sink: String,
    #[schema(pattern = "^[0-9a-f]{64}$")]
    extraction_id: String,
    tenant: String,
    state: DeliveryStateView,
    detail: Option<DeliveryDetail>,
    deliveries: u32,
    next_attempt_at: String,
    last_error: Option<String>,
    created_at: String,
}

fn event(e: &OutboxRecord) -> OutboxEvent {
    let (state, detail) = match &e.state {
        DeliveryState::Pending => (DeliveryStateView::Pending, None),
        DeliveryState::Delivered { at_ms, status } => (
            DeliveryStateView::Delivered,
            Some(DeliveryDetail::Delivered { at: crate::domain::clock::format_ms(*at_ms), status: *status }),
        ),
        DeliveryState::Dead { reason } => {
            (DeliveryStateView::Dead, Some(DeliveryDetail::Dead { reason: reason.clone() }))
        }
    };
    OutboxEvent {
        id: e.seq,
        event_id: e.event_id.clone(),
        kind: match e.kind {
            OutboxKind::Committed | OutboxKind::Revision { .. } => EventType::Committed,
            OutboxKind::Superseded { .. } => EventType::Superseded,
            OutboxKind::Failed { .. } => EventType::Failed,
            OutboxKind::Cancelled => EventType::Cancelled,
        },
        sink: e.sink.clone(),
        extraction_id: e.extraction_id.to_hex(),
        tenant: e.tenant.clone(),
        state,
        detail,
        deliveries: e.deliveries,
        next_attempt_at: crate::domain::clock::format_ms(e.next_attempt_at_ms),
        last_error: e.last_error.clone(),
        created_at: crate::domain::clock::format_ms(e.created_at_ms),
    }
}
