//! The application service behind the HTTP API (worker, tenant and admin endpoints, and
//! the webhook intake): input checks, identity and schema validation, then the store
//! operation through the store seam. Providers' answers do not pass through here: the
//! scheduler commits them with `engine::commit`, which judges outputs by the same rules.
//! The CLI never calls it directly: `serve` builds it through `app::server`, and the
//! client commands go over HTTP.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use serde_json::Value;
use tokio::sync::Notify;

use crate::domain::batch::Usage;
use crate::domain::health::{ProviderHealth, SharedHealth};
use crate::domain::identity::{ExtractionId, IdPrefix};
use crate::domain::lifecycle::TransitionError;
use crate::domain::schema::{self, Registry, ValidationIssue};
use crate::engine::commit::{Committer, Judge, WorkSignals};
use crate::engine::routing::Router;
use crate::engine::supervisor::Failures;
use crate::store::seam::Backend;
use crate::store::{
    self, BackupReport, ExtractionRecord, FindingRecord, ListFilter, ListPage, SharedStore, StateCount, TenantDepth,
};

mod bulk;
mod console;
mod endpoint;
mod erasure;
mod estimates;
mod evaluations;
mod exports;
mod intake;
mod money;
mod outbox;
mod pages;
mod readiness;
mod results;
mod revisions;
mod throughput;

pub use endpoint::{Endpoint, EndpointError, Field, MapError, WebhookOptions};
pub use estimates::WorkerPricing;
pub(crate) use estimates::{EstimateRequest, Estimation, TenantEstimate, estimate_sources};
pub use evaluations::{
    CandidateProgress, EvaluationRequest, EvaluationStatus, MAX_CANDIDATES, PromotionOutcome, SampleState,
    SelectRequest, routing_rule,
};
pub use exports::{
    DEFAULT_MAX_EXPORTS, DEFAULT_MAX_EXPORTS_PER_TENANT, DEFAULT_STALL_TIMEOUT, ExportCap, ExportLimits, ExportPermit,
};
use intake::{check_tenant, check_text};
pub use pages::{DEFAULT_MAX_PAGE_BYTES, MAX_FINDINGS_PAGE};
pub use readiness::Unready;
pub use revisions::{Against, RevisionDiff, Source};
pub use throughput::{MinuteCount, THROUGHPUT_MINUTES};

pub const MAX_CLAIM_LIMIT: usize = 1000;
pub const MAX_LIST_LIMIT: usize = 1000;
pub const MAX_LEASE_SECONDS: u64 = 24 * 3600;
pub use crate::engine::commit::DEFAULT_MAX_FINDINGS;
/// Compact JSON bytes of an intake's `metadata` unless `[limits] max_metadata_bytes` says
/// otherwise: metadata is returned with every listing and claim, so its size multiplies.
pub const DEFAULT_MAX_METADATA_BYTES: usize = 16 * 1024;
/// Tenants with series of their own on `/metrics` unless `[metrics] tenant_series` says.
pub const DEFAULT_TENANT_SERIES: usize = 100;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{field}: {message}")]
    InvalidInput { field: &'static str, message: String },
    #[error(transparent)]
    Schema(#[from] schema::Error),
    #[error("no extraction with id {0}")]
    NotFound(ExtractionId),
    #[error("`after` is not a cursor this listing returned as `next` (cursors belong to one listing of one server)")]
    InvalidCursor,
    #[error(
        "the output has {count} findings, more than the {max} allowed per output \
         (limits.max_findings_per_output); the extraction is now failed (class validation)"
    )]
    TooManyFindings { count: usize, max: usize },
    #[error(transparent)]
    Transition(TransitionError),
    #[error("the output does not satisfy schema {schema}; the extraction is now failed (class validation)")]
    ValidationFailed { schema: String, issues: Vec<ValidationIssue> },
    #[error(
        "the output does not satisfy schema {schema}; the extraction goes back to the queue to be asked again \
         with these issues (re-ask {reask}), and the next claim carries them as previous_attempt"
    )]
    Reasked { schema: String, issues: Vec<ValidationIssue>, reask: u32 },
    #[error("no provider named {0:?} is configured (see GET /v1/admin/providers)")]
    UnknownProvider(String),
    #[error("no evaluation named {0:?}")]
    UnknownEvaluation(String),
    #[error("an evaluation named {0:?} exists already; names are never reused")]
    EvaluationExists(String),
    #[error("no webhook endpoint named {0:?} is configured")]
    UnknownWebhook(String),
    #[error("no outbox event {0}")]
    UnknownEvent(u64),
    #[error("metadata is {bytes} bytes as compact JSON, more than the {max} allowed (limits.max_metadata_bytes)")]
    MetadataTooLarge { bytes: usize, max: usize },
    #[error("{}", too_many_exports(*.cap, *.limit))]
    TooManyExports { cap: ExportCap, limit: usize },
    #[error("tenant {tenant:?} has no extraction of source {source_id:?} under schema {schema:?}")]
    UnknownSource { tenant: String, source_id: String, schema: String },
    /// Two revisions whose findings cannot be compared, and why.
    #[error("{0}")]
    NotComparable(String),
    #[error(transparent)]
    Store(#[from] store::Error),
}

