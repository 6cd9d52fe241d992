//! `migrate-store`: a whole redb store copied into an empty PostgreSQL database, then
//! compared with it through both backends' read APIs.
//!
//! The redb file is opened exclusively (a running server holds it locked) and read in ONE
//! read transaction on a blocking thread, which hands chunks of rows to the PostgreSQL
//! side (`postgres::Importer`: one transaction, binary `COPY`). What redb holds and the
//! schema has no place for (retention marks, erased spend, an erased sequence floor, a
//! table or `META` key this build does not know) is refused before anything is written.
//! The derived tables (identity, state, tenant, lease, commit and pending indexes, state
//! counts, open batches, outbox due/dead lists, ledger indexes) are not copied: PostgreSQL
//! keeps its own indexes on the copied columns.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use redb::{Database, ReadTransaction, ReadableDatabase, ReadableTable, ReadableTableMetadata, TableHandle};
use tokio::sync::mpsc;

use super::codec::decode;
use super::migrate_compare::{Comparison, compare};
use super::postgres::{ExtractionRow, ImportError, ImportRows, ImportSettings, Importer, PgOptions, PgStore};
use super::records::{BatchRecord, ExtractionRecord, LedgerRecord, OutboxRecord};
use super::{Error, Store, tables};
use crate::store::evaluation::{EvaluationRecord, TrialBatchRecord};

/// Rows per `COPY` chunk: large enough to amortise a round trip, small enough that two
/// chunks in flight of 2 KiB contents stay a few MiB.
const CHUNK: usize = 2_000;
const CACHE_BYTES: usize = 64 << 20;

