//! Azure OpenAI through this adapter: the resource endpoint, the deployment name as the
//! model, the `api-key` header or an Entra ID bearer token, and the dated `api-version`
//! only where the operator asks for one (docs/PROVIDERS.md, "Azure OpenAI").

use std::time::Duration;

use super::{Auth, Flavour, OpenAiBatches, OpenAiConfig, ProviderError};
use crate::config::{AzureAuth, AzureOptions};
use crate::providers::ApiKey;

/// A key no header can carry is refused here, so `config check` says so before `serve`.
pub fn azure_adapter(name: &str, options: &AzureOptions, key: ApiKey) -> Result<OpenAiBatches, ProviderError> {
    super::api_key_header(&key)?;
    let auth = match options.auth {
        AzureAuth::ApiKey => Auth::ApiKeyHeader,
        AzureAuth::Bearer => Auth::Bearer,
    };
    let flavour =
        Flavour::azure(auth, options.api_version.clone(), options.check_deployment.clone(), options.batch_metadata);
    let adapter = OpenAiBatches::new(OpenAiConfig {
        name: name.to_string(),
        base_url: options.base_url(),
        api_key: key,
        // Azure routes a batch line by its `model`: the batch deployment's name.
        model: options.deployment.clone(),
        request_timeout: Duration::from_secs(120),
        max_completion_tokens: options.budget.max_completion_tokens,
        max_completion_tokens_cap: options.budget.max_completion_tokens_cap,
    })?;
    Ok(adapter.with_flavour(flavour))
}
