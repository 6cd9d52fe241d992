//! Who holds each provider's driver lock, read from the server's lock table: the answer
//! is whatever PostgreSQL says now, so a killed instance stops being named the moment its
//! session ends, with nothing of ours to clean up.

use super::drivers::DRIVER_LOCK_CLASS;
use super::{Error, PgStore, pg};
use crate::store::ProviderDriver;

/// Every session of this process names itself `commitpoint host:pid`.
pub(super) const APPLICATION_PREFIX: &str = "commitpoint ";

impl PgStore {
    pub(super) async fn provider_drivers(&self, providers: Vec<String>) -> Result<Vec<ProviderDriver>, Error> {
        let client = self.client().await?;
        let statement = client
            .prepare_cached(
                "SELECT a.application_name FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid \
                 WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 2 \
                   AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database()) \
                   AND l.classid = ($1::int4)::oid AND l.objid = hashtext($2)::oid",
            )
            .await
            .map_err(pg("cannot read the provider driver locks"))?;
        let mut drivers = Vec::with_capacity(providers.len());
        for provider in providers {
            let row = client
                .query_opt(&statement, &[&DRIVER_LOCK_CLASS, &provider])
                .await
                .map_err(pg("cannot read the provider driver locks"))?;
            let instance = row
                .and_then(|r| r.get::<_, Option<String>>(0))
                .map(|name| name.strip_prefix(APPLICATION_PREFIX).map_or_else(|| name.clone(), str::to_string));
            drivers.push(ProviderDriver { provider, instance });
        }
        Ok(drivers)
    }
}

/// The session name for this process; PostgreSQL keeps at most 63 bytes of it.
pub(super) fn application_name() -> String {
    let mut name = format!("{APPLICATION_PREFIX}{}", crate::store::this_instance());
    while name.len() > 63 {
        name.pop();
    }
    name
}
