//! The one place that reads the wall clock (`clippy.toml` refuses `SystemTime::now`
//! anywhere else), so every timestamp the service stores, signs or compares with a
//! provider's HTTP date comes from one source. Nothing fakes it: tests that need time to
//! pass wait for real. Elapsed time and deadlines use the monotonic `Instant` instead.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// The wall clock, for APIs that take a `SystemTime` (HTTP dates, RFC 3339).
#[allow(clippy::disallowed_methods)] // this is the one sanctioned read
pub fn now() -> SystemTime {
    SystemTime::now()
}

/// Milliseconds since the Unix epoch. A clock before 1970 reads as 0 rather than panicking.
pub fn now_ms() -> u64 {
    now().duration_since(UNIX_EPOCH).map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// Whole seconds since the Unix epoch (webhook signatures, provider `created_at` fields).
pub fn now_secs() -> u64 {
    now_ms() / 1000
}

/// RFC 3339 with milliseconds, UTC: how timestamps appear in JSON.
pub fn format_ms(ms: u64) -> String {
    humantime::format_rfc3339_millis(UNIX_EPOCH + Duration::from_millis(ms)).to_string()
}
