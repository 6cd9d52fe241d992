//! A real Cloud Storage JSON API on loopback for the Vertex tests: `gcp-storage-emulator`
//! from PyPI (pinned in `tests/fixtures/python/gcs-emulator.txt`), installed on first use
//! into a venv under `target/` and started per test on a free port, in memory; dropped, it
//! is killed. It checks no credentials.

use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

fn emulator() -> PathBuf {
    crate::python_venv::tool("gcs-emulator", "gcp-storage-emulator")
}

#[derive(Debug)]
pub struct Gcs {
    child: Child,
    pub endpoint: String,
    http: reqwest::Client,
}

impl Gcs {
    /// Starts the emulator on a free loopback port and creates `buckets`.
    pub async fn start(buckets: &[&str]) -> Gcs {
        let bin = emulator();
        let port = {
            let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("a free port");
            listener.local_addr().expect("local address").port()
        };
        let child = Command::new(bin)
            .args(["start", "--host", "127.0.0.1", "--port", &port.to_string(), "--in-memory"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start gcp-storage-emulator");
        let endpoint = format!("http://127.0.0.1:{port}");
        let gcs = Gcs { child, endpoint, http: reqwest::Client::new() };
        let deadline = Instant::now() + Duration::from_secs(30);
        while TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(Instant::now() < deadline, "gcp-storage-emulator did not listen on {port}");
            std::thread::sleep(Duration::from_millis(50));
        }
        for bucket in buckets {
            let url = format!("{}/storage/v1/b?project=test-project", gcs.endpoint);
            let reply = gcs.http.post(url).json(&json!({"name": bucket})).send().await.expect("create bucket");
            assert!(reply.status().is_success(), "create bucket {bucket}: {}", reply.status());
        }
        gcs
    }

    /// Every object name in `bucket` under `prefix`.
    pub async fn names(&self, bucket: &str, prefix: &str) -> Vec<String> {
        let url = format!("{}/storage/v1/b/{bucket}/o", self.endpoint);
        let reply = self.http.get(url).query(&[("prefix", prefix)]).send().await.expect("list");
        let page: Value = reply.json().await.expect("list JSON");
        page["items"].as_array().into_iter().flatten().filter_map(|o| o["name"].as_str().map(str::to_string)).collect()
    }

    /// An object's text.
    pub async fn object(&self, bucket: &str, name: &str) -> String {
        let url = format!("{}/storage/v1/b/{bucket}/o/{}", self.endpoint, name.replace('/', "%2F"));
        let reply = self.http.get(url).query(&[("alt", "media")]).send().await.expect("read object");
        assert!(reply.status().is_success(), "read {name}: {}", reply.status());
        reply.text().await.expect("object text")
    }
}

impl Drop for Gcs {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
