//! Extraction rows: the encoded record and the columns derived from it, written together
//! by the one function that changes a state.

use tokio_postgres::types::ToSql;

use super::sql::{self, Tx};
use super::{Error, pg};
use crate::domain::lifecycle::State;
use crate::store::Policies;
use crate::store::codec::{decode, encode};
use crate::store::records::ExtractionRecord;
use crate::store::rules::reserve;

/// Every u64 the store keeps (sequence numbers, Unix ms, micro-dollars) fits i64 for
/// centuries; a value that does not is clamped rather than wrapped.
pub(super) fn big(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

pub(super) fn unbig(v: i64) -> u64 {
    u64::try_from(v).unwrap_or(0)
}

/// What a result must present to change this state: a lease token or a batch key.
pub(super) fn fence_of(state: &State) -> Option<String> {
    match state {
        State::Claimed { lease_token, .. } => Some(lease_token.as_str().to_string()),
        other => other.batch_key().map(|k| k.as_str().to_string()),
    }
}

pub(super) fn lease_expiry(state: &State) -> Option<i64> {
    match state {
        State::Claimed { expires_at_ms, .. } => Some(big(*expires_at_ms)),
        _ => None,
    }
}

pub(super) fn committed_at(state: &State) -> Option<i64> {
    match state {
        State::Committed { at_ms } => Some(big(*at_ms)),
        _ => None,
    }
}

pub(super) fn decode_record(bytes: &[u8]) -> Result<ExtractionRecord, Error> {
    decode(bytes)
}

/// An extraction's content column. Only retention empties it, and only for committed work,
/// which no claim or batch reads: an empty one where content is needed is a broken row.
pub(super) fn stored_content(column: Option<&[u8]>, seq: u64) -> Result<&[u8], Error> {
    column.ok_or_else(|| Error::Corrupt {
        kind: "content",
        reason: format!("extraction {seq} has no content (retention dropped it) but is being worked on"),
    })
}

/// The extraction with this identity, locked for the rest of the transaction.
pub(super) async fn lock_by_id(tx: &impl Tx, id: &[u8; 32]) -> Result<Option<ExtractionRecord>, Error> {
    let sql = "SELECT record FROM extractions WHERE id = $1 FOR UPDATE";
    let row = sql::query_opt(tx, sql, &[&id.as_slice()], "cannot read an extraction").await?;
    row.map(|r| decode_record(r.get(0))).transpose()
}

const INSERT: &str = "INSERT INTO extractions (id, seq, tenant, schema_name, state_code, updated_at_ms, format, record, \
     content, fence, source_id, schema_family) \
     VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12) ON CONFLICT (id) DO NOTHING RETURNING seq";

/// Inserts a new extraction unless its identity exists. `None`: it existed.
pub(super) async fn insert_new(
    client: &impl deadpool_postgres::GenericClient,
    record: &ExtractionRecord,
    content: &[u8],
) -> Result<Option<()>, Error> {
    let bytes = encode(record)?;
    let format = i16::from(bytes[0]);
    let family = crate::store::rules::revision::schema_family(&record.schema);
    let params: [&(dyn ToSql + Sync); 12] = [
        &record.id.as_bytes().as_slice(),
        &big(record.seq),
        &record.tenant,
        &record.schema,
        &i16::from(record.state.name().code()),
        &big(record.updated_at_ms),
        &format,
        &bytes,
        &content,
        &fence_of(&record.state),
        &record.source_id,
        &family,
    ];
    let statement = client.prepare_cached(INSERT).await.map_err(pg("cannot insert an extraction"))?;
    let inserted = client.query_opt(&statement, &params).await.map_err(pg("cannot insert an extraction"))?;
    Ok(inserted.map(|_| ()))
}

/// Persists a new state with its columns and outbox events. The only place a row's state
/// changes. The `UPDATE` repeats the fence the caller checked under its row lock, so a
/// write that lost its authority changes nothing and fails.
pub(super) async fn transition(
    tx: &impl Tx,
    policies: &Policies,
    now_ms: u64,
    record: &mut ExtractionRecord,
    next: State,
) -> Result<(), Error> {
    transition_as(tx, policies, now_ms, record, next, None).await
}

/// [`transition`], with the kind of a commit's events (`rules::revision` decides it).
pub(super) async fn transition_as(
    tx: &impl Tx,
    policies: &Policies,
    now_ms: u64,
    record: &mut ExtractionRecord,
    next: State,
    committed: Option<&crate::store::records::OutboxKind>,
) -> Result<(), Error> {
    let expected_fence = fence_of(&record.state);
    super::outbox::enqueue_events(tx, policies, now_ms, record, &next, committed).await?;
    record.state = next;
    record.updated_at_ms = now_ms;
    let bytes = encode(&*record)?;
    let format = i16::from(bytes[0]);
    let keeping = reserve::KEEPING.map(|s| i16::from(s.code()));
    let keeping: &[i16] = &keeping;
    let params: [&(dyn ToSql + Sync); 10] = [
        &big(record.seq),
        &expected_fence,
        &i16::from(record.state.name().code()),
        &fence_of(&record.state),
        &lease_expiry(&record.state),
        &committed_at(&record.state),
        &big(now_ms),
        &format,
        &bytes,
        &keeping,
    ];
    // A move out of submitted or ready ends the member's reservation (`rules::reserve`).
    let sql = "UPDATE extractions SET state_code = $3, fence = $4, lease_expires_at_ms = $5, committed_at_ms = $6, \
               updated_at_ms = $7, format = $8, record = $9, \
               reserved_micros = CASE WHEN $3::smallint = ANY($10::smallint[]) THEN reserved_micros END \
               WHERE seq = $1 AND fence IS NOT DISTINCT FROM $2";
    let changed = sql::execute(tx, sql, &params, "cannot update an extraction").await?;
    if changed != 1 {
        return Err(Error::Conflict {
            reason: format!("extraction {} changed under its lock (its fence moved)", record.seq),
            cause: None,
        });
    }
    Ok(())
}
