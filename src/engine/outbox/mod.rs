//! Outbox delivery: every committed or terminally failed extraction has one event per
//! configured sink (created in the commit transaction, see `store::outbox`); this task
//! POSTs each one, signed with Standard Webhooks, until the receiver takes it.
//!
//! The `webhook-id` is the event id, the same on every attempt and after a restart, so a
//! receiver that deduplicates on it sees each event once. Delivery runs beside the
//! scheduler and never holds up extraction: a slow or dead receiver only grows its own
//! backlog. Retries back off exponentially with jitter and honour `Retry-After` on 429
//! and 503; a 410 disables the sink; after `max_attempts` or `max_age` an event goes to
//! the dead-letter list, from where an operator can redeliver it.

mod payload;

use crate::domain::schema::Registry;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use futures_util::StreamExt;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use crate::domain::backoff::backoff_delay;
use crate::domain::clock;
use crate::engine::supervisor::Supervisor;
use crate::engine::webhook::{WEBHOOK_ID, WEBHOOK_SIGNATURE, WEBHOOK_TIMESTAMP, WebhookSecret, sign_standard};
use crate::providers::parse_retry_after;
use crate::store::{DeliveryReport, OutboxRecord, SharedStore};

pub(crate) use payload::event_body;

/// One downstream receiver.
#[derive(Debug, Clone)]
pub(crate) struct Sink {
    pub name: String,
    pub url: String,
    pub secret: WebhookSecret,
    pub max_attempts: u32,
    pub max_age: Duration,
    pub timeout: Duration,
}

pub(crate) const DEFAULT_MAX_ATTEMPTS: u32 = 12;
pub(crate) const DEFAULT_MAX_AGE: Duration = Duration::from_secs(24 * 3600);
pub(crate) const DEFAULT_TIMEOUT: Duration = Duration::from_secs(10);
/// Retries never wait longer than this between attempts.
const BACKOFF_CAP: Duration = Duration::from_secs(3600);
/// The loop looks for due events at least this often (new commits do not wake it).
const IDLE_POLL: Duration = Duration::from_millis(250);
const DELIVERIES_AT_ONCE: usize = 8;
const DUE_BATCH: usize = 256;

/// Starts delivery under `supervisor`; `wake` lets others (an operator's redeliver) cut
/// its idle wait short. It stops when shutdown starts; an interrupted delivery is still
/// due in the store and is sent again on start.
pub(crate) fn spawn(
    store: SharedStore,
    registry: Registry,
    sinks: Vec<Sink>,
    wake: Arc<Notify>,
    supervisor: &Supervisor,
) -> Result<(), reqwest::Error> {
    let http = reqwest::Client::builder().connect_timeout(Duration::from_secs(5)).build()?;
    let sinks: HashMap<String, Sink> = sinks.into_iter().map(|s| (s.name.clone(), s)).collect();
    let deliverer = Deliverer { store, registry, http, sinks: Arc::new(sinks) };
    let stop = supervisor.token();
    supervisor.spawn("outbox delivery", async move {
        deliverer.run(stop, wake).await;
        Ok::<(), std::convert::Infallible>(())
    });
    Ok(())
}

#[derive(Debug, Clone)]
struct Deliverer {
    store: SharedStore,
    /// Where each schema keeps its findings, to show the rest of a committed output.
    registry: Registry,
    http: reqwest::Client,
    sinks: Arc<HashMap<String, Sink>>,
}

impl Deliverer {
    async fn run(self, stop: CancellationToken, wake: Arc<Notify>) {
        tracing::info!(sinks = self.sinks.len(), "outbox delivery started");
        loop {
            if let Err(e) = self.deliver_due().await {
                tracing::error!(error = %crate::store::error_chain(&e), "outbox delivery step failed");
            }
            let wait = match self.store.next_event_due().await {
                Ok(Some(at)) => Duration::from_millis(at.saturating_sub(clock::now_ms())).min(IDLE_POLL),
                _ => IDLE_POLL,
            };
            tokio::select! {
                () = stop.cancelled() => break,
                () = wake.notified() => {}
                () = tokio::time::sleep(wait) => {}
            }
        }
        tracing::info!("outbox delivery stopped");
    }

    /// Each outcome is recorded as soon as its attempt ends, so a crash redelivers only
    /// the events whose attempts were still open.
    async fn deliver_due(&self) -> Result<(), crate::store::Error> {
        let due = self.store.due_events(clock::now_ms(), DUE_BATCH).await?;
        let results = futures_util::stream::iter(due)
            .map(|event| async move {
                let report = self.attempt(&event).await?;
                self.note(&event, &report);
                self.store.record_delivery(event.seq, report).await.map(|_| ())
            })
            .buffer_unordered(DELIVERIES_AT_ONCE)
            .collect::<Vec<_>>()
            .await;
        results.into_iter().collect()
    }

    fn note(&self, event: &OutboxRecord, report: &DeliveryReport) {
        match report {
            DeliveryReport::Delivered { status } => {
                metrics::counter!(crate::domain::metric_names::OUTBOX_DELIVERIES_TOTAL, "outcome" => "delivered")
                    .increment(1);
                tracing::debug!(event = %event.event_id, sink = %event.sink, status, "event delivered");
            }
            DeliveryReport::Retry { error, .. } => {
                metrics::counter!(crate::domain::metric_names::OUTBOX_DELIVERIES_TOTAL, "outcome" => "retry")
                    .increment(1);
                tracing::info!(event = %event.event_id, sink = %event.sink, %error, "delivery failed; will retry");
            }
            DeliveryReport::Dead { reason } => {
                metrics::counter!(crate::domain::metric_names::OUTBOX_DELIVERIES_TOTAL, "outcome" => "dead")
                    .increment(1);
                tracing::warn!(event = %event.event_id, sink = %event.sink, %reason, "event moved to the dead-letter list");
            }
        }
    }

