//! Every secret `serve` reads besides the access tokens (which `AccessPolicy::load`
//! reads): the store's password, the outbox sinks' signing secrets, the webhook
//! endpoints' secrets. `serve` and `config check` (and so `ctl reload`'s check) both call
//! [`load`], so a file `serve` would refuse (missing, readable by others, unusable) is
//! refused by the check too, with the same message.

use crate::app::config::{self, ServeOptions, StoreChoice};
use crate::engine::outbox::Sink;
use crate::engine::webhook::WebhookSecret;
use crate::service::Endpoint;

/// A secret that cannot be used: always the operator's to fix (exit 78).
#[derive(Debug, thiserror::Error)]
pub(crate) enum Error {
    #[error(transparent)]
    Config(#[from] config::Error),
    #[error("outbox sink {name}: the secret is unusable: {reason}")]
    Sink { name: String, reason: String },
    #[error(transparent)]
    Webhook(#[from] crate::service::EndpointError),
}

/// What the secrets of a configuration became.
#[derive(Debug)]
pub(crate) struct Secrets {
    /// The PostgreSQL password, when `[store]` names one.
    pub store_password: Option<String>,
    pub sinks: Vec<Sink>,
    pub webhooks: Vec<Endpoint>,
}

pub(crate) fn load(options: &ServeOptions) -> Result<Secrets, Error> {
    let store_password = match &options.store {
        StoreChoice::Postgres { password: Some(source), .. } => {
            Some(source.load_secret().map_err(config::Error::from)?)
        }
        StoreChoice::Postgres { password: None, .. } | StoreChoice::Redb => None,
    };
    let sinks = load_sinks(&options.sinks)?;
    let webhooks = options.webhooks.iter().map(Endpoint::load).collect::<Result<Vec<_>, _>>()?;
    Ok(Secrets { store_password, sinks, webhooks })
}

fn load_sinks(options: &[config::SinkOptions]) -> Result<Vec<Sink>, Error> {
    options
        .iter()
        .map(|s| {
            let text = s.secret.load_secret().map_err(config::Error::from)?;
            let secret = WebhookSecret::standard(&text)
                .map_err(|e| Error::Sink { name: s.name.clone(), reason: e.to_string() })?;
            Ok(Sink {
                name: s.name.clone(),
                url: s.url.clone(),
                secret,
                max_attempts: s.max_attempts,
                max_age: s.max_age,
                timeout: s.timeout,
            })
        })
        .collect()
}
