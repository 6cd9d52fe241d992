//! Cloud Storage through its JSON API (`storage/v1`), with the same bearer token as the
//! Vertex calls: a media upload of the input JSONL, listing the output directory, streaming
//! an object, deleting one. Four calls are all a job needs (docs/PROVIDERS.md, "Vertex AI",
//! says why this is not `object_store`).

use reqwest::Url;
use serde::Deserialize;

use super::{VertexBatches, error};
use crate::providers::gemini::wire as google;
use crate::providers::lines::Lines;
use crate::providers::{ErrorClass, ProviderError, describe_transport};

pub const DEFAULT_GCS_ENDPOINT: &str = "https://storage.googleapis.com";

/// `gs://bucket/prefix/`, split; the prefix never starts or ends with `/`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GcsUri {
    pub bucket: String,
    pub prefix: String,
}

impl GcsUri {
    /// Cloud Storage's bucket naming rules (3–63 characters of lowercase letters, digits,
    /// `-`, `_` and `.`, beginning and ending with a letter or digit; no `goog` prefix).
    pub fn parse(text: &str) -> Result<Self, String> {
        let rest = text.strip_prefix("gs://").ok_or_else(|| format!("{text:?} must be a gs://bucket/prefix/ URI"))?;
        let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
        let edge_ok = |b: Option<u8>| b.is_some_and(|b| b.is_ascii_lowercase() || b.is_ascii_digit());
        let bucket_ok = (3..=63).contains(&bucket.len())
            && bucket.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || matches!(b, b'-' | b'_' | b'.'))
            && edge_ok(bucket.bytes().next())
            && edge_ok(bucket.bytes().last())
            && !bucket.starts_with("goog");
        if !bucket_ok {
            return Err(format!(
                "bucket {bucket:?} breaks Cloud Storage's naming rules (3-63 of a-z 0-9 - _ ., \
                 starting and ending with a letter or digit, not starting with goog)"
            ));
        }
        let prefix = prefix.trim_matches('/');
        if prefix.contains("//") || prefix.bytes().any(|b| b.is_ascii_control()) {
            return Err(format!("prefix {prefix:?} must be a plain object name prefix"));
        }
        Ok(GcsUri { bucket: bucket.to_string(), prefix: prefix.to_string() })
    }

    /// The object name under the prefix.
    pub fn key(&self, rest: &str) -> String {
        if self.prefix.is_empty() { rest.to_string() } else { format!("{}/{rest}", self.prefix) }
    }

    pub fn uri(&self, rest: &str) -> String {
        format!("gs://{}/{}", self.bucket, self.key(rest))
    }
}

