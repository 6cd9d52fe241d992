//! Outbox events on PostgreSQL, written inside the transaction of the state change they
//! belong to, as on redb; and their delivery.

use crate::store::seam::Outbox;
use async_trait::async_trait;
use tokio_postgres::Transaction;
use tokio_postgres::types::ToSql;

use super::ledger::next_seq;
use super::rows::{big, unbig};
use super::sql::{self, Tx};
use super::{Error, PgStore, pg};
use crate::domain::clock;
use crate::domain::lifecycle::State;
use crate::store::codec::{decode, encode};
use crate::store::records::{DeliveryState, ExtractionRecord, OutboxKind, OutboxRecord};
use crate::store::rules::outbox;
use crate::store::{DeliveryReport, OutboxFilter, Policies};

/// How long a claimed event stays invisible to other instances, and so the most a
/// crashed instance's events wait before they are sent again. An attempt that outlasts it
/// may be sent by a second instance too; receivers deduplicate on the event id.
const CLAIM_MS: u64 = 10_000;

pub(super) const DUE: i16 = 1;
pub(super) const DELIVERED: i16 = 2;
pub(super) const DEAD: i16 = 3;

/// Called by `transition` for every state change: terminal states get their events.
pub(super) async fn enqueue_events(
    tx: &impl Tx,
    policies: &Policies,
    now_ms: u64,
    record: &ExtractionRecord,
    next: &State,
    committed: Option<&OutboxKind>,
) -> Result<(), Error> {
    insert_events(tx, now_ms, record, outbox::new_events(record, next, &policies.sinks, committed)).await
}

/// Numbers and stores new events about `record`, due now.
pub(super) async fn insert_events(
    tx: &impl Tx,
    now_ms: u64,
    record: &ExtractionRecord,
    events: Vec<outbox::NewEvent<'_>>,
) -> Result<(), Error> {
    for event in events {
        let event = event.numbered(next_seq(tx, "outbox_seq").await?, record, now_ms);
        write_event(tx, &event, true).await?;
    }
    Ok(())
}

/// The `state_code` column of an outbox row.
pub(super) fn delivery_code(state: &DeliveryState) -> i16 {
    match state {
        DeliveryState::Pending => DUE,
        DeliveryState::Delivered { .. } => DELIVERED,
        DeliveryState::Dead { .. } => DEAD,
    }
}

async fn write_event(tx: &impl Tx, event: &OutboxRecord, insert: bool) -> Result<(), Error> {
    let bytes = encode(event)?;
    let state = delivery_code(&event.state);
    let params: [&(dyn ToSql + Sync); 7] = [
        &big(event.seq),
        &event.event_id,
        &event.sink,
        &state,
        &big(event.next_attempt_at_ms),
        &i16::from(bytes[0]),
        &bytes,
    ];
    let sql = if insert {
        "INSERT INTO outbox (seq, event_id, sink, state_code, next_attempt_at_ms, format, record) \
         VALUES ($1, $2, $3, $4, $5, $6, $7)"
    } else {
        "UPDATE outbox SET state_code = $4, next_attempt_at_ms = $5, format = $6, record = $7 \
         WHERE seq = $1 AND event_id = $2 AND sink = $3"
    };
    sql::execute(tx, sql, &params, "cannot write an outbox event").await?;
    Ok(())
}

fn events(rows: &[tokio_postgres::Row]) -> Result<Vec<OutboxRecord>, Error> {
    rows.iter().map(|r| decode(r.get(0))).collect()
}

/// An outbox event, locked until the transaction ends.
async fn lock_event(tx: &Transaction<'_>, seq: u64) -> Result<Option<OutboxRecord>, Error> {
    let row = tx
        .query_opt("SELECT record FROM outbox WHERE seq = $1 FOR UPDATE", &[&big(seq)])
        .await
        .map_err(pg("cannot read an outbox event"))?;
    row.map(|row| decode(row.get(0))).transpose()
}

#[async_trait]
impl Outbox for PgStore {
    /// Claims up to `limit` due events for this instance: each is pushed `CLAIM_MS` into
    /// the future (its record keeps the real due time), so other instances skip it while
    /// it is being delivered, and it is due again if this one dies before recording the
    /// outcome. Rows another instance is claiming are skipped, not waited for.
    async fn due_events(&self, now_ms: u64, limit: usize) -> Result<Vec<OutboxRecord>, Error> {
        let client = self.client().await?;
        let rows = client
            .query(
                "UPDATE outbox SET next_attempt_at_ms = $3 WHERE seq IN (SELECT seq FROM outbox \
                 WHERE state_code = 1 AND next_attempt_at_ms <= $1 ORDER BY next_attempt_at_ms, seq LIMIT $2 \
                 FOR UPDATE SKIP LOCKED) RETURNING record",
                &[&big(now_ms), &big(limit as u64), &big(now_ms.saturating_add(CLAIM_MS))],
            )
            .await
            .map_err(pg("cannot claim due outbox events"))?;
        let mut due = events(&rows)?;
        // Most overdue first, as on redb (RETURNING keeps no order).
        due.sort_by_key(|e| (e.next_attempt_at_ms, e.seq));
        Ok(due)
    }

