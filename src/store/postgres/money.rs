//! Ledger entries and outbox events on PostgreSQL. Both are written inside the
//! transaction of the state change they belong to, as on redb.

use tokio_postgres::Transaction;
use tokio_postgres::types::ToSql;

use super::rows::{big, unbig};
use super::{Error, PgStore, pg};
use crate::domain::clock;
use crate::domain::identity::ExtractionId;
use crate::domain::lifecycle::State;
use crate::store::codec::{decode, encode};
use crate::store::ledger::{Charge, DAY_MS, priced_entry};
use crate::store::records::{ChargeKind, DeliveryState, ExtractionRecord, LedgerRecord, OutboxKind, OutboxRecord};
use crate::store::seam::LedgerVisitor;
use crate::store::{DeliveryReport, OutboxFilter, Policies};

/// How long a claimed event stays invisible to other instances, and so the most a
/// crashed instance's events wait before they are sent again. An attempt that outlasts it
/// may be sent by a second instance too; receivers deduplicate on the event id.
const CLAIM_MS: u64 = 10_000;

pub(super) const DUE: i16 = 1;
pub(super) const DELIVERED: i16 = 2;
pub(super) const DEAD: i16 = 3;

async fn next_seq(tx: &Transaction<'_>, sequence: &'static str) -> Result<u64, Error> {
    let query = format!("SELECT nextval('{sequence}')");
    let seq: i64 = tx.query_one(query.as_str(), &[]).await.map_err(pg("cannot allocate a sequence number"))?.get(0);
    Ok(unbig(seq))
}

pub(super) async fn record_charge(
    tx: &Transaction<'_>,
    policies: &Policies,
    now_ms: u64,
    record: &ExtractionRecord,
    charge: &Charge,
    kind: ChargeKind,
) -> Result<(), Error> {
    // One provider request id is charged once per extraction, as on redb.
    let kind = if kind != ChargeKind::Replay && already_charged(tx, record.seq, charge).await? {
        ChargeKind::Replay
    } else {
        kind
    };
    let seq = next_seq(tx, "ledger_seq").await?;
    let entry = priced_entry(seq, policies.pricing.as_ref(), record, charge, kind, now_ms);
    let cost_micros = entry.cost_micros;
    let bytes = encode(&entry)?;
    let params: [&(dyn ToSql + Sync); 10] = [
        &big(seq),
        &entry.tenant,
        &big(now_ms),
        &big(record.seq),
        &entry.provider,
        &entry.usage.request_id,
        &(kind == ChargeKind::Replay),
        &big(cost_micros),
        &i16::from(bytes[0]),
        &bytes,
    ];
    tx.execute(
        "INSERT INTO ledger (seq, tenant, at_ms, extraction_seq, provider, request_id, replay, cost_micros, format, record) \
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)",
        &params,
    )
    .await
    .map_err(pg("cannot write a ledger entry"))?;
    if cost_micros > 0 {
        tx.execute(
            "INSERT INTO spend (tenant, day, micros) VALUES ($1, $2, $3) \
             ON CONFLICT (tenant, day) DO UPDATE SET micros = spend.micros + excluded.micros",
            &[&entry.tenant, &big(now_ms / DAY_MS), &big(cost_micros)],
        )
        .await
        .map_err(pg("cannot add to the spend total"))?;
    }
    Ok(())
}

async fn already_charged(tx: &Transaction<'_>, extraction_seq: u64, charge: &Charge) -> Result<bool, Error> {
    let Some(request_id) = charge.usage.request_id.as_deref() else {
        return Ok(false);
    };
    let row = tx
        .query_opt(
            "SELECT 1 FROM ledger WHERE extraction_seq = $1 AND NOT replay AND provider = $2 AND request_id = $3 LIMIT 1",
            &[&big(extraction_seq), &charge.provider, &request_id],
        )
        .await
        .map_err(pg("cannot read the ledger"))?;
    Ok(row.is_some())
}

/// The same event id derivation as on redb: receivers deduplicate across backends.
fn event_id(record: &ExtractionRecord, kind: &OutboxKind) -> String {
    let mut hasher = blake3::Hasher::new_derive_key("commitpoint outbox event v1");
    hasher.update(record.id.as_bytes());
    hasher.update(&record.attempt.to_le_bytes());
    hasher.update(match kind {
        OutboxKind::Committed => b"committed",
        OutboxKind::Failed { .. } => b"failed",
        OutboxKind::Cancelled => b"cancelled",
    });
    format!("msg_{}", &hasher.finalize().to_hex()[..32])
}

