//! Filling a fresh data directory with N pending extractions before a server starts on it:
//! straight through the library's `Store::intake` with many intakes in flight, so group
//! commit shares each fsync among hundreds of them (the fastest real way to build a large
//! store; the HTTP layer's checks are not what the benches measure).

use commitpoint::store::seam::Extractions;
use std::path::Path;
use std::time::{Duration, Instant};

use commitpoint::domain::identity::{ExtractionId, SourceHash};
use commitpoint::store::{NewExtraction, Store};
use futures_util::StreamExt;

use super::Result;

const IN_FLIGHT: usize = 256;
const CACHE_BYTES: usize = 64 << 20;
const FILLER: &str = "The change moves the retry loop out of the handler and into the queue consumer; \
the reviewer asks whether the lease is still renewed when a batch is split, notes a missing test \
for the empty-batch path, and flags an unchecked index in the parser. ";

/// `content_bytes` of text that starts with `head` and is unique to it.
pub fn content(head: &str, content_bytes: usize) -> String {
    let mut content = format!("{head}. ");
    while content.len() < content_bytes {
        let take = (content_bytes - content.len()).min(FILLER.len());
        content.push_str(&FILLER[..take]);
    }
    content
}

/// Intakes `n` pending extractions of `schema` (source ids `{prefix}/{i}`, 100 tenants
/// `t0`…`t99`) into the store in `data_dir`, then closes it; how long that took.
pub async fn fill(data_dir: &Path, n: u64, schema: &str, prefix: &str, content_bytes: usize) -> Result<Duration> {
    let started = Instant::now();
    let (store, guard) = Store::open(data_dir, CACHE_BYTES)?;
    let intakes = futures_util::stream::iter(0..n).map(|i| {
        let store = store.clone();
        let tenant = format!("t{}", i % 100);
        let source_id = format!("{prefix}/{i}");
        let content = content(&source_id, content_bytes);
        let source_hash = SourceHash::compute(content.as_bytes(), schema);
        let id = ExtractionId::compute(&tenant, &source_id, &source_hash, schema);
        let new =
            NewExtraction { id, tenant, source_id, source_hash, schema: schema.into(), metadata_json: None, content };
        async move { store.intake(new).await.map(|_| ()) }
    });
    let failed = intakes.buffer_unordered(IN_FLIGHT).filter(|r| std::future::ready(r.is_err())).count().await;
    drop(store);
    tokio::task::spawn_blocking(move || guard.join()).await?;
    if failed > 0 {
        return Err(format!("preload: {failed} of {n} intakes failed").into());
    }
    Ok(started.elapsed())
}
