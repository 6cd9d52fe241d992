//! The running appliance: configuration in, a registry of providers, and `serve`.

pub(crate) mod config;
pub(crate) mod provider_registry;
pub(crate) mod secrets;
pub(crate) mod server;
pub(crate) mod systemd;
