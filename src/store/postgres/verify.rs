//! `verify` on PostgreSQL: the redb store's invariants, asked of a live database in one
//! read-only REPEATABLE READ snapshot, so every count and every check sees the same
//! commits while servers keep writing. SQL judges what the columns can tell (which rows
//! exist beside which, sums, uniqueness, sequences); the stored records are decoded with
//! the store's own codec where only they can (identities, source hashes, finding keys,
//! and that every column agrees with the record it was written from).

mod evaluations;
mod links;
mod records;

use std::pin::pin;

use futures_util::TryStreamExt;
use tokio_postgres::types::ToSql;
use tokio_postgres::{NoTls, Row, Transaction};

use super::rows::{big, committed_at, fence_of, lease_expiry, unbig};
use super::{Error, PgOptions, known_schema_version, parse_url, pg, schema_version};
use crate::domain::lifecycle::State;
use crate::store::Report;
use crate::store::codec::{Versioned, decode};
use crate::store::records::{ExtractionRecord, StoredContent};
use crate::store::rules::verify::check_record;

/// Connects, refuses a schema this build does not know, and checks the database in one
/// read-only snapshot. Nothing is written, so it is safe beside running servers.
pub async fn verify(options: &PgOptions) -> Result<Report, Error> {
    let config = parse_url(options)?;
    let (mut client, connection) = config.connect(NoTls).await.map_err(pg("cannot connect"))?;
    let task = tokio::spawn(async move {
        if let Err(e) = connection.await {
            tracing::warn!(error = %e, "verify connection ended");
        }
    });
    let result = async {
        let known = known_schema_version();
        match schema_version(&client).await? {
            None => return Err(Error::NoSchema),
            Some(found) if found > known => return Err(Error::SchemaTooNew { found, known }),
            Some(found) if found < known => return Err(Error::SchemaTooOld { found, known }),
            Some(_) => {}
        }
        let tx = super::snapshot(&mut client).await?;
        let mut report = Report::default();
        check_extractions(&tx, &mut report).await?;
        records::check_findings(&tx, &mut report).await?;
        records::check_results(&tx, &mut report).await?;
        records::check_staged(&tx, &mut report).await?;
        records::check_batches(&tx, &mut report).await?;
        records::check_ledger(&tx, &mut report).await?;
        records::check_outbox(&tx, &mut report).await?;
        links::check(&tx, &mut report).await?;
        super::revisions::check(&tx, &mut report).await?;
        evaluations::check_evaluations(&tx, &mut report).await?;
        tx.rollback().await.map_err(pg("cannot end the snapshot"))?;
        Ok(report)
    }
    .await;
    drop(client);
    let _ = task.await;
    result
}

/// Runs `sql` in the snapshot and hands each row to `visit` as it arrives, so a large
/// table is never held in memory at once.
async fn each_row(
    tx: &Transaction<'_>,
    sql: &str,
    params: &[&(dyn ToSql + Sync)],
    mut visit: impl FnMut(Row),
) -> Result<(), Error> {
    let rows = tx.query_raw(sql, params.iter().copied()).await.map_err(pg("verify cannot read the database"))?;
    let mut rows = pin!(rows);
    while let Some(row) = rows.try_next().await.map_err(pg("verify cannot read the database"))? {
        visit(row);
    }
    Ok(())
}

/// The format column repeats the record's first byte.
/// `bytes` decoded, or `None` once the failure is reported as "`what`: error".
fn decoded<T: Versioned>(bytes: &[u8], what: impl FnOnce() -> String, report: &mut Report) -> Option<T> {
    decode(bytes).map_err(|e| report.problem(format!("{}: {e}", what()))).ok()
}

fn format_agrees(row: &Row, bytes: &[u8]) -> bool {
    bytes.first().map(|&b| i16::from(b)) == Some(row.get::<_, i16>("format"))
}

/// Each row's job id is joined in from the batch its fence names, for submitted members.
const EXTRACTIONS: &str = "SELECT e.seq, e.id, e.tenant, e.schema_name, e.state_code, e.fence, e.lease_expires_at_ms, \
     e.committed_at_ms, e.updated_at_ms, e.format, e.record, e.content, e.source_id, e.schema_family, e.superseded_by, \
     b.seq AS batch_seq, b.job_id AS batch_job \
     FROM extractions e LEFT JOIN batches b ON b.batch_key = e.fence AND e.state_code = 5 ORDER BY e.seq";

async fn check_extractions(tx: &Transaction<'_>, report: &mut Report) -> Result<(), Error> {
    each_row(tx, EXTRACTIONS, &[], |row| check_extraction(&row, report)).await
}

/// Every record decodes, its identity and source hash recompute, and every column beside
/// it says what the record says (SQL selects, locks and checks on the columns).
fn check_extraction(row: &Row, report: &mut Report) {
    let seq = unbig(row.get("seq"));
    let bytes: &[u8] = row.get("record");
    let Some(record) = decoded::<ExtractionRecord>(bytes, || format!("extraction #{seq}"), report) else {
        return;
    };
    // A NULL content is retention's doing; `links` checks that a mark says so.
    let content = row.get::<_, Option<&[u8]>>("content").map(decode::<StoredContent>);
    check_record(seq, &record, content, report);
    let id: &[u8] = row.get("id");
    if id != record.id.as_bytes() {
        report.problem(format!("{}: its id column holds another identity (invariant 1)", record.id));
    }
    for column in disagreeing_columns(row, &record, bytes) {
        report.problem(format!(
            "{}: its {column} column disagrees with its record, which is {}",
            record.id,
            record.state.name().as_str()
        ));
    }
    if let State::Submitted { batch_key, job_id, .. } = &record.state
        && row.get::<_, Option<i64>>("batch_seq").is_some()
        && row.get::<_, Option<&str>>("batch_job") != job_id.as_deref()
    {
        report.problem(format!("{}: its job id disagrees with its batch {batch_key}", record.id));
    }
}

fn disagreeing_columns(row: &Row, record: &ExtractionRecord, bytes: &[u8]) -> Vec<&'static str> {
    let checks = [
        ("tenant", row.get::<_, &str>("tenant") == record.tenant),
        ("schema_name", row.get::<_, &str>("schema_name") == record.schema),
        ("state_code", row.get::<_, i16>("state_code") == i16::from(record.state.name().code())),
        ("fence", row.get::<_, Option<String>>("fence") == fence_of(&record.state)),
        ("lease_expires_at_ms", row.get::<_, Option<i64>>("lease_expires_at_ms") == lease_expiry(&record.state)),
        ("committed_at_ms", row.get::<_, Option<i64>>("committed_at_ms") == committed_at(&record.state)),
        ("updated_at_ms", row.get::<_, i64>("updated_at_ms") == big(record.updated_at_ms)),
        ("format", format_agrees(row, bytes)),
        ("source_id", row.get::<_, Option<&str>>("source_id") == Some(record.source_id.as_str())),
        (
            "schema_family",
            row.get::<_, Option<&str>>("schema_family")
                == Some(crate::store::rules::revision::schema_family(&record.schema)),
        ),
        (
            "superseded_by",
            row.get::<_, Option<&[u8]>>("superseded_by") == record.superseded_by.as_ref().map(|id| &id.as_bytes()[..]),
        ),
    ];
    checks.into_iter().filter(|(_, agrees)| !agrees).map(|(column, _)| column).collect()
}
