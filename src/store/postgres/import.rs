//! Filling an empty database with a whole store copied from elsewhere (`migrate-store`,
//! redb → PostgreSQL). Everything is written in ONE transaction with binary `COPY`, so an
//! interrupted copy leaves the database as empty as it was. The values keep their stored
//! bytes (format byte + bincode); the columns beside them come from the same functions
//! the live writes use (`rows`, `batches`, `money`), so a copied row is the row the store
//! itself would have written.
//!
//! The transaction also writes a marker (`meta.migrate_store = 'unverified'`). `serve`
//! refuses a database that carries it until the caller has compared the copy with its
//! source and called [`Importer::mark_verified`]: a copy that was never checked never looks complete.

use tokio::sync::mpsc;
use tokio_postgres::{Client, NoTls, Transaction};

use super::import_copy::{ImportRows, write_chunk};
use super::{Error, PgOptions, parse_url, pg};

/// The `meta` key of the migration marker.
const MARKER: &str = "migrate_store";
const UNVERIFIED: &[u8] = b"unverified";
const VERIFIED: &[u8] = b"verified";

/// Every table of the schema: what "empty" is checked on, and what the copy locks.
const TABLES: [&str; 17] = [
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
    "evaluations",
    "trials",
    "trial_batches",
];

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
            ("trial_batch_seq", "trial_batches"),
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
        Some(value) if value != VERIFIED => Err(Error::UnverifiedCopy),
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
