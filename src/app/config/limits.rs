//! Reads the `[server]` limits (timeouts, connection cap) into the HTTP layer's settings.

use std::time::Duration;

use super::Error;
use super::file::{RawServer, parse_duration};
use crate::http::limits::ServerLimits;

/// The `[server]` timeouts and connection cap, with the defaults for what is not set.
pub(super) fn resolve(raw: &RawServer) -> Result<ServerLimits, Error> {
    let defaults = ServerLimits::default();
    let limits = ServerLimits {
        header_read_timeout: duration("server.header_read_timeout", &raw.header_read_timeout)?
            .unwrap_or(defaults.header_read_timeout),
        body_read_timeout: duration("server.body_read_timeout", &raw.body_read_timeout)?
            .unwrap_or(defaults.body_read_timeout),
        max_connections: raw.max_connections.unwrap_or(defaults.max_connections),
    };
    if limits.max_connections == 0 {
        return Err(Error::Invalid { key: "server.max_connections", reason: "must be at least 1".into() });
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
        let set = resolve("[server]\nheader_read_timeout = \"2s\"\nbody_read_timeout = \"500ms\"\nmax_connections = 3")
            .unwrap();
        assert_eq!(set.header_read_timeout, Duration::from_secs(2));
        assert_eq!(set.body_read_timeout, Duration::from_millis(500));
        assert_eq!(set.max_connections, 3);
    }

    #[test]
    fn zero_and_nonsense_are_refused_by_key() {
        for (text, key) in [
            ("[server]\nheader_read_timeout = \"0s\"", "server.header_read_timeout"),
            ("[server]\nbody_read_timeout = \"soon\"", "server.body_read_timeout"),
            ("[server]\nmax_connections = 0", "server.max_connections"),
            ("[server]\nallowed_hosts = [\"http://example.com\"]", "server.allowed_hosts"),
        ] {
            let err = resolve(text).unwrap_err();
            assert!(err.to_string().starts_with(key), "{text}: {err}");
        }
    }
}
