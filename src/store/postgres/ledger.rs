//! Ledger entries on PostgreSQL, written inside the transaction of the state change they
//! belong to, as on redb; and the ledger read back.

use tokio_postgres::Transaction;
use tokio_postgres::types::ToSql;

use super::rows::{big, unbig};
use super::{Error, PgStore, pg};
use crate::domain::identity::ExtractionId;
use crate::store::Policies;
use crate::store::codec::{decode, encode};
use crate::store::records::{ChargeKind, ExtractionRecord, LedgerRecord};
use crate::store::seam::LedgerVisitor;
use crate::store::seam::{Charge, DAY_MS, priced_entry};

pub(super) async fn next_seq(tx: &Transaction<'_>, sequence: &'static str) -> Result<u64, Error> {
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
}
