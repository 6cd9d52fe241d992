//! Who drives each provider's batches. One instance at a time submits, polls and ingests
//! a provider's batches; it holds a lease on the provider for a term, and every batch
//! write it makes is checked against that term, so an instance whose term ended (it was
//! paused, partitioned or slow) cannot change a batch after another has taken over.

use super::*;
use async_trait::async_trait;
use std::time::Duration;

#[async_trait]
pub trait Drivers: Send + Sync + std::fmt::Debug {
    /// Starts a term driving `provider` if no instance holds a live lease on it.
    /// `None`: another instance drives it now. A term lasts `ttl` unless renewed.
    async fn acquire_driver(&self, provider: String, ttl: Duration) -> Result<Option<DriverTerm>, Error>;
    /// Extends the term by `ttl` from now. `false`: the term is over (it lapsed, or
    /// another instance took over) and this instance must stop driving.
    async fn renew_driver(&self, term: DriverTerm, ttl: Duration) -> Result<bool, Error>;
    /// Ends the term now, so a standby need not wait for it to lapse. After this, batch
    /// writes for the provider are refused until a new term starts.
    async fn release_driver(&self, term: DriverTerm) -> Result<(), Error>;
    /// The instance driving each of `providers`' batches now, if one is.
    async fn provider_drivers(&self, providers: Vec<String>) -> Result<Vec<ProviderDriver>, Error>;
}

/// One instance's turn at driving one provider. The epoch grows with every new term of
/// any instance, so a write checked against it is refused once anyone else has started.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DriverTerm {
    pub provider: String,
    pub epoch: u64,
}

/// A provider and the instance driving its batches, if any instance is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProviderDriver {
    pub provider: String,
    pub instance: Option<String>,
    /// The term's epoch, where terms are counted (PostgreSQL).
    pub epoch: Option<u64>,
}
