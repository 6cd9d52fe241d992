//! Starting and stopping the service: bind first, open the store, then serve; on stop,
//! drain HTTP, then let the writer commit its last batch and close the file.

use std::net::SocketAddr;
use std::path::PathBuf;

use tokio::net::TcpListener;
use tokio::task::JoinHandle;

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Notify;

use crate::app::config::{self, ProviderKind, ServeOptions};
use crate::app::{provider_registry, secrets};
use crate::domain::schema::{self, Registry};
use crate::engine::routing::Router;
use crate::engine::scheduler::{self, Scheduler};
use crate::engine::supervisor::{Failures, Supervisor};
use crate::http::access::{Access, AccessPolicy};
use crate::service::Service;
use crate::simulator::Simulator;
use crate::store::Policies;
use crate::store::postgres::PgStore;
use crate::store::{self, SharedStore, Store, WriterGuard};

/// How long shutdown waits for in-flight HTTP requests (kept well under systemd's
/// default stop timeout).
const HTTP_DRAIN_DEADLINE: Duration = Duration::from_secs(10);
/// How long shutdown waits for the schedulers and the other background tasks to finish
/// their current step.
const TASK_STOP_DEADLINE: Duration = Duration::from_secs(10);
/// How long shutdown waits for stray reads to let go of the database file.
const FILE_CLOSE_DEADLINE: Duration = Duration::from_secs(5);