    async fn record_delivery(&self, seq: u64, report: DeliveryReport) -> Result<Option<OutboxRecord>, Error> {
        let now_ms = clock::now_ms();
        let mut client = self.client().await?;
        let tx = client.transaction().await.map_err(pg("cannot begin a transaction"))?;
        let Some(mut event) = lock_event(&tx, seq).await? else {
            return Ok(None);
        };
        // Its columns are written from the record, so they are its lists: nothing else moves.
        if outbox::record_delivery(&mut event, report, now_ms).is_none() {
            return Ok(Some(event));
        }
        write_event(&tx, &event, false).await?;
        tx.commit().await.map_err(pg("delivery commit failed"))?;
        Ok(Some(event))
    }

    async fn next_event_due(&self) -> Result<Option<u64>, Error> {
        let client = self.client().await?;
        let due: Option<i64> = client
            .query_one("SELECT min(next_attempt_at_ms) FROM outbox WHERE state_code = 1", &[])
            .await
            .map_err(pg("cannot read the outbox"))?
            .get(0);
        Ok(due.map(unbig))
    }

    async fn list_outbox(&self, filter: OutboxFilter, after: u64, limit: usize) -> Result<Vec<OutboxRecord>, Error> {
        let state = match filter {
            OutboxFilter::Pending => DUE,
            OutboxFilter::Dead => DEAD,
        };
        let client = self.client().await?;
        let rows = client
            .query(
                "SELECT record FROM outbox WHERE state_code = $1 AND seq > $2 ORDER BY seq LIMIT $3",
                &[&state, &big(after), &big(limit as u64)],
            )
            .await
            .map_err(pg("cannot read the outbox"))?;
        events(&rows)
    }

    async fn outbox_counts(&self) -> Result<(u64, u64, Option<u64>), Error> {
        let client = self.client().await?;
        let row = client
            .query_one(
                "SELECT count(*) FILTER (WHERE state_code = 1), count(*) FILTER (WHERE state_code = 3) FROM outbox",
                &[],
            )
            .await
            .map_err(pg("cannot count the outbox"))?;
        let (pending, dead): (i64, i64) = (row.get(0), row.get(1));
        // Bounded, as on redb: a huge backlog's oldest is among its most overdue entries.
        let oldest = client
            .query("SELECT record FROM outbox WHERE state_code = 1 ORDER BY next_attempt_at_ms, seq LIMIT 1000", &[])
            .await
            .map_err(pg("cannot read the outbox"))?;
        let oldest = events(&oldest)?.iter().map(|e| e.created_at_ms).min();
        Ok((unbig(pending), unbig(dead), oldest))
    }

    async fn redeliver(&self, seq: u64) -> Result<Option<OutboxRecord>, Error> {
        let now_ms = clock::now_ms();
        let mut client = self.client().await?;
        let tx = client.transaction().await.map_err(pg("cannot begin a transaction"))?;
        let Some(mut event) = lock_event(&tx, seq).await? else {
            return Ok(None);
        };
        if !outbox::redeliver(&mut event, now_ms) {
            return Ok(Some(event));
        }
        write_event(&tx, &event, false).await?;
        tx.commit().await.map_err(pg("redeliver commit failed"))?;
        Ok(Some(event))
    }

    async fn set_sink_disabled(&self, sink: String, disabled: bool) -> Result<(), Error> {
        let client = self.client().await?;
        let sql = if disabled {
            "INSERT INTO sink_disabled (sink) VALUES ($1) ON CONFLICT DO NOTHING"
        } else {
            "DELETE FROM sink_disabled WHERE sink = $1"
        };
        client.execute(sql, &[&sink]).await.map_err(pg("cannot record a sink's state"))?;
        Ok(())
    }

    async fn sink_disabled(&self, sink: String) -> Result<bool, Error> {
        let client = self.client().await?;
        let row = client
            .query_opt("SELECT 1 FROM sink_disabled WHERE sink = $1", &[&sink])
            .await
            .map_err(pg("cannot read a sink's state"))?;
        Ok(row.is_some())
    }
}
