//! The long-lived background tasks (schedulers, outbox delivery, the HTTP server, the
//! systemd watchdog, provider file cleanup) run under one task tracker and one
//! cancellation token. A task that panics or ends with an error is a failure of the whole
//! process: nothing would redo its work, so limping on would only hide it. The failure is
//! logged with its whole cause, `/healthz` turns unhealthy, and `failed()` resolves so the
//! command shuts down what is left and exits non-zero for the service manager to restart.

use std::error::Error as StdError;
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use futures_util::FutureExt;
use tokio::task::{AbortHandle, JoinHandle};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// One task that failed, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TaskFailure {
    pub task: String,
    pub cause: String,
}

/// The failures so far, shared with whoever reports health. Empty while healthy.
#[derive(Debug, Clone, Default)]
pub struct Failures(Arc<Mutex<Vec<TaskFailure>>>);

impl Failures {
    pub fn all(&self) -> Vec<TaskFailure> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner).clone()
    }

    fn push(&self, failure: TaskFailure) {
        self.0.lock().unwrap_or_else(PoisonError::into_inner).push(failure);
    }
}

#[derive(Debug, Clone)]
pub(crate) struct Supervisor {
    tracker: TaskTracker,
    shutdown: CancellationToken,
    failed: CancellationToken,
    failures: Failures,
    /// Aborted when the tasks overrun the shutdown deadline.
    aborts: Arc<Mutex<Vec<AbortHandle>>>,
}

impl Default for Supervisor {
    fn default() -> Self {
        Self::new()
    }
}

impl Supervisor {
    pub(crate) fn new() -> Self {
        Self {
            tracker: TaskTracker::new(),
            shutdown: CancellationToken::new(),
            failed: CancellationToken::new(),
            failures: Failures::default(),
            aborts: Arc::new(Mutex::new(Vec::new())),
        }
    }

    /// Cancelled when shutdown starts; a token of its own can be cancelled earlier, so one
    /// task (HTTP) can be stopped before the rest.
    pub(crate) fn token(&self) -> CancellationToken {
        self.shutdown.child_token()
    }

    pub(crate) fn failures(&self) -> Failures {
        self.failures.clone()
    }

    /// Runs `task` under supervision. Its panic or error is recorded against `name`; its
    /// `Ok` is a normal end (a task that is asked to stop returns `Ok`).
    pub(crate) fn spawn<F, E>(&self, name: impl Into<String>, task: F) -> JoinHandle<()>
    where
        F: Future<Output = Result<(), E>> + Send + 'static,
        E: StdError + Send + Sync + 'static,
    {
        let name = name.into();
        let failures = self.failures.clone();
        let failed = self.failed.clone();
        let handle = self.tracker.spawn(async move {
            // The future is owned by this task and dropped on unwind; nothing observes it
            // half-done afterwards, so asserting unwind safety is sound.
            let cause = match AssertUnwindSafe(task).catch_unwind().await {
                Ok(Ok(())) => return,
                Ok(Err(e)) => error_chain(&e),
                Err(payload) => format!("panicked: {}", panic_message(payload.as_ref())),
            };
            tracing::error!(task = %name, %cause, "a background task failed; shutting down so the service manager restarts the process");
            failures.push(TaskFailure { task: name, cause });
            failed.cancel();
        });
        let mut aborts = self.aborts.lock().unwrap_or_else(PoisonError::into_inner);
        aborts.retain(|a| !a.is_finished());
        aborts.push(handle.abort_handle());
        handle
    }

    /// Resolves once a task has failed (never, while all is well).
    pub(crate) async fn failed(&self) {
        self.failed.cancelled().await;
    }

    /// Asks every task to stop (each finishes its current step).
    pub(crate) fn shutdown(&self) {
        self.shutdown.cancel();
    }

    /// Asks every task to stop and waits for them; past `deadline` the stragglers are
    /// aborted. Returns whether all stopped by themselves.
    pub(crate) async fn stop(&self, deadline: Duration) -> bool {
        self.shutdown();
        self.tracker.close();
        if tokio::time::timeout(deadline, self.tracker.wait()).await.is_ok() {
            return true;
        }
        let aborts = std::mem::take(&mut *self.aborts.lock().unwrap_or_else(PoisonError::into_inner));
        let left = aborts.iter().filter(|a| !a.is_finished()).count();
        tracing::warn!(tasks = left, ?deadline, "background tasks did not stop in time; abandoning their current step");
        aborts.iter().for_each(AbortHandle::abort);
        self.tracker.wait().await;
        false
    }
}

/// The error and every source under it, outermost first.
pub(crate) fn error_chain(e: &(dyn StdError + 'static)) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

fn panic_message(payload: &(dyn std::any::Any + Send)) -> &str {
    payload
        .downcast_ref::<&str>()
        .copied()
        .or_else(|| payload.downcast_ref::<String>().map(String::as_str))
        .unwrap_or("(a panic without a message)")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    #[error("the step failed")]
    struct Outer(#[source] std::io::Error);

    async fn failed_within(supervisor: &Supervisor) -> bool {
        tokio::time::timeout(Duration::from_secs(5), supervisor.failed()).await.is_ok()
    }

    #[tokio::test]
    async fn a_panicking_task_is_a_failure_named_with_its_message() {
        let supervisor = Supervisor::new();
        supervisor.spawn("scheduler simulator", async {
            if true {
                panic!("the ledger is upside down");
            }
            Ok::<(), std::io::Error>(())
        });
        assert!(failed_within(&supervisor).await, "a panic must be noticed");
        let failures = supervisor.failures().all();
        assert_eq!(failures.len(), 1);
        assert_eq!(failures[0].task, "scheduler simulator");
        assert_eq!(failures[0].cause, "panicked: the ledger is upside down");
        assert!(supervisor.stop(Duration::from_secs(5)).await);
    }

    #[tokio::test]
    async fn an_error_is_a_failure_with_its_whole_chain() {
        let supervisor = Supervisor::new();
        supervisor.spawn("outbox delivery", async { Err(Outer(std::io::Error::other("disk on fire"))) });
        assert!(failed_within(&supervisor).await);
        assert_eq!(supervisor.failures().all()[0].cause, "the step failed: disk on fire");
    }

    #[tokio::test]
    async fn tasks_that_stop_when_asked_are_no_failure() {
        let supervisor = Supervisor::new();
        for name in ["http", "scheduler a"] {
            let token = supervisor.token();
            supervisor.spawn(name, async move {
                token.cancelled().await;
                Ok::<(), std::io::Error>(())
            });
        }
        assert!(supervisor.stop(Duration::from_secs(5)).await, "both stop by themselves");
        assert!(supervisor.failures().all().is_empty());
        assert!(!failed_within_a_moment(&supervisor).await);
    }

    #[tokio::test]
    async fn a_task_that_ignores_shutdown_is_aborted_at_the_deadline() {
        let supervisor = Supervisor::new();
        supervisor.spawn("stuck", async {
            std::future::pending::<()>().await;
            Ok::<(), std::io::Error>(())
        });
        assert!(!supervisor.stop(Duration::from_millis(50)).await);
        assert!(supervisor.failures().all().is_empty(), "an abort at shutdown is not a failure");
    }

    async fn failed_within_a_moment(supervisor: &Supervisor) -> bool {
        tokio::time::timeout(Duration::from_millis(50), supervisor.failed()).await.is_ok()
    }
}
