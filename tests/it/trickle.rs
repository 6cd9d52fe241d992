//! A body trickled a byte at a time is cut off within `server.body_read_timeout` on every
//! route (issue 30, item 3): the console's form posts once read theirs with no deadline, so
//! 1,024 trickling logins held every connection. The routes come from the router's own
//! lists (`commitpoint::fuzzing::route_table`), so a new route family is covered unasked.
#![cfg(feature = "fuzzing")]

use std::io::Write;
use std::net::TcpStream;
use std::time::{Duration, Instant};

use crate::raw::{addr, config, read_head, status};
use crate::util::{Server, temp_dir};

/// Sends the head of a request announcing 64 body bytes, then one byte every 200 ms
/// (each in time for any per-read clock); returns the answer head and when it came.
fn trickle(addr: &str, method: &str, path: &str, cookie: &str, give_up: Duration) -> (String, Duration) {
    let mut stream = TcpStream::connect(addr).expect("connect");
    let kind = if path.starts_with("/ui") { "application/x-www-form-urlencoded" } else { "application/json" };
    let head = format!(
        "{method} {path} HTTP/1.1\r\nhost: localhost\r\ncookie: {cookie}\r\ncontent-type: {kind}\r\ncontent-length: 64\r\n\r\n"
    );
    stream.write_all(head.as_bytes()).expect("send head");
    let start = Instant::now();
    loop {
        let answer = read_head(&mut stream, Duration::from_millis(200));
        if !answer.is_empty() || start.elapsed() > give_up {
            return (answer, start.elapsed());
        }
        // A server that has answered may close; a failed write is an answer of sorts too.
        if stream.write_all(b" ").is_err() {
            return (read_head(&mut stream, Duration::from_millis(200)), start.elapsed());
        }
    }
}

fn concrete(path: &str) -> String {
    path.replace("{id}", &"0".repeat(64))
        .replace("{seq}", "7")
        .replace("{tenant}", "acme")
        .replace("/backups/{name}", "/backups/commitpoint-none.redb")
        .replace("{file}", "none.css")
        .replace("{name}", "nobody")
}

#[test]
fn a_trickled_body_is_cut_off_within_the_read_timeout_on_every_route() {
    let dir = temp_dir();
    let config = config(dir.path(), "[server]\nbody_read_timeout = \"1s\"\n");
    let server = Server::start_with(&dir.path().join("data"), &["--config", &config]);
    let addr = addr(&server);
    // A server without tokens hands out an open console session: the form posts behind
    // it read their bodies, as the login form does without any session.
    let login = crate::raw::exchange(&addr, &crate::raw::get("/ui/login", None));
    let cookie = login
        .lines()
        .find_map(|l| l.to_ascii_lowercase().starts_with("set-cookie:").then(|| l[11..].trim().to_string()))
        .and_then(|c| c.split(';').next().map(str::to_string))
        .expect("an open session cookie");

    let routes = commitpoint::fuzzing::route_table();
    assert!(routes.iter().any(|(m, p)| m == "POST" && p == "/ui/login"), "{routes:?}");
    assert!(routes.iter().any(|(m, p)| m == "POST" && p == "/v1/extractions"), "{routes:?}");
    let give_up = Duration::from_secs(6);
    let handles: Vec<_> = routes
        .into_iter()
        .map(|(method, template)| {
            let (addr, cookie) = (addr.clone(), cookie.clone());
            std::thread::spawn(move || {
                let (answer, after) = trickle(&addr, &method, &concrete(&template), &cookie, give_up);
                (method, template, status(&answer), after)
            })
        })
        .collect();
    let mut late = Vec::new();
    for handle in handles {
        let (method, template, code, after) = handle.join().expect("a trickling client");
        // One second of deadline, and slack for a loaded machine.
        if code == 0 || after > Duration::from_secs(4) {
            late.push(format!("{method} {template}: status {code} after {after:?}"));
        }
    }
    assert!(late.is_empty(), "bodies read without a deadline:\n{}", late.join("\n"));
}
