//! One driving instance per provider, under a fenced lease (`provider_leases`): a row per
//! provider naming the holder, an epoch that grows with every new term, and an expiry on
//! the database's clock (so instances on hosts whose clocks disagree still agree on when a
//! lease lapsed). A term is taken only when the row's lease has lapsed or was released.
//!
//! Every batch write a driver makes (intent, job id, staged lines, reschedules, closes,
//! and the same for trial batches) first reads the lease row `FOR SHARE` in its own
//! transaction and goes on only if this process still holds the epoch it started its term
//! with. A takeover updates that row, so it waits for the writes in flight and every later
//! write of the old term finds another epoch and is refused ([`Error::NotDriving`]).
//! Nothing depends on the session that took the lease staying open, and no advisory lock
//! is used.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use tokio_postgres::Transaction;

use super::rows::{big, unbig};
use super::{Error, PgStore, pg};
use crate::store::seam::{DriverTerm, Drivers, ProviderDriver};
use crate::store::this_instance;

/// The database's clock in milliseconds, as every lease expiry is written and compared.
const DB_NOW_MS: &str = "(extract(epoch FROM clock_timestamp()) * 1000)::bigint";

/// The terms this process holds now, by provider: what its batch writes are checked with.
#[derive(Debug, Default, Clone)]
pub(super) struct HeldTerms(Arc<Mutex<HashMap<String, u64>>>);

impl HeldTerms {
    fn set(&self, provider: &str, epoch: Option<u64>) {
        let mut held = self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        match epoch {
            Some(epoch) => held.insert(provider.to_string(), epoch),
            None => held.remove(provider),
        };
    }

    fn epoch(&self, provider: &str) -> Option<u64> {
        self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner).get(provider).copied()
    }

    /// Refuses the transaction's batch write for `provider` unless this process's term is
    /// still the lease's current one. The shared row lock makes a takeover wait for this
    /// transaction, so the check holds until it commits.
    pub(super) async fn check(&self, tx: &Transaction<'_>, provider: &str) -> Result<(), Error> {
        let not_driving = || Error::NotDriving { provider: provider.to_string() };
        let epoch = self.epoch(provider).ok_or_else(not_driving)?;
        let current = tx
            .query_opt(
                "SELECT 1 FROM provider_leases WHERE provider = $1 AND holder = $2 AND epoch = $3 FOR SHARE",
                &[&provider, &this_instance(), &big(epoch)],
            )
            .await
            .map_err(pg("cannot read a provider's lease"))?;
        current.map(|_| ()).ok_or_else(not_driving)
    }
}

fn millis(ttl: Duration) -> i64 {
    i64::try_from(ttl.as_millis()).unwrap_or(i64::MAX)
}

#[async_trait]
impl Drivers for PgStore {
    async fn acquire_driver(&self, provider: String, ttl: Duration) -> Result<Option<DriverTerm>, Error> {
        let client = self.client().await?;
        let statement = format!(
            "INSERT INTO provider_leases (provider, holder, epoch, expires_at_ms) \
             VALUES ($1, $2, 1, {DB_NOW_MS} + $3) \
             ON CONFLICT (provider) DO UPDATE SET holder = excluded.holder, epoch = provider_leases.epoch + 1, \
             expires_at_ms = excluded.expires_at_ms \
             WHERE provider_leases.expires_at_ms <= {DB_NOW_MS} RETURNING epoch"
        );
        let row = client
            .query_opt(&statement, &[&provider, &this_instance(), &millis(ttl)])
            .await
            .map_err(pg("cannot take a provider's lease"))?;
        let Some(row) = row else { return Ok(None) };
        let epoch = unbig(row.get(0));
        self.held.set(&provider, Some(epoch));
        Ok(Some(DriverTerm { provider, epoch }))
    }

    async fn renew_driver(&self, term: DriverTerm, ttl: Duration) -> Result<bool, Error> {
        let client = self.client().await?;
        let statement = format!(
            "UPDATE provider_leases SET expires_at_ms = {DB_NOW_MS} + $4 \
             WHERE provider = $1 AND holder = $2 AND epoch = $3 AND expires_at_ms > {DB_NOW_MS}"
        );
        let renewed = client
            .execute(&statement, &[&term.provider, &this_instance(), &big(term.epoch), &millis(ttl)])
            .await
            .map_err(pg("cannot renew a provider's lease"))?;
        if renewed == 0 {
            self.forget(&term);
        }
        Ok(renewed == 1)
    }

    async fn release_driver(&self, term: DriverTerm) -> Result<(), Error> {
        // Forgotten first: no write of this term is let through once its end has begun.
        self.forget(&term);
        let client = self.client().await?;
        client
            .execute(
                "UPDATE provider_leases SET expires_at_ms = 0 WHERE provider = $1 AND holder = $2 AND epoch = $3",
                &[&term.provider, &this_instance(), &big(term.epoch)],
            )
            .await
            .map_err(pg("cannot release a provider's lease"))?;
        Ok(())
    }

    async fn provider_drivers(&self, providers: Vec<String>) -> Result<Vec<ProviderDriver>, Error> {
        let client = self.client().await?;
        let statement = format!(
            "SELECT provider, holder, epoch FROM provider_leases \
             WHERE provider = ANY($1) AND expires_at_ms > {DB_NOW_MS}"
        );
        let rows = client.query(&statement, &[&providers]).await.map_err(pg("cannot read the provider leases"))?;
        let mut live: HashMap<String, (String, u64)> =
            rows.into_iter().map(|r| (r.get(0), (r.get(1), unbig(r.get(2))))).collect();
        Ok(providers
            .into_iter()
            .map(|provider| {
                let holder = live.remove(&provider);
                ProviderDriver {
                    provider,
                    epoch: holder.as_ref().map(|(_, epoch)| *epoch),
                    instance: holder.map(|(instance, _)| instance),
                }
            })
            .collect())
    }
}

impl PgStore {
    fn forget(&self, term: &DriverTerm) {
        if self.held.epoch(&term.provider) == Some(term.epoch) {
            self.held.set(&term.provider, None);
        }
    }
}