    async fn attempt(&self, event: &OutboxRecord) -> Result<DeliveryReport, crate::store::Error> {
        let Some(sink) = self.sinks.get(&event.sink) else {
            return Ok(DeliveryReport::Dead { reason: format!("sink {:?} is no longer configured", event.sink) });
        };
        if self.store.sink_disabled(sink.name.clone()).await? {
            return Ok(DeliveryReport::Dead { reason: "the sink is disabled (its receiver answered 410 Gone)".into() });
        }
        let body = event_body(self.store.as_ref(), &self.registry, event).await?;
        let now = crate::domain::clock::now();
        let timestamp = now.duration_since(SystemTime::UNIX_EPOCH).map_or(0, |d| d.as_secs());
        let signature = sign_standard(&sink.secret, &event.event_id, timestamp, &body);
        let sent = self
            .http
            .post(&sink.url)
            .timeout(sink.timeout)
            .header(WEBHOOK_ID, &event.event_id)
            .header(WEBHOOK_TIMESTAMP, timestamp.to_string())
            .header(WEBHOOK_SIGNATURE, signature)
            .header(reqwest::header::CONTENT_TYPE, "application/json")
            .body(body)
            .send()
            .await;
        let (error, told_delay) = match sent {
            Ok(response) if response.status().is_success() => {
                return Ok(DeliveryReport::Delivered { status: response.status().as_u16() });
            }
            Ok(response) if response.status() == reqwest::StatusCode::GONE => {
                self.store.set_sink_disabled(sink.name.clone(), true).await?;
                tracing::warn!(sink = %sink.name, "receiver answered 410 Gone: sink disabled until an operator enables it");
                return Ok(DeliveryReport::Dead { reason: "receiver answered 410 Gone; sink disabled".into() });
            }
            Ok(response) => {
                let status = response.status().as_u16();
                let delay = matches!(status, 429 | 503).then(|| parse_retry_after(response.headers(), now)).flatten();
                (format!("receiver answered HTTP {status}"), delay)
            }
            Err(e) => (format!("request failed: {}", without_url(&e)), None),
        };
        Ok(next_step(sink, event, error, told_delay, clock::now_ms()))
    }
}

/// Retry, or give up when the attempts or the age are used up.
fn next_step(sink: &Sink, event: &OutboxRecord, error: String, told: Option<Duration>, now_ms: u64) -> DeliveryReport {
    let attempts = event.deliveries + 1;
    let age = Duration::from_millis(now_ms.saturating_sub(event.created_at_ms));
    if attempts >= sink.max_attempts || age >= sink.max_age {
        return DeliveryReport::Dead { reason: format!("gave up after {attempts} attempts: {error}") };
    }
    let delay = told.unwrap_or_else(|| backoff_delay(attempts, BACKOFF_CAP)).min(BACKOFF_CAP);
    DeliveryReport::Retry { at_ms: now_ms + delay.as_millis() as u64, error }
}

/// reqwest errors name the URL, which may carry credentials in its query.
fn without_url(e: &reqwest::Error) -> String {
    let kind = if e.is_timeout() {
        "timed out"
    } else if e.is_connect() {
        "could not connect"
    } else {
        "transport error"
    };
    kind.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::identity::ExtractionId;
    use crate::store::{DeliveryState, OutboxKind};

    fn sink() -> Sink {
        Sink {
            name: "s".into(),
            url: "http://127.0.0.1:1/".into(),
            secret: WebhookSecret::standard("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw").unwrap(),
            max_attempts: 3,
            max_age: Duration::from_secs(60),
            timeout: DEFAULT_TIMEOUT,
        }
    }

    fn event(deliveries: u32, created_at_ms: u64) -> OutboxRecord {
        OutboxRecord {
            seq: 1,
            event_id: "msg_1".into(),
            sink: "s".into(),
            kind: OutboxKind::Committed,
            extraction_seq: 1,
            extraction_id: ExtractionId([1; 32]),
            tenant: "t".into(),
            attempt: 1,
            state: DeliveryState::Pending,
            deliveries,
            next_attempt_at_ms: 0,
            last_error: None,
            created_at_ms,
        }
    }

    #[test]
    fn retries_honour_the_receivers_delay_then_give_up() {
        let told = next_step(&sink(), &event(0, 1000), "429".into(), Some(Duration::from_secs(7)), 2000);
        assert_eq!(told, DeliveryReport::Retry { at_ms: 9000, error: "429".into() });
        let DeliveryReport::Retry { at_ms, .. } = next_step(&sink(), &event(1, 1000), "500".into(), None, 2000) else {
            panic!("expected a retry");
        };
        assert!((2000..=2000 + BACKOFF_CAP.as_millis() as u64).contains(&at_ms));
        assert!(matches!(next_step(&sink(), &event(2, 1000), "500".into(), None, 2000), DeliveryReport::Dead { .. }));
        assert!(matches!(next_step(&sink(), &event(0, 0), "500".into(), None, 61_000), DeliveryReport::Dead { .. }));
    }
}
