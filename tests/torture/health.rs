//! The provider counters of each server process (`/healthz`), sampled in the background:
//! they reset with every restart, so the last sample of each process is added up. The sums
//! are lower bounds (up to one sampling interval is missed before each kill); they show
//! that the crash windows were actually hit (batches recovered by key, members requeued).

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use reqwest::Method;
use serde_json::Value;

use crate::workload::World;

pub const COUNTERS: &[&str] = &[
    "batches_submitted",
    "batches_recovered",
    "batches_closed",
    "members_requeued",
    "malformed_lines",
    "rate_limited",
];
const INTERVAL: Duration = Duration::from_millis(50);

#[derive(Debug, Default)]
pub struct Sampler {
    /// (server URL, its provider health): the URL tells the processes apart.
    latest: Mutex<Option<(String, Value)>>,
    totals: Mutex<BTreeMap<&'static str, u64>>,
}

impl Sampler {
    /// Samples until the worker is told to stop.
    pub async fn run(self: Arc<Self>, world: Arc<World>) {
        while !world.stop_worker.load(Ordering::SeqCst) {
            if let Some(api) = world.endpoint.current()
                && let Ok(reply) = api.try_send(Method::GET, "/healthz", None).await
                && reply.status == 200
            {
                let sample = (api.base().to_string(), reply.body["providers"][0].clone());
                *self.latest.lock().unwrap_or_else(|e| e.into_inner()) = Some(sample);
            }
            tokio::time::sleep(INTERVAL).await;
        }
    }

    /// The process at `url` is gone: add its last sample to the totals.
    pub fn process_ended(&self, url: &str) {
        let mut latest = self.latest.lock().unwrap_or_else(|e| e.into_inner());
        let Some((_, last)) = latest.take_if(|(sampled, _)| sampled == url) else { return };
        drop(latest);
        let mut totals = self.totals.lock().unwrap_or_else(|e| e.into_inner());
        for name in COUNTERS {
            *totals.entry(name).or_default() += last[*name].as_u64().unwrap_or(0);
        }
    }

    pub fn totals(&self) -> BTreeMap<&'static str, u64> {
        self.totals.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
}
