//! The outbox's downstream receiver, in this process so it outlives every server: it
//! checks each delivery's Standard Webhooks signature, keeps every delivery it gets, and
//! answers 500 or 429 now and then (2xx only once the run is calm), so events are retried
//! and, after kills, redelivered.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::http::{HeaderMap, StatusCode};
use commitpoint::engine::webhook::{StandardHeaders, WebhookSecret, verify_standard};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::config::SINK_SECRET;

/// One delivery as received, with the receiver's verdict and answer.
#[derive(Debug, Clone)]
pub struct Delivery {
    pub id: String,
    pub body: Vec<u8>,
    /// `Err` names why the signature did not verify.
    pub signature: Result<(), String>,
    pub status: u16,
    /// The round, and so the server process, that sent it.
    pub round: i64,
}

#[derive(Debug)]
pub struct Receiver {
    pub url: String,
    shared: Arc<Shared>,
}

#[derive(Debug)]
struct Shared {
    log: Mutex<Vec<Delivery>>,
    rng: Mutex<StdRng>,
    calm: AtomicBool,
}

impl Receiver {
    /// Binds `127.0.0.1:0` and serves on the current runtime.
    pub async fn start(seed: u64) -> Receiver {
        let shared = Arc::new(Shared {
            log: Mutex::default(),
            rng: Mutex::new(StdRng::seed_from_u64(seed)),
            calm: AtomicBool::new(false),
        });
        let state = Arc::clone(&shared);
        let app = axum::Router::new().route(
            "/hook",
            axum::routing::post(move |headers: HeaderMap, body: axum::body::Bytes| {
                let state = Arc::clone(&state);
                async move { state.take(&headers, body.to_vec()) }
            }),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind the receiver");
        let url = format!("http://{}/hook", listener.local_addr().expect("receiver address"));
        tokio::spawn(async move { axum::serve(listener, app).await });
        Receiver { url, shared }
    }

    /// From now on every delivery is taken (the final drain).
    pub fn calm(&self) {
        self.shared.calm.store(true, Ordering::SeqCst);
    }

    pub fn deliveries(&self) -> Vec<Delivery> {
        self.shared.log.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
}

impl Shared {
    fn take(&self, headers: &HeaderMap, body: Vec<u8>) -> axum::response::Response {
        let header = |n: &str| headers.get(n).and_then(|v| v.to_str().ok());
        let signature = verify(header("webhook-id"), header("webhook-timestamp"), header("webhook-signature"), &body);
        let (status, retry_after) = self.answer();
        let id = header("webhook-id").unwrap_or_default().to_string();
        let delivery = Delivery { id, body, signature, status: status.as_u16(), round: crate::context::round() };
        self.log.lock().unwrap_or_else(|e| e.into_inner()).push(delivery);
        let mut response = axum::response::Response::new(axum::body::Body::empty());
        *response.status_mut() = status;
        if retry_after {
            response.headers_mut().insert("retry-after", axum::http::HeaderValue::from_static("1"));
        }
        response
    }

    /// 2xx of three kinds mostly; 500, 503 and 429 (with `Retry-After: 1`) otherwise.
    fn answer(&self) -> (StatusCode, bool) {
        let calm = self.calm.load(Ordering::SeqCst);
        let roll = self.rng.lock().unwrap_or_else(|e| e.into_inner()).random_range(0..100);
        match roll {
            0..12 if !calm => (StatusCode::INTERNAL_SERVER_ERROR, false),
            12..16 if !calm => (StatusCode::SERVICE_UNAVAILABLE, false),
            16..22 if !calm => (StatusCode::TOO_MANY_REQUESTS, true),
            0..40 => (StatusCode::OK, false),
            40..70 => (StatusCode::NO_CONTENT, false),
            _ => (StatusCode::ACCEPTED, false),
        }
    }
}

fn verify(id: Option<&str>, timestamp: Option<&str>, signature: Option<&str>, body: &[u8]) -> Result<(), String> {
    let secret = WebhookSecret::standard(SINK_SECRET).map_err(|e| e.to_string())?;
    let now = SystemTime::now().duration_since(UNIX_EPOCH).map_err(|e| e.to_string())?.as_secs();
    let headers = StandardHeaders { id, timestamp, signature };
    verify_standard(&[secret], headers, body, now, Duration::from_secs(300)).map(|_| ()).map_err(|e| e.to_string())
}
