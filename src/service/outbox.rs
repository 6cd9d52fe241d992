//! Webhook endpoints and the outbox's operator actions.

use super::Endpoint;
use super::{Error, Service};
use crate::store::{OutboxFilter, OutboxRecord};

impl Service {
    pub fn webhook(&self, name: &str) -> Result<&Endpoint, Error> {
        self.webhooks.get(name).ok_or_else(|| Error::UnknownWebhook(name.to_string()))
    }

    pub async fn outbox(&self, filter: OutboxFilter, after: u64, limit: usize) -> Result<Vec<OutboxRecord>, Error> {
        Ok(self.store.list_outbox(filter, after, limit).await?)
    }

    /// The body a delivery of `event` sends, as the receiver would get it now.
    pub async fn outbox_payload(&self, event: &OutboxRecord) -> Result<Vec<u8>, Error> {
        Ok(crate::engine::outbox::event_body(self.store.as_ref(), self.registry(), event).await?)
    }

    pub async fn redeliver(&self, seq: u64) -> Result<OutboxRecord, Error> {
        let event = self.store.redeliver(seq).await?.ok_or(Error::UnknownEvent(seq))?;
        if let Some(wake) = &self.outbox_wake {
            wake.notify_one();
        }
        Ok(event)
    }

    /// Re-enables a sink a receiver disabled with 410 Gone.
    pub async fn enable_sink(&self, name: &str) -> Result<(), Error> {
        Ok(self.store.set_sink_disabled(name.to_string(), false).await?)
    }

    pub async fn outbox_counts(&self) -> Result<(u64, u64, Option<u64>), Error> {
        Ok(self.store.outbox_counts().await?)
    }
}
