//! Each tenant's work by schema and state (`TENANT_COUNTS`), moved by the same writes that
//! move `STATE_COUNTS`, so per-tenant depth reads one counter per (tenant, schema, state)
//! instead of counting extractions. A file without the counters, or one an older binary
//! wrote to after a rollback (its sums then disagree with `STATE_COUNTS`), is recounted
//! from its records when it is opened. An older binary's writes that leave every state's
//! total as it was (one tenant's pending item erased while another's was taken in) pass
//! that check; `verify` compares every counter with the records and names them.

use std::collections::BTreeMap;

use redb::{ReadTransaction, ReadableTable};

use super::Error;
use super::codec::decode;
use super::records::ExtractionRecord;
use super::rules::depth::{self, Counts};
use super::tables::{self, META_TENANT_COUNTS};
use super::write_tables::WriteTables;
use crate::domain::lifecycle::StateName;
use crate::store::seam::TenantDepth;

/// Moves `record`'s tenant and schema from state `from` to `to` (`None`: not stored).
pub(super) fn moved(
    t: &mut WriteTables<'_>,
    record: &ExtractionRecord,
    from: Option<StateName>,
    to: Option<StateName>,
) -> Result<(), Error> {
    if from == to {
        return Ok(());
    }
    let (tenant, schema) = (record.tenant.as_str(), record.schema.as_str());
    if let Some(from) = from {
        let key = (tenant, schema, from.code());
        let now = t.tenant_counts.get(key)?.map_or(0, |v| v.value());
        // A pair with nothing in a state leaves no counter behind: erased and finished
        // tenants do not grow the table.
        if now <= 1 {
            t.tenant_counts.remove(key)?;
        } else {
            t.tenant_counts.insert(key, now - 1)?;
        }
    }
    if let Some(to) = to {
        let key = (tenant, schema, to.code());
        let now = t.tenant_counts.get(key)?.map_or(0, |v| v.value());
        t.tenant_counts.insert(key, now.saturating_add(1))?;
    }
    Ok(())
}

fn stored<T: ReadableTable<(&'static str, &'static str, u8), u64>>(table: &T) -> Result<Counts, Error> {
    let mut counts = Counts::new();
    for entry in table.iter()? {
        let (key, value) = entry?;
        let (tenant, schema, code) = key.value();
        counts.insert((tenant.to_string(), schema.to_string(), code), value.value());
    }
    Ok(counts)
}

/// Recounts from the records unless `META` says the counters are complete and their sums
/// per state equal `STATE_COUNTS`. Runs in the opening transaction, after the per-state
/// counters are reconciled. Returns how many counters it wrote.
pub(super) fn build_if_absent(t: &mut WriteTables<'_>) -> Result<u64, Error> {
    if t.meta.get(META_TENANT_COUNTS)?.is_some() {
        let mut sums: BTreeMap<u8, u64> = BTreeMap::new();
        for ((_, _, code), n) in stored(&t.tenant_counts)? {
            *sums.entry(code).or_default() += n;
        }
        let mut agree = true;
        for state in StateName::ALL {
            agree &= sums.get(&state.code()).copied().unwrap_or(0) == super::state_counts::get(t, state)?;
        }
        if agree {
            return Ok(0);
        }
    }
    t.tenant_counts.retain(|_, _| false)?;
    // Counted while walking: a large file is not held in memory.
    let mut counts = Counts::new();
    for entry in t.extractions.iter()? {
        let record = decode::<ExtractionRecord>(entry?.1.value())?;
        depth::count_one(&mut counts, &record);
    }
    for ((tenant, schema, code), n) in &counts {
        t.tenant_counts.insert((tenant.as_str(), schema.as_str(), *code), *n)?;
    }
    t.meta.insert(META_TENANT_COUNTS, 1)?;
    if !counts.is_empty() {
        tracing::info!(
            counters = counts.len(),
            "counted each tenant's extractions by schema and state (the file predates the counters, or an older binary wrote to it)"
        );
    }
    Ok(counts.len() as u64)
}

/// Every tenant's depth from a read snapshot: the counters, and for each pair with pending
/// work the head of its pending queue (one seek and one record read per pair).
pub(super) fn read(txn: &ReadTransaction) -> Result<Vec<TenantDepth>, Error> {
    let counts = stored(&txn.open_table(tables::TENANT_COUNTS)?)?;
    let queue = txn.open_table(tables::PENDING_QUEUE)?;
    let pending = StateName::Pending.code();
    let mut oldest = BTreeMap::new();
    for (tenant, schema, _) in counts.keys().filter(|(_, _, code)| *code == pending) {
        let first =
            queue.range((schema.as_str(), tenant.as_str(), 0)..=(schema.as_str(), tenant.as_str(), u64::MAX))?.next();
        if let Some(entry) = first {
            let seq = entry?.0.value().2;
            oldest.insert((tenant.clone(), schema.clone()), super::reads::by_seq(txn, seq)?.updated_at_ms);
        }
    }
    Ok(depth::assemble(counts, oldest))
}

/// `verify`'s look: once the counters exist, each equals a recount of the records.
pub(super) fn check(
    txn: &ReadTransaction,
    records: &BTreeMap<u64, ExtractionRecord>,
    report: &mut crate::store::Report,
) -> Result<(), Error> {
    if txn.open_table(tables::META)?.get(META_TENANT_COUNTS)?.is_none() {
        return Ok(()); // a file that predates the counters; opening it counts them
    }
    let stored = stored(&txn.open_table(tables::TENANT_COUNTS)?)?;
    for problem in depth::disagreements(&stored, &depth::recount(records.values())) {
        report.problem(problem);
    }
    Ok(())
}
