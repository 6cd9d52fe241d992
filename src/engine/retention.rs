//! The retention sweep: a supervised background task that walks the committed extractions
//! in small steps (one read snapshot and at most one short write transaction each) and
//! drops what `[retention]` no longer keeps. It starts over after each full pass, waiting
//! `sweep_interval` in between.

use std::convert::Infallible;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::engine::supervisor::Supervisor;
use crate::store::{RetentionPolicy, SharedStore};

/// Committed extractions looked at per step.
const SCAN_PER_STEP: usize = 512;

/// Starts the sweep, unless the configuration keeps everything.
pub(crate) fn spawn(store: SharedStore, policy: RetentionPolicy, sweep_interval: Duration, supervisor: &Supervisor) {
    if policy.keeps_everything() {
        return;
    }
    let stop = supervisor.token();
    supervisor.spawn("retention sweep", async move {
        run(store, policy, sweep_interval, stop).await;
        Ok::<(), Infallible>(())
    });
}

async fn run(store: SharedStore, policy: RetentionPolicy, interval: Duration, stop: CancellationToken) {
    tracing::info!(?policy, interval = %humantime::format_duration(interval), "retention sweep started");
    let mut after = 0;
    let (mut contents, mut raw_results) = (0u64, 0u64);
    loop {
        let pause = match store.retention_step(policy, after, SCAN_PER_STEP).await {
            Ok(step) => {
                contents += step.contents_dropped;
                raw_results += step.raw_results_dropped;
                match step.next_after {
                    Some(next) => {
                        after = next;
                        // Between steps, let intake and commits have the writer.
                        Duration::from_millis(5)
                    }
                    None => {
                        if contents + raw_results > 0 {
                            tracing::info!(contents, raw_results, "retention pass dropped expired data");
                        }
                        (after, contents, raw_results) = (0, 0, 0);
                        interval
                    }
                }
            }
            Err(e) => {
                tracing::error!(error = %format!("{e:#}"), "retention step failed; trying again later");
                interval
            }
        };
        tokio::select! {
            () = stop.cancelled() => return,
            () = tokio::time::sleep(pause) => {}
        }
    }
}
