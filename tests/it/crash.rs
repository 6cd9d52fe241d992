//! Process lifecycle: kill -9, SIGTERM, and what survives them.
//!
//! DESIGN §6.5: every acknowledged intake survives kill -9 at any instant. Many clients
//! submit while the server is SIGKILLed (or SIGTERMed) mid-stream; every intake the
//! server acknowledged (a 2xx answer) must be there after a restart on the same data
//! directory, under the same identity, and the file must pass `verify`. A SIGTERM must
//! end in a clean exit (0) whenever it arrives.

use std::collections::{BTreeMap, BTreeSet};
use std::io::{BufRead, BufReader, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::{Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::json;

use crate::util::{
    Api, Server, assert_verifies, id_of, serve_command, stderr, stdout, stop_and_verify, temp_dir, verify, wait_timeout,
};

const CLIENTS: usize = 32;
const KILL_AFTER_ACKS: usize = 400;

#[derive(Debug, Clone)]
struct Ack {
    tenant: String,
    source_id: String,
    content: String,
    id: String,
}

/// What client `c` sends as its `n`-th request: mostly its own new sources, every fourth
/// one a source shared by all clients (a concurrent duplicate).
fn source(c: usize, n: usize) -> (String, String, String) {
    let tenant = format!("tenant-{}", c % 3);
    if n % 4 == 3 {
        let k = n % 8;
        (tenant, format!("shared-{k}"), format!("shared content {k}"))
    } else {
        (tenant, format!("c{c}-s{n}"), format!("client {c} source {n}"))
    }
}

/// Clients that submit until told to stop or until the server goes away.
struct Load {
    clients: tokio::task::JoinSet<()>,
    acks: Arc<Mutex<Vec<Ack>>>,
    acked: Arc<AtomicUsize>,
    stop: Arc<AtomicBool>,
    refused: Arc<Mutex<Vec<String>>>,
}

impl Load {
    fn start(api: &Api) -> Load {
        let mut load = Load {
            clients: tokio::task::JoinSet::new(),
            acks: Arc::default(),
            acked: Arc::default(),
            stop: Arc::default(),
            refused: Arc::default(),
        };
        for c in 0..CLIENTS {
            let api = api.clone();
            let acks = Arc::clone(&load.acks);
            let acked = Arc::clone(&load.acked);
            let stop = Arc::clone(&load.stop);
            let refused = Arc::clone(&load.refused);
            load.clients.spawn(async move {
                for n in 0.. {
                    if stop.load(Ordering::SeqCst) {
                        break;
                    }
                    let (tenant, source_id, content) = source(c, n);
                    match api.try_intake(&tenant, &source_id, &content).await {
                        Ok(reply) if reply.status == 200 || reply.status == 201 => {
                            let id = id_of(&reply.body);
                            let ack = Ack { tenant, source_id, content, id };
                            acks.lock().expect("acks").push(ack);
                            acked.fetch_add(1, Ordering::SeqCst);
                        }
                        Ok(reply) => refused.lock().expect("refused").push(format!("{} {}", reply.status, reply.body)),
                        // The server is gone: this request was never acknowledged.
                        Err(_) => break,
                    }
                }
            });
        }
        load
    }

    async fn wait_for_acks(&self, n: usize) {
        let deadline = Instant::now() + Duration::from_secs(30);
        while self.acked.load(Ordering::SeqCst) < n {
            assert!(Instant::now() < deadline, "only {} acks in 30 s", self.acked.load(Ordering::SeqCst));
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    }

    /// Stops the clients and returns every acknowledged intake.
    async fn finish(mut self) -> Vec<Ack> {
        self.stop.store(true, Ordering::SeqCst);
        while let Some(joined) = self.clients.join_next().await {
            joined.expect("client task");
        }
        let refused = self.refused.lock().expect("refused").clone();
        assert!(refused.is_empty(), "non-2xx answers under load: {refused:?}");
        self.acks.lock().expect("acks").clone()
    }
}

/// Restarts on the data directory and checks every acknowledged intake is there, once,
/// under its identity. Returns the restarted server and how many extractions it holds.
async fn assert_acks_survived(data_dir: &Path, acks: &[Ack]) -> (Server, usize) {
    // Concurrent duplicates were acknowledged under one id.
    let mut ids_by_source: BTreeMap<(&str, &str, &str), BTreeSet<&str>> = BTreeMap::new();
    for a in acks {
        ids_by_source.entry((&a.tenant, &a.source_id, &a.content)).or_default().insert(&a.id);
    }
    for (source, ids) in &ids_by_source {
        assert_eq!(ids.len(), 1, "{source:?} acknowledged under {ids:?}");
    }

    let server = Server::start(data_dir);
    let api = server.api();
    let mut checked = BTreeSet::new();
    for a in acks {
        if !checked.insert(a.id.clone()) {
            continue;
        }
        let record = api.record(&a.id).await;
        assert_eq!(record["tenant"], json!(a.tenant));
        assert_eq!(record["source_id"], json!(a.source_id));
        assert_eq!(record["content_bytes"], json!(a.content.len()));
        assert_eq!(record["state"], json!("pending"));
        let again = api.intake(&a.tenant, &a.source_id, &a.content).await;
        assert_eq!(again.status, 200, "{:#}", again.body);
        assert_eq!(again.body["created"], json!(false));
        assert_eq!(id_of(&again.body), a.id);
    }

    // Extra rows may exist (committed, then killed before the answer), but never twice.
    let listed = api.list_all("").await;
    let listed_ids: BTreeSet<String> = listed.iter().map(id_of).collect();
    assert_eq!(listed_ids.len(), listed.len(), "an id is listed twice");
    assert!(listed_ids.is_superset(&checked));
    let identities: BTreeSet<String> =
        listed.iter().map(|r| format!("{}|{}|{}", r["tenant"], r["source_id"], r["source_hash"])).collect();
    assert_eq!(identities.len(), listed.len(), "one extraction per identity");
    (server, listed.len())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn acknowledged_intakes_survive_sigkill() {
    let dir = temp_dir();
    let mut server = Server::start(dir.path());
    let load = Load::start(&server.api());
    load.wait_for_acks(KILL_AFTER_ACKS).await;
    server.kill9();
    let acks = load.finish().await;
    assert!(acks.len() >= KILL_AFTER_ACKS);

    let (server, extractions) = assert_acks_survived(dir.path(), &acks).await;

    // A running server holds the file locked; verify must refuse, not report success.
    let locked = verify(&server.db_path());
    assert_ne!(locked.status.code(), Some(0), "verify on a live file must fail\n{}", stdout(&locked));
    assert_eq!(locked.status.code(), Some(74), "{}", stderr(&locked));
    assert!(stderr(&locked).contains("cannot verify"), "{}", stderr(&locked));

    let report = stop_and_verify(server);
    assert!(report.contains(&format!("extractions: {extractions}")), "{report}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sigterm_under_load_drains_and_keeps_every_ack() {
    let dir = temp_dir();
    let server = Server::start(dir.path());
    let db = server.db_path();
    let load = Load::start(&server.api());
    load.wait_for_acks(KILL_AFTER_ACKS / 2).await;
    let (status, log) = tokio::task::spawn_blocking(move || server.terminate()).await.expect("terminate task");
    let acks = load.finish().await;
    assert_eq!(status.code(), Some(0), "SIGTERM under load: {log}");
    assert_verifies(&db);
    let (server, _) = assert_acks_survived(dir.path(), &acks).await;
    stop_and_verify(server);
}

/// Starts `serve` and sends it SIGTERM the instant its ready line appears: a shell
/// already blocked on `read` does the `kill`, so no process start sits in between.
fn sigterm_on_ready(data_dir: &Path) -> ExitStatus {
    let mut server =
        serve_command(data_dir, &[]).stdout(Stdio::piped()).stderr(Stdio::null()).spawn().expect("spawn serve");
    let mut killer = Command::new("sh")
        .args(["-c", "read _ && kill -TERM \"$0\"", &server.id().to_string()])
        .stdin(Stdio::piped())
        .spawn()
        .expect("spawn sh");
    let stdout = server.stdout.take().expect("piped stdout");
    let mut trigger = killer.stdin.take().expect("piped stdin");
    std::thread::spawn(move || {
        let mut reader = BufReader::new(stdout);
        let mut line = String::new();
        if reader.read_line(&mut line).is_ok() && line.starts_with("commitpoint listening on ") {
            let _ = trigger.write_all(b"go\n");
        }
        drop(trigger);
        let _ = std::io::copy(&mut reader, &mut std::io::sink());
    });
    let status = wait_timeout(&mut server, Duration::from_secs(20));
    let _ = killer.wait();
    status.unwrap_or_else(|| {
        let _ = server.kill();
        let _ = server.wait();
        panic!("serve did not stop within 20 s of SIGTERM")
    })
}

/// A supervisor may stop the service the moment it reports readiness. `serve` must
/// already be listening for SIGTERM when it prints its ready line, or the default
/// disposition kills it (no drain, no clean close of the store, exit by signal).
#[test]
fn sigterm_right_after_the_ready_line_stops_cleanly() {
    const ROUNDS: usize = 40;
    let mut killed_by_signal = 0;
    for _ in 0..ROUNDS {
        let dir = temp_dir();
        let status = sigterm_on_ready(dir.path());
        match status.code() {
            Some(0) => {}
            None => killed_by_signal += 1,
            Some(code) => panic!("serve exited {code} on SIGTERM"),
        }
        assert_verifies(&dir.path().join("commitpoint.redb"));
    }
    assert_eq!(
        killed_by_signal, 0,
        "of {ROUNDS} servers sent SIGTERM right after their ready line, {killed_by_signal} died of \
         the signal instead of stopping cleanly"
    );
}

/// A graceful stop drains in-flight requests, but a client that stalls halfway through
/// its body must not hold the server (and the store file) open forever: SIGTERM has to
/// end in a clean exit within a bounded time.
#[test]
fn a_stalled_client_does_not_block_sigterm() {
    let dir = temp_dir();
    let server = Server::start(dir.path());
    let addr = server.url.trim_start_matches("http://").to_string();
    let mut stalled = TcpStream::connect(&addr).expect("connect");
    stalled
        .write_all(
            b"POST /v1/extractions HTTP/1.1\r\nhost: localhost\r\ncontent-type: application/json\r\n\
              content-length: 200\r\n\r\n{\"tenant\": \"acme\", ",
        )
        .expect("send a partial request");
    // Let the server accept the connection and start waiting for the rest of the body.
    std::thread::sleep(Duration::from_millis(300));
    let db = server.db_path();
    let (status, log) = server.terminate();
    assert_eq!(status.code(), Some(0), "{log}");
    assert_verifies(&db);
    drop(stalled);
}
