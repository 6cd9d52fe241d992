//! What sets one OpenAI-shaped Batch API apart from OpenAI's own: Azure OpenAI and the
//! platforms that copied the Files and Batches API (docs/PROVIDERS.md, "Azure OpenAI" and
//! "OpenAI-compatible batch platforms"). The adapter's logic stays one; only these facts
//! change.

use std::time::Duration;

/// How the key travels.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Auth {
    /// `Authorization: Bearer <key>`: OpenAI, the compatible platforms, and an Azure
    /// Microsoft Entra ID token.
    Bearer,
    /// `api-key: <key>`: an Azure OpenAI resource key.
    ApiKeyHeader,
}

/// What `provider check` can send.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ProbeTarget {
    /// A synchronous chat completion to the batch model itself.
    BatchModel,
    /// A synchronous chat completion to another model (an Azure Standard deployment of the
    /// same model), because the batch one takes batch requests only.
    Model(String),
    /// Only a free authenticated read (`GET /batches?limit=1`): key and endpoint, no schema.
    ListOnly,
}

#[derive(Debug, Clone)]
pub struct Flavour {
    /// Named in logs beside the provider's own name.
    pub label: &'static str,
    pub auth: Auth,
    /// Sent as `?api-version=` on every request (Azure's dated API versions).
    pub api_version: Option<String>,
    /// Each input line's `url` and the create request's `endpoint`; they must match.
    pub request_url: &'static str,
    /// Where a synchronous chat completion goes, relative to the base URL; `{model}` is
    /// replaced by the model (Azure's dated API puts the deployment in the path).
    pub chat_path: &'static str,
    pub max_input_lines: usize,
    pub max_input_bytes: usize,
    /// Input and output files expire this long after creation (Azure: a resource holds
    /// 500 batch files without an expiry, 10,000 with one).
    pub file_expiry: Option<Duration>,
    /// Whether the platform keeps a batch's `metadata` and lists it back. Only then may a
    /// lookup that found no batch carrying the key say the job does not exist; otherwise
    /// it must also rule out, by input file, every batch created since the intent.
    pub metadata_kept: bool,
    pub probe: ProbeTarget,
}

/// OpenAI's limits: 200 MB and 50,000 requests per input file.
const OPENAI_MAX_BYTES: usize = 200 * 1000 * 1000;
const OPENAI_MAX_LINES: usize = 50_000;
/// Azure's limits: 200 MB and 100,000 requests per input file.
const AZURE_MAX_LINES: usize = 100_000;
/// Azure takes 14 to 30 days; 14 leaves the most room under the 10,000-file cap.
pub const AZURE_FILE_EXPIRY: Duration = Duration::from_secs(1_209_600);
/// The first dated api-version whose uploads and creates take `expires_after` /
/// `output_expires_after`: Azure's batch how-to moved from `2024-10-21` to
/// `2025-03-01-preview` when it added them (MicrosoftDocs/azure-ai-docs 0a3ff77, 2025-03-31).
const FIRST_EXPIRY_VERSION: &str = "2025-03-01";

/// An older dated version does not know the fields: sending them would be refused, and the
/// file would then live under the 500-file cap until deleted.
fn takes_expiry(api_version: &str) -> bool {
    api_version.get(..10).is_some_and(|date| date >= FIRST_EXPIRY_VERSION)
}

impl Flavour {
    /// OpenAI, or a platform speaking its API. `metadata_kept` is true for OpenAI itself;
    /// for another platform the operator says so (`batch_metadata`).
    pub fn openai(metadata_kept: bool) -> Self {
        Self {
            label: "openai",
            auth: Auth::Bearer,
            api_version: None,
            request_url: "/v1/chat/completions",
            chat_path: "/chat/completions",
            max_input_lines: OPENAI_MAX_LINES,
            max_input_bytes: OPENAI_MAX_BYTES,
            file_expiry: None,
            metadata_kept,
            probe: ProbeTarget::BatchModel,
        }
    }

    /// Azure OpenAI. Without `api_version` the base URL is `{endpoint}/openai/v1` (the v1
    /// API, GA since August 2025); with one it is `{endpoint}/openai` and every request
    /// carries `api-version`, lines use `/chat/completions` and chat goes through
    /// `/deployments/{name}/…`.
    pub fn azure(
        auth: Auth,
        api_version: Option<String>,
        check_deployment: Option<String>,
        metadata_kept: bool,
    ) -> Self {
        let dated = api_version.is_some();
        let expiry_taken = api_version.as_deref().is_none_or(takes_expiry);
        Self {
            label: "azure",
            auth,
            api_version,
            request_url: if dated { "/chat/completions" } else { "/v1/chat/completions" },
            chat_path: if dated { "/deployments/{model}/chat/completions" } else { "/chat/completions" },
            max_input_lines: AZURE_MAX_LINES,
            max_input_bytes: OPENAI_MAX_BYTES,
            file_expiry: expiry_taken.then_some(AZURE_FILE_EXPIRY),
            metadata_kept,
            probe: check_deployment.map_or(ProbeTarget::ListOnly, ProbeTarget::Model),
        }
    }

    pub fn chat_path(&self, model: &str) -> String {
        self.chat_path.replace("{model}", model)
    }
}

impl Default for Flavour {
    fn default() -> Self {
        Self::openai(true)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_expiry_fields_go_only_where_the_api_version_takes_them() {
        let with = |version: Option<&str>| Flavour::azure(Auth::ApiKeyHeader, version.map(str::to_string), None, true);
        assert_eq!(with(None).file_expiry, Some(AZURE_FILE_EXPIRY), "the v1 API");
        assert_eq!(with(Some("2025-04-01-preview")).file_expiry, Some(AZURE_FILE_EXPIRY));
        assert_eq!(with(Some("2025-03-01-preview")).file_expiry, Some(AZURE_FILE_EXPIRY));
        assert_eq!(with(Some("2024-10-21")).file_expiry, None);
        assert_eq!(with(Some("2024-07-01-preview")).file_expiry, None);
    }

    #[test]
    fn azure_dated_and_v1_differ_where_the_docs_say() {
        let v1 = Flavour::azure(Auth::ApiKeyHeader, None, None, true);
        assert_eq!((v1.request_url, v1.chat_path("dep")), ("/v1/chat/completions", "/chat/completions".to_string()));
        assert_eq!(v1.probe, ProbeTarget::ListOnly);
        let dated = Flavour::azure(Auth::Bearer, Some("2024-10-21".into()), Some("std".into()), true);
        assert_eq!(dated.request_url, "/chat/completions");
        assert_eq!(dated.chat_path("std"), "/deployments/std/chat/completions");
        assert_eq!(dated.probe, ProbeTarget::Model("std".into()));
        assert_eq!(dated.max_input_lines, 100_000);
        assert_eq!(Flavour::openai(false).max_input_lines, 50_000);
    }
}