/// Hears how far the migration is: a phase with its number of steps, then steps done.
pub trait MigrateProgress: Send + Sync {
    fn phase(&self, name: &'static str, total: u64);
    fn advance(&self, steps: u64);
}

#[derive(Debug, thiserror::Error)]
pub enum MigrateError {
    /// The file is missing, unreadable or held by a running server.
    #[error("{path}: cannot open the redb file (is a server still running on it?)")]
    Source {
        path: PathBuf,
        #[source]
        source: Error,
    },
    #[error(
        "{0}\nnothing was written: these have no PostgreSQL counterpart yet (docs/SCALE-OUT.md, \
         \"Moving from redb to PostgreSQL\")"
    )]
    Unmappable(String),
    #[error(transparent)]
    Target(#[from] ImportError),
    #[error("the copy differs from its source: {}", .0.join("; "))]
    Mismatch(Vec<String>),
    #[error(transparent)]
    Store(#[from] Error),
}

/// What was copied and how long each part took.
#[derive(Debug)]
pub struct MigrateReport {
    /// Rows per PostgreSQL table, counted in the copy's transaction.
    pub tables: Vec<(&'static str, u64)>,
    pub rows: u64,
    pub copy: Duration,
    pub comparison: Comparison,
    pub compare: Duration,
    /// `verify` on the copy, after the comparison.
    pub verify: Duration,
    /// What redb kept that has no meaning on PostgreSQL and was left behind, said aloud.
    pub not_copied: Vec<String>,
}

/// The source's survey: what it holds, so the copy's counts can be checked against it.
#[derive(Debug, Default)]
struct Survey {
    expected: Vec<(&'static str, u64)>,
    refused: Vec<String>,
    not_copied: Vec<String>,
    settings: ImportSettings,
}

/// Copies the store in `from` into the empty database `to`, compares the two, and marks
/// the copy verified. Any failure leaves the database either untouched (before the copy
/// commits) or marked unverified, which `serve` refuses.
pub async fn migrate_store(
    from: &Path,
    to: &PgOptions,
    progress: Arc<dyn MigrateProgress>,
) -> Result<MigrateReport, MigrateError> {
    let (store, guard) = open_source(from).await?;
    let result = migrate_open(&store, to, progress).await;
    drop(store);
    let _ = tokio::task::spawn_blocking(move || guard.join()).await;
    result
}

async fn open_source(from: &Path) -> Result<(Store, super::WriterGuard), MigrateError> {
    let path = from.to_path_buf();
    let opened = tokio::task::spawn_blocking(move || {
        // `open`, not `create`: a missing file is an error, never a new empty store.
        let db = Database::builder()
            .set_cache_size(CACHE_BYTES)
            .open(&path)
            .map_err(|source| Error::Open { path: path.clone(), source: source.into() })?;
        Store::start(db, path)
    })
    .await
    .map_err(|e| Error::task("open the redb file", e))?;
    opened.map_err(|source| MigrateError::Source { path: from.to_path_buf(), source })
}

async fn migrate_open(
    store: &Store,
    to: &PgOptions,
    progress: Arc<dyn MigrateProgress>,
) -> Result<MigrateReport, MigrateError> {
    let db = Arc::clone(&store.db);
    // The survey and the copy read two snapshots of a file nothing else can write: the
    // server is stopped and this process's writer is given no work.
    let survey = tokio::task::spawn_blocking(move || survey(&db.begin_read()?)).await.map_err(task)??;
    if !survey.refused.is_empty() {
        return Err(MigrateError::Unmappable(survey.refused.join("\n")));
    }
    let rows: u64 = survey.expected.iter().map(|(_, n)| n).sum();
    let mut importer = Importer::connect(to).await?;
    let started = Instant::now();
    progress.phase("copying", rows);
    let (send, receive) = mpsc::channel(2);
    let db = Arc::clone(&store.db);
    let flags =
        (survey.settings.paused.iter().map(|(p, _)| p.clone()).collect(), survey.settings.sinks_disabled.clone());
    let settings = survey.settings;
    let reader = tokio::task::spawn_blocking(move || read_all(&db.begin_read()?, settings, &send));
    let advance = Arc::clone(&progress);
    let imported = importer.import(receive, &survey.expected, &move |chunk| advance.advance(chunk.len() as u64)).await;
    // The reader stops at its next send once the importer is gone (a refused target).
    let read = reader.await.map_err(task)?;
    let copied = match (imported, read) {
        (Ok(copied), Ok(())) => copied,
        // A short copy, rolled back: the reader's own error (a record that does not
        // decode) is its cause.
        (Err(ImportError::Counts(_)), Err(e)) | (Ok(_), Err(e)) => return Err(e.into()),
        (Err(e), _) => return Err(e.into()),
    };
    let copy = started.elapsed();
    let started = Instant::now();
    let target = PgStore::open_unchecked(to).await?;
    let comparison =
        compare(store, &target, flags, &|total| progress.phase("comparing", total), &|steps| progress.advance(steps))
            .await?;
    if !comparison.mismatches.is_empty() {
        return Err(MigrateError::Mismatch(comparison.mismatches));
    }
    let compare = started.elapsed();
    progress.phase("verifying", 0);
    let started = Instant::now();
    verify_target(to).await?;
    let verify = started.elapsed();
    importer.mark_verified().await?;
    importer.close().await;
    Ok(MigrateReport {
        rows: copied.iter().map(|(_, n)| n).sum(),
        tables: copied,
        copy,
        comparison,
        compare,
        verify,
        not_copied: survey.not_copied,
    })
}

/// The product's `verify` on the copy, after the record-by-record comparison and before
/// the copy is marked verified: the comparison proves the rows say what redb said, verify
/// that they hold the invariants as PostgreSQL rows (columns beside records, sequences).
async fn verify_target(to: &PgOptions) -> Result<(), MigrateError> {
    let report = super::postgres::verify(to).await?;
    if report.is_ok() {
        return Ok(());
    }
    Err(MigrateError::Mismatch(report.problems.into_iter().map(|p| format!("verify: {p}")).collect()))
}

fn task(e: tokio::task::JoinError) -> Error {
    Error::task("migration", e)
}

fn table_len<K: redb::Key + 'static, V: redb::Value + 'static>(
    txn: &ReadTransaction,
    def: redb::TableDefinition<K, V>,
) -> Result<u64, Error> {
    match txn.open_table(def) {
        Ok(table) => Ok(table.len()?),
        Err(redb::TableError::TableDoesNotExist(_)) => Ok(0),
        Err(e) => Err(e.into()),
    }
}

/// Reads what the copy will hold and what it cannot: every table must be known, and the
/// retention and erasure tables must be empty.
fn survey(txn: &ReadTransaction) -> Result<Survey, Error> {
    let mut survey = Survey::default();
    let known: BTreeSet<&str> = [
        tables::META.name(),
        tables::IDENTITY.name(),
        tables::EXTRACTIONS.name(),
        tables::CONTENTS.name(),
        tables::STATE_INDEX.name(),
        tables::STATE_COUNTS.name(),
        tables::PENDING_QUEUE.name(),
        tables::LEASE_INDEX.name(),
        tables::TENANT_INDEX.name(),
        tables::FINDINGS.name(),
        tables::RESULTS.name(),
        tables::COMMIT_INDEX.name(),
        tables::BATCHES.name(),
        tables::OPEN_BATCHES.name(),
        tables::STAGED.name(),
        tables::LEDGER.name(),
        tables::LEDGER_BY_TENANT.name(),
        tables::LEDGER_BY_EXTRACTION.name(),
        tables::SPEND.name(),
        tables::OUTBOX.name(),
        tables::OUTBOX_DUE.name(),
        tables::OUTBOX_DEAD.name(),
        tables::WEBHOOK_DELIVERIES.name(),
        tables::RETIRED.name(),
        tables::ERASED_SPEND.name(),
        // Rebuilt from the records' columns on PostgreSQL (source_id, schema_family).
        tables::REVISIONS.name(),
        // Counted from the rows on PostgreSQL.
        tables::TENANT_COUNTS.name(),
        // Not carried: open reservations are released by a migration (docs/OPERATIONS.md).
        tables::RESERVATIONS.name(),
        tables::EVALUATIONS.name(),
        tables::TRIALS.name(),
        tables::TRIAL_BATCHES.name(),
    ]
    .into_iter()
    .collect();
    for table in txn.list_tables()? {
        if !known.contains(table.name()) {
            survey.refused.push(format!("table {:?} is not known to this build", table.name()));
        }
    }
    let retired = table_len(txn, tables::RETIRED)?;
    if retired > 0 {
        survey.refused.push(format!("{retired} extraction(s) carry retention marks (table retired)"));
    }
    let erased = table_len(txn, tables::ERASED_SPEND)?;
    if erased > 0 {
        survey.refused.push(format!("{erased} day(s) of spend from erased ledger entries (table erased_spend)"));
    }
    read_meta(txn, &mut survey)?;
    let extractions = table_len(txn, tables::EXTRACTIONS)?;
    for (what, n) in [("identity", table_len(txn, tables::IDENTITY)?), ("contents", table_len(txn, tables::CONTENTS)?)]
    {
        if n != extractions {
            survey.refused.push(format!(
                "the file is inconsistent: {extractions} extractions but {n} {what} entries (run `commitpoint verify`)"
            ));
        }
    }
    let mut members = 0;
    if let Ok(batches) = txn.open_table(tables::BATCHES) {
        for entry in batches.iter()? {
            members += decode::<BatchRecord>(entry?.1.value())?.members.len() as u64;
        }
    }
    let settings = &survey.settings;
    let meta_rows = u64::from(settings.cursor_key.is_some()) + 1; // and the migration marker
    survey.expected = vec![
        ("meta", meta_rows),
        ("extractions", extractions),
        ("findings", table_len(txn, tables::FINDINGS)?),
        ("results", table_len(txn, tables::RESULTS)?),
        ("ledger", table_len(txn, tables::LEDGER)?),
        ("spend", table_len(txn, tables::SPEND)?),
        ("outbox", table_len(txn, tables::OUTBOX)?),
        ("sink_disabled", settings.sinks_disabled.len() as u64),
        ("webhook_deliveries", table_len(txn, tables::WEBHOOK_DELIVERIES)?),
        ("batches", table_len(txn, tables::BATCHES)?),
        ("batch_members", members),
        ("staged", table_len(txn, tables::STAGED)?),
        ("provider_pause", settings.paused.len() as u64),
        ("provider_leases", 0),
        ("evaluations", table_len(txn, tables::EVALUATIONS)?),
        ("trials", table_len(txn, tables::TRIALS)?),
        ("trial_batches", table_len(txn, tables::TRIAL_BATCHES)?),
    ];
    Ok(survey)
}

/// `META` holds flags and keys, not rows: each key is mapped, or named as not copied, or
/// refused.
fn read_meta(txn: &ReadTransaction, survey: &mut Survey) -> Result<(), Error> {
    let meta = match txn.open_table(tables::META) {
        Ok(meta) => meta,
        Err(redb::TableError::TableDoesNotExist(_)) => return Ok(()),
        Err(e) => return Err(e.into()),
    };
    for entry in meta.iter()? {
        let (key, value) = entry?;
        let (key, value) = (key.value().to_string(), value.value());
        if let Some(provider) = key.strip_prefix(tables::META_PAUSE_PREFIX) {
            survey.settings.paused.push((provider.to_string(), value != 0));
        } else if let Some(sink) = key.strip_prefix(tables::META_SINK_DISABLED_PREFIX) {
            survey.settings.sinks_disabled.push(sink.to_string());
        } else if key.starts_with("cursor_key:") {
            // Read as a whole below.
        } else if key == tables::META_LAST_BACKUP {
            survey.not_copied.push(format!(
                "the time of the last redb backup ({value} ms): a PostgreSQL store is backed up with pg_dump"
            ));
        } else if key == tables::META_SEQ_FLOOR {
            survey.refused.push(format!("a tenant erasure's sequence floor ({value}) is recorded (meta {key})"));
        } else if ![
            tables::META_LAYOUT,
            tables::META_COMMIT_INDEX,
            tables::META_PENDING_QUEUE,
            tables::META_REVISIONS,
            tables::META_TENANT_COUNTS,
            // PostgreSQL's trial_batch_seq is moved past the copied batches instead.
            tables::META_TRIAL_BATCH_SEQ,
        ]
        .contains(&key.as_str())
        {
            survey.refused.push(format!("meta key {key:?} is not known to this build"));
        }
    }
    survey.settings.cursor_key = super::keys::stored_cursor_key(&meta)?;
    Ok(())
}

/// Sends every row, table by table, in an order that satisfies the target's foreign keys.
fn read_all(txn: &ReadTransaction, settings: ImportSettings, send: &mpsc::Sender<ImportRows>) -> Result<(), Error> {
    let sent = |rows: ImportRows| -> Result<(), Error> {
        send.blocking_send(rows).map_err(|_| Error::task("migration", "the copy's writer stopped"))
    };
    sent(ImportRows::Settings(settings))?;
    {
        let extractions = txn.open_table(tables::EXTRACTIONS)?;
        let contents = txn.open_table(tables::CONTENTS)?;
        let mut chunk = Vec::with_capacity(CHUNK);
        for entry in extractions.iter()? {
            let (seq, bytes) = entry?;
            let seq = seq.value();
            let content = tables::required(contents.get(seq)?, "content", seq)?;
            let bytes = bytes.value().to_vec();
            chunk.push(ExtractionRow { record: decode::<ExtractionRecord>(&bytes)?, bytes, content });
            if chunk.len() == CHUNK {
                sent(ImportRows::Extractions(std::mem::take(&mut chunk)))?;
            }
        }
        sent(ImportRows::Extractions(chunk))?;
    }
    {
        let findings = txn.open_table(tables::FINDINGS)?;
        let mut chunk = Vec::with_capacity(CHUNK);
        for entry in findings.iter()? {
            let (key, bytes) = entry?;
            let (seq, finding) = key.value();
            chunk.push((seq, *finding, bytes.value().to_vec()));
            if chunk.len() == CHUNK {
                sent(ImportRows::Findings(std::mem::take(&mut chunk)))?;
            }
        }
        sent(ImportRows::Findings(chunk))?;
    }
    for (table, wrap) in [
        (tables::RESULTS, ImportRows::Results as fn(Vec<(u64, Vec<u8>)>) -> ImportRows),
        (tables::STAGED, ImportRows::Staged),
    ] {
        let table = txn.open_table(table)?;
        let mut chunk = Vec::with_capacity(CHUNK);
        for entry in table.iter()? {
            let (seq, bytes) = entry?;
            chunk.push((seq.value(), bytes.value().to_vec()));
            if chunk.len() == CHUNK {
                sent(wrap(std::mem::take(&mut chunk)))?;
            }
        }
        sent(wrap(chunk))?;
    }
    send_decoded::<LedgerRecord>(txn, tables::LEDGER, ImportRows::Ledger, &sent)?;
    {
        let spend = txn.open_table(tables::SPEND)?;
        let mut chunk = Vec::new();
        for entry in spend.iter()? {
            let (key, micros) = entry?;
            let (tenant, day) = key.value();
            chunk.push((tenant.to_string(), day, micros.value()));
        }
        sent(ImportRows::Spend(chunk))?;
    }
    send_decoded::<OutboxRecord>(txn, tables::OUTBOX, ImportRows::Outbox, &sent)?;
    {
        let deliveries = txn.open_table(tables::WEBHOOK_DELIVERIES)?;
        let mut chunk = Vec::new();
        for entry in deliveries.iter()? {
            let (key, seq) = entry?;
            let (endpoint, delivery) = key.value();
            chunk.push((endpoint.to_string(), delivery.to_string(), seq.value()));
        }
        sent(ImportRows::Deliveries(chunk))?;
    }
    send_decoded::<BatchRecord>(txn, tables::BATCHES, ImportRows::Batches, &sent)?;
    send_evaluations(txn, &sent)
}

/// `table`, or `None` in a file written before it existed (an older file has no evaluations).
fn optional_table<K: redb::Key + 'static, V: redb::Value + 'static>(
    txn: &ReadTransaction,
    def: redb::TableDefinition<K, V>,
) -> Result<Option<redb::ReadOnlyTable<K, V>>, Error> {
    match txn.open_table(def) {
        Ok(table) => Ok(Some(table)),
        Err(redb::TableError::TableDoesNotExist(_)) => Ok(None),
        Err(e) => Err(e.into()),
    }
}

/// Evaluations, then their trials and trial batches (which refer to them on PostgreSQL).
fn send_evaluations(txn: &ReadTransaction, sent: &dyn Fn(ImportRows) -> Result<(), Error>) -> Result<(), Error> {
    if let Some(table) = optional_table(txn, tables::EVALUATIONS)? {
        let mut chunk = Vec::new();
        for entry in table.iter()? {
            let bytes = entry?.1.value().to_vec();
            chunk.push((decode::<EvaluationRecord>(&bytes)?, bytes));
            if chunk.len() == CHUNK {
                sent(ImportRows::Evaluations(std::mem::take(&mut chunk)))?;
            }
        }
        sent(ImportRows::Evaluations(chunk))?;
    }
    if let Some(table) = optional_table(txn, tables::TRIALS)? {
        let mut chunk = Vec::with_capacity(CHUNK);
        for entry in table.iter()? {
            let (key, bytes) = entry?;
            let (evaluation, candidate, index) = key.value();
            chunk.push((evaluation.to_string(), candidate.to_string(), index, bytes.value().to_vec()));
            if chunk.len() == CHUNK {
                sent(ImportRows::Trials(std::mem::take(&mut chunk)))?;
            }
        }
        sent(ImportRows::Trials(chunk))?;
    }
    if optional_table(txn, tables::TRIAL_BATCHES)?.is_some() {
        send_decoded::<TrialBatchRecord>(txn, tables::TRIAL_BATCHES, ImportRows::TrialBatches, sent)?;
    }
    Ok(())
}

/// A table of `u64 → encoded T`, sent decoded (for the columns) with its stored bytes.
fn send_decoded<T: super::codec::Versioned>(
    txn: &ReadTransaction,
    def: redb::TableDefinition<u64, &'static [u8]>,
    wrap: fn(Vec<(T, Vec<u8>)>) -> ImportRows,
    sent: &dyn Fn(ImportRows) -> Result<(), Error>,
) -> Result<(), Error> {
    let table = txn.open_table(def)?;
    let mut chunk = Vec::with_capacity(CHUNK);
    for entry in table.iter()? {
        let bytes = entry?.1.value().to_vec();
        chunk.push((decode::<T>(&bytes)?, bytes));
        if chunk.len() == CHUNK {
            sent(wrap(std::mem::take(&mut chunk)))?;
        }
    }
    sent(wrap(chunk))
}
