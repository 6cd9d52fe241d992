//! Ledger entries on PostgreSQL, written inside the transaction of the state change they
//! belong to, as on redb; and the ledger read back.

use crate::store::rules::erase::erased_days;
use crate::store::seam::Ledger;
use async_trait::async_trait;
use tokio_postgres::types::ToSql;

use super::rows::{big, unbig};
use super::sql::{self, Tx};
use super::{Error, PgStore, pg};
use crate::domain::identity::ExtractionId;
use crate::store::Policies;
use crate::store::codec::{decode, encode};
use crate::store::records::{ChargeKind, ExtractionRecord, LedgerRecord};
use crate::store::rules::ledger;
use crate::store::seam::{Charge, LedgerVisitor};

pub(super) async fn next_seq(tx: &impl Tx, sequence: &'static str) -> Result<u64, Error> {
    let query = format!("SELECT nextval('{sequence}')");
    let seq: i64 = sql::query_one(tx, &query, &[], "cannot allocate a sequence number").await?.get(0);
    Ok(unbig(seq))
}

/// Writes the entry `rules::ledger` plans for a charge, with its spend, as on redb.
pub(super) async fn record_charge(
    tx: &impl Tx,
    policies: &Policies,
    now_ms: u64,
    record: &ExtractionRecord,
    charge: &Charge,
    kind: ChargeKind,
) -> Result<u64, Error> {
    let charged = match ledger::request_to_look_up(charge, kind) {
        Some(request_id) => already_charged(tx, record.seq, request_id, charge).await?,
        None => false,
    };
    let seq = next_seq(tx, "ledger_seq").await?;
    let planned = ledger::plan_charge(seq, policies.pricing.as_ref(), record, charge, kind, charged, now_ms);
    let entry = &planned.entry;
    let bytes = encode(entry)?;
    let params: [&(dyn ToSql + Sync); 10] = [
        &big(seq),
        &entry.tenant,
        &big(now_ms),
        &big(record.seq),
        &entry.provider,
        &entry.usage.request_id,
        &(entry.kind == ChargeKind::Replay),
        &big(entry.cost_micros),
        &i16::from(bytes[0]),
        &bytes,
    ];
    let insert = "INSERT INTO ledger (seq, tenant, at_ms, extraction_seq, provider, request_id, replay, cost_micros, \
                  format, record) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)";
    sql::execute(tx, insert, &params, "cannot write a ledger entry").await?;
    if planned.spend > 0 {
        let add = "INSERT INTO spend (tenant, day, micros) VALUES ($1, $2, $3) \
                   ON CONFLICT (tenant, day) DO UPDATE SET micros = spend.micros + excluded.micros";
        let params: [&(dyn ToSql + Sync); 3] = [&entry.tenant, &big(planned.day), &big(planned.spend)];
        sql::execute(tx, add, &params, "cannot add to the spend total").await?;
    }
    Ok(entry.cost_micros)
}

/// The earlier entries of the extraction under the same request id, judged by the rule
/// redb applies to them too.
async fn already_charged(tx: &impl Tx, extraction_seq: u64, request_id: &str, charge: &Charge) -> Result<bool, Error> {
    let earlier = "SELECT record FROM ledger WHERE extraction_seq = $1 AND request_id = $2";
    let rows = sql::query(tx, earlier, &[&big(extraction_seq), &request_id], "cannot read the ledger").await?;
    for row in &rows {
        if ledger::charged_before(&decode(row.get(0))?, charge) {
            return Ok(true);
        }
    }
    Ok(false)
}

#[async_trait]
impl Ledger for PgStore {
    async fn reservations(&self) -> Result<Vec<crate::store::seam::Reserved>, Error> {
        let client = self.client().await?;
        let rows = client
            .query(
                "SELECT tenant, sum(reserved_micros)::bigint, count(*) FROM extractions \
                 WHERE reserved_micros IS NOT NULL GROUP BY tenant ORDER BY tenant",
                &[],
            )
            .await
            .map_err(pg("cannot read budget reservations"))?;
        Ok(rows
            .iter()
            .map(|r| crate::store::seam::Reserved {
                tenant: r.get(0),
                micros: unbig(r.get(1)),
                members: unbig(r.get(2)),
            })
            .collect())
    }

    fn budget_holds(&self) -> Vec<crate::store::BudgetHold> {
        self.policies().rotations.holds()
    }

    /// Micro-dollars erased from `tenant`'s ledger on the UTC days that overlap
    /// `from_ms..to_ms`.
    async fn erased_spend(&self, tenant: String, from_ms: u64, to_ms: u64) -> Result<u64, Error> {
        let (first, last) = erased_days(from_ms, to_ms);
        let client = self.client().await?;
        let sum: i64 = client
            .query_one(
                "SELECT coalesce(sum(micros), 0)::bigint FROM erased_spend WHERE tenant = $1 AND day BETWEEN $2 AND $3",
                &[&tenant, &big(first), &big(last)],
            )
            .await
            .map_err(pg("cannot read erased spend"))?
            .get(0);
        Ok(unbig(sum))
    }

    /// Micro-dollars charged to each of `tenants` on UTC days `from_day` and later.
    async fn spend_since(&self, tenants: Vec<String>, from_day: u64) -> Result<Vec<(String, u64)>, Error> {
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

    async fn extraction_ledger(&self, id: ExtractionId) -> Result<Option<Vec<LedgerRecord>>, Error> {
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
    async fn visit_ledger(
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
