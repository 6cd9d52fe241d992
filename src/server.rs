//! Starting and stopping the service: bind first, open the store, then serve; on stop,
//! drain HTTP, then let the writer commit its last batch and close the file.

use std::net::SocketAddr;
use std::path::PathBuf;

use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

use crate::config::ServeOptions;
use crate::schema::{self, Registry};
use crate::service::Service;
use crate::store::{self, Store, WriterGuard};

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("cannot listen on {addr}: is another process using it?")]
    Bind {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
    #[error(transparent)]
    Schema(#[from] schema::Error),
    #[error(transparent)]
    Store(#[from] store::Error),
    #[error("the HTTP server failed")]
    Serve(#[source] std::io::Error),
    #[error("startup task failed: {0}")]
    Task(String),
}

impl Error {
    /// Configuration mistakes an operator must fix; restarting will not help.
    pub fn is_config(&self) -> bool {
        matches!(self, Error::Bind { .. } | Error::Schema(_))
    }
}

#[derive(Debug)]
pub struct Server {
    addr: SocketAddr,
    data_dir: PathBuf,
    stop: Option<oneshot::Sender<()>>,
    task: JoinHandle<std::io::Result<()>>,
    writer: WriterGuard,
}

impl Server {
    pub async fn start(options: &ServeOptions) -> Result<Server, Error> {
        let listener =
            TcpListener::bind(options.listen).await.map_err(|source| Error::Bind { addr: options.listen, source })?;
        let addr = listener.local_addr().map_err(Error::Serve)?;
        let schema_dir = options.schema_dir.clone();
        let registry = tokio::task::spawn_blocking(move || Registry::load(schema_dir.as_deref()))
            .await
            .map_err(|e| Error::Task(e.to_string()))??;
        let data_dir = options.data_dir.clone();
        let (store, writer) = tokio::task::spawn_blocking(move || Store::open(&data_dir))
            .await
            .map_err(|e| Error::Task(e.to_string()))??;
        let router = crate::http::router(Service::new(store, registry), options.max_body_bytes);
        let (stop, stopped) = oneshot::channel::<()>();
        // Responses are small and latency-bound: never let Nagle hold an acknowledgement back.
        let listener = axum::serve::ListenerExt::tap_io(listener, |stream: &mut tokio::net::TcpStream| {
            if let Err(e) = stream.set_nodelay(true) {
                tracing::debug!(error = %e, "cannot set TCP_NODELAY");
            }
        });
        let task = tokio::spawn(async move {
            axum::serve(listener, router)
                .with_graceful_shutdown(async move {
                    let _ = stopped.await;
                })
                .await
        });
        tracing::info!(%addr, data_dir = %options.data_dir.display(), "commitpoint is serving");
        Ok(Server { addr, data_dir: options.data_dir.clone(), stop: Some(stop), task, writer })
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    pub fn database_path(&self) -> PathBuf {
        self.data_dir.join(store::FILE_NAME)
    }

    /// Stops accepting, waits for in-flight requests, then closes the store.
    pub async fn stop(mut self) -> Result<(), Error> {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        let served = self.task.await.map_err(|e| Error::Task(e.to_string()))?;
        let writer = self.writer;
        tokio::task::spawn_blocking(move || writer.join()).await.map_err(|e| Error::Task(e.to_string()))?;
        served.map_err(Error::Serve)
    }
}