/// Called by `transition` for every state change: terminal states get their events.
pub(super) async fn enqueue_events(
    tx: &Transaction<'_>,
    policies: &Policies,
    now_ms: u64,
    record: &ExtractionRecord,
    next: &State,
) -> Result<(), Error> {
    let kind = match next {
        State::Committed { .. } => OutboxKind::Committed,
        State::Failed { class, reason } => OutboxKind::Failed { class: *class, reason: reason.clone() },
        State::Cancelled { .. } => OutboxKind::Cancelled,
        _ => return Ok(()),
    };
    let id = event_id(record, &kind);
    for sink in &policies.sinks {
        let seq = next_seq(tx, "outbox_seq").await?;
        let event = OutboxRecord::due_now(seq, id.clone(), sink.clone(), kind.clone(), record, now_ms);
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

async fn write_event(tx: &Transaction<'_>, event: &OutboxRecord, insert: bool) -> Result<(), Error> {
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
    tx.execute(sql, &params).await.map_err(pg("cannot write an outbox event"))?;
    Ok(())
}

fn events(rows: &[tokio_postgres::Row]) -> Result<Vec<OutboxRecord>, Error> {
    rows.iter().map(|r| decode(r.get(0))).collect()
}

impl PgStore {
    /// Micro-dollars charged to each of `tenants` on UTC days `from_day` and later.
    pub(super) async fn spend_since(&self, tenants: Vec<String>, from_day: u64) -> Result<Vec<(String, u64)>, Error> {
        let client = self.client().await?;
        let mut totals = Vec::with_capacity(tenants.len());
        for tenant in tenants {
            let sum: i64 = client
                .query_one(
                    "SELECT coalesce(sum(micros), 0)::bigint FROM spend WHERE tenant = $1 AND day >= $2",
                    &[&tenant, &big(from_day)],
                )
                .await
                .map_err(pg("cannot read spend"))?
                .get(0);
            totals.push((tenant, unbig(sum)));
        }
        Ok(totals)
    }

    pub(super) async fn extraction_ledger(&self, id: ExtractionId) -> Result<Option<Vec<LedgerRecord>>, Error> {
        let client = self.client().await?;
        let Some(row) = client
            .query_opt("SELECT seq FROM extractions WHERE id = $1", &[&id.as_bytes().as_slice()])
            .await
            .map_err(pg("cannot read an extraction"))?
        else {
            return Ok(None);
        };
        let seq: i64 = row.get(0);
        let rows = client
            .query("SELECT record FROM ledger WHERE extraction_seq = $1 ORDER BY seq", &[&seq])
            .await
            .map_err(pg("cannot read the ledger"))?;
        rows.iter().map(|r| decode(r.get(0))).collect::<Result<Vec<_>, _>>().map(Some)
    }

    /// Every entry of `tenant` in `[from_ms, to_ms)`, oldest first, a page at a time so a
    /// long period never sits in memory at once.
    pub(super) async fn visit_ledger(
        &self,
        tenant: String,
        from_ms: u64,
        to_ms: u64,
        mut visit: LedgerVisitor,
    ) -> Result<(), Error> {
        const PAGE: i64 = 1000;
        let client = self.client().await?;
        let (mut at, mut seq) = (big(from_ms), 0i64);
        loop {
            let rows = client
                .query(
                    "SELECT at_ms, seq, record FROM ledger WHERE tenant = $1 AND (at_ms, seq) > ($2, $3) \
                     AND at_ms >= $2 AND at_ms < $4 ORDER BY at_ms, seq LIMIT $5",
                    &[&tenant, &at, &seq, &big(to_ms), &PAGE],
                )
                .await
                .map_err(pg("cannot read the ledger"))?;
            let full = rows.len() as i64 == PAGE;
            for row in &rows {
                (at, seq) = (row.get(0), row.get(1));
                visit(decode(row.get(2))?);
            }
            if !full {
                return Ok(());
            }
        }
    }

    /// Claims up to `limit` due events for this instance: each is pushed `CLAIM_MS` into
    /// the future (its record keeps the real due time), so other instances skip it while
    /// it is being delivered, and it is due again if this one dies before recording the
    /// outcome. Rows another instance is claiming are skipped, not waited for.
    pub(super) async fn due_events(&self, now_ms: u64, limit: usize) -> Result<Vec<OutboxRecord>, Error> {
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

    pub(super) async fn record_delivery(
        &self,
        seq: u64,
        report: DeliveryReport,
    ) -> Result<Option<OutboxRecord>, Error> {
        let now_ms = clock::now_ms();
        let mut client = self.client().await?;
        let tx = client.transaction().await.map_err(pg("cannot begin a transaction"))?;
        let Some(mut event) = lock_event(&tx, seq).await? else {
            return Ok(None);
        };
        if event.state != DeliveryState::Pending {
            return Ok(Some(event));
        }
        event.deliveries += 1;
        match report {
            DeliveryReport::Delivered { status } => event.state = DeliveryState::Delivered { at_ms: now_ms, status },
            DeliveryReport::Retry { at_ms, error } => {
                event.next_attempt_at_ms = at_ms;
                event.last_error = Some(error);
            }
            DeliveryReport::Dead { reason } => {
                event.last_error = Some(reason.clone());
                event.state = DeliveryState::Dead { reason };
            }
        }
        write_event(&tx, &event, false).await?;
        tx.commit().await.map_err(pg("delivery commit failed"))?;
        Ok(Some(event))
    }

    pub(super) async fn next_event_due(&self) -> Result<Option<u64>, Error> {
        let client = self.client().await?;
        let due: Option<i64> = client
            .query_one("SELECT min(next_attempt_at_ms) FROM outbox WHERE state_code = 1", &[])
            .await
            .map_err(pg("cannot read the outbox"))?
            .get(0);
        Ok(due.map(unbig))
    }

    pub(super) async fn list_outbox(
        &self,
        filter: OutboxFilter,
        after: u64,
        limit: usize,
    ) -> Result<Vec<OutboxRecord>, Error> {
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

    pub(super) async fn outbox_counts(&self) -> Result<(u64, u64, Option<u64>), Error> {
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

    pub(super) async fn redeliver(&self, seq: u64) -> Result<Option<OutboxRecord>, Error> {
        let now_ms = clock::now_ms();
        let mut client = self.client().await?;
        let tx = client.transaction().await.map_err(pg("cannot begin a transaction"))?;
        let Some(mut event) = lock_event(&tx, seq).await? else {
            return Ok(None);
        };
        if !matches!(event.state, DeliveryState::Dead { .. }) {
            return Ok(Some(event));
        }
        event.state = DeliveryState::Pending;
        event.next_attempt_at_ms = now_ms;
        write_event(&tx, &event, false).await?;
        tx.commit().await.map_err(pg("redeliver commit failed"))?;
        Ok(Some(event))
    }

    pub(super) async fn set_sink_disabled(&self, sink: String, disabled: bool) -> Result<(), Error> {
        let client = self.client().await?;
        let sql = if disabled {
            "INSERT INTO sink_disabled (sink) VALUES ($1) ON CONFLICT DO NOTHING"
        } else {
            "DELETE FROM sink_disabled WHERE sink = $1"
        };
        client.execute(sql, &[&sink]).await.map_err(pg("cannot record a sink's state"))?;
        Ok(())
    }

    pub(super) async fn sink_disabled(&self, sink: String) -> Result<bool, Error> {
        let client = self.client().await?;
        let row = client
            .query_opt("SELECT 1 FROM sink_disabled WHERE sink = $1", &[&sink])
            .await
            .map_err(pg("cannot read a sink's state"))?;
        Ok(row.is_some())
    }
}

/// An outbox event, locked until the transaction ends.
async fn lock_event(tx: &Transaction<'_>, seq: u64) -> Result<Option<OutboxRecord>, Error> {
    let row = tx
        .query_opt("SELECT record FROM outbox WHERE seq = $1 FOR UPDATE", &[&big(seq)])
        .await
        .map_err(pg("cannot read an outbox event"))?;
    row.map(|row| decode(row.get(0))).transpose()
}
