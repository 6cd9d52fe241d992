//! `verify` for what surrounds the commit point: ledger entries and their indexes and
//! per-day spend, outbox events and their due/dead lists, webhook delivery ids.

use std::collections::{BTreeMap, HashSet};

use redb::{ReadTransaction, ReadableTable};

use super::Report;
use crate::store::Error;
use crate::store::codec::decode;
use crate::store::records::{DeliveryState, ExtractionRecord, LedgerRecord, OutboxRecord};
use crate::store::redb::tables;
use crate::store::rules::verify::check_ledger_entry;
use crate::store::seam::DAY_MS;

pub(super) fn check_ledger(
    txn: &ReadTransaction,
    records: &BTreeMap<u64, ExtractionRecord>,
    report: &mut Report,
) -> Result<(), Error> {
    let ledger = txn.open_table(tables::LEDGER)?;
    let by_tenant = txn.open_table(tables::LEDGER_BY_TENANT)?;
    let by_extraction = txn.open_table(tables::LEDGER_BY_EXTRACTION)?;
    let spend = txn.open_table(tables::SPEND)?;
    let mut expected_spend: BTreeMap<(String, u64), u64> = BTreeMap::new();
    let mut entries = 0u64;
    for entry in ledger.iter()? {
        let (seq, value) = entry?;
        let seq = seq.value();
        let e: LedgerRecord = match decode(value.value()) {
            Ok(e) => e,
            Err(err) => {
                report.problem(format!("ledger #{seq}: {err}"));
                continue;
            }
        };
        entries += 1;
        check_ledger_entry(seq, &e, records.get(&e.extraction_seq), report);
        if by_tenant.get((e.tenant.as_str(), e.at_ms, seq))?.is_none()
            || by_extraction.get((e.extraction_seq, seq))?.is_none()
        {
            report.problem(format!("ledger #{seq} is missing from an index"));
        }
        if e.cost_micros > 0 {
            *expected_spend.entry((e.tenant.clone(), e.at_ms / DAY_MS)).or_default() += e.cost_micros;
        }
    }
    // Charges whose entries a tenant erasure removed still count in the day's spend.
    for entry in txn.open_table(tables::ERASED_SPEND)?.iter()? {
        let (key, micros) = entry?;
        let (tenant, day) = key.value();
        *expected_spend.entry((tenant.to_string(), day)).or_default() += micros.value();
    }
    let mut spend_rows = 0;
    for entry in spend.iter()? {
        let (key, micros) = entry?;
        let (tenant, day) = key.value();
        spend_rows += 1;
        if expected_spend.get(&(tenant.to_string(), day)) != Some(&micros.value()) {
            report.problem(format!("spend of {tenant} on day {day} disagrees with its ledger entries"));
        }
    }
    if spend_rows != expected_spend.len() {
        report.problem("a tenant's charged entries have no spend row".to_string());
    }
    if by_tenant.iter()?.count() as u64 != entries || by_extraction.iter()?.count() as u64 != entries {
        report.problem("a ledger index has entries without a ledger record".to_string());
    }
    report.ledger_entries = entries;
    Ok(())
}

pub(super) fn check_outbox(
    txn: &ReadTransaction,
    records: &BTreeMap<u64, ExtractionRecord>,
    report: &mut Report,
) -> Result<(), Error> {
    let outbox = txn.open_table(tables::OUTBOX)?;
    let due = txn.open_table(tables::OUTBOX_DUE)?;
    let dead = txn.open_table(tables::OUTBOX_DEAD)?;
    let mut due_seqs = HashSet::new();
    for entry in due.iter()? {
        let (at, seq) = entry?.0.value();
        due_seqs.insert(seq);
        match outbox.get(seq)?.map(|v| decode::<OutboxRecord>(v.value())).transpose()? {
            Some(e) if e.state == DeliveryState::Pending && e.next_attempt_at_ms == at => {}
            _ => report.problem(format!("outbox #{seq} is due but not pending at that time")),
        }
    }
    let mut events = 0;
    for entry in outbox.iter()? {
        let (seq, value) = entry?;
        let seq = seq.value();
        let e: OutboxRecord = decode(value.value())?;
        events += 1;
        if records.get(&e.extraction_seq).is_none_or(|r| r.id != e.extraction_id) {
            report.problem(format!("outbox #{seq} names an extraction that does not exist"));
        }
        let listed = match e.state {
            DeliveryState::Pending => due_seqs.contains(&seq),
            DeliveryState::Dead { .. } => dead.get(seq)?.is_some(),
            DeliveryState::Delivered { .. } => !due_seqs.contains(&seq) && dead.get(seq)?.is_none(),
        };
        if !listed {
            report.problem(format!("outbox #{seq} is not on the list its state needs"));
        }
    }
    report.outbox_events = events;
    let deliveries = txn.open_table(tables::WEBHOOK_DELIVERIES)?;
    for entry in deliveries.iter()? {
        let (key, seq) = entry?;
        if !records.contains_key(&seq.value()) {
            let (endpoint, id) = key.value();
            report.problem(format!("webhook {endpoint} delivery {id} points at no extraction"));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use redb::Database;

    use super::super::verify_file;
    use super::*;

    /// A spend row that no longer matches its ledger entries is reported.
    #[test]
    fn a_tampered_spend_row_is_found() {
        let dir = tempfile::tempdir().unwrap();
        let (store, guard) = crate::store::Store::open(dir.path(), 1 << 20).unwrap();
        drop(store);
        guard.join();
        let path = dir.path().join(crate::store::FILE_NAME);
        assert!(verify_file(&path).unwrap().is_ok());
        {
            let db = Database::open(&path).unwrap();
            let txn = db.begin_write().unwrap();
            txn.open_table(tables::SPEND).unwrap().insert(("acme", 1), 5).unwrap();
            txn.commit().unwrap();
        }
        let report = verify_file(&path).unwrap();
        assert!(report.problems.iter().any(|p| p.contains("spend of acme")), "{report}");
    }
}
