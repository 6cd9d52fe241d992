//! Filling an empty database with a whole store copied from elsewhere (`migrate-store`,
//! redb → PostgreSQL). Everything is written in ONE transaction with binary `COPY`, so an
//! interrupted copy leaves the database as empty as it was. The values keep their stored
//! bytes (format byte + bincode); the columns beside them come from the same functions
//! the live writes use (`rows`, `batches`, `money`), so a copied row is the row the store
//! itself would have written.
//!
//! The transaction also writes a marker (`meta.migrate_store = 'unverified'`). `serve`
//! refuses a database that carries it until the caller has compared the copy with its
//! source and called [`mark_verified`]: a copy that was never checked never looks complete.

use std::pin::pin;

use tokio::sync::mpsc;
use tokio_postgres::binary_copy::BinaryCopyInWriter;
use tokio_postgres::types::{ToSql, Type};
use tokio_postgres::{Client, NoTls, Transaction};

use super::batches::{job_of, state_code};
use super::money::delivery_code;
use super::rows::{big, committed_at, fence_of, lease_expiry};
use super::{Error, PgOptions, parse_url, pg};
use crate::store::records::{BatchRecord, ChargeKind, ExtractionRecord, LedgerRecord, OutboxRecord};

/// The `meta` key of the migration marker.
const MARKER: &str = "migrate_store";
const UNVERIFIED: &[u8] = b"unverified";
const VERIFIED: &[u8] = b"verified";

/// Every table of the schema: what "empty" is checked on, and what the copy locks.
const TABLES: [&str; 14] = [
    "meta",
    "extractions",
    "findings",
    "results",
    "ledger",
    "spend",
    "outbox",
    "sink_disabled",
    "webhook_deliveries",
    "batches",
    "batch_members",
    "staged",
    "provider_pause",
    "provider_leases",
];

/// One extraction as stored: its decoded record (for the columns), the record's bytes and
/// the content's bytes, both as the store encoded them.
#[derive(Debug)]
pub struct ExtractionRow {
    pub record: ExtractionRecord,
    pub bytes: Vec<u8>,
    pub content: Vec<u8>,
}

/// A chunk of rows of one kind, in an order that satisfies the foreign keys: extractions
/// before what refers to them, batches before their members.
#[derive(Debug)]
pub enum ImportRows {
    Extractions(Vec<ExtractionRow>),
    /// (extraction seq, finding key, stored bytes).
    Findings(Vec<(u64, [u8; 32], Vec<u8>)>),
    /// (extraction seq, stored bytes).
    Results(Vec<(u64, Vec<u8>)>),
    Staged(Vec<(u64, Vec<u8>)>),
    Ledger(Vec<(LedgerRecord, Vec<u8>)>),
    /// (tenant, UTC day, micro-dollars).
    Spend(Vec<(String, u64, u64)>),
    Outbox(Vec<(OutboxRecord, Vec<u8>)>),
    /// (endpoint, delivery id, extraction seq).
    Deliveries(Vec<(String, String, u64)>),
    Batches(Vec<(BatchRecord, Vec<u8>)>),
    /// What is not a row of a table of its own on redb (flags and keys kept in `META`).
    Settings(Settings),
}

impl ImportRows {
    pub fn len(&self) -> usize {
        match self {
            ImportRows::Extractions(v) => v.len(),
            ImportRows::Findings(v) => v.len(),
            ImportRows::Results(v) | ImportRows::Staged(v) => v.len(),
            ImportRows::Ledger(v) => v.len(),
            ImportRows::Spend(v) => v.len(),
            ImportRows::Outbox(v) => v.len(),
            ImportRows::Deliveries(v) => v.len(),
            ImportRows::Batches(v) => v.len(),
            ImportRows::Settings(s) => s.paused.len() + s.sinks_disabled.len() + usize::from(s.cursor_key.is_some()),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[derive(Debug, Default)]
pub struct Settings {
    /// The key behind page cursors and console sessions: kept, so both stay valid.
    pub cursor_key: Option<[u8; 32]>,
    /// (provider, paused).
    pub paused: Vec<(String, bool)>,
    pub sinks_disabled: Vec<String>,
}

/// Rows per table after the copy, read back inside its transaction.
pub type TableCounts = Vec<(&'static str, u64)>;

/// What went wrong before anything was committed.
#[derive(Debug, thiserror::Error)]
pub enum ImportError {
    #[error(
        "the target database is not empty ({0}); migrate-store copies only into an empty database: \
         create a new one (createdb) and run it again"
    )]
    NotEmpty(String),
    #[error("the target database is in use (its tables stayed locked for 10 s); stop every server on it first")]
    InUse,
    /// The rows read back in the copy's transaction are not what the source holds; the
    /// transaction was rolled back.
    #[error("the copy was rolled back: {}", .0.join("; "))]
    Counts(Vec<String>),
    #[error(transparent)]
    Store(#[from] Error),
}

/// One connection, and the copy's single transaction on it.
pub struct Importer {
    client: Client,
    connection: tokio::task::JoinHandle<()>,
}

impl std::fmt::Debug for Importer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Importer")
    }
}

impl Importer {
    /// Connects and brings the schema to this build's version (as `serve` would).
    pub async fn connect(options: &PgOptions) -> Result<Importer, Error> {
        let config = parse_url(options)?;
        super::migrate(&config).await?;
        let (client, connection) = config.connect(NoTls).await.map_err(pg("cannot connect"))?;
        let connection = tokio::spawn(async move {
            if let Err(e) = connection.await {
                tracing::warn!(error = %e, "migration connection ended");
            }
        });
        Ok(Importer { client, connection })
    }

