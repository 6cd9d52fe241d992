//! `POST /v1/batches`, `GET /v1/batches/{id}`, `GET /v1/batches` and
//! `POST /v1/batches/{id}/cancel`. Each read first brings the batch up to now (see
//! `lifecycle`), so statuses advance with the wall clock and nothing runs in the background.

use std::sync::Arc;
use std::time::Instant;

use axum::Json;
use axum::body::Bytes;
use axum::extract::rejection::{BytesRejection, QueryRejection};
use axum::extract::{ConnectInfo, Path, Query, State};

use super::error::ApiError;
use super::lifecycle::BatchRecord;
use super::net::ConnHandle;
use super::state::{Shared, unix_now};
use super::variant::{MetadataMode, Variant};
use super::wire::{
    Batch, BatchList, BatchStatus, COMPLETION_WINDOW, CreateBatchRequest, ENDPOINT_CHAT, KNOWN_ENDPOINTS, ListQuery,
    PURPOSE_BATCH, RequestCounts,
};

const MAX_METADATA_PAIRS: usize = 16;
const MAX_METADATA_KEY_CHARS: usize = 64;
const MAX_METADATA_VALUE_CHARS: usize = 512;
const DEFAULT_LIST_LIMIT: usize = 20;
const MAX_LIST_LIMIT: usize = 100;
const WINDOW_SECS: i64 = 24 * 3600;

pub(super) async fn create(
    State(shared): State<Arc<Shared>>,
    ConnectInfo(conn): ConnectInfo<ConnHandle>,
    uri: axum::http::Uri,
    body: Result<Bytes, BytesRejection>,
) -> Result<Json<Batch>, ApiError> {
    let body = body.map_err(|e| ApiError::invalid(e.body_text()))?;
    let request: CreateBatchRequest = serde_json::from_slice(&body)
        .map_err(|e| ApiError::invalid(format!("We could not parse the JSON body of your request: {e}")))?;
    let variant = shared.variant.clone();
    if variant.azure && request.output_expires_after.is_some() && !super::variant::azure_expiry_accepted(uri.query()) {
        return Err(ApiError::invalid("Unrecognized request argument supplied: output_expires_after"));
    }
    check_request(&request, &variant)?;
    let output_expires_after = check_output_expiry(&request)?;
    let now = Instant::now();
    let mut inner = shared.lock();
    let file = inner
        .files
        .get(&request.input_file_id)
        .ok_or_else(|| super::files::no_such_file(&request.input_file_id).param("input_file_id"))?;
    let input = match (&file.input, file.meta.purpose.as_str()) {
        (Some(input), PURPOSE_BATCH) => Arc::clone(input),
        _ => {
            return Err(ApiError::invalid(format!(
                "Invalid input file {}: files used by a batch must be uploaded with purpose 'batch'.",
                request.input_file_id
            ))
            .param("input_file_id"));
        }
    };
    if variant.azure && input.url.as_deref().is_some_and(|u| u != request.endpoint) {
        return Err(ApiError::invalid(format!(
            "url_mismatch: the input file's request URL does not match the batch endpoint '{}'.",
            request.endpoint
        ))
        .param("endpoint")
        .code("url_mismatch"));
    }
    let metadata = match variant.metadata {
        MetadataMode::Kept => request.metadata,
        MetadataMode::Ignored => None,
        // Checked before anything is stored: a refused create creates nothing.
        MetadataMode::Refused => None,
    };
    // Liveness statistics are exact only if every earlier batch is up to date first.
    inner.advance_all(now);
    let created_at = unix_now();
    let view = Batch {
        id: inner.new_id("batch_", 24),
        object: "batch".to_string(),
        endpoint: request.endpoint,
        model: input.model.clone(),
        errors: None,
        input_file_id: request.input_file_id,
        completion_window: request.completion_window,
        status: BatchStatus::Validating,
        output_file_id: None,
        error_file_id: None,
        created_at,
        in_progress_at: None,
        expires_at: Some(created_at + WINDOW_SECS),
        finalizing_at: None,
        completed_at: None,
        failed_at: None,
        expired_at: None,
        cancelling_at: None,
        cancelled_at: None,
        request_counts: RequestCounts::default(),
        usage: None,
        metadata,
    };
    let faults = inner.faults.clone();
    let mut record = BatchRecord::new(view.clone(), now, input, faults, output_expires_after);
    let enqueued: u64 = inner.batches.iter().map(BatchRecord::enqueued_tokens).sum();
    record.check_token_limit(inner.faults.enqueued_token_limit, enqueued);
    inner.stats.last_batch_tokens = record.tokens();
    inner.batch_went_live(record.custom_ids());
    inner.batches.push(record);
    inner.stats.batches_created += 1;
    let drop_connection = inner.faults.take_drop_after_create();
    if drop_connection {
        inner.stats.dropped_connections += 1;
    }
    drop(inner);
    if drop_connection {
        tracing::warn!(batch = %view.id, client = %conn.remote,
            "SIMULATED fault: batch created, connection dropped without an answer");
        conn.kill();
    } else {
        tracing::info!(batch = %view.id, "SIMULATED provider: batch created");
    }
    Ok(Json(view))
}

