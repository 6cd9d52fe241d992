//! `[providers.<name>] kind = "azure"`: an Azure OpenAI resource's Batch API, through the
//! OpenAI adapter's Azure flavour (docs/PROVIDERS.md, "Azure OpenAI").

use std::path::PathBuf;

use serde::Deserialize;

use super::file::one_source;
use super::kinds::OpenAiBudget;
use super::{Error, KeySource};
pub(crate) use crate::providers::openai::AzureAuth;
use crate::providers::openai::AzureTarget;

pub(super) const DEFAULT_AZURE_KEY_ENV: &str = "AZURE_OPENAI_API_KEY";

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawAzure {
    /// The resource endpoint, `https://NAME.openai.azure.com` (no `/openai/...` path).
    pub endpoint: String,
    /// The Global-Batch (or Data Zone Batch) deployment: every line's `model`.
    pub deployment: String,
    /// A dated API version (`2024-10-21`, `2025-04-01-preview`); unset: the v1 API.
    pub api_version: Option<String>,
    /// `api-key` (default): the resource key in the `api-key` header. `bearer`: a Microsoft
    /// Entra ID access token in `Authorization: Bearer`.
    pub auth: Option<String>,
    /// A Standard deployment of the same model for `provider check` to send the schema to.
    pub check_deployment: Option<String>,
    /// Whether batch `metadata` is kept (default true, as Azure's v1 reference documents).
    pub batch_metadata: Option<bool>,
    pub max_completion_tokens: Option<u32>,
    pub max_completion_tokens_cap: Option<u32>,
    pub api_key_env: Option<String>,
    pub api_key_file: Option<PathBuf>,
    pub api_key_credential: Option<String>,
}

#[derive(Debug, Clone, PartialEq)]
pub(crate) struct AzureOptions {
    pub endpoint: String,
    pub deployment: String,
    pub api_version: Option<String>,
    pub auth: AzureAuth,
    pub check_deployment: Option<String>,
    pub batch_metadata: bool,
    pub budget: OpenAiBudget,
    pub key: KeySource,
}

impl AzureOptions {
    /// `{endpoint}/openai/v1` for the v1 API, `{endpoint}/openai` with a dated version.
    pub(crate) fn base_url(&self) -> String {
        match self.api_version {
            None => format!("{}/openai/v1", self.endpoint),
            Some(_) => format!("{}/openai", self.endpoint),
        }
    }

    /// What the adapter is built from.
    pub(crate) fn target(&self) -> AzureTarget {
        AzureTarget {
            base_url: self.base_url(),
            deployment: self.deployment.clone(),
            api_version: self.api_version.clone(),
            auth: self.auth,
            check_deployment: self.check_deployment.clone(),
            batch_metadata: self.batch_metadata,
            max_completion_tokens: self.budget.max_completion_tokens,
            max_completion_tokens_cap: self.budget.max_completion_tokens_cap,
        }
    }
}

impl RawAzure {
    pub(crate) fn resolve(self) -> Result<AzureOptions, Error> {
        let invalid = |key: &'static str, reason: String| Error::Invalid { key, reason };
        let endpoint = self.endpoint.trim_end_matches('/').to_string();
        if !(endpoint.starts_with("https://") || endpoint.starts_with("http://")) {
            return Err(invalid("endpoint", format!("{endpoint:?} is not an http(s) URL")));
        }
        if endpoint.contains("/openai") {
            return Err(invalid(
                "endpoint",
                format!("{endpoint:?}: give the resource endpoint (https://NAME.openai.azure.com), without /openai/…"),
            ));
        }
        if self.deployment.trim().is_empty() {
            return Err(invalid("deployment", "is empty".into()));
        }
        if let Some(version) = &self.api_version
            && !dated_version(version)
        {
            return Err(invalid(
                "api_version",
                format!("{version:?} is not a dated version such as 2024-10-21 (leave it unset for the v1 API)"),
            ));
        }
        let auth = match self.auth.as_deref() {
            None | Some("api-key") => AzureAuth::ApiKey,
            Some("bearer") => AzureAuth::Bearer,
            Some(other) => return Err(invalid("auth", format!("{other:?} is not \"api-key\" or \"bearer\""))),
        };
        let key = one_source("api_key_*", &self.api_key_env, &self.api_key_file, &self.api_key_credential)?
            .unwrap_or_else(|| KeySource::Env(DEFAULT_AZURE_KEY_ENV.to_string()));
        Ok(AzureOptions {
            endpoint,
            deployment: self.deployment,
            api_version: self.api_version,
            auth,
            check_deployment: self.check_deployment,
            batch_metadata: self.batch_metadata.unwrap_or(true),
            budget: OpenAiBudget::resolve(self.max_completion_tokens, self.max_completion_tokens_cap)?,
            key,
        })
    }
}