fn too_many_exports(cap: ExportCap, limit: usize) -> String {
    match cap {
        ExportCap::Server => {
            format!("this server already runs {limit} exports (server.max_exports); retry when one has ended")
        }
        ExportCap::Tenant => format!(
            "this tenant already has {limit} exports running (server.max_exports_per_tenant); retry when one has ended"
        ),
    }
}

/// A provider as operators see it: its health plus the jobs it still has in flight.
#[derive(Debug, Clone, serde::Serialize)]
pub struct ProviderView {
    #[serde(flatten)]
    pub health: ProviderHealth,
    pub open_batches: u64,
}

/// Whether `name` can be a tenant at all (the rule intake applies).
pub fn is_tenant_name(name: &str) -> bool {
    check_tenant(name).is_ok()
}

fn invalid(field: &'static str, message: impl Into<String>) -> Error {
    Error::InvalidInput { field, message: message.into() }
}

/// What `ctl status` says of the store: which backend, this instance's name, and who
/// drives each provider.
#[derive(Debug, Clone)]
pub struct StoreStatus {
    pub backend: &'static str,
    pub instance: &'static str,
    pub drivers: Vec<crate::store::ProviderDriver>,
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
    /// `false`: an invalid output fails the extraction now instead of using a re-ask (a
    /// worker that cannot ask again, or knows the answer is hopeless).
    pub reask: bool,
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
    store: SharedStore,
    /// The schemas and the findings cap every output is judged by.
    judge: Judge,
    /// Wakes the schedulers when new work arrives, so batches form without polling, and
    /// counts arrivals so a scheduler can skip looking while too little has arrived.
    signals: WorkSignals,
    providers: Vec<SharedHealth>,
    backup_dir: Option<PathBuf>,
    /// Unix ms of the last successful backup since start (0: none).
    last_backup_ms: Arc<AtomicU64>,
    router: Arc<Router>,
    /// Configured webhook endpoints by name.
    webhooks: Arc<HashMap<String, Endpoint>>,
    /// Wakes outbox delivery (an operator redelivered an event).
    outbox_wake: Option<Arc<Notify>>,
    /// Background tasks that failed: the process is unhealthy and on its way out.
    task_failures: Failures,
    /// Committed and failed per minute, sampled while serving (the console's chart).
    throughput: throughput::Throughput,
    /// The running exports, under their caps.
    exports: Arc<exports::ExportGate>,
    /// `[limits] max_metadata_bytes`.
    max_metadata_bytes: usize,
    /// The most a listing page's records may weigh (`server.max_page_bytes`).
    max_page_bytes: usize,
    /// Tenants with series of their own on `/metrics` (0: none).
    tenant_series: usize,
    /// Providers and prices as `POST /v1/estimates` reads them.
    estimation: Arc<estimates::Estimation>,
    /// The readiness probe's read in flight (`readiness.rs`).
    probe: readiness::Probe,
}

impl Service {
    pub fn new(store: impl Backend + 'static, registry: Registry) -> Self {
        Self::over(Arc::new(store), registry)
    }

    /// The service over a backend chosen at start.
    pub fn over(store: crate::store::SharedStore, registry: Registry) -> Self {
        let throughput = throughput::Throughput::default();
        let mut signals = WorkSignals::default();
        // New work wakes the sampler, which sleeps while nothing is in flight.
        signals.add_scheduler(throughput.wake());
        Self {
            store,
            judge: Judge::new(registry, DEFAULT_MAX_FINDINGS),
            signals,
            providers: Vec::new(),
            backup_dir: None,
            last_backup_ms: Arc::new(AtomicU64::new(0)),
            router: Arc::new(Router::default()),
            webhooks: Arc::new(HashMap::new()),
            outbox_wake: None,
            task_failures: Failures::default(),
            throughput,
            exports: Arc::default(),
            max_metadata_bytes: DEFAULT_MAX_METADATA_BYTES,
            max_page_bytes: DEFAULT_MAX_PAGE_BYTES,
            tenant_series: DEFAULT_TENANT_SERIES,
            estimation: Arc::default(),
            probe: readiness::Probe::default(),
        }
    }

    /// The export caps and the stall deadline (replaces the gate: call before serving).
    pub fn with_export_limits(mut self, limits: ExportLimits) -> Self {
        self.exports = Arc::new(exports::ExportGate::new(limits));
        self
    }

