//! What `provider check` asks of Vertex (docs/PROVIDERS.md, "Vertex AI"): the credentials
//! through a one-job listing, the model through `:countTokens` (the request a batch line
//! carries, counted and never generated, so nothing is billed), and the input prefix in
//! Cloud Storage. No job is created, and the schema is not checked: it rides along in the
//! counted request, but nothing says countTokens judges a response schema.

use serde_json::Value;

use super::{VertexBatches, error, google, wire};
use crate::domain::schema::{Dialect, Schema};
use crate::providers::{Checked, Coverage, ErrorClass, PROBE_MAX_OUTPUT_TOKENS, ProviderError, probe_member};

/// Why the schema is not claimed: the count is the only free call that names the model.
const SCHEMA_NOT_CHECKED: &str = "countTokens counts the request, schema included, without generating and is \
    not documented to judge a response schema, so one Vertex refuses at generation would pass here";

impl VertexBatches {
    pub(super) async fn probe_steps(&self, schema: &Schema) -> Result<Checked, ProviderError> {
        let mut url = self.api_url(&["batchPredictionJobs"])?;
        url.query_pairs_mut().append_pair("pageSize", "1");
        self.call::<wire::JobList>(self.http.get(url)).await?;
        self.count_tokens(schema).await?;
        self.gcs_list(&self.config.input.bucket, &self.config.input.key("")).await?;
        Ok(Checked { schema: Coverage::NotChecked(SCHEMA_NOT_CHECKED.to_string()), ..Checked::everything() })
    }

    /// `publishers/google/models/{model}:countTokens`. A 404 naming the model is Vertex's
    /// answer for a model this project cannot use here: said as such, so the operator reads
    /// which setting is wrong.
    async fn count_tokens(&self, schema: &Schema) -> Result<(), ProviderError> {
        let view = &schema
            .view(Dialect::GeminiJson)
            .map_err(|e| error(ErrorClass::InvalidRequest, None, e.to_string()))?
            .document;
        let request = google::request(&probe_member(), schema, view, Some(PROBE_MAX_OUTPUT_TOKENS));
        let verb = format!("{}:countTokens", self.config.model);
        let url = self.api_url(&["publishers", "google", "models", &verb])?;
        // The count itself is not needed: an answer at all is the proof.
        let counted = self.call::<Value>(self.http.post(url).json(&request)).await;
        counted.map(drop).map_err(|e| {
            let model = &self.config.model;
            if e.status == Some(404) && e.message().contains(&format!("models/{model}")) {
                error(ErrorClass::InvalidRequest, Some(404), format!("unknown model {model}: {}", e.message()))
            } else {
                e
            }
        })
    }
}
