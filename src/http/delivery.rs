//! Signed webhook intake and the outbox's dead-letter endpoints.

use axum::Json;
use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use serde::Deserialize;
use serde_json::{Value, json};

use super::error::ApiError;
use super::extract::QueryParams;
use super::handlers::{Reply, ok};
use crate::service::Service;
use crate::store::{DeliveryState, OutboxFilter, OutboxKind, OutboxRecord};

const MAX_OUTBOX_PAGE: usize = 1000;

/// The signature is the authentication here: checked over the raw bytes before the body
/// is parsed, and nothing is stored unless it holds.
pub async fn receive(
    State(service): State<Service>,
    Path(name): Path<String>,
    headers: HeaderMap,
    body: Bytes,
) -> Reply {
    let endpoint = service.webhook(&name)?;
    let lookup = |header: &str| headers.get(header).and_then(|v| v.to_str().ok());
    let now_secs = crate::clock::now_ms() / 1000;
    let delivery = endpoint.verify(&lookup, &body, now_secs).map_err(|e| {
        tracing::warn!(webhook = %name, error = %e, "rejected a webhook delivery");
        ApiError::new(StatusCode::UNAUTHORIZED, "bad_signature", e.to_string())
    })?;
    let request = endpoint
        .map(&body)
        .map_err(|e| ApiError::new(StatusCode::UNPROCESSABLE_ENTITY, "invalid_payload", e.to_string()))?;
    let (outcome, redelivery) = service.webhook_intake(endpoint, &delivery.id, request).await?;
    let status = if outcome.created { StatusCode::CREATED } else { StatusCode::OK };
    let body = json!({
        "extraction_id": outcome.record.id.to_hex(),
        "state": outcome.record.state.name().as_str(),
        "created": outcome.created,
        "redelivery": redelivery,
        "delivery_id": delivery.id,
    });
    Ok((status, Json(body)))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OutboxQuery {
    state: Option<String>,
    after: Option<u64>,
    limit: Option<usize>,
}

pub async fn list(State(service): State<Service>, QueryParams(q): QueryParams<OutboxQuery>) -> Reply {
    let filter = match q.state.as_deref() {
        None | Some("pending") => OutboxFilter::Pending,
        Some("dead") => OutboxFilter::Dead,
        Some(other) => {
            return Err(ApiError::bad_request("invalid_query", format!("state: {other:?} is not pending or dead")));
        }
    };
    let limit = q.limit.unwrap_or(100).clamp(1, MAX_OUTBOX_PAGE);
    let events = service.outbox(filter, q.after.unwrap_or(0), limit).await?;
    let next = (events.len() == limit).then(|| events.last().map(|e| e.seq)).flatten();
    ok(json!({ "events": events.iter().map(event).collect::<Vec<_>>(), "next": next }))
}

pub async fn redeliver(State(service): State<Service>, Path(seq): Path<u64>) -> Reply {
    let record = service.redeliver(seq).await?;
    ok(event(&record))
}

pub async fn enable_sink(State(service): State<Service>, Path(name): Path<String>) -> Reply {
    service.enable_sink(&name).await?;
    ok(json!({ "sink": name, "enabled": true }))
}

fn event(e: &OutboxRecord) -> Value {
    let (state, detail) = match &e.state {
        DeliveryState::Pending => ("pending", Value::Null),
        DeliveryState::Delivered { at_ms, status } => {
            ("delivered", json!({ "at": crate::clock::format_ms(*at_ms), "status": status }))
        }
        DeliveryState::Dead { reason } => ("dead", json!({ "reason": reason })),
    };
    json!({
        "id": e.seq,
        "event_id": e.event_id,
        "type": match e.kind { OutboxKind::Committed => "extraction.committed", OutboxKind::Failed { .. } => "extraction.failed" },
        "sink": e.sink,
        "extraction_id": e.extraction_id.to_hex(),
        "tenant": e.tenant,
        "state": state,
        "detail": detail,
        "deliveries": e.deliveries,
        "next_attempt_at": crate::clock::format_ms(e.next_attempt_at_ms),
        "last_error": e.last_error,
        "created_at": crate::clock::format_ms(e.created_at_ms),
    })
}
