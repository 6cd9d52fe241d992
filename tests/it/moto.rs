//! A real S3 on loopback for the Bedrock tests: moto's server (`moto[server]` from PyPI,
//! pinned in `tests/fixtures/python/moto.txt`), installed on first use into a venv under
//! `target/` and started per test on a free port; dropped, it is killed. Path-style
//! requests, any credentials accepted.

use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Fake credentials for the signed requests (moto checks none).
pub const ACCESS_KEY_ID: &str = "AKIAIOSFODNN7EXAMPLE";
pub const SECRET_ACCESS_KEY: &str = "commitpoint-test-secret-not-a-real-key";

fn moto_server() -> PathBuf {
    crate::python_venv::tool("moto", "moto_server")
}

#[derive(Debug)]
pub struct Moto {
    child: Child,
    pub endpoint: String,
    http: reqwest::Client,
}

impl Moto {
    /// Starts moto on a free loopback port and creates `buckets`.
    pub async fn start(buckets: &[&str]) -> Moto {
        let bin = moto_server();
        let port = {
            let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("a free port");
            listener.local_addr().expect("local address").port()
        };
        let child = Command::new(bin)
            .args(["-H", "127.0.0.1", "-p", &port.to_string()])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start moto_server");
        let endpoint = format!("http://127.0.0.1:{port}");
        let moto = Moto { child, endpoint, http: reqwest::Client::new() };
        let deadline = Instant::now() + Duration::from_secs(30);
        while TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(Instant::now() < deadline, "moto_server did not listen on {port}");
            std::thread::sleep(Duration::from_millis(50));
        }
        for bucket in buckets {
            let reply = moto.http.put(format!("{}/{bucket}", moto.endpoint)).send().await.expect("create bucket");
            assert!(reply.status().is_success(), "create bucket {bucket}: {}", reply.status());
        }
        moto
    }

    /// Every key in `bucket` under `prefix` (path-style ListObjectsV2; keys read from the XML).
    pub async fn keys(&self, bucket: &str, prefix: &str) -> Vec<String> {
        let url = format!("{}/{bucket}?list-type=2&prefix={prefix}", self.endpoint);
        let xml = self.http.get(url).send().await.expect("list").text().await.expect("list body");
        xml.split("<Key>").skip(1).filter_map(|s| s.split("</Key>").next()).map(str::to_string).collect()
    }

    /// An object's text, read with a signed GET (moto keeps objects private).
    pub async fn object(&self, bucket: &str, key: &str) -> String {
        use object_store::ObjectStoreExt;
        let store = object_store::aws::AmazonS3Builder::new()
            .with_bucket_name(bucket)
            .with_region("us-east-1")
            .with_endpoint(&self.endpoint)
            .with_allow_http(true)
            .with_access_key_id(ACCESS_KEY_ID)
            .with_secret_access_key(SECRET_ACCESS_KEY)
            .build()
            .expect("an S3 client");
        let object = store.get(&object_store::path::Path::from(key)).await.expect("get object");
        String::from_utf8(object.bytes().await.expect("object body").to_vec()).expect("UTF-8")
    }
}

impl Drop for Moto {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
