//! URLs, the authenticated call with Google's errors sorted into our classes, and the
//! File API's resumable upload (start, then one `upload, finalize` of the whole file).

use reqwest::Url;
use reqwest::header::CONTENT_TYPE;

use super::{GeminiBatches, error, job_name, wire};
use crate::providers::{ErrorClass, ProviderError, describe_transport};

const API_VERSION: &str = "v1beta";

impl GeminiBatches {
    /// `{base}/{prefix…}/{segments…}`, each segment percent-encoded on its own.
    fn url(&self, prefix: &[&str], segments: &[&str]) -> Result<Url, ProviderError> {
        let mut url = self.base.clone();
        url.path_segments_mut()
            .map_err(|()| error(ErrorClass::Protocol, None, "the base URL cannot take a path".into()))?
            .pop_if_empty()
            .extend(prefix)
            .extend(segments);
        Ok(url)
    }

    pub(super) fn api_url(&self, segments: &[&str]) -> Result<Url, ProviderError> {
        self.url(&[API_VERSION], segments)
    }

    /// `v1beta/batches/{id}` or `v1beta/batches/{id}:{action}`.
    pub(super) fn batch_url(&self, job_id: &str, action: Option<&str>) -> Result<Url, ProviderError> {
        let id = job_name(job_id)?;
        let last = action.map_or_else(|| id.to_string(), |a| format!("{id}:{a}"));
        self.api_url(&["batches", &last])
    }

    /// `v1beta/models/{model}:{method}`.
    pub(super) fn model_url(&self, method: &str) -> Result<Url, ProviderError> {
        self.api_url(&["models", &format!("{}:{method}", self.config.model)])
    }

    /// `download/v1beta/files/{id}:download?alt=media` (batch guide, "Retrieving results").
    pub(super) fn download_url(&self, file: &str) -> Result<Url, ProviderError> {
        let id = file_id(file)?;
        let mut url = self.url(&["download", API_VERSION], &["files", &format!("{id}:download")])?;
        url.query_pairs_mut().append_pair("alt", "media");
        Ok(url)
    }

    /// `v1beta/files/{id}`, for `DELETE`.
    pub(super) fn file_url(&self, file: &str) -> Result<Url, ProviderError> {
        self.api_url(&["files", file_id(file)?])
    }

    /// Sends with the key, turning transport failures and non-2xx answers into classified
    /// errors with the delay Google asked for (`RetryInfo`, else `Retry-After`).
    pub(super) async fn send(&self, request: reqwest::RequestBuilder) -> Result<reqwest::Response, ProviderError> {
        let response =
            request.headers(self.headers.clone()).send().await.map_err(|e| {
                error(ErrorClass::Transient, None, format!("request failed: {}", describe_transport(&e)))
            })?;
        if response.status().is_success() {
            return Ok(response);
        }
        let status = response.status().as_u16();
        let headers = response.headers().clone();
        let body = response.text().await.unwrap_or_default();
        Err(wire::refusal(super::PROVIDER, status, &headers, &body, "", ""))
    }

    pub(super) async fn json<T: serde::de::DeserializeOwned>(
        &self,
        request: reqwest::RequestBuilder,
    ) -> Result<T, ProviderError> {
        let response = self.send(request.timeout(self.config.request_timeout)).await?;
        response
            .json()
            .await
            .map_err(|e| error(ErrorClass::Protocol, None, format!("unexpected answer: {}", describe_transport(&e))))
    }

    /// Uploads `jsonl` and returns its name (`files/{id}`). The upload URL comes from the
    /// start answer's `x-goog-upload-url`; the key is only sent to the configured origin.
    pub(super) async fn upload(&self, display_name: &str, jsonl: Vec<u8>) -> Result<String, ProviderError> {
        let start = self
            .http
            .post(self.url(&["upload", API_VERSION], &["files"])?)
            .timeout(self.config.request_timeout)
            .header("X-Goog-Upload-Protocol", "resumable")
            .header("X-Goog-Upload-Command", "start")
            .header("X-Goog-Upload-Header-Content-Length", jsonl.len().to_string())
            .header("X-Goog-Upload-Header-Content-Type", "application/jsonl")
            .header(CONTENT_TYPE, "application/json")
            .json(&serde_json::json!({"file": {"displayName": display_name}}));
        let started = self.send(start).await?;
        let raw = started.headers().get("x-goog-upload-url").and_then(|v| v.to_str().ok()).ok_or_else(|| {
            error(ErrorClass::Protocol, None, "the upload start answered without x-goog-upload-url".to_string())
        })?;
        let target =
            self.base.join(raw).ok().filter(|u| u.origin() == self.base.origin()).ok_or_else(|| {
                error(ErrorClass::Protocol, None, "the upload URL is outside the API origin".to_string())
            })?;
        let finish = self
            .http
            .post(target)
            .header("X-Goog-Upload-Command", "upload, finalize")
            .header("X-Goog-Upload-Offset", "0")
            .body(jsonl);
        let done = self.send(finish).await?;
        let status = done.headers().get("x-goog-upload-status").and_then(|v| v.to_str().ok()).map(str::to_string);
        if status.as_deref() != Some("final") {
            return Err(error(ErrorClass::Transient, None, format!("the upload did not finalize (status {status:?})")));
        }
        let answer: serde_json::Value = done.json().await.map_err(|e| {
            error(ErrorClass::Protocol, None, format!("unexpected upload answer: {}", describe_transport(&e)))
        })?;
        answer["file"]["name"]
            .as_str()
            .map(str::to_string)
            .ok_or_else(|| error(ErrorClass::Protocol, None, "the upload answer names no file".to_string()))
    }
}

/// The id of a file named `files/{id}`: one path segment.
fn file_id(file: &str) -> Result<&str, ProviderError> {
    file.strip_prefix("files/")
        .filter(|id| !id.is_empty() && !id.contains('/'))
        .ok_or_else(|| error(ErrorClass::Protocol, None, format!("unexpected file name {file:?}")))
}
