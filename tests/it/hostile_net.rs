//! Clients that stall or leak connections: every kind of stall is cut off within the
//! configured timeouts while others are served, and past the connection cap new clients
//! get 503 while `/healthz` still answers.

use std::io::Write;
use std::net::TcpStream;
use std::thread;
use std::time::Duration;

use crate::raw::{addr, config, exchange, get, read_head, read_until_closed, status};
use crate::util::{Server, temp_dir};

/// Short limits so the test is quick; each stall must end within the limit plus slack.
const HEADER_TIMEOUT_SECS: u64 = 1;
const BODY_TIMEOUT_SECS: u64 = 1;
const SLACK: Duration = Duration::from_secs(3);
/// Long enough that a server without timeouts is plainly caught.
const GIVE_UP: Duration = Duration::from_secs(6);

fn limit() -> Duration {
    Duration::from_secs(HEADER_TIMEOUT_SECS.max(BODY_TIMEOUT_SECS)) + SLACK
}

/// Writes `bytes` one at a time, `every` apart, until the peer stops taking them.
fn trickle(mut stream: TcpStream, bytes: Vec<u8>, every: Duration) {
    for byte in bytes {
        if stream.write_all(&[byte]).is_err() {
            return;
        }
        thread::sleep(every);
    }
}

/// A stalled connection: how it was opened, and what it must see before it is closed.
struct Stall {
    name: &'static str,
    stream: TcpStream,
    expect_status: Option<u16>,
}

fn open_stalls(addr: &str) -> Vec<Stall> {
    let connect = || TcpStream::connect(addr).expect("connect");
    let mut stalls = Vec::new();

    stalls.push(Stall { name: "sends nothing", stream: connect(), expect_status: None });

    let slow_head = connect();
    let head =
        b"GET /healthz HTTP/1.1\r\nhost: localhost\r\nx-padding: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\r\n\r\n";
    let writer = slow_head.try_clone().expect("clone");
    thread::spawn(move || trickle(writer, head.to_vec(), Duration::from_millis(200)));
    stalls.push(Stall { name: "headers at 5 bytes/s", stream: slow_head, expect_status: None });

    let mut idle = connect();
    idle.write_all(b"GET /healthz HTTP/1.1\r\nhost: localhost\r\n\r\n").expect("send");
    let answer = read_head(&mut idle, Duration::from_secs(5));
    assert_eq!(status(&answer), 200, "the keep-alive request itself is served: {answer:?}");
    stalls.push(Stall { name: "idle keep-alive", stream: idle, expect_status: None });

    let mut short = connect();
    short
        .write_all(b"POST /v1/extractions HTTP/1.1\r\nhost: localhost\r\ncontent-type: application/json\r\ncontent-length: 200\r\n\r\n{\"tenant\":")
        .expect("send");
    stalls.push(Stall { name: "body shorter than Content-Length", stream: short, expect_status: Some(408) });

    let mut chunked = connect();
    chunked
        .write_all(b"POST /v1/extractions HTTP/1.1\r\nhost: localhost\r\ncontent-type: application/json\r\ntransfer-encoding: chunked\r\n\r\n")
        .expect("send");
    let writer = chunked.try_clone().expect("clone");
    // A one-byte chunk five times a second, for ever: it never stalls long, it never ends.
    thread::spawn(move || trickle(writer, b"1\r\n \r\n".repeat(200), Duration::from_millis(40)));
    stalls.push(Stall { name: "never-ending chunked body", stream: chunked, expect_status: Some(408) });
    stalls
}

#[test]
fn stalled_connections_are_closed_within_the_timeouts_while_others_are_served() {
    let dir = temp_dir();
    let config = config(
        dir.path(),
        &format!(
            "[server]\nheader_read_timeout = \"{HEADER_TIMEOUT_SECS}s\"\nbody_read_timeout = \"{BODY_TIMEOUT_SECS}s\"\n"
        ),
    );
    let server = Server::start_with(&dir.path().join("data"), &["--config", &config]);
    let addr = addr(&server);
    let stalls = open_stalls(&addr);
    let watchers: Vec<_> = stalls
        .into_iter()
        .map(|mut stall| {
            thread::spawn(move || {
                let (answer, closed) = read_until_closed(&mut stall.stream, GIVE_UP);
                (stall.name, stall.expect_status, answer, closed)
            })
        })
        .collect();
    // While they stall, a new client is served.
    let answer = exchange(&addr, &get("/healthz", None));
    assert_eq!(status(&answer), 200, "{answer}");

    for watcher in watchers {
        let (name, expect_status, answer, closed) = watcher.join().expect("watcher");
        let closed = closed.unwrap_or_else(|| panic!("{name}: still open after {GIVE_UP:?}; got {answer:?}"));
        assert!(closed <= limit(), "{name}: closed only after {closed:?} (limit {:?})", limit());
        if let Some(expected) = expect_status {
            assert_eq!(status(&answer), expected, "{name}: {answer:?}");
            assert!(answer.contains("\"body_timeout\""), "{name}: a JSON error body: {answer:?}");
        }
    }
    let answer = exchange(&addr, &get("/healthz", None));
    assert_eq!(status(&answer), 200, "still serving after the stalls: {answer}");
    crate::util::stop_and_verify(server);
}

#[test]
fn past_the_connection_cap_new_clients_get_503_while_healthz_answers() {
    let dir = temp_dir();
    let config = config(dir.path(), "[server]\nmax_connections = 2\nheader_read_timeout = \"30s\"\n");
    let server = Server::start_with(&dir.path().join("data"), &["--config", &config]);
    let addr = addr(&server);
    // Two kept-alive connections hold the cap (each has been served, so each is counted).
    let mut held: Vec<TcpStream> = (0..2)
        .map(|_| {
            let mut stream = TcpStream::connect(&addr).expect("connect");
            stream.write_all(b"GET /healthz HTTP/1.1\r\nhost: localhost\r\n\r\n").expect("send");
            assert_eq!(status(&read_head(&mut stream, Duration::from_secs(5))), 200);
            stream
        })
        .collect();

    let refused = exchange(&addr, &get("/v1/extractions", None));
    assert_eq!(status(&refused), 503, "{refused}");
    assert!(refused.contains("\"overloaded\""), "a JSON error body: {refused}");
    let health = exchange(&addr, &get("/healthz", None));
    assert_eq!(status(&health), 200, "/healthz answers past the cap: {health}");

    // A freed slot is taken by the next client.
    drop(held.pop());
    let mut served = 0;
    for _ in 0..50 {
        if status(&exchange(&addr, &get("/v1/extractions", None))) == 200 {
            served += 1;
            break;
        }
        thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(served, 1, "a client is served again once a connection closes");
    drop(held);
    crate::util::stop_and_verify(server);
}