    pub fn with_max_metadata_bytes(mut self, max: usize) -> Self {
        self.max_metadata_bytes = max;
        self
    }

    /// `[metrics] tenant_series`: how many tenants `/metrics` shows one by one.
    pub fn with_tenant_series(mut self, n: usize) -> Self {
        self.tenant_series = n;
        self
    }

    pub fn tenant_series(&self) -> usize {
        self.tenant_series
    }

    pub fn with_max_page_bytes(mut self, max: usize) -> Self {
        self.max_page_bytes = max;
        self
    }

    pub fn with_max_findings(mut self, max: usize) -> Self {
        self.judge = self.judge.with_max_findings(max);
        self
    }

    pub fn with_webhooks(mut self, endpoints: Vec<Endpoint>) -> Self {
        self.webhooks = Arc::new(endpoints.into_iter().map(|e| (e.name.clone(), e)).collect());
        self
    }

    pub fn with_outbox_wake(mut self, wake: Arc<Notify>) -> Self {
        self.outbox_wake = Some(wake);
        self
    }

    pub fn with_task_failures(mut self, failures: Failures) -> Self {
        self.task_failures = failures;
        self
    }

    /// The names of the background tasks that failed (none while healthy).
    pub fn failed_tasks(&self) -> Vec<String> {
        self.task_failures.all().into_iter().map(|f| f.task).collect()
    }

    /// Every provider's scheduler looks for work again (each keeps one wake-up permit).
    pub fn wake_schedulers(&self) {
        self.signals.wake_all();
    }

    /// What a scheduler commits its provider's answers with. Call after every
    /// [`Service::with_scheduler`], so the committer can wake all of them.
    pub fn committer(&self) -> Committer {
        Committer::new(Arc::clone(&self.store), self.judge.clone(), self.signals.clone())
    }

    pub fn signals(&self) -> &WorkSignals {
        &self.signals
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
            metrics::gauge!(crate::domain::metric_names::LAST_BACKUP_SUCCESS_TIMESTAMP_SECONDS).set(ms as f64 / 1000.0);
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
        let stamp = crate::domain::clock::format_ms(crate::domain::clock::now_ms()).replace([':', '.'], "-");
        let report = self.store.backup(dir.join(format!("commitpoint-{stamp}.redb"))).await?;
        let now = crate::domain::clock::now_ms();
        self.last_backup_ms.store(now, Ordering::Relaxed);
        metrics::gauge!(crate::domain::metric_names::LAST_BACKUP_SUCCESS_TIMESTAMP_SECONDS).set(now as f64 / 1000.0);
        Ok(report)
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
        self.signals.add_scheduler(wake);
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
                let open_batches = open.iter().filter(|b| b.provider == health.name.as_str()).count() as u64;
                ProviderView { health, open_batches }
            })
            .collect())
    }

    pub fn provider_health(&self) -> Vec<ProviderHealth> {
        self.providers.iter().map(SharedHealth::snapshot).collect()
    }

    /// The store's backend and, for each provider this server configures, the instance
    /// driving its batches now (on PostgreSQL possibly another one, or none during a
    /// takeover).
    pub async fn store_status(&self) -> Result<StoreStatus, Error> {
        let names = self.provider_health().into_iter().map(|h| h.name).collect();
        Ok(StoreStatus {
            backend: self.store.backend_name(),
            instance: crate::store::this_instance(),
            drivers: self.store.provider_drivers(names).await?,
        })
    }

    pub fn registry(&self) -> &Registry {
        self.judge.registry()
    }

    pub async fn get(&self, id: ExtractionId) -> Result<ExtractionRecord, Error> {
        self.store.get(id).await?.ok_or(Error::NotFound(id))
    }

    /// The extractions (of `tenant`, if given) whose id starts with `prefix`: one when
    /// the prefix is unique, up to `limit` when not.
    pub async fn with_id_prefix(
        &self,
        prefix: IdPrefix,
        tenant: Option<String>,
        limit: usize,
    ) -> Result<Vec<ExtractionRecord>, Error> {
        if limit == 0 || limit > MAX_LIST_LIMIT {
            return Err(invalid("limit", format!("must be between 1 and {MAX_LIST_LIMIT}")));
        }
        Ok(self.store.with_id_prefix(prefix, tenant, limit).await?)
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

    /// Each tenant's work by schema and state, and how long its oldest pending item waits.
    pub async fn depth_by_tenant(&self) -> Result<Vec<TenantDepth>, Error> {
        Ok(self.store.depth_by_tenant().await?)
    }

    pub fn store(&self) -> &SharedStore {
        &self.store
    }

    pub async fn findings(&self, id: ExtractionId) -> Result<Vec<FindingRecord>, Error> {
        self.store.findings(id).await?.ok_or(Error::NotFound(id))
    }
}
