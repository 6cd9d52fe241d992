//! Azure OpenAI through this adapter: the resource endpoint, the deployment name as the
//! model, the `api-key` header or an Entra ID bearer token, and the dated `api-version`
//! only where the operator asks for one (docs/PROVIDERS.md, "Azure OpenAI").

use std::time::Duration;

use super::{Auth, Flavour, OpenAiBatches, OpenAiConfig, ProviderError};
use crate::providers::ApiKey;

/// How the key is presented: the resource key in `api-key`, or an Entra ID token.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AzureAuth {
    ApiKey,
    Bearer,
}

/// One Azure OpenAI resource's Batch API as the adapter needs it (config resolves it from
/// `[providers.<name>] kind = "azure"`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AzureTarget {
    /// `{endpoint}/openai/v1`, or `{endpoint}/openai` with a dated `api_version`.
    pub base_url: String,
    pub deployment: String,
    pub api_version: Option<String>,
    pub auth: AzureAuth,
    pub check_deployment: Option<String>,
    pub batch_metadata: bool,
    pub max_completion_tokens: Option<u32>,
    pub max_completion_tokens_cap: u32,
}

/// A key no header can carry is refused here, so `config check` says so before `serve`.
pub fn azure_adapter(name: &str, options: &AzureTarget, key: ApiKey) -> Result<OpenAiBatches, ProviderError> {
    super::api_key_header(&key)?;
    let auth = match options.auth {
        AzureAuth::ApiKey => Auth::ApiKeyHeader,
        AzureAuth::Bearer => Auth::Bearer,
    };
    let flavour =
        Flavour::azure(auth, options.api_version.clone(), options.check_deployment.clone(), options.batch_metadata);
    let adapter = OpenAiBatches::new(OpenAiConfig {
        name: name.to_string(),
        base_url: options.base_url.clone(),
        api_key: key,
        // Azure routes a batch line by its `model`: the batch deployment's name.
        model: options.deployment.clone(),
        request_timeout: Duration::from_secs(120),
        max_completion_tokens: options.max_completion_tokens,
        max_completion_tokens_cap: options.max_completion_tokens_cap,
    })?;
    Ok(adapter.with_flavour(flavour))
}
