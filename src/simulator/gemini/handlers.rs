//! `models/{model}:batchGenerateContent` and `:generateContent`, and the `batches`
//! collection: get, list (newest first, `pageSize`/`pageToken`), `:cancel`, delete. Each
//! read first brings batches up to now (see `lifecycle`).

use std::sync::Arc;
use std::time::Instant;

use axum::Json;
use axum::body::Bytes;
use axum::extract::rejection::{BytesRejection, QueryRejection};
use axum::extract::{ConnectInfo, Path, Query, State};
use axum::response::{IntoResponse, Response};
use rand::SeedableRng;
use rand::rngs::StdRng;
use serde::Deserialize;
use serde_json::{Value, json};

use super::error::GoogleError;
use super::lifecycle::{self, Record, Request};
use super::model;
use crate::simulator::faults::{Behaviour, Flaw};
use crate::simulator::net::ConnHandle;
use crate::simulator::output::batch_salt;
use crate::simulator::state::Shared;

/// The size Google's front end refuses a request body over, in its own words
/// ("Request payload size exceeds the limit: 20971520 bytes.", quoted in public issue
/// threads); the batch guide says inline batches stay "under 20MB".
pub(super) const MAX_INLINE_BODY: usize = 20 * 1024 * 1024;
const DEFAULT_PAGE_SIZE: usize = 50;
const MAX_PAGE_SIZE: usize = 1000;