#[derive(Debug, thiserror::Error)]
pub(crate) enum Error {
    #[error("cannot listen on {addr}: is another process using it?")]
    Bind {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
    #[error(transparent)]
    Schema(#[from] schema::Error),
    #[error(transparent)]
    Store(#[from] store::Error),
    #[error(transparent)]
    Config(#[from] config::Error),
    #[error(transparent)]
    Providers(#[from] provider_registry::Error),
    #[error("the HTTP server failed")]
    Serve(#[source] std::io::Error),
    #[error("startup task failed: {0}")]
    Task(String),
    #[error(transparent)]
    Secret(#[from] secrets::Error),
}

impl Error {
    /// The store's failure this is, if any: its exit code is the store's (a locked or
    /// unreadable database file is an I/O failure, 74, not a crash).
    pub(crate) fn store(&self) -> Option<&store::Error> {
        match self {
            Error::Store(e) => Some(e),
            _ => None,
        }
    }

    /// Configuration mistakes an operator must fix; restarting will not help.
    pub(crate) fn is_config(&self) -> bool {
        matches!(self, Error::Bind { .. } | Error::Schema(_) | Error::Config(_) | Error::Secret(_))
            || matches!(self, Error::Providers(e) if e.is_config())
    }
}

#[derive(Debug)]
pub(crate) struct Server {
    addr: SocketAddr,
    data_dir: PathBuf,
    /// Every background task, HTTP included.
    supervisor: Supervisor,
    http: JoinHandle<()>,
    /// What a reload can change: routing and budgets, the prices the writer applies, and
    /// the tokens.
    router: Arc<Router>,
    access: Arc<Access>,
    store: Opened,
    sink_names: Vec<String>,
    service: Service,
    /// The embedded simulators of `simulator`-kind providers.
    simulators: Vec<Simulator>,
}

/// The store backend `serve` opened: the embedded redb file (with its writer thread), or
/// a PostgreSQL database shared with other instances.
#[derive(Debug)]
enum Opened {
    Redb { store: Store, writer: WriterGuard },
    Postgres(PgStore),
}

impl Opened {
    async fn open(options: &ServeOptions, password: Option<String>) -> Result<Opened, Error> {
        match &options.store {
            config::StoreChoice::Redb => {
                let data_dir = options.data_dir.clone();
                let cache_bytes = options.cache_bytes;
                let (store, writer) = tokio::task::spawn_blocking(move || {
                    create_private_store_file(&data_dir)?;
                    Store::open(&data_dir, cache_bytes)
                })
                .await
                .map_err(|e| Error::Task(e.to_string()))??;
                Ok(Opened::Redb { store, writer })
            }
            config::StoreChoice::Postgres { url, .. } => {
                let sessions = export_sessions(&options.limits);
                let options = store::postgres::PgOptions { url: url.clone(), password };
                Ok(Opened::Postgres(PgStore::open(&options).await?.with_export_sessions(sessions)?))
            }
        }
    }

    fn set_policies(&self, policies: Policies) {
        match self {
            Opened::Redb { store, .. } => store.set_policies(policies),
            Opened::Postgres(store) => store.set_policies(policies),
        }
    }

    fn shared(&self) -> SharedStore {
        match self {
            Opened::Redb { store, .. } => Arc::new(store.clone()),
            Opened::Postgres(store) => Arc::new(store.clone()),
        }
    }
}

/// The exports' PostgreSQL sessions: one connection per export the server may run, and
/// server-side timeouts a little past the stall deadline, which ends a stalled export
/// first; they end what that deadline cannot reach (a session left idle in its
/// transaction, a query that does not return).
fn export_sessions(limits: &config::ServerLimits) -> store::postgres::ExportSessions {
    const MARGIN: Duration = Duration::from_secs(30);
    store::postgres::ExportSessions {
        connections: limits.max_exports,
        idle_in_transaction: limits.stream_stall_timeout + MARGIN,
        statement: limits.stream_stall_timeout.max(Duration::from_secs(60)),
    }
}

/// The data directory (0700) and an empty store file (0600) when they do not exist yet,
/// so the file holding every tenant's data is never created under the umask's 0644; redb
/// initialises an empty file as a new database. What exists already is left as it is.
fn create_private_store_file(data_dir: &std::path::Path) -> Result<(), store::Error> {
    use crate::domain::private_file;
    private_file::create_dir_all(data_dir)
        .map_err(|source| store::Error::CreateDir { path: data_dir.to_path_buf(), source })?;
    let path = data_dir.join(store::FILE_NAME);
    match private_file::create_new(&path) {
        Ok(_) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(()),
        Err(source) => Err(store::Error::Io { path, what: "create the store file", source }),
    }
}

impl Server {
    pub(crate) async fn start(options: &ServeOptions) -> Result<Server, Error> {
        // Secrets first: a bad token file is a configuration error, before anything binds.
        let access = AccessPolicy::load(
            options.access.admin_token.as_ref(),
            options.access.tenant_tokens.as_ref(),
            options.access.worker_tokens.as_ref(),
        )
        .map_err(config::Error::from)?;
        let secrets::Secrets { store_password, sinks, webhooks } = secrets::load(options)?;
        let listener =
            TcpListener::bind(options.listen).await.map_err(|source| Error::Bind { addr: options.listen, source })?;
        let addr = listener.local_addr().map_err(Error::Serve)?;
        let schema_dir = options.schema_dir.clone();
        let registry = tokio::task::spawn_blocking(move || Registry::load(schema_dir.as_deref()))
            .await
            .map_err(|e| Error::Task(e.to_string()))??;
        registry.check_providers(&options.schema_targets())?;
        let store = Opened::open(options, store_password).await?;
        crate::http::metrics::init();
        let provider_registry::Providers { providers, simulators } =
            provider_registry::build(&options.providers).await?;
        store.set_policies(
            Policies::new(
                sinks.iter().map(|s| s.name.clone()).collect(),
                Arc::new(options.prices.clone()),
                options.fairness.clone(),
            )
            .with_budgets(options.budgets.clone()),
        );
        let supervisor = Supervisor::new();
        crate::app::systemd::spawn_watchdog(store.shared(), &supervisor);
        let router = Arc::new(Router::new(options.routes.clone(), options.budgets.clone()));
        router.set_prices(options.prices.clone());
        let outbox_wake = Arc::new(Notify::new());
        let mut service = Service::over(store.shared(), registry)
            .with_backup_dir(options.data_dir.join("backups"))
            .with_router(Arc::clone(&router))
            .with_webhooks(webhooks)
            .with_outbox_wake(Arc::clone(&outbox_wake))
            .with_max_findings(options.max_findings)
            .with_max_metadata_bytes(options.max_metadata_bytes)
            .with_max_page_bytes(options.limits.max_page_bytes)
            .with_tenant_series(options.tenant_series)
            .with_estimation(crate::service::Estimation::new(
                options.providers.iter().map(crate::app::config::ProviderSettings::estimate_profile).collect(),
                options.prices.clone(),
            ))
            .with_export_limits(options.limits.exports())
            .with_task_failures(supervisor.failures());
        if let Err(e) = service.load_last_backup().await {
            tracing::warn!(error = %e, "cannot read the last backup time");
        }
        let mut wakes = Vec::new();
        for provider in &providers {
            let paused = service.store().provider_paused(provider.adapter.name().to_string()).await?;
            router.set_paused(provider.adapter.name(), paused);
            wakes.push((Arc::new(Notify::new()), paused));
        }
        // Every scheduler gets a service that can wake all of them (and knows every provider).
        let mut healths = Vec::new();
        for (provider, (wake, paused)) in providers.iter().zip(&wakes) {
            let health = crate::domain::health::SharedHealth::new(provider.adapter.name());
            health.set_operator_pause(*paused);
            healths.push(health.clone());
            service = service.with_scheduler(Arc::clone(wake), health);
        }
        for ((provider, (wake, _)), health) in providers.into_iter().zip(wakes).zip(healths) {
            let mut settings = settings_for(provider.kind, &options.scheduler);
            settings.reask = provider.reask;
            settings.driver_lease = options.store.driver_lease();
            let configured = options.providers.iter().find(|p| p.name == provider.adapter.name());
            settings.profile = configured.map(crate::app::config::ProviderSettings::estimate_profile);
            if let Some(configured) = configured {
                settings.min_batch_size = configured.min_batch();
                settings.min_batch_wait = configured.min_batch_wait.unwrap_or(scheduler::DEFAULT_MIN_BATCH_WAIT);
                settings.min_batch_fallback = configured.min_batch_fallback.clone();
            }
            let context = scheduler::Context {
                store: Arc::clone(service.store()),
                committer: service.committer(),
                signals: service.signals().clone(),
                router: Arc::clone(&router),
                registry: service.registry().clone(),
                wake,
                health,
            };
            Scheduler::spawn(context, provider.adapter, settings, &supervisor);
        }
        let sink_names: Vec<String> = sinks.iter().map(|s| s.name.clone()).collect();
        if !sinks.is_empty() {
            crate::engine::outbox::spawn(
                Arc::clone(service.store()),
                service.registry().clone(),
                sinks,
                outbox_wake,
                &supervisor,
            )
            .map_err(|e| Error::Task(e.to_string()))?;
        }
        crate::engine::retention::spawn(
            Arc::clone(service.store()),
            options.retention.policy(),
            options.retention.sweep_interval,
            &supervisor,
        );
        supervisor.spawn("throughput", service.clone().sample_throughput(supervisor.token()));
        let reload_service = service.clone();
        let body =
            crate::http::BodyLimits { max_bytes: options.max_body_bytes, deadline: options.limits.body_read_timeout };
        let hosts = crate::http::HostNames::new(addr, &options.allowed_hosts);
        let allowance = options.access.wrong_token_allowance.unwrap_or(crate::http::DEFAULT_WRONG_TOKEN_ALLOWANCE);
        let access = Arc::new(Access::with_allowance(access, allowance));
        let app = crate::http::router(service, body, Arc::clone(&access), hosts);
        let stop = supervisor.token();
        let serve = crate::http::serve(listener, app, options.limits, async move { stop.cancelled().await });
        let http = supervisor.spawn("http", serve);
        warn_unpriced(options);
        crate::app::write_address(&options.data_dir, addr);
        tracing::info!(%addr, data_dir = %options.data_dir.display(), "commitpoint is serving");
        Ok(Server {
            addr,
            data_dir: options.data_dir.clone(),
            supervisor,
            http,
            router,
            access,
            store,
            sink_names,
            service: reload_service,
            simulators,
        })
    }

    /// Applies a re-read configuration's routing, budgets, prices and tokens (SIGHUP).
    /// Everything else (listen address, providers, sinks, webhooks) takes a restart.
    pub(crate) fn reload(&self, options: &ServeOptions) {
        // Rotating a token must end what the old one opened: the console's session key is
        // derived from the tokens, so swapping them ends those sessions too.
        let tokens = match AccessPolicy::load(
            options.access.admin_token.as_ref(),
            options.access.tenant_tokens.as_ref(),
            options.access.worker_tokens.as_ref(),
        ) {
            Ok(policy) => {
                if self.access.replace(policy) {
                    tracing::warn!("tokens changed: the old ones are refused, console sessions opened with them ended");
                }
                "routing, budgets, prices and tokens apply now"
            }
            Err(e) => {
                tracing::error!(error = %e, "tokens not reloaded: keeping the ones in force");
                "routing, budgets and prices apply now; the tokens in force were kept (see the error above)"
            }
        };
        self.router.configure(options.routes.clone(), options.budgets.clone());
        self.store.set_policies(
            Policies::new(self.sink_names.clone(), Arc::new(options.prices.clone()), options.fairness.clone())
                .with_budgets(options.budgets.clone()),
        );
        self.router.set_prices(options.prices.clone());
        self.service.set_prices(options.prices.clone());
        warn_unpriced(options);
        // Work held or routed elsewhere until now may be free to go.
        self.service.wake_schedulers();
        tracing::info!(
            rules = options.routes.rules.len(),
            budgets = options.budgets.limits.len(),
            prices = options.prices.len(),
            "configuration reloaded: {tokens}; other settings take effect at the next restart"
        );
    }

    pub(crate) fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The first embedded simulator, when one is a provider (the demo turns its faults on).
    pub(crate) fn simulator(&self) -> Option<&Simulator> {
        self.simulators.first()
    }

    pub(crate) fn database_path(&self) -> PathBuf {
        self.data_dir.join(store::FILE_NAME)
    }

    /// Resolves once a background task has failed; the caller should then `stop` and
    /// exit non-zero.
    pub(crate) async fn task_failed(&self) {
        self.supervisor.failed().await;
    }

    /// The background tasks that failed so far (panicked or ended with an error).
    pub(crate) fn task_failures(&self) -> Failures {
        self.supervisor.failures()
    }

    /// Stops accepting, waits for in-flight requests and the background tasks' current
    /// steps, then closes the store.
    pub(crate) async fn stop(mut self) -> Result<(), Error> {
        crate::app::systemd::stopping();
        self.supervisor.shutdown();
        // A client that stalls mid-request must not hold the process (and the store) open
        // past the deadline: after it, remaining connections are cut.
        if tokio::time::timeout(HTTP_DRAIN_DEADLINE, &mut self.http).await.is_err() {
            tracing::warn!(deadline = ?HTTP_DRAIN_DEADLINE, "requests still open at the drain deadline; closing them");
            self.http.abort();
        }
        self.supervisor.stop(TASK_STOP_DEADLINE).await;
        for simulator in self.simulators.drain(..) {
            simulator.stop().await;
        }
        let Opened::Redb { store, writer } = self.store else {
            // Every PostgreSQL write was committed before it was answered: nothing to flush.
            return Ok(());
        };
        tokio::task::spawn_blocking(move || writer.join()).await.map_err(|e| Error::Task(e.to_string()))?;
        // A read started by a request that was cut off may still hold the file for a
        // moment; the file is closed (its lock released) only when the last handle goes.
        drop(self.service);
        if !store.wait_until_last_handle(FILE_CLOSE_DEADLINE).await {
            tracing::warn!("the database file is still referenced at exit; the OS releases it with the process");
        }
        Ok(())
    }
}

/// A synchronous provider has its answers when `submit` returns: small batches keep each
/// submit short, and its "poll" can follow at once.
fn settings_for(kind: ProviderKind, base: &scheduler::Settings) -> scheduler::Settings {
    let mut settings = base.clone();
    if kind.is_synchronous() {
        settings.batch_max_size = settings.batch_max_size.min(32);
        settings.poll_interval = Duration::from_millis(20);
    }
    // The embedded simulator keeps nothing across a restart of `serve`: a job it does not
    // know is gone at the first 404, not after ten minutes of polls answered 404.
    if kind == ProviderKind::Simulator {
        settings.job_gone_after = Duration::ZERO;
    }
    settings
}

/// A provider whose model has no price is booked at $0 and slips past every budget: said at
/// start and at each reload, before its first call (the price table warns at that call too).
fn warn_unpriced(options: &ServeOptions) {
    for gap in options.unpriced_providers() {
        tracing::warn!("{gap}");
    }
}
