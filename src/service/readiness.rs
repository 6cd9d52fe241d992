//! Whether the store answers at all: `/healthz` once said ok while every thread of the
//! blocking pool (which redb reads run on) or every PostgreSQL connection was taken, so
//! nothing could be read. The probe is a real read through that same path, with a short
//! deadline; at most one is in flight, so probes of a stuck store do not pile up reads
//! behind the ones already waiting.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use super::Service;

/// Why the store is not ready. The messages go to callers without a token: they say what
/// is wrong, and the cause stays in the server log.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Unready {
    #[error(
        "the store did not answer a read within {0:?}: the blocking pool or the database connections are all taken"
    )]
    Slow(Duration),
    #[error("the store cannot be read; see the server log")]
    Failed,
}

/// The probe in flight, shared by the clones of one service.
#[derive(Debug, Clone, Default)]
pub(super) struct Probe(Arc<AtomicBool>);

impl Service {
    /// Reads the state counts (a read on the blocking pool on redb, a pooled query on
    /// PostgreSQL) within `deadline`.
    pub async fn check_store(&self, deadline: Duration) -> Result<(), Unready> {
        let in_flight = Arc::clone(&self.probe.0);
        if in_flight.swap(true, Ordering::AcqRel) {
            // The last probe's read is still waiting: the store has not answered since.
            return Err(Unready::Slow(deadline));
        }
        let store = Arc::clone(&self.store);
        let read = tokio::spawn(async move {
            let answer = store.counts_by_state().await;
            in_flight.store(false, Ordering::Release);
            answer
        });
        match tokio::time::timeout(deadline, read).await {
            Err(_) => Err(Unready::Slow(deadline)),
            Ok(Ok(Ok(_))) => Ok(()),
            Ok(Ok(Err(e))) => {
                tracing::warn!(error = %crate::store::error_chain(&e), "the readiness probe cannot read the store");
                Err(Unready::Failed)
            }
            Ok(Err(e)) => {
                self.probe.0.store(false, Ordering::Release);
                tracing::warn!(error = %e, "the readiness probe's read did not finish");
                Err(Unready::Failed)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::schema::Registry;

    #[test]
    fn a_taken_blocking_pool_makes_the_store_unready_until_it_frees() {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .max_blocking_threads(1)
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(async {
            let dir = tempfile::tempdir().unwrap();
            let (store, _writer) = crate::store::Store::open(dir.path(), 16 << 20).unwrap();
            let service = Service::new(store, Registry::builtin());
            assert_eq!(service.check_store(Duration::from_secs(5)).await, Ok(()));

            let (release, held) = std::sync::mpsc::channel::<()>();
            let blocker = tokio::task::spawn_blocking(move || held.recv());
            let short = Duration::from_millis(200);
            assert_eq!(service.check_store(short).await, Err(Unready::Slow(short)));
            assert_eq!(service.check_store(short).await, Err(Unready::Slow(short)), "no second read queued");
            release.send(()).unwrap();
            blocker.await.unwrap().unwrap();
            let mut answer = service.check_store(short).await;
            for _ in 0..50 {
                if answer.is_ok() {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
                answer = service.check_store(short).await;
            }
            assert_eq!(answer, Ok(()), "ready again once the pool frees");
        });
    }
}