/// `POST models/{model}:{method}`.
pub(super) async fn models(
    State(shared): State<Arc<Shared>>,
    ConnectInfo(conn): ConnectInfo<ConnHandle>,
    Path(call): Path<String>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, GoogleError> {
    let body = body.map_err(|e| GoogleError::invalid(e.body_text()))?;
    let (model, method) = call.split_once(':').ok_or_else(|| GoogleError::not_found("Method not found."))?;
    if shared.lock().faults.missing_models.iter().any(|m| m == model) {
        return Err(GoogleError::not_found(format!(
            "models/{model} is not found for API version v1beta, or is not supported for {method}. Call ListModels \
             to see the list of available models and their supported methods."
        )));
    }
    match method {
        "batchGenerateContent" => create(&shared, &conn, model, &body).map(IntoResponse::into_response),
        "generateContent" => generate(&shared, model, &body).map(IntoResponse::into_response),
        _ => Err(GoogleError::not_found("Method not found.")),
    }
}

fn parse_json(body: &[u8]) -> Result<Value, GoogleError> {
    serde_json::from_slice(body).map_err(|e| GoogleError::invalid(format!("Invalid JSON payload received. {e}")))
}

fn create(shared: &Shared, conn: &ConnHandle, model: &str, body: &[u8]) -> Result<Json<Value>, GoogleError> {
    if body.len() > MAX_INLINE_BODY {
        return Err(GoogleError::invalid(format!("Request payload size exceeds the limit: {MAX_INLINE_BODY} bytes.")));
    }
    let body = parse_json(body)?;
    let batch =
        body.get("batch").filter(|b| b.is_object()).ok_or_else(|| GoogleError::invalid("batch: is required"))?;
    let display_name = batch
        .get("displayName")
        .or_else(|| batch.get("display_name"))
        .and_then(Value::as_str)
        .filter(|n| !n.trim().is_empty())
        .ok_or_else(|| GoogleError::invalid("* BatchGenerateContentRequest.batch.display_name: is required"))?;
    let input = batch.get("inputConfig").or_else(|| batch.get("input_config")).unwrap_or(&Value::Null);
    let file = input.get("fileName").or_else(|| input.get("file_name")).and_then(Value::as_str);
    let inline = input.pointer("/requests/requests").and_then(Value::as_array);
    let (requests, input_file) = match (file, inline) {
        (Some(file), None) => {
            // Cloning `Bytes` shares the buffer; the parse runs without the lock.
            let stored = shared.lock().gemini.files.get(file).map(|f| f.bytes.clone());
            let stored =
                stored.ok_or_else(|| GoogleError::not_found(format!("File {file} not found or has expired.")))?;
            (super::files::parse_input(&stored)?, Some(file.to_string()))
        }
        (None, Some(entries)) => (parse_inline(entries)?, None),
        _ => {
            return Err(GoogleError::invalid(
                "* BatchGenerateContentRequest.batch.input_config: exactly one of file_name or requests must be set",
            ));
        }
    };
    let mut inner = shared.lock();
    lifecycle::advance_all(&mut inner, Instant::now());
    let name = inner.new_id("batches/", 24).to_ascii_lowercase();
    let faults = inner.faults.clone();
    let record = Record::new(name.clone(), display_name.to_string(), model.to_string(), input_file, requests)
        .with_faults(faults);
    inner.batch_went_live(&record.keys());
    let answer = record.operation();
    inner.gemini.batches.push(record);
    inner.stats.batches_created += 1;
    let drop_connection = inner.faults.take_drop_after_create();
    if drop_connection {
        inner.stats.dropped_connections += 1;
    }
    drop(inner);
    if drop_connection {
        tracing::warn!(batch = %name, client = %conn.remote,
            "SIMULATED fault: Gemini batch created, connection dropped without an answer");
        conn.kill();
    } else {
        tracing::info!(batch = %name, "SIMULATED provider: Gemini batch created");
    }
    Ok(Json(answer))
}

fn parse_inline(entries: &[Value]) -> Result<Vec<Request>, GoogleError> {
    if entries.is_empty() {
        return Err(GoogleError::invalid("* BatchGenerateContentRequest.batch.input_config.requests: is empty"));
    }
    entries
        .iter()
        .enumerate()
        .map(|(index, entry)| {
            let at = |problem: String| {
                GoogleError::invalid(format!("* batch.input_config.requests.requests[{index}].{problem}"))
            };
            let request = entry.get("request").cloned().unwrap_or(Value::Null);
            model::check(&request).map_err(|p| at(format!("request: {p}")))?;
            let key = match entry.pointer("/metadata/key") {
                None => None,
                Some(Value::String(key)) => Some(key.clone()),
                Some(_) => return Err(at("metadata.key: must be a string".to_string())),
            };
            Ok(Request { key, request })
        })
        .collect()
}

/// The synchronous call `commitpoint provider check` makes.
fn generate(shared: &Shared, model: &str, body: &[u8]) -> Result<Json<Value>, GoogleError> {
    let request = parse_json(body)?;
    model::check(&request).map_err(|p| GoogleError::invalid(format!("* {p}")))?;
    let mut rng = StdRng::seed_from_u64(shared.seed ^ batch_salt(&shared.next_request_id()));
    Ok(Json(model::respond(&request, Behaviour::Answer { flaw: Flaw::None }, model, &mut rng)))
}

pub(super) async fn get(State(shared): State<Arc<Shared>>, Path(id): Path<String>) -> Result<Json<Value>, GoogleError> {
    let name = format!("batches/{id}");
    let mut inner = shared.lock();
    let index = lifecycle::advance_one(&mut inner, &name, Instant::now()).ok_or_else(|| no_such(&name))?;
    if inner.faults.take_poll_not_found() {
        inner.stats.polls_not_found += 1;
        return Err(no_such(&name));
    }
    inner.stats.polls += 1;
    Ok(Json(inner.gemini.batches[index].operation()))
}

/// `POST batches/{id}:cancel`, answered with `Empty`.
pub(super) async fn action(
    State(shared): State<Arc<Shared>>,
    Path(call): Path<String>,
) -> Result<Json<Value>, GoogleError> {
    let Some((id, "cancel")) = call.split_once(':') else {
        return Err(GoogleError::not_found("Method not found."));
    };
    let name = format!("batches/{id}");
    let mut inner = shared.lock();
    let index = lifecycle::advance_one(&mut inner, &name, Instant::now()).ok_or_else(|| no_such(&name))?;
    let mut batch = inner.gemini.batches.remove(index);
    let cancelled = batch.cancel(&mut inner);
    inner.gemini.batches.insert(index, batch);
    cancelled.map_err(GoogleError::failed_precondition)?;
    Ok(Json(json!({})))
}

pub(super) async fn delete(
    State(shared): State<Arc<Shared>>,
    Path(id): Path<String>,
) -> Result<Json<Value>, GoogleError> {
    let name = format!("batches/{id}");
    let mut inner = shared.lock();
    lifecycle::advance_one(&mut inner, &name, Instant::now()).ok_or_else(|| no_such(&name))?;
    inner.gemini.batches.retain(|b| b.name != name);
    Ok(Json(json!({})))
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct ListQuery {
    page_size: Option<String>,
    page_token: Option<String>,
}

pub(super) async fn list(
    State(shared): State<Arc<Shared>>,
    query: Result<Query<ListQuery>, QueryRejection>,
) -> Result<Json<Value>, GoogleError> {
    let Query(query) = query.map_err(|e| GoogleError::invalid(e.body_text()))?;
    // AIP-158: an unset size is the server's choice, a larger one is coerced down.
    let size = match query.page_size.as_deref() {
        None => DEFAULT_PAGE_SIZE,
        Some(text) => match text.parse::<usize>() {
            Ok(0) => DEFAULT_PAGE_SIZE,
            Ok(n) => n.min(MAX_PAGE_SIZE),
            Err(_) => {
                return Err(GoogleError::invalid(format!("Invalid value at 'page_size' (TYPE_INT32), \"{text}\"")));
            }
        },
    };
    let start = match query.page_token.as_deref().filter(|t| !t.is_empty()) {
        None => 0,
        Some(token) => token
            .strip_prefix("tok-")
            .and_then(|n| n.parse::<usize>().ok())
            .ok_or_else(|| GoogleError::invalid("Invalid page token."))?,
    };
    let mut inner = shared.lock();
    lifecycle::advance_all(&mut inner, Instant::now());
    inner.stats.batches_listed += 1;
    // Another client of the project, busy: its batches are the newest.
    let foreign = (0..inner.faults.foreign_batches).map(|i| {
        json!({"name": format!("batches/foreign{i:04}"), "metadata": {
            "displayName": format!("someone-else-{i}"), "state": "BATCH_STATE_RUNNING",
            "model": "models/other"}})
    });
    let all: Vec<Value> = foreign.chain(inner.gemini.batches.iter().rev().map(Record::operation)).collect();
    let end = all.len().min(start.saturating_add(size));
    let page: Vec<Value> = all.get(start..end).map(<[Value]>::to_vec).unwrap_or_default();
    let mut answer = json!({"operations": page});
    if end < all.len() {
        answer["nextPageToken"] = json!(format!("tok-{end}"));
    }
    Ok(Json(answer))
}

fn no_such(name: &str) -> GoogleError {
    GoogleError::not_found(format!("Batch {name} not found."))
}
