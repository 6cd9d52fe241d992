//! The accept loop: hyper's HTTP/1 server with a timer (so the header-read timeout, which
//! also bounds idle keep-alive, applies), a deadline on writes the client does not take
//! (`stall.rs`), a cap on concurrent connections, and a small reserve past the cap that
//! answers `/healthz` and refuses everything else with 503.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;
use tokio::task::JoinSet;

use super::Front;
use super::limits::{HEALTH_RESERVE, ServerLimits};
use super::stall::WriteDeadline;

/// After an accept error that is not about one connection (out of file descriptors, say),
/// pause so the loop does not spin while the cause persists.
const ACCEPT_ERROR_PAUSE: Duration = Duration::from_millis(100);

/// The two ends of the connection a request came on: the client's address (what failed
/// logins are counted by) and the address it reached (a `Host` naming it is no rebinding).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Peer {
    pub remote: SocketAddr,
    pub local: SocketAddr,
}

/// Serves `app` until `stop` resolves, then lets open requests finish (idle connections
/// close at once). Dropping the returned future cuts every connection: they live in a
/// `JoinSet` it owns.
pub(crate) async fn serve(
    listener: TcpListener,
    app: Front,
    limits: ServerLimits,
    stop: impl Future<Output = ()>,
) -> std::io::Result<()> {
    let regular = Arc::new(Semaphore::new(limits.max_connections));
    let reserve = Arc::new(Semaphore::new(HEALTH_RESERVE));
    let health_only = app.clone().health_only();
    let mut builder = http1::Builder::new();
    builder.timer(TokioTimer::new()).header_read_timeout(limits.header_read_timeout);
    // A reserve connection serves one request and closes, so it is soon free again.
    let mut reserve_builder = builder.clone();
    reserve_builder.keep_alive(false);
    let graceful = GracefulShutdown::new();
    let mut connections = JoinSet::new();
    tokio::pin!(stop);
    loop {
        let (stream, remote) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, remote)) => (stream, remote),
                Err(e) => {
                    accept_failed(&e).await;
                    continue;
                }
            },
            () = &mut stop => break,
        };
        // Reap finished connections so the set holds only live ones.
        while connections.try_join_next().is_some() {}
        // Responses are small and latency-bound: never let Nagle hold an acknowledgement back.
        if let Err(e) = stream.set_nodelay(true) {
            tracing::debug!(error = %e, "cannot set TCP_NODELAY");
        }
        let peer = Peer { remote, local: stream.local_addr().unwrap_or(remote) };
        if let Ok(permit) = Arc::clone(&regular).try_acquire_owned() {
            let conn =
                builder.serve_connection(io(stream, &limits), TowerToHyperService::new(app.for_connection(peer)));
            let conn = graceful.watch(conn);
            connections.spawn(async move {
                let _ = conn.await;
                drop(permit);
            });
        } else if let Ok(permit) = Arc::clone(&reserve).try_acquire_owned() {
            tracing::debug!(
                max_connections = limits.max_connections,
                "connection cap reached; answering /healthz only"
            );
            let conn = reserve_builder
                .serve_connection(io(stream, &limits), TowerToHyperService::new(health_only.for_connection(peer)));
            let conn = graceful.watch(conn);
            connections.spawn(async move {
                let _ = conn.await;
                drop(permit);
            });
        } else {
            // Closing at once costs nothing; answering would need a connection we do not have.
            drop(stream);
        }
    }
    drop(listener);
    graceful.shutdown().await;
    Ok(())
}

fn io(stream: TcpStream, limits: &ServerLimits) -> TokioIo<WriteDeadline<TcpStream>> {
    TokioIo::new(WriteDeadline::new(stream, limits.stream_stall_timeout))
}

async fn accept_failed(e: &std::io::Error) {
    use std::io::ErrorKind::{ConnectionAborted, ConnectionRefused, ConnectionReset};
    if matches!(e.kind(), ConnectionAborted | ConnectionRefused | ConnectionReset) {
        return;
    }
    tracing::warn!(error = %e, "accept failed");
    tokio::time::sleep(ACCEPT_ERROR_PAUSE).await;
}
