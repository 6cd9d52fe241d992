//! At most one log line per interval for an event any client can trigger at will.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

#[derive(Debug)]
pub(super) struct LogLimit {
    interval_ms: u64,
    /// Milliseconds since the Unix epoch of the last line written; 0 before the first.
    last_ms: AtomicU64,
    /// Events not logged since that line.
    suppressed: AtomicU64,
}

impl LogLimit {
    pub(super) const fn new(interval: Duration) -> Self {
        Self { interval_ms: interval.as_millis() as u64, last_ms: AtomicU64::new(0), suppressed: AtomicU64::new(0) }
    }

    /// Calls `log` with the number of events skipped since the last line, if a line is due.
    pub(super) fn warn(&self, log: impl FnOnce(u64)) {
        self.record(crate::domain::clock::now_ms(), log);
    }

    fn record(&self, now_ms: u64, log: impl FnOnce(u64)) {
        let last = self.last_ms.load(Ordering::Relaxed);
        let due = last == 0 || now_ms.saturating_sub(last) >= self.interval_ms;
        // Only the caller that moves the clock forward logs; racing callers count as suppressed.
        if due && self.last_ms.compare_exchange(last, now_ms.max(1), Ordering::Relaxed, Ordering::Relaxed).is_ok() {
            log(self.suppressed.swap(0, Ordering::Relaxed));
        } else {
            self.suppressed.fetch_add(1, Ordering::Relaxed);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_line_per_interval_carrying_the_count_of_the_rest() {
        let limit = LogLimit::new(Duration::from_secs(10));
        let mut lines = Vec::new();
        for i in 0..100u64 {
            limit.record(1_000_000 + i * 100, |skipped| lines.push(skipped));
        }
        // 100 events within 10 s: only the first is logged.
        assert_eq!(lines, vec![0]);
        limit.record(1_010_000, |skipped| lines.push(skipped));
        limit.record(1_010_001, |skipped| lines.push(skipped));
        assert_eq!(lines, vec![0, 99], "the next line, 10 s on, counts the 99 skipped");
    }
}
