//! Reads the `[server]` limits (timeouts, connection and export caps, page size) into the
//! HTTP layer's settings.

use std::time::Duration;

use super::Error;
use super::file::{RawServer, parse_duration};
use crate::http::limits::ServerLimits;

/// The smallest page budget: below it most pages would hold one record.
const MIN_PAGE_BYTES: usize = 16 * 1024;

/// The `[server]` timeouts and caps, with the defaults for what is not set.
pub(super) fn resolve(raw: &RawServer) -> Result<ServerLimits, Error> {
    let defaults = ServerLimits::default();
    let limits = ServerLimits {
        header_read_timeout: duration("server.header_read_timeout", &raw.header_read_timeout)?
            .unwrap_or(defaults.header_read_timeout),
        body_read_timeout: duration("server.body_read_timeout", &raw.body_read_timeout)?
            .unwrap_or(defaults.body_read_timeout),
        max_connections: raw.max_connections.unwrap_or(defaults.max_connections),
        stream_stall_timeout: duration("server.stream_stall_timeout", &raw.stream_stall_timeout)?
            .unwrap_or(defaults.stream_stall_timeout),
        max_exports: raw.max_exports.unwrap_or(defaults.max_exports),
        max_exports_per_tenant: raw.max_exports_per_tenant.unwrap_or(defaults.max_exports_per_tenant),
        max_page_bytes: raw.max_page_bytes.unwrap_or(defaults.max_page_bytes),
    };
    for (key, value) in [
        ("server.max_connections", limits.max_connections),
        ("server.max_exports", limits.max_exports),
        ("server.max_exports_per_tenant", limits.max_exports_per_tenant),
    ] {
        if value == 0 {
            return Err(Error::Invalid { key, reason: "must be at least 1".into() });
        }
    }
    if limits.max_exports_per_tenant > limits.max_exports {
        return Err(Error::Invalid {
            key: "server.max_exports_per_tenant",
            reason: format!("must not exceed server.max_exports ({})", limits.max_exports),
        });
    }
    if limits.max_page_bytes < MIN_PAGE_BYTES {
        return Err(Error::Invalid {
            key: "server.max_page_bytes",
            reason: format!("must be at least {MIN_PAGE_BYTES}"),
        });
    }
    Ok(limits)
}

/// `[server] allowed_hosts`: each a DNS name or `name:port`, so that a typo (a URL, a
/// path) is refused at start rather than leaving the real name refused at every request.
pub(super) fn allowed_hosts(raw: &RawServer) -> Result<Vec<String>, Error> {
    let names = raw.allowed_hosts.clone().unwrap_or_default();
    for name in &names {
        let (host, port) = name.rsplit_once(':').unwrap_or((name.as_str(), "0"));
        let host_ok = !host.is_empty()
            && host.len() <= 253
            && host.bytes().all(|b| b.is_ascii_alphanumeric() || b"-.".contains(&b));
        if !host_ok || port.parse::<u16>().is_err() {
            return Err(Error::Invalid {
                key: "server.allowed_hosts",
                reason: format!("{name:?} is not a host name or host:port (like \"commitpoint.internal:8787\")"),
            });
        }
    }
    Ok(names)
}

/// A zero timeout would cut off every client, so it is refused rather than read as "off".
fn duration(key: &'static str, text: &Option<String>) -> Result<Option<Duration>, Error> {
    let Some(text) = text else { return Ok(None) };
    let d = parse_duration(key, text)?;
    if d.is_zero() {
        return Err(Error::Invalid { key, reason: "must be more than 0s".into() });
    }
    Ok(Some(d))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn resolve(text: &str) -> Result<ServerLimits, Error> {
        let raw: super::super::RawConfig = toml::from_str(text).unwrap();
        super::allowed_hosts(&raw.server)?;
        super::resolve(&raw.server)
    }

    #[test]
    fn limits_default_to_seconds_and_can_be_set() {
        assert_eq!(resolve("").unwrap(), ServerLimits::default());
        let set = resolve(
            "[server]\nheader_read_timeout = \"2s\"\nbody_read_timeout = \"500ms\"\nmax_connections = 3\n\
             stream_stall_timeout = \"5s\"\nmax_exports = 4\nmax_exports_per_tenant = 1\nmax_page_bytes = 65536",
        )
        .unwrap();
        assert_eq!(set.header_read_timeout, Duration::from_secs(2));
        assert_eq!(set.body_read_timeout, Duration::from_millis(500));
        assert_eq!(set.max_connections, 3);
        assert_eq!(set.stream_stall_timeout, Duration::from_secs(5));
        assert_eq!((set.max_exports, set.max_exports_per_tenant, set.max_page_bytes), (4, 1, 65536));
    }

    #[test]
    fn zero_and_nonsense_are_refused_by_key() {
        for (text, key) in [
            ("[server]\nheader_read_timeout = \"0s\"", "server.header_read_timeout"),
            ("[server]\nbody_read_timeout = \"soon\"", "server.body_read_timeout"),
            ("[server]\nmax_connections = 0", "server.max_connections"),
            ("[server]\nstream_stall_timeout = \"0s\"", "server.stream_stall_timeout"),
            ("[server]\nmax_exports = 0", "server.max_exports"),
            ("[server]\nmax_exports = 2\nmax_exports_per_tenant = 3", "server.max_exports_per_tenant"),
            ("[server]\nmax_page_bytes = 100", "server.max_page_bytes"),
            ("[server]\nallowed_hosts = [\"http://example.com\"]", "server.allowed_hosts"),
        ] {
            let err = resolve(text).unwrap_err();
            assert!(err.to_string().starts_with(key), "{text}: {err}");
        }
    }
}
