//! `POST /v1/files` (multipart `file` and `purpose`: `fine-tune`, `batch` or `ocr`, the
//! SDKs' `FilePurpose`), `GET /v1/files/{id}/content` (the raw bytes) and
//! `DELETE /v1/files/{id}` (client-python `files.py`).

use std::sync::Arc;

use axum::Json;
use axum::extract::multipart::MultipartRejection;
use axum::extract::{Multipart, Path, State};
use axum::http::{HeaderValue, header};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use serde_json::{Value, json};

use super::error::MistralError;
use super::lifecycle::Request;
use super::store::{StoredFile, uuid};
use crate::simulator::state::{Shared, unix_now};

const PURPOSES: [&str; 3] = ["fine-tune", "batch", "ocr"];

pub(super) async fn upload(
    State(shared): State<Arc<Shared>>,
    multipart: Result<Multipart, MultipartRejection>,
) -> Result<Json<Value>, MistralError> {
    let mut multipart = multipart.map_err(|e| MistralError::invalid(format!("Expected a multipart body: {e}")))?;
    let (mut file, mut purpose) = (None, None);
    while let Some(field) = multipart.next_field().await.map_err(|e| MistralError::invalid(e.body_text()))? {
        match field.name() {
            Some("file") => {
                let name = field.file_name().unwrap_or("upload.jsonl").to_string();
                let bytes = field.bytes().await.map_err(|e| MistralError::invalid(e.body_text()))?;
                file = Some((name, bytes));
            }
            Some("purpose") => purpose = Some(field.text().await.map_err(|e| MistralError::invalid(e.body_text()))?),
            _ => {}
        }
    }
    let (filename, bytes) = file.ok_or_else(|| MistralError::invalid("file: field required"))?;
    let purpose = purpose.unwrap_or_else(|| "fine-tune".to_string());
    if !PURPOSES.contains(&purpose.as_str()) {
        return Err(MistralError::invalid(format!(
            "purpose: Input should be 'fine-tune', 'batch' or 'ocr', not {purpose:?}"
        )));
    }
    let lines = if purpose == "batch" { Some(parse_input(&bytes)?.len() as u64) } else { None };
    let mut inner = shared.lock();
    let limit = inner.faults.max_input_file_bytes;
    if limit > 0 && bytes.len() as u64 > limit {
        inner.stats.uploads_refused += 1;
        return Err(MistralError::api(
            axum::http::StatusCode::PAYLOAD_TOO_LARGE,
            "invalid_request_error",
            format!("File size exceeds the maximum of {limit} bytes."),
            None,
        ));
    }
    let id = uuid(&mut inner);
    let stored = StoredFile { filename, purpose, bytes, created_at: unix_now(), lines };
    let object = stored.object(&id);
    inner.mistral.files.insert(id, stored);
    inner.stats.files_uploaded += 1;
    Ok(Json(object))
}

/// A batch input: one JSON object a line, each with a `body` object and an optional
/// `custom_id` string (`BatchRequest`).
pub(super) fn parse_input(bytes: &[u8]) -> Result<Vec<Request>, MistralError> {
    let text = std::str::from_utf8(bytes).map_err(|_| MistralError::invalid("The batch file must be UTF-8 JSONL."))?;
    let mut requests = Vec::new();
    for (index, line) in text.lines().enumerate().filter(|(_, l)| !l.trim().is_empty()) {
        let at = |problem: &str| MistralError::invalid(format!("Invalid batch file, line {}: {problem}", index + 1));
        let value: Value = serde_json::from_str(line).map_err(|_| at("not a JSON object"))?;
        let body = value.get("body").filter(|b| b.is_object()).ok_or_else(|| at("body: field required"))?;
        let custom_id = match value.get("custom_id") {
            None | Some(Value::Null) => None,
            Some(Value::String(id)) => Some(id.clone()),
            Some(_) => return Err(at("custom_id: Input should be a valid string")),
        };
        requests.push(Request { custom_id, body: body.clone() });
    }
    if requests.is_empty() {
        return Err(MistralError::invalid("The batch file holds no requests."));
    }
    Ok(requests)
}

pub(super) async fn content(
    State(shared): State<Arc<Shared>>,
    Path(id): Path<String>,
) -> Result<Response, MistralError> {
    let mut inner = shared.lock();
    let bytes: Bytes = inner.mistral.files.get(&id).map(|f| f.bytes.clone()).ok_or_else(|| no_such(&id))?;
    inner.stats.content_downloads += 1;
    drop(inner);
    let mut response = bytes.into_response();
    response.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("application/octet-stream"));
    Ok(response)
}

pub(super) async fn delete(
    State(shared): State<Arc<Shared>>,
    Path(id): Path<String>,
) -> Result<Json<Value>, MistralError> {
    let mut inner = shared.lock();
    inner.mistral.files.remove(&id).ok_or_else(|| no_such(&id))?;
    inner.stats.files_deleted += 1;
    Ok(Json(json!({"id": id, "object": "file", "deleted": true})))
}

fn no_such(id: &str) -> MistralError {
    MistralError::not_found(format!("File {id} not found"))
}
