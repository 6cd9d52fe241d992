//! The store on PostgreSQL: the second backend behind the seam, for deployments that
//! outgrow one host. Several `serve` processes may share one database.
//!
//! The invariants are the redb store's, kept by PostgreSQL's own means: the identity is
//! the primary key and intake is `INSERT … ON CONFLICT DO NOTHING`; claims take rows with
//! `FOR UPDATE SKIP LOCKED`; a result's `UPDATE` repeats the fence it was checked against
//! in its `WHERE`; every write of one operation is one transaction, and the answer is
//! given only after `COMMIT` returns with `synchronous_commit = on`. Values keep the
//! store's encoding (format byte + bincode), so the lifecycle and the records are shared
//! with redb; only the indexes are SQL.

mod batch_reads;
mod batches;
mod driver_status;
mod drivers;
mod dump;
mod erase;
mod evaluations;
mod export;
mod extractions;
mod import;
mod import_copy;
mod intake_group;
mod ledger;
mod outbox;
mod pending_queue;
mod reads;
mod retention;
mod revisions;
mod rows;
mod seam;
mod sql;
mod staging;
mod upkeep;
mod verify;

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, RwLock};

use deadpool_postgres::{Manager, ManagerConfig, Pool, RecyclingMethod};
use tokio_postgres::NoTls;

pub use dump::dump_database;

use super::{Error, Policies};
use crate::domain::cursor::CursorKey;
pub use import::{ImportError, Importer, TableCounts};
pub use import_copy::{ExtractionRow, ImportRows, Settings as ImportSettings};
pub use verify::verify;

mod embedded {
    refinery::embed_migrations!("src/store/postgres/migrations");
}

/// The work of one transaction, borrowing it.
type TxFuture<'t, T> = Pin<Box<dyn Future<Output = Result<T, Error>> + Send + 't>>;

/// The advisory lock key migrations hold (any constant no other user of the database takes).
const MIGRATION_LOCK: i64 = 0x636f_6d6d_6974;

/// Connections one process keeps open at most.
const POOL_SIZE: usize = 16;

/// A serving transaction waits on nothing but its own statements, so one idle this long
/// belongs to a process that was paused or cut off mid-transaction. The server ends its
/// session, which releases its row locks: a driver paused inside a batch write would
/// otherwise hold that batch, and the provider's lease row, from the instance taking over.
const SERVING_IDLE_IN_TRANSACTION: std::time::Duration = std::time::Duration::from_secs(10);

/// The sessions exports read on: a pool of their own, so exports can never take the
/// connections intake and every other read need (16 stalled exports once held them all,
/// issue 30), with server-side timeouts that end a session whose export stopped moving
/// (an open REPEATABLE READ transaction also holds back vacuum).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ExportSessions {
    /// The pool's size: the server's cap on concurrent exports.
    pub connections: usize,
    /// `idle_in_transaction_session_timeout`: the session ends when its export has been
    /// waiting on its client (between two pages) this long.
    pub idle_in_transaction: std::time::Duration,
    /// `statement_timeout`: one page's query may run this long.
    pub statement: std::time::Duration,
}

impl Default for ExportSessions {
    /// `connections` is the default of `server.max_exports`.
    fn default() -> Self {
        Self {
            connections: 8,
            idle_in_transaction: std::time::Duration::from_secs(60),
            statement: std::time::Duration::from_secs(60),
        }
    }
}

fn build_pool(config: tokio_postgres::Config, size: usize) -> Result<Pool, Error> {
    let manager = Manager::from_config(config, NoTls, ManagerConfig { recycling_method: RecyclingMethod::Fast });
    Pool::builder(manager)
        .max_size(size)
        .build()
        .map_err(|e| Error::Postgres { context: "cannot build the connection pool", source: Box::new(e) })
}

fn export_pool(config: &tokio_postgres::Config, sessions: ExportSessions) -> Result<Pool, Error> {
    let mut config = config.clone();
    let options = format!(
        "{} -c idle_in_transaction_session_timeout={} -c statement_timeout={}",
        config.get_options().unwrap_or_default(),
        sessions.idle_in_transaction.as_millis().max(1),
        sessions.statement.as_millis().max(1)
    );
    config.options(options.trim_start());
    build_pool(config, sessions.connections.max(1))
}

