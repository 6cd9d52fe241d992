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
/// A client that takes no data of an answer for this long loses the answer (and its
/// connection), so a reader that stops reading frees what the answer holds.
pub(crate) const DEFAULT_STREAM_STALL_TIMEOUT: Duration = crate::service::DEFAULT_STALL_TIMEOUT;
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
    /// How long a response may wait for the client to take more of it: an export's next
    /// chunk, or any answer's next write to the connection.
    pub stream_stall_timeout: Duration,
    /// Exports running at once on this server, and per tenant.
    pub max_exports: usize,
    pub max_exports_per_tenant: usize,
    /// The most a listing page's records may weigh.
    pub max_page_bytes: usize,
}

impl Default for ServerLimits {
    fn default() -> Self {
        Self {
            header_read_timeout: DEFAULT_HEADER_READ_TIMEOUT,
            body_read_timeout: DEFAULT_BODY_READ_TIMEOUT,
            max_connections: DEFAULT_MAX_CONNECTIONS,
            stream_stall_timeout: DEFAULT_STREAM_STALL_TIMEOUT,
            max_exports: crate::service::DEFAULT_MAX_EXPORTS,
            max_exports_per_tenant: crate::service::DEFAULT_MAX_EXPORTS_PER_TENANT,
            max_page_bytes: crate::service::DEFAULT_MAX_PAGE_BYTES,
        }
    }
}

impl ServerLimits {
    pub(crate) fn describe(&self) -> String {
        format!(
            "header_read_timeout = \"{}\"\nbody_read_timeout = \"{}\"\nmax_connections = {}\n\
             stream_stall_timeout = \"{}\"\nmax_exports = {}\nmax_exports_per_tenant = {}\nmax_page_bytes = {}",
            humantime::format_duration(self.header_read_timeout),
            humantime::format_duration(self.body_read_timeout),
            self.max_connections,
            humantime::format_duration(self.stream_stall_timeout),
            self.max_exports,
            self.max_exports_per_tenant,
            self.max_page_bytes
        )
    }

    /// What the service enforces of these: the export caps and their stall deadline.
    pub(crate) fn exports(&self) -> crate::service::ExportLimits {
        crate::service::ExportLimits {
            max_exports: self.max_exports,
            max_per_tenant: self.max_exports_per_tenant,
            stall_timeout: self.stream_stall_timeout,
        }
    }
}
