//! `/v1/messages/batches` handlers: create, list (newest first), retrieve, cancel, delete
//! and the results JSONL. Each read first brings batches up to now (see `lifecycle`).

use std::sync::Arc;
use std::time::Instant;

use axum::Json;
use axum::body::Bytes;
use axum::extract::rejection::{BytesRejection, QueryRejection};
use axum::extract::{ConnectInfo, Path, Query, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};

use super::error::AnthropicError;
use super::lifecycle::{self, Record};
use super::wire::{
    self, BatchPage, DEFAULT_LIST_LIMIT, DeletedBatch, ListQuery, MAX_BODY_BYTES, MAX_LIST_LIMIT, MessageBatch,
    ProcessingStatus,
};
use crate::simulator::net::ConnHandle;
use crate::simulator::state::Shared;

pub(super) async fn create(
    State(shared): State<Arc<Shared>>,
    ConnectInfo(conn): ConnectInfo<ConnHandle>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Json<MessageBatch>, AnthropicError> {
    let body = body.map_err(|e| {
        if e.status() == StatusCode::PAYLOAD_TOO_LARGE {
            AnthropicError::new(
                StatusCode::PAYLOAD_TOO_LARGE,
                "request_too_large",
                format!("Request exceeds the maximum allowed number of bytes ({MAX_BODY_BYTES})."),
            )
        } else {
            AnthropicError::invalid(e.body_text())
        }
    })?;
    // Checking up to 100,000 requests is CPU work; keep it off the request threads.
    let requests = tokio::task::spawn_blocking(move || wire::parse_create(&body))
        .await
        .map_err(|e| AnthropicError::new(StatusCode::INTERNAL_SERVER_ERROR, "api_error", e.to_string()))?
        .map_err(AnthropicError::invalid)?;
    let now = Instant::now();
    let mut inner = shared.lock();
    // Liveness statistics are exact only if every earlier batch is up to date first.
    lifecycle::advance_all(&mut inner, now, &shared.origin);
    let id = inner.new_id("msgbatch_", 24);
    let faults = inner.faults.clone();
    let record = Record::new(id, now, crate::domain::clock::now(), requests, faults);
    let view = record.view.clone();
    inner.batch_went_live(&record.custom_ids());
    inner.message_batches.push(record);
    inner.stats.batches_created += 1;
    let drop_connection = inner.faults.take_drop_after_create();
    if drop_connection {
        inner.stats.dropped_connections += 1;
    }
    drop(inner);
    if drop_connection {
        tracing::warn!(batch = %view.id, client = %conn.remote,
            "SIMULATED fault: message batch created, connection dropped without an answer");
        conn.kill();
    } else {
        tracing::info!(batch = %view.id, "SIMULATED provider: message batch created");
    }
    Ok(Json(view))
}

pub(super) async fn retrieve(
    State(shared): State<Arc<Shared>>,
    Path(id): Path<String>,
) -> Result<Json<MessageBatch>, AnthropicError> {
    let mut inner = shared.lock();
    let view = lifecycle::advance_one(&mut inner, &id, Instant::now(), &shared.origin).ok_or_else(|| no_such(&id))?;
    inner.stats.polls += 1;
    Ok(Json(view))
}

pub(super) async fn list(
    State(shared): State<Arc<Shared>>,
    query: Result<Query<ListQuery>, QueryRejection>,
) -> Result<Json<BatchPage>, AnthropicError> {
    let Query(query) = query.map_err(|e| AnthropicError::invalid(e.body_text()))?;
    let limit = match query.limit.as_deref() {
        None => DEFAULT_LIST_LIMIT,
        Some(text) => text.parse::<usize>().ok().filter(|n| (1..=MAX_LIST_LIMIT).contains(n)).ok_or_else(|| {
            AnthropicError::invalid(format!("limit: Input should be an integer between 1 and {MAX_LIST_LIMIT}"))
        })?,
    };
    if query.after_id.is_some() && query.before_id.is_some() {
        return Err(AnthropicError::invalid("Only one of after_id and before_id may be given."));
    }
    let mut inner = shared.lock();
    lifecycle::advance_all(&mut inner, Instant::now(), &shared.origin);
    inner.stats.batches_listed += 1;
    let newest_first: Vec<&MessageBatch> = inner.message_batches.iter().rev().map(|b| &b.view).collect();
    // An unknown cursor lists nothing rather than restarting from the newest batch,
    // which would make a paginating client loop forever.
    let (start, end) = match (&query.after_id, &query.before_id) {
        (Some(after), _) => {
            let start = newest_first.iter().position(|b| b.id == *after).map_or(newest_first.len(), |i| i + 1);
            (start, newest_first.len().min(start.saturating_add(limit)))
        }
        (None, Some(before)) => {
            let end = newest_first.iter().position(|b| b.id == *before).unwrap_or(0);
            (end.saturating_sub(limit), end)
        }
        (None, None) => (0, newest_first.len().min(limit)),
    };
    let page: Vec<MessageBatch> = newest_first[start..end].iter().map(|b| (*b).clone()).collect();
    let has_more = match query.before_id {
        Some(_) => start > 0,
        None => end < newest_first.len(),
    };
    Ok(Json(BatchPage {
        first_id: page.first().map(|b| b.id.clone()),
        last_id: page.last().map(|b| b.id.clone()),
        data: page,
        has_more,
    }))
}

pub(super) async fn cancel(
    State(shared): State<Arc<Shared>>,
    Path(id): Path<String>,
) -> Result<Json<MessageBatch>, AnthropicError> {
    let now = Instant::now();
    let mut inner = shared.lock();
    lifecycle::advance_one(&mut inner, &id, now, &shared.origin).ok_or_else(|| no_such(&id))?;
    let complete_after = inner.timeline.complete_after();
    let batch = inner.message_batches.iter_mut().find(|b| b.view.id == id).ok_or_else(|| no_such(&id))?;
    batch.cancel(now, crate::domain::clock::now(), complete_after).map_err(AnthropicError::invalid)?;
    tracing::info!(batch = %id, "SIMULATED provider: message batch canceling");
    Ok(Json(batch.view.clone()))
}

pub(super) async fn delete(
    State(shared): State<Arc<Shared>>,
    Path(id): Path<String>,
) -> Result<Json<DeletedBatch>, AnthropicError> {
    let mut inner = shared.lock();
    let view = lifecycle::advance_one(&mut inner, &id, Instant::now(), &shared.origin).ok_or_else(|| no_such(&id))?;
    if view.processing_status != ProcessingStatus::Ended {
        return Err(AnthropicError::invalid(format!(
            "Batch {id} is still processing; cancel it and wait for it to end before deleting it."
        )));
    }
    inner.message_batches.retain(|b| b.view.id != id);
    Ok(Json(DeletedBatch { id, kind: "message_batch_deleted".to_string() }))
}

pub(super) async fn results(
    State(shared): State<Arc<Shared>>,
    Path(id): Path<String>,
) -> Result<Response, AnthropicError> {
    let mut inner = shared.lock();
    lifecycle::advance_one(&mut inner, &id, Instant::now(), &shared.origin).ok_or_else(|| no_such(&id))?;
    let results = inner.message_batches.iter().find(|b| b.view.id == id).and_then(|b| b.results.clone());
    let Some(bytes) = results else {
        return Err(AnthropicError::invalid(format!(
            "Batch {id} has not ended yet; results are available once processing_status is 'ended'."
        )));
    };
    inner.stats.content_downloads += 1;
    let content_type = [(header::CONTENT_TYPE, HeaderValue::from_static("application/binary"))];
    Ok((content_type, bytes).into_response())
}

fn no_such(id: &str) -> AnthropicError {
    AnthropicError::not_found(format!("No message batch found with id '{id}'."))
}
