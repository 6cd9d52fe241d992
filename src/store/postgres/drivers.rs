//! One driving instance per provider. Each instance that has `[providers.X]` holds a
//! session advisory lock for X on a connection of its own, taken at start and kept for
//! the life of the process; a second instance configured with X is refused at start.
//! Losing that connection ends the process (the caller supervises the hold), because the
//! server has then let go of the lock and another instance may take it.

use std::future::Future;

use tokio_postgres::NoTls;

use super::{Error, PgStore, pg};

/// The first key of every provider's advisory lock ('prov'); the second is the name's
/// hash. Distinct from the migration lock's key.
pub(super) const DRIVER_LOCK_CLASS: i32 = 0x7072_6f76;

impl PgStore {
    /// Takes the driver lock of every provider in `providers`. `Ok(Err(name))`: another
    /// instance drives `name`. `Ok(Ok(hold))`: the locks are held until `hold` is dropped;
    /// it resolves (with an error) only if the connection holding them ends.
    pub async fn hold_drivers(
        &self,
        providers: Vec<String>,
    ) -> Result<Result<impl Future<Output = Result<(), Error>> + Send + 'static + use<>, String>, Error> {
        let (client, connection) =
            self.config.connect(NoTls).await.map_err(pg("cannot connect for the provider driver locks"))?;
        let connection = tokio::spawn(connection);
        for name in &providers {
            let taken: bool = client
                .query_one("SELECT pg_try_advisory_lock($1, hashtext($2))", &[&DRIVER_LOCK_CLASS, name])
                .await
                .map_err(pg("cannot take a provider driver lock"))?
                .get(0);
            if !taken {
                // Dropping the client ends the session and releases what was taken.
                drop(client);
                let _ = connection.await;
                return Ok(Err(name.clone()));
            }
        }
        Ok(Ok(async move {
            // The client lives as long as this future: dropping it would end the session.
            let _client = client;
            let ended = match connection.await {
                Ok(Ok(())) => "closed".to_string(),
                Ok(Err(e)) => e.to_string(),
                Err(e) => e.to_string(),
            };
            Err(Error::DriverLockLost { ended })
        }))
    }
}
