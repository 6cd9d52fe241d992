//! The rows of `migrate-store`'s copy and how they are written: one binary `COPY` per
//! chunk, each table's columns derived by the functions the live writes use, the stored
//! bytes as they were.

use std::pin::pin;

use tokio_postgres::Transaction;
use tokio_postgres::binary_copy::BinaryCopyInWriter;
use tokio_postgres::types::{ToSql, Type};

use super::batches::{job_of, state_code};
use super::outbox::delivery_code;
use super::rows::{big, committed_at, fence_of, lease_expiry};
use super::{Error, pg};
use crate::store::evaluation::{EvaluationRecord, TrialBatchRecord};
use crate::store::records::{BatchRecord, ChargeKind, ExtractionRecord, LedgerRecord, OutboxRecord};

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
    /// Evaluations before their trials and trial batches.
    Evaluations(Vec<(EvaluationRecord, Vec<u8>)>),
    /// (evaluation, candidate, member index, stored bytes).
    Trials(Vec<(String, String, u32, Vec<u8>)>),
    TrialBatches(Vec<(TrialBatchRecord, Vec<u8>)>),
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
            ImportRows::Evaluations(v) => v.len(),
            ImportRows::Trials(v) => v.len(),
            ImportRows::TrialBatches(v) => v.len(),
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

pub(super) async fn write_chunk(tx: &Transaction<'_>, chunk: &ImportRows) -> Result<(), Error> {
    use Type as T;
    match chunk {
        ImportRows::Extractions(rows) => {
            copy(
                tx,
                "extractions (id, seq, tenant, schema_name, state_code, fence, lease_expires_at_ms, committed_at_ms, \
                 updated_at_ms, format, record, content, source_id, schema_family, superseded_by)",
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
                    T::TEXT,
                    T::TEXT,
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
                        Box::new(r.source_id.as_str()),
                        Box::new(crate::store::rules::revision::schema_family(&r.schema)),
                        Box::new(r.superseded_by.map(|id| id.as_bytes().to_vec())),
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
        ImportRows::Evaluations(rows) => {
            copy(
                tx,
                "evaluations (name, created_at_ms, format, record)",
                &[T::TEXT, T::INT8, T::INT2, T::BYTEA],
                rows,
                |(evaluation, bytes)| {
                    vec![
                        Box::new(evaluation.name.as_str()),
                        Box::new(big(evaluation.created_at_ms)),
                        Box::new(format_of(bytes)),
                        Box::new(bytes.as_slice()),
                    ]
                },
            )
            .await
        }
        ImportRows::Trials(rows) => {
            copy(
                tx,
                "trials (evaluation, candidate, idx, format, record)",
                &[T::TEXT, T::TEXT, T::INT4, T::INT2, T::BYTEA],
                rows,
                |(evaluation, candidate, index, bytes)| {
                    vec![
                        Box::new(evaluation.as_str()),
                        Box::new(candidate.as_str()),
                        // Past i32, the row is refused by the column's check, never wrapped.
                        Box::new(i32::try_from(*index).unwrap_or(-1)),
                        Box::new(format_of(bytes)),
                        Box::new(bytes.as_slice()),
                    ]
                },
            )
            .await
        }
        ImportRows::TrialBatches(rows) => {
            copy(
                tx,
                "trial_batches (seq, evaluation, open, format, record)",
                &[T::INT8, T::TEXT, T::BOOL, T::INT2, T::BYTEA],
                rows,
                |(batch, bytes)| {
                    vec![
                        Box::new(big(batch.seq)),
                        Box::new(batch.evaluation.as_str()),
                        Box::new(batch.closed.is_none()),
                        Box::new(format_of(bytes)),
                        Box::new(bytes.as_slice()),
                    ]
                },
            )
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
