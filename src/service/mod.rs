//! The application service behind every entry point (HTTP today; webhooks and the CLI
//! later): input checks, identity, schema validation, then one store operation.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use serde_json::Value;
use tokio::sync::Notify;

use crate::identity::{ExtractionId, SourceHash};
use crate::lifecycle::TransitionError;
use crate::routing::Router;
use crate::scheduler::{ProviderHealth, SharedHealth};
use crate::schema::{self, Registry, ValidationIssue};
use crate::store::{
    self, Authority, BackupReport, Charge, ClaimRequest, DeliveryOutcome, ExtractionRecord, FindingRecord, Grant,
    IntakeOutcome, ListFilter, ListPage, NewExtraction, PostOutcome, PostResult, ReadyItem, RetryOutcome, StateCount,
    Store, Submission, Usage,
};
use crate::webhook::Endpoint;

mod money;
mod outbox;

pub const MAX_CLAIM_LIMIT: usize = 1000;
pub const MAX_LIST_LIMIT: usize = 1000;
pub const MAX_LEASE_SECONDS: u64 = 24 * 3600;
const MAX_REASON_CHARS: usize = 2000;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{field}: {message}")]
    InvalidInput { field: &'static str, message: String },
    #[error(transparent)]
    Schema(#[from] schema::Error),
    #[error("no extraction with id {0}")]
    NotFound(ExtractionId),
    #[error(transparent)]
    Transition(TransitionError),
    #[error("the output does not satisfy schema {schema}; the extraction is now failed (class validation)")]
    ValidationFailed { schema: String, issues: Vec<ValidationIssue> },
    #[error("no provider named {0:?} is configured (see GET /v1/admin/providers)")]
    UnknownProvider(String),
    #[error("no webhook endpoint named {0:?} is configured")]
    UnknownWebhook(String),
    #[error("no outbox event {0}")]
    UnknownEvent(u64),
    #[error(transparent)]
    Store(#[from] store::Error),
}

/// A provider as operators see it: its health plus the jobs it still has in flight.
#[derive(Debug, Clone, serde::Serialize)]
pub struct ProviderView {
    #[serde(flatten)]
    pub health: ProviderHealth,
    pub open_batches: u64,
}

fn invalid(field: &'static str, message: impl Into<String>) -> Error {
    Error::InvalidInput { field, message: message.into() }
}

#[derive(Debug, Clone)]
pub struct IntakeRequest {
    pub tenant: String,
    pub source_id: String,
    pub schema: String,
    pub content: String,
    pub metadata: Option<Value>,
}

#[derive(Debug, Clone)]
pub struct ResultRequest {
    pub lease_token: String,
    pub output: Value,
    /// What the worker's model call used, for the ledger.
    pub usage: Option<WorkerUsage>,
}

/// Usage an external worker reports with its result.
#[derive(Debug, Clone)]
pub struct WorkerUsage {
    /// The provider the worker called (`external` when it does not say).
    pub provider: String,
    pub usage: Usage,
    pub latency_ms: Option<u64>,
}

#[derive(Debug, Clone)]
pub struct Service {
    store: Store,
    registry: Registry,
    /// Wakes the scheduler when new work arrives, so batches form without polling.
    wake: Vec<Arc<Notify>>,
    providers: Vec<SharedHealth>,
    backup_dir: Option<PathBuf>,
    /// Unix ms of the last successful backup since start (0: none).
    last_backup_ms: Arc<AtomicU64>,
    /// Extractions that became pending since start (new intakes and retries): lets the
    /// scheduler skip looking for a batch while too little new work has arrived to fill one.
    arrivals: Arc<AtomicU64>,
    router: Arc<Router>,
    /// Configured webhook endpoints by name.
    webhooks: Arc<HashMap<String, Endpoint>>,
    /// Wakes outbox delivery (an operator redelivered an event).
    outbox_wake: Option<Arc<Notify>>,
}

impl Service {
    pub fn new(store: Store, registry: Registry) -> Self {
        Self {
            store,
            registry,
            wake: Vec::new(),
            providers: Vec::new(),
            backup_dir: None,
            last_backup_ms: Arc::new(AtomicU64::new(0)),
            arrivals: Arc::new(AtomicU64::new(0)),
            router: Arc::new(Router::default()),
            webhooks: Arc::new(HashMap::new()),
            outbox_wake: None,
        }
    }

    pub fn with_webhooks(mut self, endpoints: Vec<Endpoint>) -> Self {
        self.webhooks = Arc::new(endpoints.into_iter().map(|e| (e.name.clone(), e)).collect());
        self
    }

    pub fn with_outbox_wake(mut self, wake: Arc<Notify>) -> Self {
        self.outbox_wake = Some(wake);
        self
    }

    /// Every provider's scheduler looks for work again (each keeps one wake-up permit).
    fn wake_schedulers(&self) {
        self.wake.iter().for_each(|w| w.notify_one());
    }

    /// Routes new work to providers and holds tenants over budget.
    pub fn with_router(mut self, router: Arc<Router>) -> Self {
        self.router = router;
        self
    }

    pub fn router(&self) -> &Arc<Router> {
        &self.router
    }

    /// Remembers the last backup recorded in the store (call once at start).
    pub async fn load_last_backup(&self) -> Result<(), Error> {
        if let Some(ms) = self.store.last_backup_ms().await? {
            self.last_backup_ms.store(ms, Ordering::Relaxed);
            metrics::gauge!("commitpoint_last_backup_success_timestamp_seconds").set(ms as f64 / 1000.0);
        }
        Ok(())
    }

    /// Where online backups are written (inside the data directory, which is the one
    /// place a sandboxed service may write).
    pub fn with_backup_dir(mut self, dir: PathBuf) -> Self {
        self.backup_dir = Some(dir);
        self
    }

    /// Takes a consistent snapshot while serving; returns where it is.
    pub async fn backup(&self) -> Result<BackupReport, Error> {
        let dir = self.backup_dir.clone().ok_or(Error::InvalidInput {
            field: "backup",
            message: "this server has no backup directory".to_string(),
        })?;
        let stamp = crate::clock::format_ms(crate::clock::now_ms()).replace([':', '.'], "-");
        let report = self.store.backup(dir.join(format!("commitpoint-{stamp}.redb"))).await?;
        let now = crate::clock::now_ms();
        self.last_backup_ms.store(now, Ordering::Relaxed);
        metrics::gauge!("commitpoint_last_backup_success_timestamp_seconds").set(now as f64 / 1000.0);
        Ok(report)
    }

    /// How many extractions became pending since start.
    pub fn arrivals(&self) -> u64 {
        self.arrivals.load(Ordering::Relaxed)
    }

    pub fn last_backup_ms(&self) -> Option<u64> {
        Some(self.last_backup_ms.load(Ordering::Relaxed)).filter(|ms| *ms > 0)
    }

    /// The path of a finished backup by its file name, refusing anything that is not one.
    pub fn backup_path(&self, name: &str) -> Result<PathBuf, Error> {
        let valid = name.starts_with("commitpoint-")
            && name.ends_with(".redb")
            && name.bytes().all(|b| b.is_ascii_alphanumeric() || b"-.".contains(&b))
            && !name.contains("..");
        let dir = self.backup_dir.as_ref().filter(|_| valid).ok_or_else(|| Error::InvalidInput {
            field: "name",
            message: format!("{name:?} is not a backup name returned by POST /v1/admin/backup"),
        })?;
        Ok(dir.join(name))
    }

    /// Connects the service to a running scheduler.
    pub fn with_scheduler(mut self, wake: Arc<Notify>, health: SharedHealth) -> Self {
        self.wake.push(wake);
        self.providers.push(health);
        self
    }

    /// Pauses (or resumes) new submissions to a provider; its known jobs are still polled
    /// to completion. Persisted, so a restart keeps the pause.
    pub async fn set_provider_paused(&self, name: &str, paused: bool) -> Result<ProviderView, Error> {
        let health = self
            .providers
            .iter()
            .find(|h| h.snapshot().name == name)
            .ok_or_else(|| Error::UnknownProvider(name.to_string()))?;
        self.store.set_provider_paused(name.to_string(), paused).await?;
        health.set_operator_pause(paused);
        self.router.set_paused(name, paused);
        self.wake_schedulers();
        tracing::info!(provider = name, paused, "operator changed the provider's pause");
        Ok(self
            .providers()
            .await?
            .into_iter()
            .find(|p| p.health.name == name)
            .unwrap_or(ProviderView { health: health.snapshot(), open_batches: 0 }))
    }

    pub async fn providers(&self) -> Result<Vec<ProviderView>, Error> {
        let open = self.store.open_batches().await?;
        Ok(self
            .providers
            .iter()
            .map(|h| {
                let health = h.snapshot();
                let open_batches = open.iter().filter(|b| b.provider == health.name).count() as u64;
                ProviderView { health, open_batches }
            })
            .collect())
    }

    pub fn provider_health(&self) -> Vec<ProviderHealth> {
        self.providers.iter().map(SharedHealth::snapshot).collect()
    }

    pub fn registry(&self) -> &Registry {
        &self.registry
    }

    pub async fn intake(&self, request: IntakeRequest) -> Result<IntakeOutcome, Error> {
        let new = Self::prepare_intake(&self.registry, request)?;
        let outcome = self.store.intake(new).await?;
        self.count_intake(&outcome);
        Ok(outcome)
    }

    /// Intake for a verified webhook delivery: the delivery id is stored in the same
    /// transaction, and a redelivery returns what the first delivery created.
    pub async fn intake_delivery(
        &self,
        endpoint: &str,
        delivery_id: &str,
        request: IntakeRequest,
    ) -> Result<(IntakeOutcome, bool), Error> {
        // A redelivery is answered before the payload is even checked: it may be a
        // retry of a request whose content we accepted under an older schema set.
        if let Some(record) = self.store.delivered(endpoint.to_string(), delivery_id.to_string()).await? {
            metrics::counter!("commitpoint_webhook_redeliveries_total").increment(1);
            return Ok((IntakeOutcome { created: false, record }, true));
        }
        let new = Self::prepare_intake(&self.registry, request)?;
        match self.store.intake_delivery(endpoint.to_string(), delivery_id.to_string(), new).await? {
            DeliveryOutcome::First(outcome) => {
                self.count_intake(&outcome);
                Ok((outcome, false))
            }
            DeliveryOutcome::Redelivery(record) => {
                metrics::counter!("commitpoint_webhook_redeliveries_total").increment(1);
                Ok((IntakeOutcome { created: false, record }, true))
            }
        }
    }

    fn count_intake(&self, outcome: &IntakeOutcome) {
        let result = if outcome.created { "created" } else { "duplicate" };
        metrics::counter!("commitpoint_intakes_total", "result" => result).increment(1);
        if outcome.created {
            self.arrivals.fetch_add(1, Ordering::Relaxed);
            self.wake_schedulers();
        }
    }

    /// The input checks and identity of an intake, without the store (also run by the fuzzers).
    pub(crate) fn prepare_intake(registry: &Registry, request: IntakeRequest) -> Result<NewExtraction, Error> {
        check_tenant(&request.tenant)?;
        check_text("source_id", &request.source_id, 1024)?;
        if request.content.is_empty() {
            return Err(invalid("content", "must not be empty"));
        }
        let metadata_json = match request.metadata {
            None | Some(Value::Null) => None,
            Some(v @ Value::Object(_)) => Some(v.to_string()),
            Some(_) => return Err(invalid("metadata", "must be a JSON object")),
        };
        let schema = registry.get(&request.schema)?;
        let source_hash = SourceHash::compute(request.content.as_bytes(), schema.name());
        let id = ExtractionId::compute(&request.tenant, &request.source_id, &source_hash, schema.name());
        Ok(NewExtraction {
            id,
            tenant: request.tenant,
            source_id: request.source_id,
            source_hash,
            schema: request.schema,
            metadata_json,
            content: request.content,
        })
    }

    pub async fn get(&self, id: ExtractionId) -> Result<ExtractionRecord, Error> {
        self.store.get(id).await?.ok_or(Error::NotFound(id))
    }

    pub async fn list(&self, filter: ListFilter) -> Result<ListPage, Error> {
        if filter.limit == 0 || filter.limit > MAX_LIST_LIMIT {
            return Err(invalid("limit", format!("must be between 1 and {MAX_LIST_LIMIT}")));
        }
        if let Some(tenant) = &filter.tenant {
            check_tenant(tenant)?;
        }
        Ok(self.store.list(filter).await?)
    }

    pub async fn counts_by_state(&self) -> Result<Vec<StateCount>, Error> {
        Ok(self.store.counts_by_state().await?)
    }

    pub fn store(&self) -> &Store {
        &self.store
    }

    pub async fn findings(&self, id: ExtractionId) -> Result<Vec<FindingRecord>, Error> {
        self.store.findings(id).await?.ok_or(Error::NotFound(id))
    }

    pub async fn claim(&self, request: ClaimRequest) -> Result<Vec<Grant>, Error> {
        check_text("worker", &request.worker, 256)?;
        if request.limit == 0 || request.limit > MAX_CLAIM_LIMIT {
            return Err(invalid("limit", format!("must be between 1 and {MAX_CLAIM_LIMIT}")));
        }
        if request.lease_ms == 0 || request.lease_ms > MAX_LEASE_SECONDS * 1000 {
            return Err(invalid("lease_seconds", format!("must be between 1 and {MAX_LEASE_SECONDS}")));
        }
        if let Some(schema) = &request.schema {
            self.registry.get(schema)?;
        }
        Ok(self.store.claim(request).await?)
    }

    /// Validates the output against the extraction's schema outside the writer, then
    /// commits (or fails) it in one transaction that re-checks the lease.
    pub async fn post_result(&self, id: ExtractionId, request: ResultRequest) -> Result<PostOutcome, Error> {
        check_text("lease_token", &request.lease_token, 256)?;
        let record = self.get(id).await?;
        let schema = self.registry.get(&record.schema)?;
        let (submission, issues) = match schema.validate(&request.output) {
            Ok(findings) => (Submission::Valid { findings, output: request.output }, None),
            Err(issues) => (Submission::Invalid { reason: summarize(&issues) }, Some(issues)),
        };
        let charge = request.usage.map(|u| Charge {
            provider: u.provider,
            job_id: None,
            usage: u.usage,
            latency_ms: u.latency_ms,
            batch: false,
        });
        let post = PostResult { id, authority: Authority::Lease(request.lease_token), submission, charge };
        let outcome = self.store.post_result(post).await?;
        count_outcome(&outcome, "worker");
        match outcome {
            PostOutcome::NotFound => Err(Error::NotFound(id)),
            PostOutcome::Rejected(e) => Err(Error::Transition(e)),
            PostOutcome::Failed { .. } => {
                Err(Error::ValidationFailed { schema: record.schema, issues: issues.unwrap_or_default() })
            }
            outcome => Ok(outcome),
        }
    }

    /// Validates a provider's staged answer and commits it (or fails it) under the
    /// authority of the batch it came from.
    pub async fn commit_ready(&self, item: ReadyItem) -> Result<PostOutcome, Error> {
        let id = item.record.id;
        let Some(batch_key) = item.record.state.batch_key().map(str::to_string) else {
            return Err(Error::Transition(TransitionError::StaleBatch));
        };
        let schema = self.registry.get(&item.record.schema)?;
        // The staged answer names its provider (`worker`) and job (`lease_token`).
        let charge = item.staged.usage.clone().map(|usage| Charge {
            provider: item.staged.worker.clone(),
            job_id: Some(item.staged.lease_token.clone()).filter(|j| !j.is_empty()),
            usage,
            latency_ms: item.staged.latency_ms,
            batch: true,
        });
        let submission = match serde_json::from_str::<Value>(&item.staged.output_json) {
            Ok(output) => match schema.validate(&output) {
                Ok(findings) => Submission::Valid { findings, output },
                Err(issues) => Submission::Invalid { reason: summarize(&issues) },
            },
            Err(e) => Submission::Invalid { reason: format!("the model's answer is not JSON: {e}") },
        };
        let outcome = self
            .store
            .post_result(PostResult { id, authority: Authority::Batch(batch_key), submission, charge })
            .await?;
        count_outcome(&outcome, "provider");
        if matches!(outcome, PostOutcome::Failed { .. }) {
            self.wake_schedulers();
        }
        Ok(outcome)
    }

    pub async fn retry(&self, id: ExtractionId) -> Result<ExtractionRecord, Error> {
        match self.store.retry(id).await? {
            RetryOutcome::Retried(record) => {
                metrics::counter!("commitpoint_retries_total").increment(1);
                self.arrivals.fetch_add(1, Ordering::Relaxed);
                self.wake_schedulers();
                Ok(*record)
            }
            RetryOutcome::NotFound => Err(Error::NotFound(id)),
            RetryOutcome::Rejected(e) => Err(Error::Transition(e)),
        }
    }
}

fn count_outcome(outcome: &PostOutcome, path: &'static str) {
    match outcome {
        PostOutcome::Committed { .. } => metrics::counter!("commitpoint_commits_total", "path" => path).increment(1),
        PostOutcome::Replay { .. } => metrics::counter!("commitpoint_replays_total").increment(1),
        PostOutcome::Failed { .. } => {
            metrics::counter!("commitpoint_failures_total", "class" => "validation").increment(1);
        }
        PostOutcome::NotFound | PostOutcome::Rejected(_) => {}
    }
}

fn summarize(issues: &[ValidationIssue]) -> String {
    let mut text = issues
        .iter()
        .map(|i| format!("{}: {}", if i.path.is_empty() { "/" } else { &i.path }, i.message))
        .collect::<Vec<_>>()
        .join("; ");
    if text.chars().count() > MAX_REASON_CHARS {
        text = text.chars().take(MAX_REASON_CHARS).collect::<String>() + "…";
    }
    text
}

/// Tenants appear in URLs and metrics labels, so they are kept to a safe alphabet.
fn check_tenant(tenant: &str) -> Result<(), Error> {
    let ok = !tenant.is_empty()
        && tenant.len() <= 128
        && tenant.bytes().all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b));
    if ok { Ok(()) } else { Err(invalid("tenant", "must be 1-128 characters of [A-Za-z0-9._-]")) }
}

fn check_text(field: &'static str, value: &str, max_bytes: usize) -> Result<(), Error> {
    if value.is_empty() {
        return Err(invalid(field, "must not be empty"));
    }
    if value.len() > max_bytes {
        return Err(invalid(field, format!("must be at most {max_bytes} bytes")));
    }
    if value.chars().any(char::is_control) {
        return Err(invalid(field, "must not contain control characters"));
    }
    Ok(())
}
