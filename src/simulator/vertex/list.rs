//! `GET …/batchPredictionJobs`: newest first, `pageSize` (at most 100) and `pageToken`
//! paging, and the one filter form the dialect understands, `labels.<key>=<value>` (AIP-160;
//! the discovery doc's example `labels.keyA=valueA`), which is how a client finds the job a
//! lost create made.

use std::sync::Arc;

use axum::Json;
use axum::extract::{Path, Query, State};
use serde::Deserialize;
use serde_json::{Value, json};

use super::jobs::{Job, settle};
use crate::simulator::gemini::error::GoogleError;
use crate::simulator::state::Shared;

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct ListQuery {
    filter: Option<String>,
    page_size: Option<usize>,
    page_token: Option<String>,
}

/// `labels.<key>="<value>"` or `labels.<key>=<value>`; anything else is `None`.
fn label_filter(filter: &str) -> Option<(String, String)> {
    let (key, value) = filter.trim().strip_prefix("labels.")?.split_once('=')?;
    let value = value.trim();
    // Quoted (AIP-160's string literal) or bare, as the discovery doc's `labels.keyA=valueA`.
    let value = value.strip_prefix('"').and_then(|v| v.strip_suffix('"')).unwrap_or(value);
    if value.is_empty() || value.contains(['"', ' ']) {
        return None;
    }
    Some((key.trim().to_string(), value.to_string()))
}

pub(super) async fn list(
    State(shared): State<Arc<Shared>>,
    Path((project, location)): Path<(String, String)>,
    Query(query): Query<ListQuery>,
) -> Result<Json<Value>, GoogleError> {
    let wanted = match query.filter.as_deref().filter(|f| !f.trim().is_empty()) {
        Some(filter) => Some(label_filter(filter).ok_or_else(|| {
            GoogleError::invalid(format!(
                "Unsupported filter (SIMULATED dialect: labels.<key>=\"<value>\" only): {filter}"
            ))
        })?),
        None => None,
    };
    let size = query.page_size.unwrap_or(100).clamp(1, 100);
    let count = shared.lock().vertex.jobs.len();
    for index in 0..count {
        settle(&shared, index).await;
    }
    let mut inner = shared.lock();
    inner.stats.batches_listed += 1;
    let skip = match &query.page_token {
        Some(token) if !token.is_empty() => {
            token.parse::<usize>().map_err(|_| GoogleError::invalid("Invalid page token."))?
        }
        _ => 0,
    };
    let parent = super::jobs::job_name(&project, &location, "");
    let matching: Vec<Value> = inner
        .vertex
        .jobs
        .iter()
        .rev()
        .filter(|j| j.name.starts_with(&parent))
        .filter(|j| wanted.as_ref().is_none_or(|(k, v)| j.labels.get(k).and_then(Value::as_str) == Some(v)))
        .map(Job::describe)
        .collect();
    let page: Vec<Value> = matching.iter().skip(skip).take(size).cloned().collect();
    let mut answer = json!({"batchPredictionJobs": page});
    if skip + size < matching.len() {
        answer["nextPageToken"] = json!((skip + size).to_string());
    }
    Ok(Json(answer))
}

#[cfg(test)]
mod tests {
    use super::label_filter;

    #[test]
    fn label_filters() {
        let quoted = label_filter(r#"labels.commitpoint_batch="cpb-1""#);
        assert_eq!(quoted, Some(("commitpoint_batch".into(), "cpb-1".into())));
        assert_eq!(label_filter("labels.k=v"), Some(("k".into(), "v".into())));
        assert_eq!(label_filter("state=JOB_STATE_RUNNING"), None);
        assert_eq!(label_filter(r#"labels.k="a" AND state="x""#), None);
    }
}
