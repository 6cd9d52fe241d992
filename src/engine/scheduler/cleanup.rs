//! Deleting a finished job's files at the provider. It runs beside the scheduler, after
//! the batch is closed, so it never blocks or delays a commit; a failure only leaves
//! files that the provider expires on its own (OpenAI: 30 days), so it is retried a few
//! times with backoff and then given up with a warning. Shutdown does not wait for it,
//! for the same reason.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use super::{Scheduler, SharedHealth};
use crate::domain::backoff::backoff_delay;
use crate::providers::{BatchProvider, JobStatus};

const ATTEMPTS: u32 = 5;
const BACKOFF_CAP: Duration = Duration::from_secs(60);

impl Scheduler {
    pub(super) fn delete_files_later(&self, job: JobStatus) {
        let provider = self.provider.clone();
        let health = self.health.clone();
        let stop = self.supervisor.token();
        let name = format!("provider file cleanup {}", provider.name());
        self.supervisor.spawn(name, async move {
            tokio::select! {
                () = stop.cancelled() => {}
                () = delete_with_retries(provider, health, job) => {}
            }
            Ok::<(), Infallible>(())
        });
    }
}

async fn delete_with_retries(provider: Arc<dyn BatchProvider>, health: SharedHealth, job: JobStatus) {
    for attempt in 0..ATTEMPTS {
        match provider.delete_files(&job).await {
            Ok(deleted) => {
                health.update(|h| h.files_deleted += deleted);
                tracing::debug!(job_id = %job.job_id, deleted, "provider files deleted");
                return;
            }
            Err(e) if attempt + 1 < ATTEMPTS => {
                let wait = e.retry_after.unwrap_or_else(|| backoff_delay(attempt + 1, BACKOFF_CAP));
                tracing::debug!(job_id = %job.job_id, error = %e, ?wait, "could not delete provider files yet");
                tokio::time::sleep(wait).await;
            }
            Err(e) => {
                tracing::warn!(job_id = %job.job_id, error = %e, "gave up deleting provider files; the provider expires them");
            }
        }
    }
}
