//! `POST /batches`: the batch key in `metadata` where the platform takes it, and what to
//! do where it does not (docs/PROVIDERS.md, "OpenAI-compatible batch platforms").
//!
//! A platform may refuse `metadata` (a 400 naming it) or accept it and drop it. A 400 means
//! nothing was created, so the create is sent again without it; either way the lookup
//! stops trusting metadata for this process, and the operator is told to say so in the
//! config (`batch_metadata = false`), because after a restart the lesson is forgotten.

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;

use super::{ErrorClass, OpenAiBatches, ProviderError, wire};

impl OpenAiBatches {
    pub(super) async fn create_batch(&self, batch_key: &str, file_id: &str) -> Result<String, ProviderError> {
        let with_metadata = !self.omit_metadata.load(Ordering::Relaxed);
        match self.send_create(batch_key, file_id, with_metadata).await {
            Err(e) if with_metadata && refuses_metadata(&e) => {
                self.omit_metadata.store(true, Ordering::Relaxed);
                self.metadata_lost.store(true, Ordering::Relaxed);
                tracing::warn!(provider = %self.config.name, error = %e,
                    "the platform refuses batch metadata: creating without it; set batch_metadata = false for this provider");
                self.send_create(batch_key, file_id, false).await
            }
            other => other,
        }
    }

    async fn send_create(&self, batch_key: &str, file_id: &str, with_metadata: bool) -> Result<String, ProviderError> {
        let body = wire::CreateBatch {
            input_file_id: file_id,
            endpoint: self.flavour.request_url,
            completion_window: "24h",
            metadata: with_metadata.then(|| BTreeMap::from([(wire::BATCH_KEY_METADATA, batch_key)])),
            output_expires_after: self
                .flavour
                .file_expiry
                .map(|e| wire::ExpiresAfter { anchor: "created_at", seconds: e.as_secs() }),
        };
        let batch: wire::Batch = self.json(self.http.post(self.url("/batches")).json(&body)).await?;
        let kept =
            batch.metadata.as_ref().and_then(|m| m.get(wire::BATCH_KEY_METADATA)).is_some_and(|k| k == batch_key);
        if with_metadata && !kept && !self.metadata_lost.swap(true, Ordering::Relaxed) {
            tracing::warn!(provider = %self.config.name, batch = %batch.id,
                "the platform dropped the batch metadata: lost jobs are looked up by input file; set batch_metadata = false for this provider");
        }
        Ok(batch.id)
    }
}

/// A 400 about `metadata` (its parameter or its words): the create did not happen.
fn refuses_metadata(e: &ProviderError) -> bool {
    e.class == ErrorClass::InvalidRequest
        && e.status == Some(400)
        && e.message().to_ascii_lowercase().contains("metadata")
}
