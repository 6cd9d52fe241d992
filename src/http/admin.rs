//! Admin endpoints: online backup, and fetching or removing a finished backup file.

use axum::Json;
use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::json;
use tokio_util::io::ReaderStream;

use super::error::ApiError;
use crate::service::Service;

pub async fn backup(State(service): State<Service>) -> Result<(StatusCode, Json<serde_json::Value>), ApiError> {
    let report = service.backup().await?;
    let name = report.path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let body = json!({
        "name": name,
        "path": report.path.display().to_string(),
        "bytes": report.bytes,
        "entries": report.entries,
        "download": format!("/v1/admin/backups/{name}"),
    });
    Ok((StatusCode::CREATED, Json(body)))
}

pub async fn download(State(service): State<Service>, Path(name): Path<String>) -> Result<Response, ApiError> {
    let path = service.backup_path(&name)?;
    let file = tokio::fs::File::open(&path).await.map_err(|_| not_found(&name))?;
    let len = file.metadata().await.map(|m| m.len()).unwrap_or(0);
    let headers =
        [(header::CONTENT_TYPE, "application/octet-stream".to_string()), (header::CONTENT_LENGTH, len.to_string())];
    Ok((headers, Body::from_stream(ReaderStream::new(file))).into_response())
}

pub async fn remove(State(service): State<Service>, Path(name): Path<String>) -> Result<StatusCode, ApiError> {
    let path = service.backup_path(&name)?;
    tokio::fs::remove_file(&path).await.map_err(|_| not_found(&name))?;
    Ok(StatusCode::NO_CONTENT)
}

fn not_found(name: &str) -> ApiError {
    ApiError::new(StatusCode::NOT_FOUND, "not_found", format!("no backup named {name:?}"))
}

pub async fn providers(State(service): State<Service>) -> Result<Json<serde_json::Value>, ApiError> {
    Ok(Json(json!({ "providers": service.providers().await? })))
}

pub async fn pause(
    State(service): State<Service>,
    Path(name): Path<String>,
) -> Result<Json<serde_json::Value>, ApiError> {
    Ok(Json(json!(service.set_provider_paused(&name, true).await?)))
}

pub async fn resume(
    State(service): State<Service>,
    Path(name): Path<String>,
) -> Result<Json<serde_json::Value>, ApiError> {
    Ok(Json(json!(service.set_provider_paused(&name, false).await?)))
}
