//! How long the server waits on a client and how many it serves at once: the defences
//! against clients that connect and stall, trickle, or leak connections.

use std::time::Duration;

use super::Error;
use super::file::{RawServer, parse_duration};

/// A client that has not sent a full request head in this long is cut off. Seconds, not
/// minutes: a real client sends its head at once.
pub const DEFAULT_HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);
/// The whole body must arrive in this long (8 MiB at loopback speed takes milliseconds).
pub const DEFAULT_BODY_READ_TIMEOUT: Duration = Duration::from_secs(30);
pub const DEFAULT_MAX_CONNECTIONS: usize = 1024;
/// Connections accepted past the cap that may still ask for `/healthz` (and get 503 for
/// anything else), so a saturated server still tells its probes why.
pub const HEALTH_RESERVE: usize = 16;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ServerLimits {
    /// From the moment a connection waits for a request (new, or kept alive after the
    /// last one) until that request's head has fully arrived. hyper runs one clock for
    /// both, so this is also how long an idle keep-alive connection is kept.
    pub header_read_timeout: Duration,
    /// From the handler's first read of the body until its last byte.
    pub body_read_timeout: Duration,
    pub max_connections: usize,
}

impl Default for ServerLimits {
    fn default() -> Self {
        Self {
            header_read_timeout: DEFAULT_HEADER_READ_TIMEOUT,
            body_read_timeout: DEFAULT_BODY_READ_TIMEOUT,
            max_connections: DEFAULT_MAX_CONNECTIONS,
        }
    }
}

impl ServerLimits {
    pub(super) fn resolve(raw: &RawServer) -> Result<Self, Error> {
        let defaults = Self::default();
        let limits = Self {
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

    pub fn describe(&self) -> String {
        format!(
            "header_read_timeout = \"{}\"\nbody_read_timeout = \"{}\"\nmax_connections = {}",
            humantime::format_duration(self.header_read_timeout),
            humantime::format_duration(self.body_read_timeout),
            self.max_connections
        )
    }
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
        ServerLimits::resolve(&raw.server)
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
        ] {
            let err = resolve(text).unwrap_err();
            assert!(err.to_string().starts_with(key), "{text}: {err}");
        }
    }
}
