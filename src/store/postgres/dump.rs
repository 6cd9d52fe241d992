//! A debug dump of every row of every commitpoint table in a PostgreSQL store, decoded,
//! one line per row (`table`, TAB, the plain columns, TAB, the decoded record), in the
//! shape of the redb file's dump (`store::dump`). Tests use it to prove that an erased
//! tenant left nothing behind and that retention emptied what it should. It reads one
//! `REPEATABLE READ` snapshot and writes nothing; a table this build does not know makes
//! it fail rather than silently skip it.

use std::fmt::Debug;

use tokio_postgres::{NoTls, Row};

use super::{Error, PgOptions, parse_url, pg};
use crate::store::StagedAnswer;
use crate::store::codec::{Versioned, decode};
use crate::store::evaluation::{EvaluationRecord, TrialBatchRecord, TrialRecord};
use crate::store::records::{
    BatchRecord, ExtractionRecord, FindingRecord, LedgerRecord, OutboxRecord, ResultRecord, StoredContent,
};

/// How each known table is read: its plain columns, and the decoder of its record column.
const TABLES: [(&str, &str); 19] = [
    ("meta", "SELECT key, value FROM meta ORDER BY key"),
    (
        "extractions",
        "SELECT seq, tenant, schema_name, state_code, fence, record, content FROM extractions ORDER BY seq",
    ),
    ("findings", "SELECT extraction_seq, key, record FROM findings ORDER BY extraction_seq, key"),
    ("results", "SELECT extraction_seq, record FROM results ORDER BY extraction_seq"),
    ("ledger", "SELECT seq, tenant, extraction_seq, record FROM ledger ORDER BY seq"),
    ("spend", "SELECT tenant, day, micros FROM spend ORDER BY tenant, day"),
    ("outbox", "SELECT seq, event_id, sink, record FROM outbox ORDER BY seq"),
    ("sink_disabled", "SELECT sink FROM sink_disabled ORDER BY sink"),
    ("webhook_deliveries", "SELECT endpoint, delivery_id, extraction_seq FROM webhook_deliveries ORDER BY 1, 2"),
    ("batches", "SELECT seq, batch_key, provider, state_code, job_id, record FROM batches ORDER BY seq"),
    ("batch_members", "SELECT batch_seq, extraction_seq FROM batch_members ORDER BY 1, 2"),
    ("staged", "SELECT extraction_seq, record FROM staged ORDER BY extraction_seq"),
    ("provider_pause", "SELECT provider, paused FROM provider_pause ORDER BY provider"),
    ("provider_leases", "SELECT provider, holder, epoch, expires_at_ms FROM provider_leases ORDER BY provider"),
    ("retired", "SELECT extraction_seq, bits FROM retired ORDER BY extraction_seq"),
    ("erased_spend", "SELECT tenant, day, micros FROM erased_spend ORDER BY tenant, day"),
    ("evaluations", "SELECT name, created_at_ms, record FROM evaluations ORDER BY name"),
    ("trials", "SELECT evaluation, candidate, idx, record FROM trials ORDER BY evaluation, candidate, idx"),
    ("trial_batches", "SELECT seq, evaluation, open, record FROM trial_batches ORDER BY seq"),
];

/// The store's tables that hold no record: the migration history, and the per-state
/// counters (derived from `extractions`; `verify` checks them).
const NOT_DATA: [&str; 3] = ["refinery_schema_history", "state_counts", "state_deltas"];

/// Every row of the store at `options`, decoded; returns the dump's text.
pub async fn dump_database(options: &PgOptions) -> Result<String, Error> {
    let (mut client, connection) = parse_url(options)?.connect(NoTls).await.map_err(pg("cannot connect"))?;
    let task = tokio::spawn(async move {
        if let Err(e) = connection.await {
            tracing::warn!(error = %e, "dump connection ended");
        }
    });
    let result = async {
        let tx = super::snapshot(&mut client).await?;
        let present = tx
            .query("SELECT tablename::text FROM pg_tables WHERE schemaname = current_schema() ORDER BY 1", &[])
            .await
            .map_err(pg("cannot list tables"))?;
        for row in &present {
            let name: String = row.get(0);
            if !TABLES.iter().any(|(known, _)| *known == name) && !NOT_DATA.contains(&name.as_str()) {
                return Err(Error::Corrupt {
                    kind: "dump",
                    reason: format!("table {name:?} is not known to this build's dump"),
                });
            }
        }
        let mut out = String::new();
        for (table, sql) in TABLES {
            for row in tx.query(sql, &[]).await.map_err(pg("cannot read a table"))? {
                out.push_str(&format!("{table}\t{}\n", render(table, &row)?));
            }
        }
        tx.commit().await.map_err(pg("cannot end the dump's snapshot"))?;
        Ok(out)
    }
    .await;
    drop(client);
    let _ = task.await;
    result
}

/// The plain columns of a row (every column but a record), then its decoded record.
fn render(table: &str, row: &Row) -> Result<String, Error> {
    let plain = |n: usize| (0..n).map(|i| column(row, i)).collect::<Vec<_>>().join("\t");
    Ok(match table {
        "extractions" => {
            let content: Option<StoredContent> = row.get::<_, Option<&[u8]>>(6).map(decode).transpose()?;
            format!("{}\t{:?}\t{content:?}", plain(5), decoded::<ExtractionRecord>(row, 5)?)
        }
        "findings" => format!("{}\t{:?}", plain(2), decoded::<FindingRecord>(row, 2)?),
        "results" => format!("{}\t{:?}", plain(1), decoded::<ResultRecord>(row, 1)?),
        "ledger" => format!("{}\t{:?}", plain(3), decoded::<LedgerRecord>(row, 3)?),
        "outbox" => format!("{}\t{:?}", plain(3), decoded::<OutboxRecord>(row, 3)?),
        "batches" => format!("{}\t{:?}", plain(5), decoded::<BatchRecord>(row, 5)?),
        "staged" => format!("{}\t{:?}", plain(1), decoded::<StagedAnswer>(row, 1)?),
        "evaluations" => format!("{}\t{:?}", plain(2), decoded::<EvaluationRecord>(row, 2)?),
        "trials" => format!("{}\t{:?}", plain(3), decoded::<TrialRecord>(row, 3)?),
        "trial_batches" => format!("{}\t{:?}", plain(3), decoded::<TrialBatchRecord>(row, 3)?),
        _ => plain(row.len()),
    })
}

fn decoded<T: Versioned + Debug>(row: &Row, index: usize) -> Result<T, Error> {
    decode(row.get::<_, &[u8]>(index))
}

/// One plain column as text, whatever its SQL type (bytea as its bytes, in Debug form).
fn column(row: &Row, index: usize) -> String {
    use tokio_postgres::types::Type;
    let ty = row.columns()[index].type_();
    let shown = if *ty == Type::BYTEA {
        row.get::<_, Option<Vec<u8>>>(index).map(|v| format!("{v:?}"))
    } else if *ty == Type::INT8 {
        row.get::<_, Option<i64>>(index).map(|v| v.to_string())
    } else if *ty == Type::INT4 {
        row.get::<_, Option<i32>>(index).map(|v| v.to_string())
    } else if *ty == Type::INT2 {
        row.get::<_, Option<i16>>(index).map(|v| v.to_string())
    } else if *ty == Type::BOOL {
        row.get::<_, Option<bool>>(index).map(|v| v.to_string())
    } else {
        row.get::<_, Option<String>>(index)
    };
    shown.unwrap_or_else(|| "NULL".to_string())
}
