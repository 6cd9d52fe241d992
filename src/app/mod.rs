//! The running appliance: configuration in, a registry of providers, and `serve`.

pub(crate) mod config;
pub(crate) mod provider_registry;
pub(crate) mod secrets;
pub(crate) mod server;
pub(crate) mod systemd;
pub(crate) mod telemetry;

/// The file in the data directory where `serve` writes the address it is bound to, so the
/// CLI on the same host finds a server started on port 0.
pub(crate) const ADDRESS_FILE: &str = "address";

/// Records where `serve` is bound ([`ADDRESS_FILE`]). Best effort: a server that cannot
/// write it still serves.
pub(crate) fn write_address(data_dir: &std::path::Path, addr: std::net::SocketAddr) {
    use std::io::Write;
    let written = crate::domain::private_file::create_dir_all(data_dir)
        .and_then(|()| crate::domain::private_file::replace(&data_dir.join(ADDRESS_FILE)))
        .and_then(|mut file| file.write_all(format!("{addr}\n").as_bytes()));
    if let Err(e) = written {
        tracing::warn!(error = %e, dir = %data_dir.display(), "cannot record the bound address for the CLI");
    }
}