fn serving_pool(config: &tokio_postgres::Config) -> Result<Pool, Error> {
    let mut config = config.clone();
    let options = format!(
        "{} -c idle_in_transaction_session_timeout={}",
        config.get_options().unwrap_or_default(),
        SERVING_IDLE_IN_TRANSACTION.as_millis()
    );
    config.options(options.trim_start());
    build_pool(config, POOL_SIZE)
}

/// Where the database is and how to log in. The password comes from a secret reference
/// the caller has already read; it is never part of the URL in a configuration file.
#[derive(Clone)]
pub struct PgOptions {
    pub url: String,
    pub password: Option<String>,
}

impl std::fmt::Debug for PgOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgOptions")
            .field("url", &self.url)
            .field("password", &self.password.as_ref().map(|_| "<redacted>"))
            .finish()
    }
}

/// A cheap, cloneable handle on the PostgreSQL store.
#[derive(Debug, Clone)]
pub struct PgStore {
    pool: Pool,
    /// Exports only (see [`ExportSessions`]).
    export_pool: Pool,
    /// For the export pool, rebuilt with its own session settings.
    config: Arc<tokio_postgres::Config>,
    policies: Arc<RwLock<Arc<Policies>>>,
    cursor_key: CursorKey,
    /// The provider terms this process drives in, which its batch writes are checked by.
    held: drivers::HeldTerms,
    /// Intakes waiting for a shared commit.
    intake: intake_group::Group,
}

pub(super) fn pg(context: &'static str) -> impl FnOnce(tokio_postgres::Error) -> Error {
    move |e| {
        use tokio_postgres::error::SqlState;
        let raced = matches!(e.code(), Some(&SqlState::T_R_SERIALIZATION_FAILURE | &SqlState::T_R_DEADLOCK_DETECTED));
        let failure = Error::Postgres { context, source: Box::new(e) };
        if raced { Error::Conflict { reason: context.to_string(), cause: Some(Box::new(failure)) } } else { failure }
    }
}

/// A read-only REPEATABLE READ transaction: one consistent view of every table while
/// instances keep committing (export, dump, verify).
pub(super) async fn snapshot(client: &mut tokio_postgres::Client) -> Result<tokio_postgres::Transaction<'_>, Error> {
    client
        .build_transaction()
        .isolation_level(tokio_postgres::IsolationLevel::RepeatableRead)
        .read_only(true)
        .start()
        .await
        .map_err(pg("cannot start a read-only snapshot"))
}

/// Parses a `postgres://` URL (or key=value string) and applies what this store needs of
/// every session: results acknowledged only once durable.
pub fn parse_url(options: &PgOptions) -> Result<tokio_postgres::Config, Error> {
    let mut config: tokio_postgres::Config = options.url.parse().map_err(|e: tokio_postgres::Error| {
        Error::Postgres { context: "the store URL is invalid", source: Box::new(e) }
    })?;
    if let Some(password) = &options.password {
        config.password(password);
    }
    config.application_name(driver_status::application_name());
    config.options("-c synchronous_commit=on -c default_transaction_isolation=read\\ committed");
    Ok(config)
}

impl PgStore {
    /// Connects, applies the migrations this build carries (refusing a database whose
    /// schema is newer), and reads (or makes) the cursor key.
    pub async fn open(options: &PgOptions) -> Result<PgStore, Error> {
        let store = Self::open_unchecked(options).await?;
        import::refuse_unverified(&*store.client().await?).await?;
        Ok(store)
    }

    /// `open` without the refusal of an unverified `migrate-store` copy: what the
    /// migration itself uses to compare that copy with its source.
    pub async fn open_unchecked(options: &PgOptions) -> Result<PgStore, Error> {
        let config = parse_url(options)?;
        migrate(&config).await?;
        let pool = serving_pool(&config)?;
        let export_pool = export_pool(&config, ExportSessions::default())?;
        let store = PgStore {
            intake: intake_group::Group::start(pool.clone()),
            pool,
            export_pool,
            config: Arc::new(config),
            policies: Arc::default(),
            cursor_key: CursorKey::new([0; 32]),
            held: drivers::HeldTerms::default(),
        };
        let cursor_key = store.load_cursor_key().await?;
        revisions::backfill(&*store.client().await?).await?;
        Ok(PgStore { cursor_key, ..store })
    }