    /// Refuses a database holding anything, takes every table exclusively, writes each
    /// chunk `rows` yields, moves the sequences past the copied numbers, counts every
    /// table, and commits with the `unverified` marker only if each count is the
    /// `expected` one: a sender that stopped early (a read error) leaves nothing behind.
    /// `progress` hears of each chunk written.
    pub async fn import(
        &mut self,
        mut rows: mpsc::Receiver<ImportRows>,
        expected: &[(&'static str, u64)],
        progress: &(dyn Fn(&ImportRows) + Send + Sync),
    ) -> Result<TableCounts, ImportError> {
        let tx = self.client.transaction().await.map_err(pg("cannot begin the copy's transaction"))?;
        lock_and_check_empty(&tx).await?;
        while let Some(chunk) = rows.recv().await {
            write_chunk(&tx, &chunk).await?;
            progress(&chunk);
        }
        let sequences = [
            ("extraction_seq", "extractions"),
            ("ledger_seq", "ledger"),
            ("outbox_seq", "outbox"),
            ("batch_seq", "batches"),
        ];
        for (sequence, table) in sequences {
            // The next number handed out follows the highest one copied, as on redb.
            let sql = format!(
                "SELECT setval('{sequence}', coalesce((SELECT max(seq) FROM {table}), 1), \
                 (SELECT max(seq) IS NOT NULL FROM {table}))"
            );
            tx.execute(sql.as_str(), &[]).await.map_err(pg("cannot move a sequence"))?;
        }
        tx.execute("INSERT INTO meta (key, value) VALUES ($1, $2)", &[&MARKER, &UNVERIFIED])
            .await
            .map_err(pg("cannot write the migration marker"))?;
        let counts = count_tables(&tx).await?;
        let differ: Vec<String> = expected
            .iter()
            .filter_map(|(table, want)| {
                let got = counts.iter().find(|(t, _)| t == table).map_or(0, |(_, n)| *n);
                (got != *want).then(|| format!("table {table}: {want} rows in the source, {got} copied"))
            })
            .collect();
        if !differ.is_empty() {
            return Err(ImportError::Counts(differ));
        }
        tx.commit().await.map_err(pg("the copy's commit failed"))?;
        Ok(counts)
    }

    /// Called once the copy was compared with its source: `serve` may use it from now on.
    pub async fn mark_verified(&self) -> Result<(), Error> {
        self.client
            .execute("UPDATE meta SET value = $2 WHERE key = $1", &[&MARKER, &VERIFIED])
            .await
            .map_err(pg("cannot mark the copy verified"))?;
        Ok(())
    }

    pub async fn close(self) {
        drop(self.client);
        let _ = self.connection.await;
    }
}

/// `serve` on a database whose copy was never verified is refused.
pub(super) async fn refuse_unverified(client: &Client) -> Result<(), Error> {
    let row = client
        .query_opt("SELECT value FROM meta WHERE key = $1", &[&MARKER])
        .await
        .map_err(pg("cannot read the migration marker"))?;
    match row.map(|r| r.get::<_, Vec<u8>>(0)) {
        Some(value) if value != VERIFIED => Err(Error::Unavailable {
            reason: "this database holds a migrate-store copy that was never verified (the migration failed or \
                     was interrupted): drop it, create an empty database and run migrate-store again"
                .into(),
            cause: None,
        }),
        _ => Ok(()),
    }
}

async fn lock_and_check_empty(tx: &Transaction<'_>) -> Result<(), ImportError> {
    tx.execute("SET LOCAL lock_timeout = '10s'", &[]).await.map_err(pg("cannot set the lock timeout"))?;
    let lock = format!("LOCK TABLE {} IN ACCESS EXCLUSIVE MODE", TABLES.join(", "));
    if let Err(e) = tx.execute(lock.as_str(), &[]).await {
        if e.code() == Some(&tokio_postgres::error::SqlState::LOCK_NOT_AVAILABLE) {
            return Err(ImportError::InUse);
        }
        return Err(pg("cannot lock the target's tables")(e).into());
    }
    let mut held = Vec::new();
    for (table, n) in count_tables(tx).await? {
        if n > 0 {
            held.push(format!("{table}: {n} row{}", if n == 1 { "" } else { "s" }));
        }
    }
    if !held.is_empty() {
        return Err(ImportError::NotEmpty(held.join(", ")));
    }
    Ok(())
}

async fn count_tables(tx: &Transaction<'_>) -> Result<TableCounts, Error> {
    let mut counts = Vec::with_capacity(TABLES.len());
    for table in TABLES {
        let sql = format!("SELECT count(*) FROM {table}");
        let n: i64 = tx.query_one(sql.as_str(), &[]).await.map_err(pg("cannot count a table"))?.get(0);
        counts.push((table, u64::try_from(n).unwrap_or(0)));
    }
    Ok(counts)
}

/// One binary `COPY` of `rows` into `into`.
async fn copy<R>(
    tx: &Transaction<'_>,
    into: &str,
    types: &[Type],
    rows: impl IntoIterator<Item = R>,
    values: impl Fn(&R) -> Vec<Box<dyn ToSql + Sync + Send + '_>>,
) -> Result<(), Error>
where
    R: Send,
{
    let sink =
        tx.copy_in(format!("COPY {into} FROM STDIN BINARY").as_str()).await.map_err(pg("cannot start a COPY"))?;
    let mut writer = pin!(BinaryCopyInWriter::new(sink, types));
    for row in rows {
        let owned = values(&row);
        let refs: Vec<&(dyn ToSql + Sync)> = owned.iter().map(|v| &**v as &(dyn ToSql + Sync)).collect();
        writer.as_mut().write(&refs).await.map_err(pg("cannot copy a row"))?;
    }
    writer.finish().await.map_err(pg("cannot finish a COPY"))?;
    Ok(())
}

fn format_of(bytes: &[u8]) -> i16 {
    bytes.first().map_or(0, |b| i16::from(*b))
}

async fn write_chunk(tx: &Transaction<'_>, chunk: &ImportRows) -> Result<(), Error> {
    use Type as T;
    match chunk {
        ImportRows::Extractions(rows) => {
            copy(
                tx,
                "extractions (id, seq, tenant, schema_name, state_code, fence, lease_expires_at_ms, committed_at_ms, \
                 updated_at_ms, format, record, content)",
                &[
                    T::BYTEA,
                    T::INT8,
                    T::TEXT,
                    T::TEXT,
                    T::INT2,
                    T::TEXT,
                    T::INT8,
                    T::INT8,
                    T::INT8,
                    T::INT2,
                    T::BYTEA,
                    T::BYTEA,
                ],
                rows,
                |row| {
                    let r = &row.record;
                    vec![
                        Box::new(r.id.as_bytes().to_vec()),
                        Box::new(big(r.seq)),
                        Box::new(r.tenant.as_str()),
                        Box::new(r.schema.as_str()),
                        Box::new(i16::from(r.state.name().code())),
                        Box::new(fence_of(&r.state)),
                        Box::new(lease_expiry(&r.state)),
                        Box::new(committed_at(&r.state)),
                        Box::new(big(r.updated_at_ms)),
                        Box::new(format_of(&row.bytes)),
                        Box::new(row.bytes.as_slice()),
                        Box::new(row.content.as_slice()),
                    ]
                },
            )
            .await
        }
        ImportRows::Findings(rows) => {
            copy(
                tx,
                "findings (extraction_seq, key, format, record)",
                &[T::INT8, T::BYTEA, T::INT2, T::BYTEA],
                rows,
                |(seq, key, bytes)| {
                    vec![
                        Box::new(big(*seq)),
                        Box::new(key.as_slice()),
                        Box::new(format_of(bytes)),
                        Box::new(bytes.as_slice()),
                    ]
                },
            )
            .await
        }
        ImportRows::Results(rows) => copy_keyed(tx, "results", rows).await,
        ImportRows::Staged(rows) => copy_keyed(tx, "staged", rows).await,
        ImportRows::Ledger(rows) => copy(
            tx,
            "ledger (seq, tenant, at_ms, extraction_seq, provider, request_id, replay, cost_micros, format, record)",
            &[T::INT8, T::TEXT, T::INT8, T::INT8, T::TEXT, T::TEXT, T::BOOL, T::INT8, T::INT2, T::BYTEA],
            rows,
            |(entry, bytes)| {
                vec![
                    Box::new(big(entry.seq)),
                    Box::new(entry.tenant.as_str()),
                    Box::new(big(entry.at_ms)),
                    Box::new(big(entry.extraction_seq)),
                    Box::new(entry.provider.as_str()),
                    Box::new(entry.usage.request_id.as_deref()),
                    Box::new(entry.kind == ChargeKind::Replay),
                    Box::new(big(entry.cost_micros)),
                    Box::new(format_of(bytes)),
                    Box::new(bytes.as_slice()),
                ]
            },
        )
        .await,
        ImportRows::Spend(rows) => {
            copy(tx, "spend (tenant, day, micros)", &[T::TEXT, T::INT8, T::INT8], rows, |(tenant, day, micros)| {
                vec![Box::new(tenant.as_str()), Box::new(big(*day)), Box::new(big(*micros))]
            })
            .await
        }
        ImportRows::Outbox(rows) => {
            copy(
                tx,
                "outbox (seq, event_id, sink, state_code, next_attempt_at_ms, format, record)",
                &[T::INT8, T::TEXT, T::TEXT, T::INT2, T::INT8, T::INT2, T::BYTEA],
                rows,
                |(event, bytes)| {
                    vec![
                        Box::new(big(event.seq)),
                        Box::new(event.event_id.as_str()),
                        Box::new(event.sink.as_str()),
                        Box::new(delivery_code(&event.state)),
                        Box::new(big(event.next_attempt_at_ms)),
                        Box::new(format_of(bytes)),
                        Box::new(bytes.as_slice()),
                    ]
                },
            )
            .await
        }
        ImportRows::Deliveries(rows) => {
            copy(
                tx,
                "webhook_deliveries (endpoint, delivery_id, extraction_seq)",
                &[T::TEXT, T::TEXT, T::INT8],
                rows,
                |(endpoint, delivery, seq)| {
                    vec![Box::new(endpoint.as_str()), Box::new(delivery.as_str()), Box::new(big(*seq))]
                },
            )
            .await
        }
        ImportRows::Batches(rows) => {
            copy(
                tx,
                "batches (seq, batch_key, provider, state_code, job_id, next_action_at_ms, created_at_ms, format, record)",
                &[T::INT8, T::TEXT, T::TEXT, T::INT2, T::TEXT, T::INT8, T::INT8, T::INT2, T::BYTEA],
                rows,
                |(batch, bytes)| {
                    vec![
                        Box::new(big(batch.seq)),
                        Box::new(batch.batch_key.as_str()),
                        Box::new(batch.provider.as_str()),
                        Box::new(state_code(&batch.state)),
                        Box::new(job_of(&batch.state)),
                        Box::new(big(batch.next_action_at_ms)),
                        Box::new(big(batch.created_at_ms)),
                        Box::new(format_of(bytes)),
                        Box::new(bytes.as_slice()),
                    ]
                },
            )
            .await?;
            // The member list the live store keeps beside each batch is its record's list.
            let members = rows.iter().flat_map(|(batch, _)| batch.members.iter().map(|&m| (batch.seq, m)));
            copy(tx, "batch_members (batch_seq, extraction_seq)", &[T::INT8, T::INT8], members, |(batch, member)| {
                vec![Box::new(big(*batch)), Box::new(big(*member))]
            })
            .await
        }
        ImportRows::Settings(settings) => write_settings(tx, settings).await,
    }
}

async fn copy_keyed(tx: &Transaction<'_>, table: &str, rows: &[(u64, Vec<u8>)]) -> Result<(), Error> {
    use Type as T;
    let into = format!("{table} (extraction_seq, format, record)");
    copy(tx, &into, &[T::INT8, T::INT2, T::BYTEA], rows, |(seq, bytes)| {
        vec![Box::new(big(*seq)), Box::new(format_of(bytes)), Box::new(bytes.as_slice())]
    })
    .await
}

async fn write_settings(tx: &Transaction<'_>, settings: &Settings) -> Result<(), Error> {
    if let Some(key) = &settings.cursor_key {
        tx.execute("INSERT INTO meta (key, value) VALUES ('cursor_key', $1)", &[&key.as_slice()])
            .await
            .map_err(pg("cannot copy the cursor key"))?;
    }
    for (provider, paused) in &settings.paused {
        tx.execute("INSERT INTO provider_pause (provider, paused) VALUES ($1, $2)", &[provider, paused])
            .await
            .map_err(pg("cannot copy a provider's pause"))?;
    }
    for sink in &settings.sinks_disabled {
        tx.execute("INSERT INTO sink_disabled (sink) VALUES ($1)", &[sink])
            .await
            .map_err(pg("cannot copy a sink's state"))?;
    }
    Ok(())
}
