//! Throughput over the last hour, for the console's chart: the server samples the
//! committed and failed counts (seven numbers from the state index) and keeps the
//! per-minute increase in memory. A restart starts a fresh hour; nothing is stored.
//! While nothing is in flight the sampler sleeps until new work arrives, and while work
//! is in flight on a store only this process writes, until something commits, so an idle
//! server does not wake for it.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::sync::Notify;
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
    /// False for minutes before this server's first sample: nothing was counted then, so
    /// their zeros are not news that nothing finished.
    pub sampled: bool,
}

#[derive(Debug, Default)]
struct Ring {
    /// The totals at the last sample, to take differences from.
    last: Option<(u64, u64)>,
    /// The minute of the first sample (the baseline).
    first_minute: Option<u64>,
    minutes: VecDeque<MinuteCount>,
}

#[derive(Debug, Clone, Default)]
pub(super) struct Throughput {
    ring: Arc<Mutex<Ring>>,
    wake: Arc<Notify>,
}

impl Throughput {
    /// Notified when new work arrives.
    pub(super) fn wake(&self) -> Arc<Notify> {
        Arc::clone(&self.wake)
    }

    /// Adds what finished since the last sample to its minute; true when anything did.
    fn record(&self, now_ms: u64, committed: u64, failed: u64) -> bool {
        let mut ring = self.ring.lock().unwrap_or_else(PoisonError::into_inner);
        let minute = now_ms / 60_000;
        // A retry moves a failed extraction back to pending, so totals can fall: count
        // only increases.
        let (dc, df) = match ring.last {
            Some((c, f)) => (committed.saturating_sub(c), failed.saturating_sub(f)),
            None => (0, 0),
        };
        ring.last = Some((committed, failed));
        ring.first_minute.get_or_insert(minute);
        match ring.minutes.back_mut() {
            Some(m) if m.minute == minute => {
                m.committed += dc;
                m.failed += df;
            }
            _ => ring.minutes.push_back(MinuteCount { minute, committed: dc, failed: df, sampled: true }),
        }
        while ring.minutes.front().is_some_and(|m| m.minute + THROUGHPUT_MINUTES as u64 <= minute) {
            ring.minutes.pop_front();
        }
        dc + df > 0
    }

    /// The last hour, one entry per minute (oldest first), zeros where nothing was seen;
    /// minutes before the first sample are marked unsampled.
    fn hour(&self, now_ms: u64) -> Vec<MinuteCount> {
        let ring = self.ring.lock().unwrap_or_else(PoisonError::into_inner);
        let now = now_ms / 60_000;
        let first = now + 1 - THROUGHPUT_MINUTES as u64;
        let sampled = |minute: u64| ring.first_minute.is_some_and(|f| minute >= f);
        (first..=now)
            .map(|minute| {
                ring.minutes.iter().find(|m| m.minute == minute).copied().unwrap_or(MinuteCount {
                    minute,
                    sampled: sampled(minute),
                    ..MinuteCount::default()
                })
            })
            .collect()
    }
}

impl Service {
    /// Work started moving without a new arrival (a worker's claim): the sampler looks.
    pub(super) fn work_in_flight(&self) {
        self.throughput.wake.notify_one();
    }

    /// Committed and failed extractions per minute over the last hour.
    pub fn throughput(&self) -> Vec<MinuteCount> {
        self.throughput.hour(crate::domain::clock::now_ms())
    }

    /// Samples the state counts every few seconds while work is in flight, and otherwise
    /// waits for new work, until `stop`; run it under the supervisor. A failed read is
    /// skipped (the next sample catches up).
    pub async fn sample_throughput(self, stop: CancellationToken) -> Result<(), Error> {
        let wake = self.throughput.wake();
        let mut commits = self.store.commits();
        loop {
            if let Some(commits) = commits.as_mut() {
                commits.borrow_and_update();
            }
            let mut in_flight = true;
            if let Ok(counts) = self.store.counts_by_state().await {
                let of = |name| counts.iter().find(|c| c.state == name).map_or(0, |c| c.count);
                let totals = (of(StateName::Committed), of(StateName::Failed));
                let moved = self.throughput.record(crate::domain::clock::now_ms(), totals.0, totals.1);
                // Pending work alone (no worker, a paused provider) finishes nothing: the
                // sampler waits for arrivals, claims or a resume instead of polling it.
                in_flight = moved
                    || [StateName::Claimed, StateName::Submitted, StateName::Ready].into_iter().any(|s| of(s) > 0);
            }
            tokio::select! {
                () = stop.cancelled() => return Ok(()),
                () = next_sample(commits.as_mut(), SAMPLE_EVERY), if in_flight => {}
                () = wake.notified(), if !in_flight => {}
            }
        }
    }
}

/// Waits for the next sample of work in flight. Where this process sees every commit,
/// counts cannot move without one, so it first waits for a commit: a server whose work
/// sits claimed or submitted without news does not wake. Elsewhere (other instances
/// commit unseen) it samples on the clock.
async fn next_sample(commits: Option<&mut tokio::sync::watch::Receiver<u64>>, every: Duration) {
    if let Some(commits) = commits
        && commits.changed().await.is_err()
    {
        // The writer is gone: nothing will ever change.
        std::future::pending::<()>().await;
    }
    tokio::time::sleep(every).await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn work_in_flight_is_sampled_after_a_commit_or_on_the_clock_where_commits_are_unseen() {
        let every = Duration::from_millis(10);
        let (committed, mut commits) = tokio::sync::watch::channel(0u64);
        let quiet = tokio::time::timeout(Duration::from_millis(300), next_sample(Some(&mut commits), every)).await;
        assert!(quiet.is_err(), "no commit, no sample, however short the interval");
        committed.send_modify(|n| *n += 1);
        let after_commit = tokio::time::timeout(Duration::from_secs(5), next_sample(Some(&mut commits), every)).await;
        assert!(after_commit.is_ok(), "a commit is sampled one interval later");
        let unseen = tokio::time::timeout(Duration::from_secs(5), next_sample(None, every)).await;
        assert!(unseen.is_ok(), "without a commit watch the clock decides");
    }

    #[test]
    fn minutes_hold_increases_and_roll_off() {
        let t = Throughput::default();
        let m = 60_000;
        assert!(!t.record(100 * m, 10, 1), "the first sample is the baseline");
        assert!(t.record(100 * m + 5_000, 13, 1));
        assert!(!t.record(100 * m + 6_000, 13, 1), "nothing finished since");
        t.record(101 * m, 20, 3);
        // A retry lowers the failed total: not a negative count.
        t.record(101 * m + 1, 20, 2);
        let hour = t.hour(101 * m + 2);
        assert_eq!(hour.len(), THROUGHPUT_MINUTES);
        assert_eq!(hour[THROUGHPUT_MINUTES - 2], MinuteCount { minute: 100, committed: 3, failed: 0, sampled: true });
        assert_eq!(hour[THROUGHPUT_MINUTES - 1], MinuteCount { minute: 101, committed: 7, failed: 2, sampled: true });
        assert!(!hour[THROUGHPUT_MINUTES - 3].sampled, "before the baseline nothing was counted");
        assert!(t.hour(130 * m).iter().any(|m| m.sampled && m.committed == 0), "an idle sampled minute is a zero");
        let later = t.hour(200 * m);
        assert!(later.iter().all(|m| m.committed == 0 && m.failed == 0), "an hour later nothing is left");
    }
}
