//! `[providers.<name>] kind = "vertex"`: Vertex AI batch prediction for Gemini models
//! (docs/PROVIDERS.md, "Vertex AI"). No key in the config: a service-account key file by
//! path (`credentials_file`), else the metadata server's attached service account.

use std::path::PathBuf;

use serde::Deserialize;

use super::Error;
use super::kinds::at_least_one;
use crate::providers::vertex::{self, Credentials, GcsUri};

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawVertex {
    pub project: String,
    /// A region such as `us-central1`, or `global`.
    pub location: String,
    /// A Gemini model id such as `gemini-2.5-flash`.
    pub model: String,
    /// `gs://bucket/prefix/` the JSONL requests are written under.
    pub input_gcs_uri: String,
    /// `gs://bucket/prefix/` Vertex writes each job's predictions under.
    pub output_gcs_uri: String,
    /// A service-account JSON key file; unset, the metadata server (GCE, GKE workload
    /// identity, Cloud Run) is asked for tokens.
    pub credentials_file: Option<PathBuf>,
    /// The control plane (default `https://{location}-aiplatform.googleapis.com`).
    pub endpoint: Option<String>,
    /// Cloud Storage's JSON API (default `https://storage.googleapis.com`).
    pub gcs_endpoint: Option<String>,
    pub max_output_tokens: Option<u32>,
    pub max_output_tokens_cap: Option<u32>,
}

#[derive(Debug, Clone, PartialEq)]
pub(crate) struct VertexOptions {
    pub project: String,
    pub location: String,
    pub model: String,
    pub input: GcsUri,
    pub output: GcsUri,
    pub credentials: Credentials,
    pub endpoint: Option<String>,
    pub gcs_endpoint: Option<String>,
    pub max_output_tokens: Option<u32>,
    pub max_output_tokens_cap: u32,
}

impl RawVertex {
    pub(super) fn resolve(self) -> Result<VertexOptions, Error> {
        let invalid = |key: &'static str, reason: String| Error::Invalid { key, reason };
        vertex::project_rule(&self.project).map_err(|rule| invalid("project", rule))?;
        vertex::location_rule(&self.location).map_err(|rule| invalid("location", rule))?;
        vertex::model_rule(&self.model).map_err(|rule| invalid("model", rule))?;
        let gcs = |key: &'static str, text: &str| GcsUri::parse(text).map_err(|rule| invalid(key, rule));
        let credentials = match self.credentials_file {
            Some(path) => {
                vertex::check_key_file(&path).map_err(|e| invalid("credentials_file", e.to_string()))?;
                Credentials::KeyFile(path)
            }
            None => Credentials::MetadataServer,
        };
        let max_output_tokens = at_least_one("max_output_tokens", self.max_output_tokens)?;
        let max_output_tokens_cap = at_least_one("max_output_tokens_cap", self.max_output_tokens_cap)?
            .unwrap_or(vertex::DEFAULT_MAX_OUTPUT_TOKENS_CAP);
        if max_output_tokens.is_some_and(|n| n > max_output_tokens_cap) {
            return Err(invalid(
                "max_output_tokens",
                format!("must not exceed max_output_tokens_cap ({max_output_tokens_cap})"),
            ));
        }
        Ok(VertexOptions {
            project: self.project,
            location: self.location,
            model: self.model,
            input: gcs("input_gcs_uri", &self.input_gcs_uri)?,
            output: gcs("output_gcs_uri", &self.output_gcs_uri)?,
            credentials,
            endpoint: self.endpoint,
            gcs_endpoint: self.gcs_endpoint,
            max_output_tokens,
            max_output_tokens_cap,
        })
    }
}

/// `config check` / `describe` lines for the table.
pub(super) fn describe(v: &VertexOptions, lines: &mut Vec<String>) {
    let mut line = |key: &str, value: &str| lines.push(format!("{key} = {value:?}"));
    line("project", &v.project);
    line("location", &v.location);
    line("model", &v.model);
    line("input_gcs_uri", &v.input.uri(""));
    line("output_gcs_uri", &v.output.uri(""));
    if let Credentials::KeyFile(path) = &v.credentials {
        line("credentials_file", &path.display().to_string());
    }
    if let Some(endpoint) = &v.endpoint {
        line("endpoint", endpoint);
    }
    if let Some(endpoint) = &v.gcs_endpoint {
        line("gcs_endpoint", endpoint);
    }
    match v.max_output_tokens {
        Some(n) => lines.push(format!("max_output_tokens = {n}")),
        None => lines.push("# max_output_tokens: unset, the model's own limit".to_string()),
    }
    lines.push(format!("max_output_tokens_cap = {}", v.max_output_tokens_cap));
    if v.credentials == Credentials::MetadataServer {
        lines.push("# credentials: the metadata server's service account (no credentials_file)".to_string());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const BASE: &str = "project = \"my-project-1\"\nlocation = \"us-central1\"\nmodel = \"gemini-2.5-flash\"\n\
        input_gcs_uri = \"gs://cp-in/commitpoint/\"\noutput_gcs_uri = \"gs://cp-out/results\"\n";

    fn resolve(text: &str) -> Result<VertexOptions, Error> {
        toml::from_str::<RawVertex>(text).map_err(|e| Error::Invalid { key: "t", reason: e.to_string() })?.resolve()
    }

    fn refusal(text: &str) -> String {
        resolve(text).unwrap_err().to_string()
    }

    #[test]
    fn defaults_and_refusals() {
        let o = resolve(BASE).unwrap();
        assert_eq!(o.credentials, Credentials::MetadataServer);
        assert_eq!((o.input.bucket.as_str(), o.input.prefix.as_str()), ("cp-in", "commitpoint"));
        assert_eq!(o.max_output_tokens_cap, vertex::DEFAULT_MAX_OUTPUT_TOKENS_CAP);
        assert!(refusal(&BASE.replace("my-project-1", "Proj")).contains("6-30"));
        assert!(refusal(&BASE.replace("us-central1", "US Central")).contains("location"));
        assert!(refusal(&BASE.replace("gs://cp-in/commitpoint/", "s3://x/y")).contains("gs://"));
        assert!(refusal(&BASE.replace("gs://cp-out/results", "gs://goog-out/r")).contains("naming rules"));
        assert!(refusal(&format!("{BASE}credentials_file = \"/nonexistent/sa.json\"")).contains("credentials_file"));
        assert!(refusal(&format!("{BASE}max_output_tokens = 99999")).contains("max_output_tokens_cap"));
        assert!(resolve(&format!("{BASE}api_key_env = \"X\"")).is_err(), "no key in the config");
    }
}
