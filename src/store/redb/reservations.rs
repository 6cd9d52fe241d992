//! Budget reservations on redb (`rules::reserve` decides them): one entry per reserved
//! batch member under its tenant, and the tenant's sum under `RESERVED_TOTAL`, both moved
//! in the write that reserves or releases.

use std::collections::BTreeMap;

use redb::{ReadTransaction, ReadableTable};

use super::Error;
use super::records::ExtractionRecord;
use super::rules::reserve;
use super::rules::verify::Report;
use super::tables::{self, RESERVED_TOTAL};
use super::write_tables::WriteTables;
use crate::domain::lifecycle::StateName;

/// What `tenant` may still reserve now: its budget less its spend this period and its
/// open reservations; `None` when it has no budget.
pub(super) fn headroom(t: &WriteTables<'_>, tenant: &str) -> Result<Option<u64>, Error> {
    let budgets = &t.policies.budgets;
    if budgets.limit(tenant).is_none() {
        return Ok(None);
    }
    let from_day = budgets.period_start_day(t.now_ms);
    let mut spent = 0u64;
    for entry in t.spend.range((tenant, from_day)..=(tenant, u64::MAX))? {
        spent = spent.saturating_add(entry?.1.value());
    }
    let reserved = t.reservations.get((tenant, RESERVED_TOTAL))?.map_or(0, |v| v.value());
    Ok(reserve::headroom(budgets, tenant, spent, reserved))
}

pub(super) fn reserve(t: &mut WriteTables<'_>, member: &ExtractionRecord, micros: u64) -> Result<(), Error> {
    let tenant = member.tenant.as_str();
    let before = t.reservations.insert((tenant, member.seq), micros)?.map_or(0, |v| v.value());
    let total = t.reservations.get((tenant, RESERVED_TOTAL))?.map_or(0, |v| v.value());
    t.reservations.insert((tenant, RESERVED_TOTAL), total.saturating_sub(before).saturating_add(micros))?;
    Ok(())
}

/// Ends `record`'s reservation if its move from `from` to `to` ends it.
pub(super) fn follow(
    t: &mut WriteTables<'_>,
    record: &ExtractionRecord,
    from: StateName,
    to: StateName,
) -> Result<(), Error> {
    if reserve::ends(from, to) { release(t, record) } else { Ok(()) }
}

/// Drops `record`'s reservation, if it has one.
pub(super) fn release(t: &mut WriteTables<'_>, record: &ExtractionRecord) -> Result<(), Error> {
    let tenant = record.tenant.as_str();
    let Some(micros) = t.reservations.remove((tenant, record.seq))?.map(|v| v.value()) else { return Ok(()) };
    let total = t.reservations.get((tenant, RESERVED_TOTAL))?.map_or(0, |v| v.value());
    let left = total.saturating_sub(micros);
    if left == 0 {
        t.reservations.remove((tenant, RESERVED_TOTAL))?;
    } else {
        t.reservations.insert((tenant, RESERVED_TOTAL), left)?;
    }
    Ok(())
}

/// Each tenant with open reservations: (tenant, micro-dollars, members).
pub(super) fn read(txn: &ReadTransaction) -> Result<Vec<(String, u64, u64)>, Error> {
    let table = txn.open_table(tables::RESERVATIONS)?;
    let mut out: Vec<(String, u64, u64)> = Vec::new();
    for entry in table.iter()? {
        let (key, value) = entry?;
        let (tenant, seq) = key.value();
        if out.last().is_none_or(|(t, _, _)| t != tenant) {
            out.push((tenant.to_string(), 0, 0));
        }
        if let Some(last) = out.last_mut() {
            if seq == RESERVED_TOTAL {
                last.1 = value.value();
            } else {
                last.2 += 1;
            }
        }
    }
    Ok(out)
}

/// `verify`: each reservation is for a member of its tenant with the provider, and each
/// tenant's sum is the sum of its reservations.
pub(super) fn check(
    txn: &ReadTransaction,
    records: &BTreeMap<u64, ExtractionRecord>,
    report: &mut Report,
) -> Result<(), Error> {
    let table = txn.open_table(tables::RESERVATIONS)?;
    let mut sums: BTreeMap<String, (u64, Option<u64>)> = BTreeMap::new();
    for entry in table.iter()? {
        let (key, value) = entry?;
        let (tenant, seq) = key.value();
        let sum = sums.entry(tenant.to_string()).or_default();
        if seq == RESERVED_TOTAL {
            sum.1 = Some(value.value());
            continue;
        }
        sum.0 = sum.0.saturating_add(value.value());
        match records.get(&seq) {
            Some(r) if r.tenant == tenant && reserve::keeps(r.state.name()) => {}
            Some(r) => report.problem(format!(
                "{}: a budget reservation is open for it in state {} (tenant {tenant})",
                r.id,
                r.state.name().as_str()
            )),
            None => report.problem(format!("a budget reservation of {tenant} names extraction {seq}, which is gone")),
        }
    }
    for (tenant, (sum, total)) in sums {
        if total != Some(sum) {
            report.problem(format!("{tenant}'s reservations add up to {sum}, but its total says {total:?}"));
        }
    }
    Ok(())
}
