//! Who drives each provider on redb: the file lock admits one process, so always this one.

use super::{Error, ProviderDriver, Store, this_instance};

impl Store {
    pub async fn provider_drivers(&self, providers: Vec<String>) -> Result<Vec<ProviderDriver>, Error> {
        let instance = Some(this_instance().to_string());
        Ok(providers.into_iter().map(|provider| ProviderDriver { provider, instance: instance.clone() }).collect())
    }
}
