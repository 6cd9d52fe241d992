//! The systemd service protocol: READY once the port is bound and the store is open,
//! STOPPING when shutdown starts, and WATCHDOG pings while the store's writer answers.
//! Outside systemd (no `NOTIFY_SOCKET`) every call is a no-op.

use std::time::Duration;

use crate::engine::supervisor::Supervisor;
use crate::store::SharedStore;
use sd_notify::NotifyState;

pub(crate) fn ready(status: &str) {
    send(&[NotifyState::Ready, NotifyState::Status(status)]);
}

pub(crate) fn stopping() {
    send(&[NotifyState::Stopping, NotifyState::Status("draining requests and closing the store")]);
}

fn send(states: &[NotifyState<'_>]) {
    if let Err(e) = sd_notify::notify(states) {
        tracing::warn!(error = %e, "cannot notify systemd");
    }
}

/// Pings the watchdog at half its interval, but only while the writer thread still
/// answers: a wedged writer means no pings, and systemd restarts the service. It ends
/// when shutdown starts (systemd has been told STOPPING by then).
pub(crate) fn spawn_watchdog(store: SharedStore, supervisor: &Supervisor) {
    let Some(interval) = sd_notify::watchdog_enabled() else { return };
    let period = (interval / 2).max(Duration::from_millis(100));
    let stop = supervisor.token();
    supervisor.spawn("systemd watchdog", async move {
        tokio::select! {
            () = stop.cancelled() => {}
            () = ping(&store, period) => {}
        }
        Ok::<(), std::convert::Infallible>(())
    });
}

async fn ping(store: &SharedStore, period: Duration) {
    loop {
        tokio::time::sleep(period).await;
        match tokio::time::timeout(period, store.ping_writer()).await {
            Ok(Ok(())) => send(&[NotifyState::Watchdog]),
            Ok(Err(e)) => tracing::error!(error = %e, "the store writer refused a ping; withholding the watchdog"),
            Err(_) => tracing::error!(?period, "the store writer did not answer; withholding the watchdog"),
        }
    }
}
