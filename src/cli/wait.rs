//! Waiting for extractions to settle (`submit --wait`): each is read until it is
//! committed, failed or cancelled, with a progress bar, and the reads slow down while
//! nothing changes so a long provider batch costs the server little.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use indicatif::{ProgressBar, ProgressStyle};
use serde_json::Value;
use tokio::sync::Semaphore;

const FIRST_INTERVAL: Duration = Duration::from_millis(250);
const MAX_INTERVAL: Duration = Duration::from_secs(5);
/// Reads in flight at once.
const READERS: usize = 16;

/// The last record read of each extraction waited on.
pub(super) struct Settled {
    records: BTreeMap<String, Value>,
    finished: bool,
}

impl Settled {
    pub(super) fn record(&self, id: &str) -> Option<&Value> {
        self.records.get(id)
    }

    /// Whether every extraction settled (false: the wait timed out).
    pub(super) fn finished(&self) -> bool {
        self.finished
    }

    /// The extractions that ended failed or cancelled.
    pub(super) fn failed(&self) -> impl Iterator<Item = &Value> {
        self.records.values().filter(|r| matches!(r["state"].as_str(), Some("failed" | "cancelled")))
    }

    pub(super) fn summary(&self) -> String {
        let count = |state: &str| self.records.values().filter(|r| r["state"] == state).count();
        let waiting = self.records.len() - count("committed") - count("failed") - count("cancelled");
        let mut text = format!(
            "settled: {} committed, {} failed, {} cancelled",
            count("committed"),
            count("failed"),
            count("cancelled")
        );
        if !self.finished {
            text.push_str(&format!(", {waiting} still waiting (gave up)"));
        }
        text
    }
}

fn settled(record: &Value) -> bool {
    matches!(record["state"].as_str(), Some("committed" | "failed" | "cancelled"))
}

pub(super) async fn until_settled(
    client: &reqwest::Client,
    base: &str,
    ids: &[String],
    timeout: Option<Duration>,
) -> anyhow::Result<Settled> {
    let deadline = timeout.map(|t| tokio::time::Instant::now() + t);
    let bar = ProgressBar::new(ids.len() as u64);
    bar.set_style(
        ProgressStyle::with_template("{bar:40} {pos}/{len} settled {msg}")
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    let mut records: BTreeMap<String, Value> = BTreeMap::new();
    let mut interval = FIRST_INTERVAL;
    loop {
        let open: Vec<String> = ids.iter().filter(|id| records.get(*id).is_none_or(|r| !settled(r))).cloned().collect();
        if open.is_empty() {
            bar.finish_and_clear();
            return Ok(Settled { records, finished: true });
        }
        let before = records.values().filter(|r| settled(r)).count();
        for (id, record) in read_all(client, base, open).await? {
            records.insert(id, record);
        }
        let now_settled = records.values().filter(|r| settled(r)).count();
        bar.set_position(now_settled as u64);
        let failed = records.values().filter(|r| r["state"] == "failed").count();
        bar.set_message(if failed > 0 { format!("({failed} failed)") } else { String::new() });
        if now_settled == ids.len() {
            continue;
        }
        interval = if now_settled > before { FIRST_INTERVAL } else { (interval * 2).min(MAX_INTERVAL) };
        let wake = tokio::time::Instant::now() + interval;
        if deadline.is_some_and(|d| d <= wake) {
            bar.finish_and_clear();
            return Ok(Settled { records, finished: false });
        }
        tokio::time::sleep_until(wake).await;
    }
}

/// The current record of each id, read concurrently.
async fn read_all(client: &reqwest::Client, base: &str, ids: Vec<String>) -> anyhow::Result<Vec<(String, Value)>> {
    let gate = Arc::new(Semaphore::new(READERS));
    let mut tasks = tokio::task::JoinSet::new();
    for id in ids {
        let (client, gate) = (client.clone(), Arc::clone(&gate));
        let url = format!("{base}/v1/extractions/{id}");
        tasks.spawn(async move {
            let _permit = gate.acquire_owned().await;
            let response = client.get(&url).send().await.with_context(|| format!("cannot reach {url}"))?;
            let status = response.status();
            let body: Value = response.json().await.context("the server sent a non-JSON answer")?;
            anyhow::ensure!(
                status.is_success(),
                "{url}: {status}: {}",
                body["error"]["message"].as_str().unwrap_or("no message")
            );
            Ok((id, body))
        });
    }
    let mut out = Vec::new();
    while let Some(joined) = tasks.join_next().await {
        out.push(joined??);
    }
    Ok(out)
}
