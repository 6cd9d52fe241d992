//! Throughput over the last hour, for the console's chart: the server samples the
//! committed and failed counts (seven numbers from the state index) and keeps the
//! per-minute increase in memory. A restart starts a fresh hour; nothing is stored.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::{Error, Service};
use crate::domain::lifecycle::StateName;

/// Minutes kept.
pub const THROUGHPUT_MINUTES: usize = 60;
const SAMPLE_EVERY: Duration = Duration::from_secs(5);

/// Extractions that reached committed and failed within one UTC minute.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct MinuteCount {
    /// Unix minute (ms / 60,000).
    pub minute: u64,
    pub committed: u64,
    pub failed: u64,
}

#[derive(Debug, Default)]
struct Ring {
    /// The totals at the last sample, to take differences from.
    last: Option<(u64, u64)>,
    minutes: VecDeque<MinuteCount>,
}

#[derive(Debug, Clone, Default)]
pub(super) struct Throughput(Arc<Mutex<Ring>>);

impl Throughput {
    fn record(&self, now_ms: u64, committed: u64, failed: u64) {
        let mut ring = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        let minute = now_ms / 60_000;
        // A retry moves a failed extraction back to pending, so totals can fall: count
        // only increases.
        let (dc, df) = match ring.last {
            Some((c, f)) => (committed.saturating_sub(c), failed.saturating_sub(f)),
            None => (0, 0),
        };
        ring.last = Some((committed, failed));
        match ring.minutes.back_mut() {
            Some(m) if m.minute == minute => {
                m.committed += dc;
                m.failed += df;
            }
            _ => ring.minutes.push_back(MinuteCount { minute, committed: dc, failed: df }),
        }
        while ring.minutes.front().is_some_and(|m| m.minute + THROUGHPUT_MINUTES as u64 <= minute) {
            ring.minutes.pop_front();
        }
    }

    /// The last hour, one entry per minute (oldest first), zeros where nothing was seen.
    fn hour(&self, now_ms: u64) -> Vec<MinuteCount> {
        let ring = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        let now = now_ms / 60_000;
        let first = now + 1 - THROUGHPUT_MINUTES as u64;
        (first..=now)
            .map(|minute| {
                ring.minutes
                    .iter()
                    .find(|m| m.minute == minute)
                    .copied()
                    .unwrap_or(MinuteCount { minute, ..MinuteCount::default() })
            })
            .collect()
    }
}

impl Service {
    /// Committed and failed extractions per minute over the last hour.
    pub fn throughput(&self) -> Vec<MinuteCount> {
        self.throughput.hour(crate::domain::clock::now_ms())
    }

    /// Samples the state counts every few seconds until `stop`; run it under the
    /// supervisor. A failed read is skipped (the next sample catches up).
    pub async fn sample_throughput(self, stop: CancellationToken) -> Result<(), Error> {
        loop {
            if let Ok(counts) = self.store.counts_by_state().await {
                let of = |name| counts.iter().find(|c| c.state == name).map_or(0, |c| c.count);
                self.throughput.record(crate::domain::clock::now_ms(), of(StateName::Committed), of(StateName::Failed));
            }
            tokio::select! {
                () = stop.cancelled() => return Ok(()),
                () = tokio::time::sleep(SAMPLE_EVERY) => {}
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn minutes_hold_increases_and_roll_off() {
        let t = Throughput::default();
        let m = 60_000;
        t.record(100 * m, 10, 1);
        t.record(100 * m + 5_000, 13, 1);
        t.record(101 * m, 20, 3);
        // A retry lowers the failed total: not a negative count.
        t.record(101 * m + 1, 20, 2);
        let hour = t.hour(101 * m + 2);
        assert_eq!(hour.len(), THROUGHPUT_MINUTES);
        assert_eq!(hour[THROUGHPUT_MINUTES - 2], MinuteCount { minute: 100, committed: 3, failed: 0 });
        assert_eq!(hour[THROUGHPUT_MINUTES - 1], MinuteCount { minute: 101, committed: 7, failed: 2 });
        let later = t.hour(200 * m);
        assert!(later.iter().all(|m| m.committed == 0 && m.failed == 0), "an hour later nothing is left");
    }
}
