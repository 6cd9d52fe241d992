//! When each round's SIGKILL lands. Most rounds kill at a uniformly random moment; some aim
//! at the provider path, a few milliseconds after the simulator created a batch (the window
//! between the create and the job id's commit) or served a result file (mid-ingestion).

use std::time::{Duration, Instant};

use commitpoint::simulator::{Simulator, Stats};
use rand::Rng;
use rand::rngs::StdRng;

/// How long a server lives when the kill is not aimed.
const LIFETIME_MS: std::ops::Range<u64> = 100..1500;
/// An aimed kill whose event does not come within this falls back to a plain kill.
const AIM_LIMIT: Duration = Duration::from_secs(3);

#[derive(Debug, Clone, Copy)]
pub enum KillAt {
    After(Duration),
    /// `jitter` after the next batch creation the simulator sees.
    AfterBatchCreated(Duration),
    /// `jitter` after the next result-file download.
    AfterDownload(Duration),
}

impl KillAt {
    pub fn draw(rng: &mut StdRng) -> KillAt {
        let jitter = Duration::from_millis(rng.random_range(0..40));
        match rng.random_range(0..100) {
            0..65 => KillAt::After(Duration::from_millis(rng.random_range(LIFETIME_MS))),
            65..85 => KillAt::AfterBatchCreated(jitter),
            _ => KillAt::AfterDownload(jitter),
        }
    }

    /// Blocks until the moment to kill; returns a description of it for the round log.
    pub fn wait(self, sim: &Simulator) -> String {
        let (jitter, counter): (Duration, fn(&Stats) -> u64) = match self {
            KillAt::After(lifetime) => {
                std::thread::sleep(lifetime);
                return format!("after {lifetime:?}");
            }
            KillAt::AfterBatchCreated(jitter) => (jitter, |s| s.batches_created),
            KillAt::AfterDownload(jitter) => (jitter, |s| s.content_downloads),
        };
        let what = if matches!(self, KillAt::AfterBatchCreated(_)) { "batch create" } else { "file download" };
        let started = Instant::now();
        let before = counter(&sim.stats());
        while counter(&sim.stats()) == before {
            if started.elapsed() >= AIM_LIMIT {
                return format!("after {AIM_LIMIT:?} (no {what} came)");
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        std::thread::sleep(jitter);
        format!("{jitter:?} after a {what} ({:?} in)", started.elapsed())
    }
}
