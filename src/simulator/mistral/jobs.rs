//! `/v1/batch/jobs`: create, list (`page` from 0, `page_size`, newest first), get and
//! `/cancel` (client-python `batch_jobs.py`); and the synchronous `POST
//! /v1/chat/completions` that `commitpoint provider check` makes. Each read first brings
//! jobs up to now (see `lifecycle`).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

use axum::Json;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{ConnectInfo, Path, Query, State};
use rand::SeedableRng;
use rand::rngs::StdRng;
use serde_json::{Value, json};

use super::error::MistralError;
use super::lifecycle::{self, Job};
use super::store::uuid;
use super::{body, files, results};
use crate::simulator::faults::{Behaviour, Flaw};
use crate::simulator::model;
use crate::simulator::net::ConnHandle;
use crate::simulator::output::batch_salt;
use crate::simulator::state::Shared;

const ENDPOINTS: [&str; 1] = ["/v1/chat/completions"];
const MAX_PAGE_SIZE: usize = 1000;

fn parse_json(body: Result<Bytes, BytesRejection>) -> Result<Value, MistralError> {
    let body = body.map_err(|e| MistralError::invalid(e.body_text()))?;
    serde_json::from_slice(&body).map_err(|e| MistralError::invalid(format!("Invalid JSON body: {e}")))
}

pub(super) async fn create(
    State(shared): State<Arc<Shared>>,
    ConnectInfo(conn): ConnectInfo<ConnHandle>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Json<Value>, MistralError> {
    let request = parse_json(body)?;
    let endpoint = request.get("endpoint").and_then(Value::as_str).unwrap_or_default();
    if !ENDPOINTS.contains(&endpoint) {
        return Err(MistralError::invalid(format!(
            "endpoint: {endpoint:?} is not a batch endpoint this simulator runs"
        )));
    }
    let model = request.get("model").and_then(Value::as_str).filter(|m| !m.is_empty());
    let model = model.ok_or_else(|| MistralError::invalid("Either model or agent_id must be provided"))?;
    if shared.lock().faults.missing_models.iter().any(|m| m == model) {
        return Err(MistralError::invalid_model(model));
    }
    let metadata = request.get("metadata").cloned().unwrap_or(Value::Null);
    if !(metadata.is_null() || metadata.as_object().is_some_and(|m| m.values().all(Value::is_string))) {
        return Err(MistralError::invalid("metadata: Input should be a valid dictionary of strings"));
    }
    let input_files: Vec<String> = request
        .get("input_files")
        .and_then(Value::as_array)
        .map(|files| files.iter().filter_map(Value::as_str).map(str::to_string).collect())
        .unwrap_or_default();
    if input_files.is_empty() {
        return Err(MistralError::invalid("input_files: at least one input file is required"));
    }
    let mut requests = Vec::new();
    for file in &input_files {
        let stored = shared.lock().mistral.files.get(file).map(|f| f.bytes.clone());
        let stored = stored.ok_or_else(|| MistralError::not_found(format!("File {file} not found")))?;
        requests.extend(files::parse_input(&stored)?);
    }
    let mut inner = shared.lock();
    lifecycle::advance_all(&mut inner, Instant::now());
    let id = uuid(&mut inner);
    let faults = inner.faults.clone();
    let job = Job::new(id.clone(), model.to_string(), metadata, input_files, requests).with_faults(faults);
    inner.batch_went_live(&job.custom_ids());
    let answer = job.object();
    inner.mistral.jobs.push(job);
    inner.stats.batches_created += 1;
    let drop_connection = inner.faults.take_drop_after_create();
    if drop_connection {
        inner.stats.dropped_connections += 1;
    }
    drop(inner);
    if drop_connection {
        tracing::warn!(job = %id, client = %conn.remote,
            "SIMULATED fault: Mistral batch job created, connection dropped without an answer");
        conn.kill();
    } else {
        tracing::info!(job = %id, "SIMULATED provider: Mistral batch job created");
    }
    Ok(Json(answer))
}

pub(super) async fn get(
    State(shared): State<Arc<Shared>>,
    Path(id): Path<String>,
) -> Result<Json<Value>, MistralError> {
    let mut inner = shared.lock();
    let index = lifecycle::advance_one(&mut inner, &id, Instant::now()).ok_or_else(|| no_such(&id))?;
    if inner.faults.take_poll_not_found() {
        inner.stats.polls_not_found += 1;
        return Err(no_such(&id));
    }
    inner.stats.polls += 1;
    Ok(Json(inner.mistral.jobs[index].object()))
}

pub(super) async fn cancel(
    State(shared): State<Arc<Shared>>,
    Path(id): Path<String>,
) -> Result<Json<Value>, MistralError> {
    let mut inner = shared.lock();
    let index = lifecycle::advance_one(&mut inner, &id, Instant::now()).ok_or_else(|| no_such(&id))?;
    let job = &mut inner.mistral.jobs[index];
    job.cancel().map_err(MistralError::invalid)?;
    Ok(Json(job.object()))
}

pub(super) async fn list(
    State(shared): State<Arc<Shared>>,
    Query(query): Query<HashMap<String, String>>,
) -> Result<Json<Value>, MistralError> {
    let number = |name: &str, default: usize| match query.get(name) {
        None => Ok(default),
        Some(text) => text
            .parse::<usize>()
            .map_err(|_| MistralError::invalid(format!("{name}: Input should be a valid integer, got {text:?}"))),
    };
    let page = number("page", 0)?;
    let size = number("page_size", 100)?.clamp(1, MAX_PAGE_SIZE);
    let mut inner = shared.lock();
    lifecycle::advance_all(&mut inner, Instant::now());
    inner.stats.batches_listed += 1;
    // Another client of the organisation, busy: its jobs are the newest.
    let foreign = (0..inner.faults.foreign_batches).map(|i| {
        json!({"id": format!("00000000-0000-4000-a000-{i:012}"), "object": "batch", "input_files": [],
            "metadata": {"job_type": "someone-else"}, "endpoint": "/v1/chat/completions", "model": "other",
            "errors": [], "status": "RUNNING", "created_at": crate::simulator::state::unix_now(),
            "total_requests": 1, "completed_requests": 0, "succeeded_requests": 0, "failed_requests": 0})
    });
    let all: Vec<Value> = foreign.chain(inner.mistral.jobs.iter().rev().map(Job::object)).collect();
    let start = page.saturating_mul(size).min(all.len());
    let end = start.saturating_add(size).min(all.len());
    Ok(Json(json!({"data": &all[start..end], "object": "list", "total": all.len()})))
}

/// The synchronous completion `commitpoint provider check` asks for.
pub(super) async fn chat(
    State(shared): State<Arc<Shared>>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Json<Value>, MistralError> {
    let request = parse_json(body)?;
    body::check(&request, false)?;
    let model_name = request.get("model").and_then(Value::as_str).unwrap_or_default();
    if shared.lock().faults.missing_models.iter().any(|m| m == model_name) {
        return Err(MistralError::invalid_model(model_name));
    }
    let reply = model::respond(&request, Behaviour::Answer { flaw: Flaw::None });
    let mut rng = StdRng::seed_from_u64(shared.seed ^ batch_salt(&shared.next_request_id()));
    shared.lock().stats.chat_completions += 1;
    Ok(Json(results::completion(&mut rng, model_name, &reply)))
}

fn no_such(id: &str) -> MistralError {
    MistralError::not_found(format!("Batch job {id} not found"))
}
