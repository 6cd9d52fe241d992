//! The File API's resumable upload and the download of a batch's responses file.
//!
//! Upload (batch guide, "Input file", REST): `POST upload/v1beta/files` with
//! `X-Goog-Upload-Protocol: resumable`, `X-Goog-Upload-Command: start` and the size in
//! `X-Goog-Upload-Header-Content-Length` answers with `x-goog-upload-url`; the bytes then go
//! to that URL with `X-Goog-Upload-Command: upload, finalize` and `X-Goog-Upload-Offset`,
//! and the final answer (`x-goog-upload-status: final`) holds the `File`. A chunk without
//! `finalize` is appended and answered `active`. Input files are at most 2 GB (batch guide).
//! Download: `GET download/v1beta/files/{id}:download?alt=media`.

use std::collections::HashMap;
use std::sync::Arc;

use axum::Json;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, HeaderValue, header};
use axum::response::{IntoResponse, Response};
use bytes::BytesMut;
use serde_json::{Value, json};

use super::error::GoogleError;
use super::lifecycle::Request;
use super::model;
use super::store::Upload;
use crate::simulator::state::Shared;

const MAX_FILE_BYTES: u64 = 2_000_000_000;

pub(super) async fn upload(
    State(shared): State<Arc<Shared>>,
    Query(query): Query<HashMap<String, String>>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, GoogleError> {
    let body = body.map_err(|e| GoogleError::invalid(e.body_text()))?;
    let text = |name: &str| headers.get(name).and_then(|v| v.to_str().ok()).map(str::trim);
    let command = text("x-goog-upload-command").unwrap_or_default().to_ascii_lowercase();
    match query.get("upload_id") {
        None => {
            start(&shared, text("x-goog-upload-protocol"), text("x-goog-upload-header-content-length"), &command, &body)
        }
        Some(id) => chunk(&shared, id, text("x-goog-upload-offset"), &command, body),
    }
}

fn start(
    shared: &Shared,
    protocol: Option<&str>,
    length: Option<&str>,
    command: &str,
    body: &[u8],
) -> Result<Response, GoogleError> {
    if protocol != Some("resumable") || command != "start" {
        return Err(GoogleError::invalid(
            "Uploads need X-Goog-Upload-Protocol: resumable and X-Goog-Upload-Command: start first.",
        ));
    }
    let declared = length
        .and_then(|l| l.parse::<u64>().ok())
        .ok_or_else(|| GoogleError::invalid("X-Goog-Upload-Header-Content-Length: a byte count is required."))?;
    let metadata: Value = if body.is_empty() { json!({}) } else { serde_json::from_slice(body).unwrap_or(json!({})) };
    let display_name = metadata.pointer("/file/displayName").and_then(Value::as_str).unwrap_or_default().to_string();
    let mut inner = shared.lock();
    let limit = match inner.faults.max_input_file_bytes {
        0 => MAX_FILE_BYTES,
        n => n,
    };
    if declared > limit {
        inner.stats.uploads_refused += 1;
        return Err(GoogleError::invalid(format!("File size {declared} exceeds the maximum of {limit} bytes.")));
    }
    let id = inner.new_id("", 32);
    inner.gemini.uploads.insert(id.clone(), Upload { display_name, declared, received: BytesMut::new() });
    drop(inner);
    let url = format!("{}/upload/v1beta/files?upload_id={id}&upload_protocol=resumable", shared.origin);
    let mut response = Json(json!({})).into_response();
    insert(&mut response, "x-goog-upload-url", &url);
    insert(&mut response, "x-goog-upload-status", "active");
    Ok(response)
}

fn chunk(shared: &Shared, id: &str, offset: Option<&str>, command: &str, body: Bytes) -> Result<Response, GoogleError> {
    let finalize = command.split(',').any(|c| c.trim() == "finalize");
    if !command.split(',').any(|c| c.trim() == "upload") && !finalize {
        return Err(GoogleError::invalid("X-Goog-Upload-Command must be upload, finalize or both."));
    }
    let mut inner = shared.lock();
    let upload = inner.gemini.uploads.get_mut(id).ok_or_else(|| GoogleError::not_found("No such upload session."))?;
    if offset.and_then(|o| o.parse::<usize>().ok()) != Some(upload.received.len()) {
        return Err(GoogleError::invalid(format!(
            "X-Goog-Upload-Offset must be {} (the bytes received so far).",
            upload.received.len()
        )));
    }
    upload.received.extend_from_slice(&body);
    if !finalize {
        let mut response = Json(json!({})).into_response();
        insert(&mut response, "x-goog-upload-status", "active");
        return Ok(response);
    }
    let Some(upload) = inner.gemini.uploads.remove(id) else {
        return Err(GoogleError::not_found("No such upload session."));
    };
    if upload.received.len() as u64 != upload.declared {
        return Err(GoogleError::invalid(format!(
            "Received {} bytes, but X-Goog-Upload-Header-Content-Length declared {}.",
            upload.received.len(),
            upload.declared
        )));
    }
    let name = format!("files/{}", inner.new_id("", 12).to_ascii_lowercase());
    let bytes = upload.received.freeze();
    inner.stats.files_uploaded += 1;
    inner.stats.last_upload_bytes = bytes.len() as u64;
    inner.gemini.store_file(name.clone(), upload.display_name, bytes);
    let file = inner.gemini.files[&name].resource(&name, &shared.origin);
    drop(inner);
    let mut response = Json(json!({"file": file})).into_response();
    insert(&mut response, "x-goog-upload-status", "final");
    Ok(response)
}

fn insert(response: &mut Response, name: &'static str, value: &str) {
    if let Ok(value) = HeaderValue::from_str(value) {
        response.headers_mut().insert(name, value);
    }
}

/// `GET download/v1beta/files/{id}:download?alt=media`.
pub(super) async fn download(
    State(shared): State<Arc<Shared>>,
    Path(call): Path<String>,
    Query(query): Query<HashMap<String, String>>,
) -> Result<Response, GoogleError> {
    let Some((id, "download")) = call.split_once(':') else {
        return Err(GoogleError::not_found("Method not found."));
    };
    if query.get("alt").map(String::as_str) != Some("media") {
        return Err(GoogleError::invalid("Downloads need alt=media."));
    }
    let name = format!("files/{id}");
    let mut inner = shared.lock();
    let bytes = inner.gemini.files.get(&name).map(|f| f.bytes.clone());
    let bytes = bytes.ok_or_else(|| GoogleError::not_found(format!("File {name} not found or has expired.")))?;
    inner.stats.content_downloads += 1;
    drop(inner);
    Ok(([(header::CONTENT_TYPE, HeaderValue::from_static("application/octet-stream"))], bytes).into_response())
}

/// `DELETE v1beta/files/{id}`, answered with `Empty`.
pub(super) async fn delete(
    State(shared): State<Arc<Shared>>,
    Path(id): Path<String>,
) -> Result<Json<Value>, GoogleError> {
    let name = format!("files/{id}");
    let mut inner = shared.lock();
    if inner.gemini.files.remove(&name).is_none() {
        return Err(GoogleError::not_found(format!("File {name} not found or has expired.")));
    }
    inner.stats.files_deleted += 1;
    Ok(Json(json!({})))
}

/// The JSONL input file: every line `{"key", "request"}`, checked like inline requests.
pub(super) fn parse_input(bytes: &[u8]) -> Result<Vec<Request>, GoogleError> {
    let text = std::str::from_utf8(bytes).map_err(|_| GoogleError::invalid("The input file is not UTF-8 JSONL."))?;
    let mut requests = Vec::new();
    for (index, line) in text.lines().enumerate().filter(|(_, l)| !l.trim().is_empty()) {
        let at = |problem: &str| GoogleError::invalid(format!("Input file line {}: {problem}", index + 1));
        let value: Value = serde_json::from_str(line).map_err(|_| at("not a JSON object"))?;
        let key = value.get("key").and_then(Value::as_str).ok_or_else(|| at("key: is required"))?.to_string();
        let request = value.get("request").cloned().unwrap_or(Value::Null);
        model::check(&request).map_err(|p| at(&p))?;
        requests.push(Request { key: Some(key), request });
    }
    if requests.is_empty() {
        return Err(GoogleError::invalid("The input file holds no requests."));
    }
    Ok(requests)
}
