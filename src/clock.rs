//! The one place that reads the wall clock, so time can be reasoned about (and, where
//! needed, controlled) in one spot.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Milliseconds since the Unix epoch. A clock before 1970 reads as 0 rather than panicking.
pub fn now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// RFC 3339 with milliseconds, UTC: how timestamps appear in JSON.
pub fn format_ms(ms: u64) -> String {
    humantime::format_rfc3339_millis(UNIX_EPOCH + Duration::from_millis(ms)).to_string()
}
