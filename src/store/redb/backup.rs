//! Online backup: a consistent copy of the whole store taken while it keeps serving.
//!
//! Copying the live file is never safe (a commit in flight leaves a torn copy), so the
//! backup reads every table inside ONE read transaction — a snapshot that concurrent
//! commits cannot change — and writes it into a fresh redb file, committed durably,
//! then renamed into place and the directory fsynced. The result holds exactly the
//! commits that preceded the snapshot: a prefix of everything ever acknowledged. The copy
//! holds every tenant's data, so it is created 0600 (its directory 0700) at
//! `FILE.partial`, never through a link planted there.

use std::path::Path;

use redb::backends::FileBackend;
use redb::{Database, Durability, Key, ReadTransaction, ReadableTable, TableDefinition, TableHandle, Value};

use super::{Error, tables};
use crate::domain::private_file;
use crate::store::seam::BackupReport;

fn io_error(path: &Path, what: &'static str, e: std::io::Error) -> Error {
    Error::Io { path: path.to_path_buf(), what, source: e }
}

pub(super) fn write_snapshot(snapshot: &ReadTransaction, dest: &Path) -> Result<BackupReport, Error> {
    if dest.exists() {
        return Err(Error::TargetExists { path: dest.to_path_buf() });
    }
    let dir = dest.parent().unwrap_or(Path::new("."));
    private_file::create_dir_all(dir).map_err(|e| io_error(dir, "create the backup directory", e))?;
    let temp = private_file::partial_path(dest);
    let file = private_file::replace(&temp).map_err(|e| io_error(&temp, "create the backup file", e))?;
    let copied = copy_all(snapshot, file, &temp);
    if copied.is_err() {
        let _ = std::fs::remove_file(&temp);
    }
    let entries = copied?;
    std::fs::rename(&temp, dest).map_err(|e| io_error(dest, "move the finished backup into place", e))?;
    std::fs::File::open(dir).and_then(|d| d.sync_all()).map_err(|e| io_error(dir, "sync the directory", e))?;
    let bytes = std::fs::metadata(dest).map_err(|e| io_error(dest, "stat the backup", e))?.len();
    Ok(BackupReport { path: dest.to_path_buf(), bytes, entries })
}

fn copy_all(snapshot: &ReadTransaction, file: std::fs::File, temp: &Path) -> Result<u64, Error> {
    let open = |source: ::redb::DatabaseError| Error::Open { path: temp.to_path_buf(), source: source.into() };
    let target = Database::builder().create_with_backend(FileBackend::new(file).map_err(open)?).map_err(open)?;
    let mut txn = target.begin_write()?;
    txn.set_durability(Durability::Immediate)?;
    let mut entries = 0;
    entries += copy(snapshot, &txn, tables::META)?;
    entries += copy(snapshot, &txn, tables::IDENTITY)?;
    entries += copy(snapshot, &txn, tables::EXTRACTIONS)?;
    entries += copy(snapshot, &txn, tables::CONTENTS)?;
    entries += copy(snapshot, &txn, tables::STATE_INDEX)?;
    entries += copy(snapshot, &txn, tables::STATE_COUNTS)?;
    entries += copy(snapshot, &txn, tables::TENANT_COUNTS)?;
    entries += copy(snapshot, &txn, tables::PENDING_QUEUE)?;
    entries += copy(snapshot, &txn, tables::LEASE_INDEX)?;
    entries += copy(snapshot, &txn, tables::TENANT_INDEX)?;
    entries += copy(snapshot, &txn, tables::FINDINGS)?;
    entries += copy(snapshot, &txn, tables::RESULTS)?;
    entries += copy(snapshot, &txn, tables::COMMIT_INDEX)?;
    entries += copy(snapshot, &txn, tables::BATCHES)?;
    entries += copy(snapshot, &txn, tables::OPEN_BATCHES)?;
    entries += copy(snapshot, &txn, tables::STAGED)?;
    entries += copy(snapshot, &txn, tables::LEDGER)?;
    entries += copy(snapshot, &txn, tables::LEDGER_BY_TENANT)?;
    entries += copy(snapshot, &txn, tables::LEDGER_BY_EXTRACTION)?;
    entries += copy(snapshot, &txn, tables::SPEND)?;
    entries += copy(snapshot, &txn, tables::OUTBOX)?;
    entries += copy(snapshot, &txn, tables::OUTBOX_DUE)?;
    entries += copy(snapshot, &txn, tables::OUTBOX_DEAD)?;
    entries += copy(snapshot, &txn, tables::WEBHOOK_DELIVERIES)?;
    entries += copy(snapshot, &txn, tables::RETIRED)?;
    entries += copy(snapshot, &txn, tables::ERASED_SPEND)?;
    entries += copy(snapshot, &txn, tables::REVISIONS)?;
    entries += copy(snapshot, &txn, tables::RESERVATIONS)?;
    entries += copy(snapshot, &txn, tables::EVALUATIONS)?;
    entries += copy(snapshot, &txn, tables::TRIALS)?;
    entries += copy(snapshot, &txn, tables::TRIAL_BATCHES)?;
    // A table added to the store but not to this list would silently be missing from
    // every backup: refuse to finish one instead.
    let copied: std::collections::BTreeSet<String> = txn.list_tables()?.map(|t| t.name().to_string()).collect();
    if let Some(missing) = snapshot.list_tables()?.map(|t| t.name().to_string()).find(|name| !copied.contains(name)) {
        return Err(Error::Corrupt {
            kind: "backup",
            reason: format!("table {missing:?} is not copied by this build's backup; refusing an incomplete backup"),
        });
    }
    // Durable before it is renamed into place: a crash leaves only the `.partial` file.
    txn.commit()?;
    drop(target);
    Ok(entries)
}

fn copy<K: Key + 'static, V: Value + 'static>(
    snapshot: &ReadTransaction,
    target: &redb::WriteTransaction,
    table: TableDefinition<K, V>,
) -> Result<u64, Error> {
    let source = match snapshot.open_table(table) {
        Ok(source) => source,
        Err(redb::TableError::TableDoesNotExist(_)) => return Ok(0),
        Err(e) => return Err(e.into()),
    };
    let mut out = target.open_table(table)?;
    let mut n = 0;
    for entry in source.iter()? {
        let (key, value) = entry?;
        out.insert(key.value(), value.value())?;
        n += 1;
    }
    Ok(n)
}
