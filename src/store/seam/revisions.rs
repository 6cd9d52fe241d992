//! The revisions of a source: every extraction of one (tenant, source_id, schema name).

use super::*;
use async_trait::async_trait;

/// Reads of a source's revisions (the service's `GET /v1/sources/...` and diffs).
#[async_trait]
pub trait Revisions: Send + Sync + std::fmt::Debug {
    /// Every extraction of `source_id` for `tenant` under any version of the schema name
    /// `schema_name` (`code-review`, no version), in intake order (oldest first).
    async fn revisions(
        &self,
        tenant: String,
        source_id: String,
        schema_name: String,
    ) -> Result<Vec<ExtractionRecord>, Error>;
}