    /// Exports read on sessions with these settings from now on (the pool connects lazily,
    /// so replacing it before serving costs nothing).
    pub fn with_export_sessions(mut self, sessions: ExportSessions) -> Result<Self, Error> {
        self.export_pool = export_pool(&self.config, sessions)?;
        Ok(self)
    }

    /// Sets the outbox sinks and the pricing used from the next write on.
    pub fn set_policies(&self, policies: Policies) {
        crate::store::policies::replace(&self.policies, policies);
    }

    pub fn cursor_key(&self) -> &CursorKey {
        &self.cursor_key
    }

    fn policies(&self) -> Arc<Policies> {
        crate::store::policies::current(&self.policies)
    }

    async fn client(&self) -> Result<deadpool_postgres::Object, Error> {
        self.pool.get().await.map_err(|e| Error::Postgres { context: "no database connection", source: Box::new(e) })
    }

    async fn export_client(&self) -> Result<deadpool_postgres::Object, Error> {
        self.export_pool
            .get()
            .await
            .map_err(|e| Error::Postgres { context: "no database connection for an export", source: Box::new(e) })
    }

    async fn load_cursor_key(&self) -> Result<CursorKey, Error> {
        let client = self.client().await?;
        let fresh: [u8; 32] = rand::random();
        // Two instances starting at once both offer a key; the first insert wins for both.
        client
            .execute(
                "INSERT INTO meta (key, value) VALUES ('cursor_key', $1) ON CONFLICT (key) DO NOTHING",
                &[&fresh.as_slice()],
            )
            .await
            .map_err(pg("cannot store the cursor key"))?;
        let row = client
            .query_one("SELECT value FROM meta WHERE key = 'cursor_key'", &[])
            .await
            .map_err(pg("cannot read the cursor key"))?;
        let bytes: Vec<u8> = row.get(0);
        let key: [u8; 32] =
            bytes.try_into().map_err(|_| Error::Corrupt { kind: "cursor key", reason: "not 32 bytes".into() })?;
        Ok(CursorKey::new(key))
    }
}

/// The newest schema version this build's migrations create.
pub fn known_schema_version() -> i64 {
    embedded::migrations::runner().get_migrations().iter().map(|m| i64::from(m.version())).max().unwrap_or(0)
}

/// The newest migration applied to the database; `None` before the first.
async fn schema_version(client: &tokio_postgres::Client) -> Result<Option<i64>, Error> {
    let has_history: bool = client
        .query_one("SELECT to_regclass('refinery_schema_history') IS NOT NULL", &[])
        .await
        .map_err(pg("cannot read the schema version"))?
        .get(0);
    if !has_history {
        return Ok(None);
    }
    client
        .query_one("SELECT max(version)::bigint FROM refinery_schema_history", &[])
        .await
        .map_err(pg("cannot read the schema version"))
        .map(|row| row.get(0))
}

/// Applies the embedded migrations in one connection. A database migrated by a newer
/// build is refused before anything is written: this build would not know its tables.
async fn migrate(config: &tokio_postgres::Config) -> Result<(), Error> {
    let (mut client, connection) = config.connect(NoTls).await.map_err(pg("cannot connect"))?;
    let task = tokio::spawn(async move {
        if let Err(e) = connection.await {
            tracing::warn!(error = %e, "migration connection ended");
        }
    });
    let result = async {
        // Instances started together migrate one after the other.
        client
            .execute("SELECT pg_advisory_lock($1)", &[&MIGRATION_LOCK])
            .await
            .map_err(pg("cannot take the migration lock"))?;
        let found = schema_version(&client).await?;
        let known = known_schema_version();
        if let Some(found) = found.filter(|&found| found > known) {
            return Err(Error::SchemaTooNew { found, known });
        }
        embedded::migrations::runner()
            .set_abort_divergent(true)
            .run_async(&mut client)
            .await
            .map_err(|e| Error::Postgres { context: "schema migration failed", source: Box::new(e) })?;
        Ok(())
    }
    .await;
    drop(client);
    let _ = task.await;
    result
}
