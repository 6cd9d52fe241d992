//! A debug dump of every row of every table, decoded, one line per row. Tests use it to
//! prove that an erased tenant left nothing behind; operators can use it to look inside a
//! copy of a file. A table this build does not know makes the dump fail rather than
//! silently skip it.

use std::fmt::Debug;
use std::io::Write;
use std::path::Path;

use redb::{Database, Key, ReadTransaction, ReadableDatabase, ReadableTable, TableDefinition, TableHandle, Value};

use super::Error;
use super::codec::{Versioned, decode};
use super::records::{
    BatchRecord, ExtractionRecord, FindingRecord, LedgerRecord, OutboxRecord, ResultRecord, StoredContent,
};
use super::tables;

/// Opens the file exclusively (a running server holds it locked) and writes every row.
pub fn dump_file(path: &Path, out: &mut dyn Write) -> Result<u64, Error> {
    let db = Database::open(path).map_err(|source| Error::Open { path: path.to_path_buf(), source: source.into() })?;
    let txn = db.begin_read()?;
    let mut rows = 0;
    for table in txn.list_tables()? {
        let name = table.name().to_string();
        rows += match name.as_str() {
            "meta" => plain(&txn, tables::META, out)?,
            "identity" => plain(&txn, tables::IDENTITY, out)?,
            "extractions" => coded::<ExtractionRecord, _>(&txn, tables::EXTRACTIONS, out)?,
            "contents" => coded::<StoredContent, _>(&txn, tables::CONTENTS, out)?,
            "state_index" => plain(&txn, tables::STATE_INDEX, out)?,
            "state_counts" => plain(&txn, tables::STATE_COUNTS, out)?,
            "tenant_counts" => plain(&txn, tables::TENANT_COUNTS, out)?,
            "pending_queue" => plain(&txn, tables::PENDING_QUEUE, out)?,
            "lease_index" => plain(&txn, tables::LEASE_INDEX, out)?,
            "tenant_index" => plain(&txn, tables::TENANT_INDEX, out)?,
            "findings" => coded::<FindingRecord, _>(&txn, tables::FINDINGS, out)?,
            "results" => coded::<ResultRecord, _>(&txn, tables::RESULTS, out)?,
            "batches" => coded::<BatchRecord, _>(&txn, tables::BATCHES, out)?,
            "open_batches" => plain(&txn, tables::OPEN_BATCHES, out)?,
            "staged_results" => coded::<super::StagedAnswer, _>(&txn, tables::STAGED, out)?,
            "ledger" => coded::<LedgerRecord, _>(&txn, tables::LEDGER, out)?,
            "ledger_by_tenant" => plain(&txn, tables::LEDGER_BY_TENANT, out)?,
            "ledger_by_extraction" => plain(&txn, tables::LEDGER_BY_EXTRACTION, out)?,
            "spend" => plain(&txn, tables::SPEND, out)?,
            "outbox" => coded::<OutboxRecord, _>(&txn, tables::OUTBOX, out)?,
            "outbox_due" => plain(&txn, tables::OUTBOX_DUE, out)?,
            "outbox_dead" => plain(&txn, tables::OUTBOX_DEAD, out)?,
            "webhook_deliveries" => plain(&txn, tables::WEBHOOK_DELIVERIES, out)?,
            "retired" => plain(&txn, tables::RETIRED, out)?,
            "erased_spend" => plain(&txn, tables::ERASED_SPEND, out)?,
            "commit_index" => plain(&txn, tables::COMMIT_INDEX, out)?,
            "revisions" => plain(&txn, tables::REVISIONS, out)?,
            "reservations" => plain(&txn, tables::RESERVATIONS, out)?,
            "evaluations" => coded::<crate::store::evaluation::EvaluationRecord, _>(&txn, tables::EVALUATIONS, out)?,
            "trials" => coded::<crate::store::evaluation::TrialRecord, _>(&txn, tables::TRIALS, out)?,
            "trial_batches" => {
                coded::<crate::store::evaluation::TrialBatchRecord, _>(&txn, tables::TRIAL_BATCHES, out)?
            }
            other => {
                return Err(Error::Corrupt {
                    kind: "dump",
                    reason: format!("table {other:?} is not known to this build's dump"),
                });
            }
        };
    }
    Ok(rows)
}

fn write_row(out: &mut dyn Write, table: &str, key: &dyn Debug, value: &dyn Debug) -> Result<(), Error> {
    writeln!(out, "{table}\t{key:?}\t{value:?}").map_err(|source| Error::Io {
        path: "standard output".into(),
        what: "write the dump",
        source,
    })
}

fn plain<K, V>(txn: &ReadTransaction, def: TableDefinition<K, V>, out: &mut dyn Write) -> Result<u64, Error>
where
    K: Key + 'static,
    V: Value + 'static,
    for<'a> K::SelfType<'a>: Debug,
    for<'a> V::SelfType<'a>: Debug,
{
    let table = txn.open_table(def)?;
    let mut n = 0;
    for entry in table.iter()? {
        let (key, value) = entry?;
        write_row(out, def.name(), &key.value(), &value.value())?;
        n += 1;
    }
    Ok(n)
}

fn coded<T, K>(txn: &ReadTransaction, def: TableDefinition<K, &'static [u8]>, out: &mut dyn Write) -> Result<u64, Error>
where
    T: Versioned + Debug,
    K: Key + 'static,
    for<'a> K::SelfType<'a>: Debug,
{
    let table = txn.open_table(def)?;
    let mut n = 0;
    for entry in table.iter()? {
        let (key, value) = entry?;
        let decoded: T = decode(value.value())?;
        write_row(out, def.name(), &key.value(), &decoded)?;
        n += 1;
    }
    Ok(n)
}
