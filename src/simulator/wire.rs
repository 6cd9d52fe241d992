//! OpenAI Batch API objects exactly as they appear on the wire (`OpenAIFile`, `Batch`,
//! the list envelope, `CreateBatchRequest`). Field names and enum strings are the
//! protocol, so they are spelled here once and nowhere else.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

pub(super) const ENDPOINT_CHAT: &str = "/v1/chat/completions";
pub(super) const COMPLETION_WINDOW: &str = "24h";
/// Every `endpoint` value the real API accepts; only chat completions is simulated.
pub(super) const KNOWN_ENDPOINTS: &[&str] = &[
    "/v1/responses",
    ENDPOINT_CHAT,
    "/v1/embeddings",
    "/v1/completions",
    "/v1/moderations",
    "/v1/images/generations",
    "/v1/images/edits",
    "/v1/videos",
];
/// Purposes a client may upload with; `batch` is the only one a batch can use.
pub(super) const UPLOAD_PURPOSES: &[&str] = &["assistants", "batch", "fine-tune", "vision", "user_data", "evals"];
pub(super) const PURPOSE_BATCH: &str = "batch";
pub(super) const PURPOSE_BATCH_OUTPUT: &str = "batch_output";

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(super) struct OpenAiFile {
    pub id: String,
    pub object: String,
    pub bytes: u64,
    pub created_at: i64,
    pub expires_at: Option<i64>,
    pub filename: String,
    pub purpose: String,
    pub status: String,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(super) enum BatchStatus {
    Validating,
    Failed,
    InProgress,
    Finalizing,
    Completed,
    Expired,
    Cancelling,
    Cancelled,
}

impl BatchStatus {
    pub(super) fn is_terminal(self) -> bool {
        matches!(self, BatchStatus::Failed | BatchStatus::Completed | BatchStatus::Expired | BatchStatus::Cancelled)
    }
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(super) struct RequestCounts {
    pub total: u64,
    pub completed: u64,
    pub failed: u64,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(super) struct BatchError {
    pub code: String,
    pub message: String,
    pub param: Option<String>,
    pub line: Option<u64>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(super) struct BatchErrors {
    pub object: String,
    pub data: Vec<BatchError>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(super) struct CachedTokens {
    pub cached_tokens: u64,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(super) struct ReasoningTokens {
    pub reasoning_tokens: u64,
}

/// Batch-level token totals (`Batch.usage`), summed over the billed lines.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(super) struct BatchUsage {
    pub input_tokens: u64,
    pub input_tokens_details: CachedTokens,
    pub output_tokens: u64,
    pub output_tokens_details: ReasoningTokens,
    pub total_tokens: u64,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(super) struct Batch {
    pub id: String,
    pub object: String,
    pub endpoint: String,
    pub model: Option<String>,
    pub errors: Option<BatchErrors>,
    pub input_file_id: String,
    pub completion_window: String,
    pub status: BatchStatus,
    pub output_file_id: Option<String>,
    pub error_file_id: Option<String>,
    pub created_at: i64,
    pub in_progress_at: Option<i64>,
    pub expires_at: Option<i64>,
    pub finalizing_at: Option<i64>,
    pub completed_at: Option<i64>,
    pub failed_at: Option<i64>,
    pub expired_at: Option<i64>,
    pub cancelling_at: Option<i64>,
    pub cancelled_at: Option<i64>,
    pub request_counts: RequestCounts,
    pub usage: Option<BatchUsage>,
    pub metadata: Option<BTreeMap<String, String>>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(super) struct BatchList {
    pub object: String,
    pub data: Vec<Batch>,
    pub first_id: Option<String>,
    pub last_id: Option<String>,
    pub has_more: bool,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(super) struct DeletedFile {
    pub id: String,
    pub object: String,
    pub deleted: bool,
}

/// `BatchFileExpirationAfter`: accepted and range-checked; the simulator keeps files forever.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct ExpiresAfter {
    pub anchor: String,
    pub seconds: i64,
}

/// The real API rejects unknown parameters, so this does too: a typo in a client
/// should fail here rather than silently against production.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct CreateBatchRequest {
    pub input_file_id: String,
    pub endpoint: String,
    pub completion_window: String,
    #[serde(default)]
    pub metadata: Option<BTreeMap<String, String>>,
    #[serde(default)]
    pub output_expires_after: Option<ExpiresAfter>,
}

#[derive(Clone, Debug, Default, Deserialize)]
pub(super) struct ListQuery {
    pub after: Option<String>,
    pub limit: Option<String>,
}