/// The table as `describe` prints it; the key only says where it comes from.
pub(super) fn describe(a: &AzureOptions, lines: &mut Vec<String>) {
    lines.push(format!("endpoint = {:?}", a.endpoint));
    lines.push(format!("deployment = {:?}", a.deployment));
    match &a.api_version {
        Some(version) => lines.push(format!("api_version = {version:?}")),
        None => lines.push("# api_version: unset, the v1 API".to_string()),
    }
    lines.push(format!("auth = {:?}", if a.auth == AzureAuth::Bearer { "bearer" } else { "api-key" }));
    if let Some(check) = &a.check_deployment {
        lines.push(format!("check_deployment = {check:?}"));
    }
    lines.push(format!("batch_metadata = {}", a.batch_metadata));
    match a.budget.max_completion_tokens {
        Some(n) => lines.push(format!("max_completion_tokens = {n}")),
        None => lines.push("# max_completion_tokens: unset, the model's own limit".to_string()),
    }
    lines.push(format!("max_completion_tokens_cap = {}", a.budget.max_completion_tokens_cap));
}

/// `YYYY-MM-DD` with an optional `-preview`.
fn dated_version(text: &str) -> bool {
    let date = text.strip_suffix("-preview").unwrap_or(text);
    let bytes = date.as_bytes();
    bytes.len() == 10
        && bytes.iter().enumerate().all(|(i, b)| if i == 4 || i == 7 { *b == b'-' } else { b.is_ascii_digit() })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn raw(extra: &str) -> Result<AzureOptions, Error> {
        let text = format!("endpoint = \"https://res.openai.azure.com/\"\ndeployment = \"gpt-4o-batch\"\n{extra}");
        toml::from_str::<RawAzure>(&text).map_err(|e| Error::Invalid { key: "toml", reason: e.to_string() })?.resolve()
    }

    #[test]
    fn defaults_are_the_v1_api_with_the_resource_key() {
        let o = raw("").unwrap();
        assert_eq!(o.base_url(), "https://res.openai.azure.com/openai/v1");
        assert_eq!((o.auth, o.batch_metadata), (AzureAuth::ApiKey, true));
        assert_eq!(o.key, KeySource::Env(DEFAULT_AZURE_KEY_ENV.into()));
        let dated = raw("api_version = \"2025-04-01-preview\"\nauth = \"bearer\"").unwrap();
        assert_eq!(dated.base_url(), "https://res.openai.azure.com/openai");
        assert_eq!(dated.auth, AzureAuth::Bearer);
    }

    #[test]
    fn mistakes_are_named() {
        for (extra, key) in [
            ("api_version = \"v1\"", "api_version"),
            ("api_version = \"2024-1-21\"", "api_version"),
            ("auth = \"key\"", "auth"),
        ] {
            let Err(Error::Invalid { key: got, .. }) = raw(extra) else { panic!("{extra} accepted") };
            assert_eq!(got, key, "{extra}");
        }
        let pasted =
            toml::from_str::<RawAzure>("endpoint = \"https://r.openai.azure.com/openai/v1\"\ndeployment = \"d\"")
                .unwrap()
                .resolve();
        assert!(matches!(pasted, Err(Error::Invalid { key: "endpoint", .. })), "{pasted:?}");
        assert!(toml::from_str::<RawAzure>("endpoint = \"https://r\"\ndeployment = \"d\"\nmodel = \"m\"").is_err());
    }
}
