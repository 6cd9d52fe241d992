//! Raw TCP clients for what an HTTP library will not do: stall, trickle, or send a head
//! and hold the body back. Every read has a deadline.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::time::{Duration, Instant};

use crate::util::Server;

/// `host:port` of a server.
pub fn addr(server: &Server) -> String {
    server.url.trim_start_matches("http://").to_string()
}

/// Writes a `config.toml` into `dir` and returns its path as a string.
pub fn config(dir: &Path, text: &str) -> String {
    let path = dir.join("config.toml");
    std::fs::write(&path, text).expect("write config");
    path.display().to_string()
}

/// Reads until the peer closes or `limit` passes. Returns what arrived and, if the peer
/// closed, after how long.
pub fn read_until_closed(stream: &mut TcpStream, limit: Duration) -> (String, Option<Duration>) {
    let start = Instant::now();
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        let left = limit.saturating_sub(start.elapsed());
        if left.is_zero() {
            return (String::from_utf8_lossy(&got).into_owned(), None);
        }
        stream.set_read_timeout(Some(left.min(Duration::from_millis(200)))).expect("set read timeout");
        match stream.read(&mut buf) {
            Ok(0) => return (String::from_utf8_lossy(&got).into_owned(), Some(start.elapsed())),
            Ok(n) => got.extend_from_slice(&buf[..n]),
            Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {}
            // A reset is a close too.
            Err(_) => return (String::from_utf8_lossy(&got).into_owned(), Some(start.elapsed())),
        }
    }
}

/// Reads until a whole response head has arrived (or `limit` passes); returns it.
pub fn read_head(stream: &mut TcpStream, limit: Duration) -> String {
    let start = Instant::now();
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    while !got.windows(4).any(|w| w == b"\r\n\r\n") && start.elapsed() < limit {
        stream.set_read_timeout(Some(Duration::from_millis(100))).expect("set read timeout");
        match stream.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => got.extend_from_slice(&buf[..n]),
            Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {}
            Err(_) => break,
        }
    }
    String::from_utf8_lossy(&got).into_owned()
}

/// One request with `connection: close`; returns the whole answer (head and body).
pub fn exchange(addr: &str, request: &[u8]) -> String {
    let mut stream = TcpStream::connect(addr).expect("connect");
    stream.write_all(request).expect("send request");
    let (answer, closed) = read_until_closed(&mut stream, Duration::from_secs(10));
    assert!(closed.is_some(), "no end to the answer within 10 s: {answer:?}");
    answer
}

/// The status code of a raw answer, 0 if there is none.
pub fn status(answer: &str) -> u16 {
    answer.split(' ').nth(1).and_then(|s| s.parse().ok()).unwrap_or(0)
}

/// A `GET` with `connection: close` and an optional bearer token.
pub fn get(path: &str, token: Option<&str>) -> Vec<u8> {
    let auth = token.map(|t| format!("authorization: Bearer {t}\r\n")).unwrap_or_default();
    format!("GET {path} HTTP/1.1\r\nhost: localhost\r\n{auth}connection: close\r\n\r\n").into_bytes()
}
