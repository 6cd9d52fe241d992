//! Shutdown signals for long-running commands. The handlers are installed before the
//! process announces readiness, so a SIGTERM that follows the ready line at once still
//! means a clean stop; a second signal during the drain exits immediately.

use std::future::Future;

use tokio::signal::unix::{Signal, SignalKind, signal};

/// The exit status of a process that gave up draining on a second signal (128 + SIGINT).
const EXIT_SECOND_SIGNAL: i32 = 130;

#[derive(Debug)]
pub(super) struct Signals {
    terminate: Signal,
    interrupt: Signal,
    hangup: Signal,
}

impl Signals {
    pub(super) fn install() -> std::io::Result<Self> {
        Ok(Self {
            terminate: signal(SignalKind::terminate())?,
            interrupt: signal(SignalKind::interrupt())?,
            hangup: signal(SignalKind::hangup())?,
        })
    }

    /// Waits for SIGTERM or SIGINT, calling `reload` on every SIGHUP meanwhile; then arms
    /// the second-signal escape hatch.
    pub(super) async fn wait(self, reload: impl FnMut()) {
        self.wait_or(reload, std::future::pending()).await;
    }

    /// Like `wait`, but also ends when `failed` resolves (a background task failed). The
    /// escape hatch is armed either way: a signal during that drain exits at once too.
    pub(super) async fn wait_or(mut self, mut reload: impl FnMut(), failed: impl Future<Output = ()>) -> Stopped {
        tokio::pin!(failed);
        let stopped = loop {
            tokio::select! {
                _ = self.terminate.recv() => break Stopped::Signal,
                _ = self.interrupt.recv() => break Stopped::Signal,
                _ = self.hangup.recv() => reload(),
                () = &mut failed => break Stopped::TaskFailed,
            }
        };
        tokio::spawn(async move {
            tokio::select! {
                _ = self.terminate.recv() => {}
                _ = self.interrupt.recv() => {}
            }
            eprintln!("commitpoint: second signal: exiting without finishing the drain");
            std::process::exit(EXIT_SECOND_SIGNAL);
        });
        stopped
    }
}

/// Why a long-running command stops.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Stopped {
    Signal,
    TaskFailed,
}
