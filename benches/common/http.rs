//! One keep-alive HTTP/1.1 connection to the server under test, for benches that send
//! JSON requests back to back.

use std::net::SocketAddr;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::client::conn::http1;
use hyper::header::{CONTENT_TYPE, HOST};
use hyper_util::rt::TokioIo;

use super::Result;

#[derive(Debug)]
pub struct Connection {
    host: String,
    sender: http1::SendRequest<Full<Bytes>>,
    driver: tokio::task::JoinHandle<()>,
}

impl Connection {
    pub async fn open(addr: SocketAddr) -> Result<Self> {
        let stream = tokio::net::TcpStream::connect(addr).await?;
        stream.set_nodelay(true)?;
        let (sender, connection) = http1::handshake(TokioIo::new(stream)).await?;
        let driver = tokio::spawn(async move {
            let _ = connection.await;
        });
        Ok(Self { host: addr.to_string(), sender, driver })
    }

    /// POSTs `body` as JSON; the status and the whole answer.
    pub async fn post(&mut self, path: &str, body: Bytes) -> Result<(u16, Bytes)> {
        self.sender.ready().await?;
        let request = hyper::Request::post(path)
            .header(HOST, &self.host)
            .header(CONTENT_TYPE, "application/json")
            .body(Full::new(body))?;
        let response = self.sender.send_request(request).await?;
        let status = response.status().as_u16();
        Ok((status, response.into_body().collect().await?.to_bytes()))
    }

    /// Closes the connection, so a graceful shutdown has nothing to wait for.
    pub async fn close(self) {
        drop(self.sender);
        let _ = tokio::time::timeout(std::time::Duration::from_secs(5), self.driver).await;
    }
}
