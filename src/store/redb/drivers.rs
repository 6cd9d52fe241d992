//! Who drives each provider on redb: the file lock admits one process, so always this one,
//! in one term that never lapses. There is nothing to fence: no other instance can write.

use std::time::Duration;

use async_trait::async_trait;

use super::{Error, Store, this_instance};
use crate::store::seam::{DriverTerm, Drivers, ProviderDriver};

#[async_trait]
impl Drivers for Store {
    async fn acquire_driver(&self, provider: String, _ttl: Duration) -> Result<Option<DriverTerm>, Error> {
        Ok(Some(DriverTerm { provider, epoch: 1 }))
    }

    async fn renew_driver(&self, _term: DriverTerm, _ttl: Duration) -> Result<bool, Error> {
        Ok(true)
    }

    async fn release_driver(&self, _term: DriverTerm) -> Result<(), Error> {
        Ok(())
    }

    async fn provider_drivers(&self, providers: Vec<String>) -> Result<Vec<ProviderDriver>, Error> {
        let instance = Some(this_instance().to_string());
        Ok(providers
            .into_iter()
            .map(|provider| ProviderDriver { provider, instance: instance.clone(), epoch: None })
            .collect())
    }
}
