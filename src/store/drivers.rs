//! Which process drives each provider's batches. On redb the file lock admits one process,
//! so it is always this one; on PostgreSQL it is the session holding the provider's driver
//! lock, named by the `application_name` every commitpoint session carries.

use std::sync::OnceLock;

use super::{Error, Store};

/// A provider and the instance driving its batches, if any instance is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProviderDriver {
    pub provider: String,
    pub instance: Option<String>,
}

/// This process as other instances and the database see it: `host:pid`. A host name
/// that cannot be read is shown as `unknown-host` rather than failing the start.
pub fn this_instance() -> &'static str {
    static LABEL: OnceLock<String> = OnceLock::new();
    LABEL.get_or_init(|| {
        let host = nix::unistd::gethostname().ok().and_then(|h| h.into_string().ok());
        format!("{}:{}", host.as_deref().unwrap_or("unknown-host"), std::process::id())
    })
}

impl Store {
    pub async fn provider_drivers(&self, providers: Vec<String>) -> Result<Vec<ProviderDriver>, Error> {
        let instance = Some(this_instance().to_string());
        Ok(providers.into_iter().map(|provider| ProviderDriver { provider, instance: instance.clone() }).collect())
    }
}
