//! A small typed client for the demo: the same HTTP calls any integration would make.

use anyhow::{Context, bail};
use serde_json::{Value, json};

use super::corpus::Source;

#[derive(Clone)]
pub(super) struct Api {
    pub(super) base: String,
    pub(super) http: reqwest::Client,
}

impl Api {
    pub(super) async fn call(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<Value>,
    ) -> anyhow::Result<(u16, Value)> {
        let mut request = self.http.request(method, format!("{}{path}", self.base));
        if let Some(body) = body {
            request = request.json(&body);
        }
        let response = request.send().await.with_context(|| format!("request to {path} failed"))?;
        let status = response.status().as_u16();
        let body = response.json().await.with_context(|| format!("{path}: answer is not JSON"))?;
        Ok((status, body))
    }

    pub(super) async fn post(&self, path: &str, body: Value) -> anyhow::Result<(u16, Value)> {
        self.call(reqwest::Method::POST, path, Some(body)).await
    }

    pub(super) async fn get(&self, path: &str) -> anyhow::Result<Value> {
        let (status, body) = self.call(reqwest::Method::GET, path, None).await?;
        if status != 200 {
            bail!("GET {path}: {status} {body}");
        }
        Ok(body)
    }

    /// A `GET` whose answer is text (a report's `format=text`).
    pub(super) async fn get_text(&self, path: &str) -> anyhow::Result<String> {
        let response = self.http.get(format!("{}{path}", self.base)).send().await;
        let response = response.with_context(|| format!("request to {path} failed"))?;
        let status = response.status().as_u16();
        let text = response.text().await.with_context(|| format!("{path}: cannot read the answer"))?;
        if status != 200 {
            bail!("GET {path}: {status} {text}");
        }
        Ok(text)
    }

    pub(super) async fn intake(&self, source: &Source) -> anyhow::Result<(u16, Value)> {
        let body = json!({"tenant": source.tenant, "source_id": source.source_id, "schema": "code-review@1", "content": source.content});
        self.post("/v1/extractions", body).await
    }

    pub(super) async fn claim(&self, worker: &str, limit: usize, lease_seconds: u64) -> anyhow::Result<Vec<Value>> {
        let (status, body) =
            self.post("/v1/claims", json!({"worker": worker, "limit": limit, "lease_seconds": lease_seconds})).await?;
        if status != 200 {
            bail!("claim: {status} {body}");
        }
        Ok(body["claims"].as_array().cloned().unwrap_or_default())
    }

    pub(super) async fn post_result(&self, claim: &Value, output: Value) -> anyhow::Result<(u16, Value)> {
        let id = claim["extraction_id"].as_str().unwrap_or_default();
        let body = json!({
            "lease_token": claim["lease_token"],
            "output": output,
            "usage": {"model": "demo-reviewer", "input_tokens": claim["content"].as_str().map_or(0, str::len), "output_tokens": 64},
        });
        self.post(&format!("/v1/extractions/{id}/result"), body).await
    }
}
