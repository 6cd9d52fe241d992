//! `GET /v1/files`: the account's files, newest first, with OpenAI's `after`, `limit`
//! (1–10,000, default 10,000), `order` and `purpose`; on a platform with one-page lists
//! (Groq) every file in one answer with no paging fields.

use std::sync::Arc;

use axum::Json;
use axum::extract::rejection::QueryRejection;
use axum::extract::{Query, State};
use serde::Deserialize;
use serde_json::{Value, json};

use super::error::ApiError;
use super::state::Shared;
use super::wire::OpenAiFile;

const MAX_LIMIT: usize = 10_000;

#[derive(Debug, Deserialize)]
pub(super) struct FilesQuery {
    after: Option<String>,
    limit: Option<String>,
    order: Option<String>,
    purpose: Option<String>,
}

pub(super) async fn list(
    State(shared): State<Arc<Shared>>,
    query: Result<Query<FilesQuery>, QueryRejection>,
) -> Result<Json<Value>, ApiError> {
    let Query(query) = query.map_err(|e| ApiError::invalid(e.body_text()))?;
    let limit = match query.limit.as_deref() {
        None => MAX_LIMIT,
        Some(text) => text.parse::<usize>().ok().filter(|n| (1..=MAX_LIMIT).contains(n)).ok_or_else(|| {
            ApiError::invalid(format!("Invalid 'limit': {text}. Expected an integer between 1 and {MAX_LIMIT}."))
                .param("limit")
                .code("invalid_value")
        })?,
    };
    let ascending = match query.order.as_deref() {
        None | Some("desc") => false,
        Some("asc") => true,
        Some(other) => {
            return Err(ApiError::invalid(format!("Invalid 'order': {other}. Expected 'asc' or 'desc'."))
                .param("order")
                .code("invalid_value"));
        }
    };
    let inner = shared.lock();
    let mut files: Vec<&OpenAiFile> = inner
        .files
        .values()
        .map(|f| &f.meta)
        .filter(|f| query.purpose.as_deref().is_none_or(|p| f.purpose == p))
        .collect();
    // Ids break ties within a second, so a cursor always finds its place again.
    files.sort_by(|a, b| (a.created_at, &a.id).cmp(&(b.created_at, &b.id)));
    if !ascending {
        files.reverse();
    }
    if !shared.variant.paged_lists {
        return Ok(Json(json!({"object": "list", "data": files})));
    }
    let start = match &query.after {
        // An unknown cursor lists nothing rather than starting over.
        Some(after) => files.iter().position(|f| f.id == *after).map_or(files.len(), |i| i + 1),
        None => 0,
    };
    let mut page: Vec<&OpenAiFile> = files.into_iter().skip(start).take(limit + 1).collect();
    let has_more = page.len() > limit;
    page.truncate(limit);
    Ok(Json(json!({
        "object": "list",
        "first_id": page.first().map(|f| f.id.clone()),
        "last_id": page.last().map(|f| f.id.clone()),
        "has_more": has_more,
        "data": page,
    })))
}
