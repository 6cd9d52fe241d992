//! Ledger entries in the store. An entry is written by the same job, and so in the same
//! transaction, as the state change its model call paid for: a crash leaves either both
//! or neither. Pricing is a policy handed in from outside; the store only applies it.

use super::rules::erase::erased_days;
use crate::store::seam::Ledger;
use async_trait::async_trait;
use redb::ReadableTable;

use super::codec::{decode, encode};
use super::records::{ChargeKind, ExtractionRecord, LedgerRecord};
use super::rules::ledger;
use super::tables::{self, required};
use super::write_tables::WriteTables;
use super::{Error, Store};
use crate::domain::identity::ExtractionId;
use crate::store::seam::Charge;

/// Writes the entry `rules::ledger` plans for a charge, with its indexes and spend.
pub(super) fn record_charge(
    t: &mut WriteTables<'_>,
    record: &ExtractionRecord,
    charge: &Charge,
    kind: ChargeKind,
) -> Result<u64, Error> {
    let charged = match ledger::request_to_look_up(charge, kind) {
        Some(_) => already_charged(t, record.seq, charge)?,
        None => false,
    };
    let seq = t.allocate_ledger_seq();
    let planned = ledger::plan_charge(seq, t.policies.pricing.as_ref(), record, charge, kind, charged, t.now_ms);
    t.ledger.insert(seq, encode(&planned.entry)?.as_slice())?;
    t.ledger_by_tenant.insert((record.tenant.as_str(), t.now_ms, seq), ())?;
    t.ledger_by_extraction.insert((record.seq, seq), ())?;
    if planned.spend > 0 {
        let key = (record.tenant.as_str(), planned.day);
        let spent = t.spend.get(key)?.map_or(0, |v| v.value());
        t.spend.insert(key, spent.saturating_add(planned.spend))?;
    }
    Ok(planned.entry.cost_micros)
}

fn already_charged(t: &WriteTables<'_>, extraction_seq: u64, charge: &Charge) -> Result<bool, Error> {
    for entry in t.ledger_by_extraction.range((extraction_seq, 0)..=(extraction_seq, u64::MAX))? {
        let ledger_seq = entry?.0.value().1;
        let earlier: LedgerRecord = decode(&required(t.ledger.get(ledger_seq)?, "ledger", ledger_seq)?)?;
        if ledger::charged_before(&earlier, charge) {
            return Ok(true);
        }
    }
    Ok(false)
}

impl Store {
    /// Folds a tenant's entries with `from_ms <= at < to_ms`, in time order, on the
    /// blocking pool, so a long range never sits in memory at once.
    pub async fn fold_ledger<A, F>(
        &self,
        tenant: String,
        from_ms: u64,
        to_ms: u64,
        init: A,
        mut f: F,
    ) -> Result<A, Error>
    where
        A: Send + 'static,
        F: FnMut(&mut A, LedgerRecord) + Send + 'static,
    {
        self.read(move |txn| {
            let index = txn.open_table(tables::LEDGER_BY_TENANT)?;
            let ledger = txn.open_table(tables::LEDGER)?;
            let mut acc = init;
            if from_ms >= to_ms {
                return Ok(acc);
            }
            for entry in index.range((tenant.as_str(), from_ms, 0)..(tenant.as_str(), to_ms, 0))? {
                let seq = entry?.0.value().2;
                f(&mut acc, decode(&required(ledger.get(seq)?, "ledger", seq)?)?);
            }
            Ok(acc)
        })
        .await
    }
}

#[async_trait]
impl Ledger for Store {
    async fn reservations(&self) -> Result<Vec<crate::store::seam::Reserved>, Error> {
        let rows = self.read(super::reservations::read).await?;
        Ok(rows
            .into_iter()
            .map(|(tenant, micros, members)| crate::store::seam::Reserved { tenant, micros, members })
            .collect())
    }

    fn budget_holds(&self) -> Vec<crate::store::BudgetHold> {
        self.current_policies().rotations.holds()
    }

    /// Micro-dollars erased from `tenant`'s ledger on the UTC days that overlap
    /// `from_ms..to_ms`.
    async fn erased_spend(&self, tenant: String, from_ms: u64, to_ms: u64) -> Result<u64, Error> {
        self.read(move |txn| {
            let table = txn.open_table(super::tables::ERASED_SPEND)?;
            let (first, last) = erased_days(from_ms, to_ms);
            let mut sum = 0u64;
            for entry in table.range((tenant.as_str(), first)..=(tenant.as_str(), last))? {
                sum = sum.saturating_add(entry?.1.value());
            }
            Ok(sum)
        })
        .await
    }

    /// [`Store::fold_ledger`] for a visitor that keeps its own state (the seam's form).
    async fn visit_ledger(
        &self,
        tenant: String,
        from_ms: u64,
        to_ms: u64,
        mut visit: super::seam::LedgerVisitor,
    ) -> Result<(), Error> {
        self.fold_ledger(tenant, from_ms, to_ms, (), move |_, entry| visit(entry)).await
    }

    /// Every ledger entry of one extraction, oldest first; `None` if the id is unknown.
    async fn extraction_ledger(&self, id: ExtractionId) -> Result<Option<Vec<LedgerRecord>>, Error> {
        self.read(move |txn| {
            let identity = txn.open_table(tables::IDENTITY)?;
            let Some(seq) = identity.get(id.as_bytes())?.map(|v| v.value()) else {
                return Ok(None);
            };
            let index = txn.open_table(tables::LEDGER_BY_EXTRACTION)?;
            let ledger = txn.open_table(tables::LEDGER)?;
            let mut entries = Vec::new();
            for entry in index.range((seq, 0)..=(seq, u64::MAX))? {
                let ledger_seq = entry?.0.value().1;
                entries.push(decode(&required(ledger.get(ledger_seq)?, "ledger", ledger_seq)?)?);
            }
            Ok(Some(entries))
        })
        .await
    }

    /// Micro-dollars charged to each of `tenants` on UTC days `from_day` and later.
    async fn spend_since(&self, tenants: Vec<String>, from_day: u64) -> Result<Vec<(String, u64)>, Error> {
        self.read(move |txn| {
            let spend = txn.open_table(tables::SPEND)?;
            let mut totals = Vec::with_capacity(tenants.len());
            for tenant in tenants {
                let mut sum = 0u64;
                for entry in spend.range((tenant.as_str(), from_day)..=(tenant.as_str(), u64::MAX))? {
                    sum = sum.saturating_add(entry?.1.value());
                }
                totals.push((tenant, sum));
            }
            Ok(totals)
        })
        .await
    }
}
