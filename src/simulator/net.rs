//! The listener, with one extra power: a handler can cut its own connection so the client
//! gets no answer at all (the `drop_after_create_next` fault). Each accepted socket carries
//! a kill switch, handed to handlers as `ConnectInfo<ConnHandle>`; once it is thrown, every
//! read and write on that socket fails, hyper abandons the connection and the socket closes
//! before a single response byte is written.

use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::extract::connect_info::Connected;
use axum::serve::{IncomingStream, Listener};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};

#[derive(Debug)]
pub(super) struct SimListener {
    inner: TcpListener,
}

impl SimListener {
    pub(super) fn new(inner: TcpListener) -> Self {
        Self { inner }
    }
}

#[derive(Clone, Debug)]
pub(super) struct ConnHandle {
    pub remote: SocketAddr,
    kill: Arc<AtomicBool>,
}

impl ConnHandle {
    fn new(remote: SocketAddr) -> Self {
        Self { remote, kill: Arc::new(AtomicBool::new(false)) }
    }

    /// Makes the connection die instead of carrying the response being prepared.
    pub(super) fn kill(&self) {
        self.kill.store(true, Ordering::SeqCst);
    }
}

#[derive(Debug)]
pub(super) struct KillableStream {
    stream: TcpStream,
    kill: Arc<AtomicBool>,
}

impl KillableStream {
    fn killed(&self) -> Option<io::Error> {
        self.kill
            .load(Ordering::SeqCst)
            .then(|| io::Error::new(io::ErrorKind::ConnectionAborted, "SIMULATED fault: connection dropped"))
    }
}

impl AsyncRead for KillableStream {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if let Some(error) = this.killed() {
            return Poll::Ready(Err(error));
        }
        Pin::new(&mut this.stream).poll_read(cx, buf)
    }
}

impl AsyncWrite for KillableStream {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        if let Some(error) = this.killed() {
            return Poll::Ready(Err(error));
        }
        Pin::new(&mut this.stream).poll_write(cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if let Some(error) = this.killed() {
            return Poll::Ready(Err(error));
        }
        Pin::new(&mut this.stream).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_shutdown(cx)
    }
}

impl Listener for SimListener {
    type Io = KillableStream;
    type Addr = ConnHandle;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        loop {
            match self.inner.accept().await {
                Ok((stream, remote)) => {
                    // Small JSON answers: never let Nagle delay them.
                    if let Err(e) = stream.set_nodelay(true) {
                        tracing::debug!(error = %e, "simulator: cannot set TCP_NODELAY");
                    }
                    let handle = ConnHandle::new(remote);
                    let io = KillableStream { stream, kill: Arc::clone(&handle.kill) };
                    return (io, handle);
                }
                Err(e) => {
                    // Usually EMFILE: back off instead of spinning on the error.
                    tracing::warn!(error = %e, "simulator: accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            }
        }
    }

    fn local_addr(&self) -> io::Result<Self::Addr> {
        self.inner.local_addr().map(ConnHandle::new)
    }
}

impl Connected<IncomingStream<'_, SimListener>> for ConnHandle {
    fn connect_info(stream: IncomingStream<'_, SimListener>) -> Self {
        stream.remote_addr().clone()
    }
}