pub(super) async fn retrieve(
    State(shared): State<Arc<Shared>>,
    Path(id): Path<String>,
) -> Result<Json<Batch>, ApiError> {
    let mut inner = shared.lock();
    let index = inner.find_batch(&id).ok_or_else(|| no_such_batch(&id))?;
    inner.stats.polls += 1;
    if inner.faults.take_poll_not_found() {
        inner.stats.polls_not_found += 1;
        tracing::warn!(batch = %id, "SIMULATED fault: a live batch answered 404");
        return Err(no_such_batch(&id));
    }
    inner.advance_one(index, Instant::now()).map(Json).ok_or_else(|| no_such_batch(&id))
}

pub(super) async fn list(
    State(shared): State<Arc<Shared>>,
    query: Result<Query<ListQuery>, QueryRejection>,
) -> Result<Json<serde_json::Value>, ApiError> {
    let Query(query) = query.map_err(|e| ApiError::invalid(e.body_text()))?;
    let limit = match query.limit.as_deref() {
        None => DEFAULT_LIST_LIMIT,
        Some(text) => text.parse::<usize>().ok().filter(|n| (1..=MAX_LIST_LIMIT).contains(n)).ok_or_else(|| {
            ApiError::invalid(format!("Invalid 'limit': {text}. Expected an integer between 1 and {MAX_LIST_LIMIT}."))
                .param("limit")
                .code("invalid_value")
        })?,
    };
    let mut inner = shared.lock();
    inner.advance_all(Instant::now());
    inner.stats.batches_listed += 1;
    let foreign: Vec<Batch> = (0..inner.faults.foreign_batches).map(foreign_batch).collect();
    let newest_first = foreign.iter().chain(inner.batches.iter().rev().map(|b| &b.view));
    // An unknown cursor lists nothing rather than restarting from the newest batch,
    // which would make a paginating client loop forever.
    let mut page: Vec<Batch> = match query.after.as_deref() {
        None => newest_first.take(limit + 1).cloned().collect(),
        Some(after) => newest_first.skip_while(|b| b.id != after).skip(1).take(limit + 1).cloned().collect(),
    };
    if !shared.variant.paged_lists {
        // One answer with every batch and no paging fields, as Groq's list is.
        let all: Vec<Batch> = foreign.into_iter().chain(inner.batches.iter().rev().map(|b| b.view.clone())).collect();
        return Ok(Json(serde_json::json!({"object": "list", "data": all})));
    }
    let has_more = page.len() > limit;
    page.truncate(limit);
    let list = BatchList {
        object: "list".to_string(),
        first_id: page.first().map(|b| b.id.clone()),
        last_id: page.last().map(|b| b.id.clone()),
        data: page,
        has_more,
    };
    serde_json::to_value(list).map(Json).map_err(|e| ApiError::server(format!("cannot encode the list: {e}")))
}

