//! How long the server waits on a client and how many it serves at once: the defences
//! against clients that connect and stall, trickle, or leak connections. Config reads
//! them from `[server]`; the defaults live here, beside the code that enforces them.

use std::time::Duration;

/// The body limit of the token-protected API unless `server.max_body_bytes` says otherwise.
pub(crate) const DEFAULT_MAX_BODY_BYTES: usize = 8 * 1024 * 1024;
/// A client that has not sent a full request head in this long is cut off. Seconds, not
/// minutes: a real client sends its head at once.
pub(crate) const DEFAULT_HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);
/// The whole body must arrive in this long (8 MiB at loopback speed takes milliseconds).
pub(crate) const DEFAULT_BODY_READ_TIMEOUT: Duration = Duration::from_secs(30);
pub(crate) const DEFAULT_MAX_CONNECTIONS: usize = 1024;
/// Connections accepted past the cap that may still ask for `/healthz` (and get 503 for
/// anything else), so a saturated server still tells its probes why.
pub(crate) const HEALTH_RESERVE: usize = 16;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ServerLimits {
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
    pub(crate) fn describe(&self) -> String {
        format!(
            "header_read_timeout = \"{}\"\nbody_read_timeout = \"{}\"\nmax_connections = {}",
            humantime::format_duration(self.header_read_timeout),
            humantime::format_duration(self.body_read_timeout),
            self.max_connections
        )
    }
}