/// One page of `objects.list`.
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct ObjectList {
    #[serde(default)]
    items: Vec<ObjectName>,
    #[serde(default)]
    next_page_token: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
struct ObjectName {
    name: String,
}

/// A listing that long is not a job's output directory: stop instead of paging for ever.
const MAX_LIST_PAGES: usize = 100;

impl VertexBatches {
    fn gcs_url(&self, segments: &[&str]) -> Result<Url, ProviderError> {
        let mut url = self.gcs.clone();
        url.path_segments_mut()
            .map_err(|()| error(ErrorClass::Protocol, None, "the storage endpoint cannot take a path".into()))?
            .pop_if_empty()
            .extend(segments);
        Ok(url)
    }

    /// Sends an authorised storage call; a refusal is sorted like any Google API error.
    async fn gcs_send(&self, what: &str, request: reqwest::RequestBuilder) -> Result<reqwest::Response, ProviderError> {
        let bearer = self.tokens.bearer().await?;
        let response = request.header(reqwest::header::AUTHORIZATION, bearer).send().await.map_err(|e| {
            error(ErrorClass::Transient, None, format!("Cloud Storage {what}: {}", describe_transport(&e)))
        })?;
        if response.status().is_success() {
            return Ok(response);
        }
        let status = response.status().as_u16();
        let headers = response.headers().clone();
        let body = response.text().await.unwrap_or_default();
        let hint = self.tokens.scope_hint(&headers, &body);
        Err(google::refusal(super::PROVIDER, status, &headers, &body, &format!("Cloud Storage {what}: "), hint))
    }

    pub(super) async fn gcs_put(&self, bucket: &str, name: &str, body: Vec<u8>) -> Result<(), ProviderError> {
        let mut url = self.gcs_url(&["upload", "storage", "v1", "b", bucket, "o"])?;
        url.query_pairs_mut().append_pair("uploadType", "media").append_pair("name", name);
        let request = self
            .http
            .post(url)
            .timeout(self.config.request_timeout)
            .header(reqwest::header::CONTENT_TYPE, "application/octet-stream")
            .body(body);
        self.gcs_send(&format!("upload gs://{bucket}/{name}"), request).await.map(drop)
    }

    /// Every object name under `prefix`.
    pub(super) async fn gcs_list(&self, bucket: &str, prefix: &str) -> Result<Vec<String>, ProviderError> {
        let mut names = Vec::new();
        let mut token: Option<String> = None;
        for _ in 0..MAX_LIST_PAGES {
            let mut url = self.gcs_url(&["storage", "v1", "b", bucket, "o"])?;
            url.query_pairs_mut().append_pair("prefix", prefix);
            if let Some(token) = &token {
                url.query_pairs_mut().append_pair("pageToken", token);
            }
            let what = format!("list gs://{bucket}/{prefix}");
            let response = self.gcs_send(&what, self.http.get(url).timeout(self.config.request_timeout)).await?;
            let page: ObjectList = response.json().await.map_err(|e| {
                error(ErrorClass::Protocol, None, format!("Cloud Storage {what}: {}", describe_transport(&e)))
            })?;
            names.extend(page.items.into_iter().map(|o| o.name));
            match page.next_page_token.filter(|t| !t.is_empty()) {
                Some(next) => token = Some(next),
                None => return Ok(names),
            }
        }
        Err(error(ErrorClass::Protocol, None, format!("more than {MAX_LIST_PAGES} pages under gs://{bucket}/{prefix}")))
    }

    /// An object's lines, streamed (`alt=media`).
    pub(super) async fn gcs_lines(&self, bucket: &str, name: &str) -> Result<Lines, ProviderError> {
        let mut url = self.gcs_url(&["storage", "v1", "b", bucket, "o", name])?;
        url.query_pairs_mut().append_pair("alt", "media");
        let response = self.gcs_send(&format!("read gs://{bucket}/{name}"), self.http.get(url)).await?;
        Ok(Lines::new(response, super::PROVIDER))
    }

    /// Deletes an object; false when it was already gone.
    pub(super) async fn gcs_delete(&self, bucket: &str, name: &str) -> Result<bool, ProviderError> {
        let url = self.gcs_url(&["storage", "v1", "b", bucket, "o", name])?;
        let request = self.http.delete(url).timeout(self.config.request_timeout);
        match self.gcs_send(&format!("delete gs://{bucket}/{name}"), request).await {
            Ok(_) => Ok(true),
            Err(e) if e.status == Some(404) => Ok(false),
            Err(e) => Err(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::GcsUri;

    #[test]
    fn gcs_uris_follow_the_bucket_naming_rules() {
        let uri = GcsUri::parse("gs://my-bucket/in/put/").unwrap();
        assert_eq!((uri.bucket.as_str(), uri.prefix.as_str()), ("my-bucket", "in/put"));
        assert_eq!(uri.uri("b/requests.jsonl"), "gs://my-bucket/in/put/b/requests.jsonl");
        assert_eq!(GcsUri::parse("gs://bkt").unwrap().key("x"), "x");
        for bad in ["s3://bkt/x", "gs://Upper/x", "gs://ab/x", "gs://-bkt/x", "gs://google-x/y", "gs://bkt/a//b"] {
            assert!(GcsUri::parse(bad).is_err(), "{bad}");
        }
    }
}
