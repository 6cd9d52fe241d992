//! The running appliance: configuration in, a registry of providers, and `serve`.

pub mod config;
pub mod provider_registry;
pub mod server;
pub mod systemd;