pub(super) async fn cancel(State(shared): State<Arc<Shared>>, Path(id): Path<String>) -> Result<Json<Batch>, ApiError> {
    let now = Instant::now();
    let timeline = shared.timeline;
    let mut inner = shared.lock();
    let index = inner.find_batch(&id).ok_or_else(|| no_such_batch(&id))?;
    inner.advance_one(index, now);
    let batch = inner.batches.get_mut(index).ok_or_else(|| no_such_batch(&id))?;
    batch.cancel(now, unix_now(), &timeline)?;
    tracing::info!(batch = %id, "SIMULATED provider: batch cancelling");
    Ok(Json(batch.view.clone()))
}

fn check_request(request: &CreateBatchRequest, variant: &Variant) -> Result<(), ApiError> {
    if variant.metadata == MetadataMode::Refused && request.metadata.is_some() {
        return Err(ApiError::invalid("Unrecognized request argument supplied: metadata")
            .param("metadata")
            .code("unknown_parameter"));
    }
    let azure_url = variant.azure && variant.request_urls().contains(&request.endpoint.as_str());
    if !azure_url && !KNOWN_ENDPOINTS.contains(&request.endpoint.as_str()) {
        return Err(ApiError::invalid(format!("Invalid value for 'endpoint': '{}'.", request.endpoint))
            .param("endpoint")
            .code("invalid_value"));
    }
    if request.endpoint != ENDPOINT_CHAT && !azure_url {
        return Err(ApiError::invalid(format!(
            "The commitpoint simulator only simulates '{ENDPOINT_CHAT}', not '{}'.",
            request.endpoint
        ))
        .param("endpoint")
        .code("unsupported_value"));
    }
    if request.completion_window != COMPLETION_WINDOW {
        return Err(ApiError::invalid(format!(
            "Invalid value for 'completion_window': '{}'. Supported values are: '24h'.",
            request.completion_window
        ))
        .param("completion_window")
        .code("invalid_value"));
    }
    if let Some(metadata) = &request.metadata {
        let bad = |message: String| Err(ApiError::invalid(message).param("metadata").code("invalid_value"));
        if metadata.len() > MAX_METADATA_PAIRS {
            return bad(format!("Invalid 'metadata': too many pairs ({} > {MAX_METADATA_PAIRS}).", metadata.len()));
        }
        for (key, value) in metadata {
            if key.chars().count() > MAX_METADATA_KEY_CHARS {
                return bad(format!(
                    "Invalid 'metadata': key '{key}' is longer than {MAX_METADATA_KEY_CHARS} characters."
                ));
            }
            if value.chars().count() > MAX_METADATA_VALUE_CHARS {
                return bad(format!(
                    "Invalid 'metadata': the value of '{key}' is longer than {MAX_METADATA_VALUE_CHARS} characters."
                ));
            }
        }
    }
    Ok(())
}

fn check_output_expiry(request: &CreateBatchRequest) -> Result<Option<i64>, ApiError> {
    let Some(expiry) = &request.output_expires_after else {
        return Ok(None);
    };
    if expiry.anchor != "created_at" || !(3600..=2_592_000).contains(&expiry.seconds) {
        return Err(ApiError::invalid(
            "Invalid 'output_expires_after': anchor must be 'created_at' and seconds between 3600 and 2592000.",
        )
        .param("output_expires_after")
        .code("invalid_value"));
    }
    Ok(Some(expiry.seconds))
}

/// A batch of another client of the organisation, created just now (`foreign_batches`).
fn foreign_batch(index: u32) -> Batch {
    let created_at = unix_now();
    Batch {
        id: format!("batch_foreign{index:08}"),
        object: "batch".to_string(),
        endpoint: ENDPOINT_CHAT.to_string(),
        model: None,
        errors: None,
        input_file_id: format!("file-foreign{index:08}"),
        completion_window: COMPLETION_WINDOW.to_string(),
        status: BatchStatus::InProgress,
        output_file_id: None,
        error_file_id: None,
        created_at,
        in_progress_at: Some(created_at),
        expires_at: Some(created_at + WINDOW_SECS),
        finalizing_at: None,
        completed_at: None,
        failed_at: None,
        expired_at: None,
        cancelling_at: None,
        cancelled_at: None,
        request_counts: RequestCounts::default(),
        usage: None,
        metadata: None,
    }
}

fn no_such_batch(id: &str) -> ApiError {
    ApiError::not_found(format!("No batch found with id '{id}'.")).param("batch_id")
}
