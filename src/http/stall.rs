//! A deadline on writing to a client. hyper has none: a client that stops reading leaves
//! a response's write pending for ever, holding the connection, its slot under the
//! connection cap and whatever the answer buffers (a listing page, an export's chunks).
//! Each write that cannot proceed starts a timer, any progress resets it, and once it
//! runs out the write fails, which ends the connection and cuts the answer short.

use std::io::{self, IoSlice};
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::Sleep;

#[derive(Debug)]
pub(super) struct WriteDeadline<T> {
    inner: T,
    timeout: Duration,
    /// Running while a write waits for the client to take data.
    stalled: Option<Pin<Box<Sleep>>>,
}

impl<T> WriteDeadline<T> {
    pub(super) fn new(inner: T, timeout: Duration) -> Self {
        Self { inner, timeout, stalled: None }
    }

    /// Passes a finished write through (progress: the timer stops); a pending one waits
    /// on the timer too, and fails once it has run out.
    fn watch<R>(&mut self, cx: &mut Context<'_>, polled: Poll<io::Result<R>>) -> Poll<io::Result<R>> {
        if polled.is_ready() {
            self.stalled = None;
            return polled;
        }
        let timeout = self.timeout;
        let timer = self.stalled.get_or_insert_with(|| Box::pin(tokio::time::sleep(timeout)));
        match timer.as_mut().poll(cx) {
            Poll::Ready(()) => Poll::Ready(Err(io::Error::new(
                io::ErrorKind::TimedOut,
                format!("the client took no data for {timeout:?} (server.stream_stall_timeout)"),
            ))),
            Poll::Pending => Poll::Pending,
        }
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for WriteDeadline<T> {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_read(cx, buf)
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for WriteDeadline<T> {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let polled = Pin::new(&mut this.inner).poll_write(cx, buf);
        this.watch(cx, polled)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let polled = Pin::new(&mut this.inner).poll_write_vectored(cx, bufs);
        this.watch(cx, polled)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let polled = Pin::new(&mut this.inner).poll_flush(cx);
        this.watch(cx, polled)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let polled = Pin::new(&mut this.inner).poll_shutdown(cx);
        this.watch(cx, polled)
    }
}

#[cfg(test)]
mod tests {
    use tokio::io::AsyncWriteExt;

    use super::*;

    // Real time, briefly: the crate does not build tokio's `test-util` (a paused clock),
    // and turning it on would rebuild tokio's whole dependency graph for every test build.
    const TIMEOUT: Duration = Duration::from_millis(500);

    #[tokio::test]
    async fn a_write_the_peer_never_takes_fails_after_the_timeout_and_progress_resets_it() {
        // A pipe with room for 8 bytes that nobody reads.
        let (near, mut far) = tokio::io::duplex(8);
        let mut out = WriteDeadline::new(near, TIMEOUT);
        out.write_all(b"12345678").await.unwrap();
        let started = std::time::Instant::now();
        let err = out.write_all(b"more").await.unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::TimedOut);
        assert!(started.elapsed() >= TIMEOUT);

        // A reader that takes a byte every 100 ms keeps the writer going well past it.
        let mut out = WriteDeadline::new(out.inner, TIMEOUT);
        let reader = tokio::spawn(async move {
            let mut byte = [0u8; 1];
            for _ in 0..8 {
                tokio::time::sleep(Duration::from_millis(100)).await;
                tokio::io::AsyncReadExt::read_exact(&mut far, &mut byte).await.unwrap();
            }
            far
        });
        let started = std::time::Instant::now();
        out.write_all(b"abcdefgh").await.unwrap();
        assert!(started.elapsed() >= Duration::from_millis(700));
        drop(reader.await.unwrap());
    }
}
