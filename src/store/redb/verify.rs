//! Offline check of a database file: redb's own integrity check, then every DESIGN §6
//! invariant that can be seen in one file. Used by `commitpoint verify` and the tests.

use std::collections::{BTreeMap, HashSet};
use std::path::Path;

use redb::{Database, ReadTransaction, ReadableDatabase, ReadableTable, ReadableTableMetadata};

use super::Error;
use super::codec::decode;
use super::records::{BatchRecord, BatchState, ExtractionRecord, FindingRecord, ResultRecord, StoredContent};
use super::tables;

mod commit_index;
mod evaluations;
mod ledger;
mod pending_queue;
mod retention;
mod state_counts;
use super::rules::verify::{Report, check_finding_key, check_record, check_result};
use crate::domain::lifecycle::State;
use crate::domain::names::BatchKey;

/// Opens the file exclusively (a running server holds it locked) and checks it.
pub fn verify_file(path: &Path) -> Result<Report, Error> {
    let mut db =
        Database::open(path).map_err(|source| Error::Open { path: path.to_path_buf(), source: source.into() })?;
    verify_database(&mut db)
}

/// The same checks on an open database (the power-loss tests reopen simulated disks).
pub(crate) fn verify_database(db: &mut Database) -> Result<Report, Error> {
    let mut report = Report::default();
    match db.check_integrity() {
        Ok(true) => {}
        Ok(false) => report.problem("redb integrity check repaired damage in the file".to_string()),
        Err(e) => report.problem(format!("redb integrity check failed: {e}")),
    }
    let txn = db.begin_read()?;
    check(&txn, &mut report)?;
    Ok(report)
}

fn check(txn: &ReadTransaction, report: &mut Report) -> Result<(), Error> {
    let records = check_records(txn, report)?;
    check_indexes(txn, &records, report)?;
    state_counts::check_state_counts(txn, report)?;
    pending_queue::check_pending_queue(txn, &records, report)?;
    commit_index::check_commit_index(txn, &records, report)?;
    check_findings(txn, &records, report)?;
    check_results(txn, &records, report)?;
    check_batches(txn, &records, report)?;
    ledger::check_ledger(txn, &records, report)?;
    ledger::check_outbox(txn, &records, report)?;
    retention::check_retired(txn, &records, report)?;
    super::revisions::check(txn, &records, report)?;
    super::tenant_counts::check(txn, &records, report)?;
    super::reservations::check(txn, &records, report)?;
    evaluations::check_evaluations(txn, &records, report)?;
    Ok(())
}

fn retired_bits(retired: &redb::ReadOnlyTable<u64, u8>, seq: u64) -> Result<u8, Error> {
    Ok(retired.get(seq)?.map_or(0, |v| v.value()))
}

/// Staged answers belong to `Ready` extractions only; every extraction in a batch state
/// belongs to exactly one open batch whose job id agrees with it (invariant 4: no member
/// of a live job is in a second one). A batch may still list members it has released.
fn check_batches(
    txn: &ReadTransaction,
    records: &BTreeMap<u64, ExtractionRecord>,
    report: &mut Report,
) -> Result<(), Error> {
    let staged = txn.open_table(tables::STAGED)?;
    for entry in staged.iter()? {
        let (key, value) = entry?;
        let seq = key.value();
        if let Err(e) = decode::<super::StagedAnswer>(value.value()) {
            report.problem(format!("staged answer #{seq}: {e}"));
        }
        match records.get(&seq) {
            Some(r) if matches!(r.state, State::Ready { .. }) => {}
            Some(r) => report.problem(format!("{}: has a staged answer but is {}", r.id, r.state.name().as_str())),
            None => report.problem(format!("staged answer under unknown extraction #{seq}")),
        }
    }
    let batches = txn.open_table(tables::BATCHES)?;
    let open = txn.open_table(tables::OPEN_BATCHES)?;
    let mut owner: BTreeMap<u64, (BatchKey, Option<String>)> = BTreeMap::new();
    for entry in batches.iter()? {
        let (seq, value) = entry?;
        let seq = seq.value();
        let batch: BatchRecord = match decode(value.value()) {
            Ok(b) => b,
            Err(e) => {
                report.problem(format!("batch #{seq}: {e}"));
                continue;
            }
        };
        let is_open = open.get(seq)?.is_some();
        let job = match &batch.state {
            BatchState::Intent => None,
            BatchState::Submitted { job_id } => Some(job_id.clone()),
            BatchState::Closed { .. } => {
                if is_open {
                    report.problem(format!("batch {} is closed but still scheduled", batch.batch_key));
                }
                continue;
            }
        };
        if !is_open {
            report.problem(format!("batch {} is live but not scheduled: it would never be polled", batch.batch_key));
        }
        for member in &batch.members {
            // A member whose line said "try again" is requeued while its batch is still
            // open (closed after the whole file is read); from then on the old batch only
            // lists it. Only members whose state names this batch are bound to it.
            let bound = records.get(member).and_then(|r| r.state.batch_key()) == Some(&batch.batch_key);
            if !bound {
                continue;
            }
            if owner.insert(*member, (batch.batch_key.clone(), job.clone())).is_some() {
                report.problem(format!("extraction #{member} is a member of two live batches (invariant 4)"));
            }
        }
    }
    for (seq, record) in records {
        let (key, job) = match &record.state {
            State::Submitted { batch_key, job_id, .. } => (batch_key, job_id.clone()),
            // A ready answer may outlive its batch (closed while the commit was pending);
            // it only needs the answer itself.
            State::Ready { .. } => {
                if staged.get(*seq)?.is_none() {
                    report.problem(format!("{}: ready without its staged answer", record.id));
                }
                continue;
            }
            _ => continue,
        };
        match owner.get(seq) {
            Some((owner_key, owner_job)) if owner_key == key && *owner_job == job => {}
            Some((owner_key, _)) if owner_key == key => {
                report.problem(format!("{}: its job id disagrees with its batch {key}", record.id));
            }
            _ => report.problem(format!("{}: belongs to batch {key}, which is not live", record.id)),
        }
    }
    Ok(())
}

/// Every record decodes, its identity recomputes, and identity ↔ record is one-to-one.
fn check_records(txn: &ReadTransaction, report: &mut Report) -> Result<BTreeMap<u64, ExtractionRecord>, Error> {
    let extractions = txn.open_table(tables::EXTRACTIONS)?;
    let identity = txn.open_table(tables::IDENTITY)?;
    let contents = txn.open_table(tables::CONTENTS)?;
    let retired = txn.open_table(tables::RETIRED)?;
    let mut records = BTreeMap::new();
    for entry in extractions.iter()? {
        let (seq, value) = entry?;
        let seq = seq.value();
        let record: ExtractionRecord = match decode(value.value()) {
            Ok(r) => r,
            Err(e) => {
                report.problem(format!("extraction #{seq}: {e}"));
                continue;
            }
        };
        let content = match contents.get(seq)? {
            Some(v) => Some(decode::<StoredContent>(v.value())),
            None if retired_bits(&retired, seq)? & super::rules::retention::RETIRED_CONTENT != 0 => None,
            None => {
                report.problem(format!("{}: content is missing", record.id));
                None
            }
        };
        check_record(seq, &record, content, report);
        match identity.get(record.id.as_bytes())?.map(|v| v.value()) {
            Some(s) if s == seq => {}
            Some(s) => report.problem(format!("{}: identity index points at #{s}, record is #{seq}", record.id)),
            None => report.problem(format!("{}: missing from the identity index", record.id)),
        }
        records.insert(seq, record);
    }
    if identity.len()? != records.len() as u64 {
        report.problem(format!(
            "identity index has {} entries for {} extractions (invariant 1: one extraction per identity)",
            identity.len()?,
            records.len()
        ));
    }
    Ok(records)
}

fn check_indexes(
    txn: &ReadTransaction,
    records: &BTreeMap<u64, ExtractionRecord>,
    report: &mut Report,
) -> Result<(), Error> {
    let state_index = txn.open_table(tables::STATE_INDEX)?;
    let lease_index = txn.open_table(tables::LEASE_INDEX)?;
    let tenant_index = txn.open_table(tables::TENANT_INDEX)?;
    let mut leases = 0u64;
    for (seq, record) in records {
        if state_index.get((record.state.name().code(), *seq))?.is_none() {
            report.problem(format!("{}: missing from the {} queue", record.id, record.state.name().as_str()));
        }
        if tenant_index.get((record.tenant.as_str(), *seq))?.is_none() {
            report.problem(format!("{}: missing from the tenant index", record.id));
        }
        if let State::Claimed { expires_at_ms, .. } = record.state {
            leases += 1;
            if lease_index.get((expires_at_ms, *seq))?.is_none() {
                report.problem(format!("{}: claimed but missing from the lease index", record.id));
            }
        }
    }
    let sizes = [
        ("state", state_index.len()?, records.len() as u64),
        ("tenant", tenant_index.len()?, records.len() as u64),
        ("lease", lease_index.len()?, leases),
    ];
    for (name, found, expected) in sizes {
        if found != expected {
            report.problem(format!("{name} index has {found} entries, expected {expected}"));
        }
    }
    Ok(())
}

/// Findings belong only to committed extractions, and every key recomputes and is unique.
fn check_findings(
    txn: &ReadTransaction,
    records: &BTreeMap<u64, ExtractionRecord>,
    report: &mut Report,
) -> Result<(), Error> {
    let findings = txn.open_table(tables::FINDINGS)?;
    let mut seen = HashSet::new();
    for entry in findings.iter()? {
        let (key, value) = entry?;
        let (seq, key_bytes) = key.value();
        report.findings += 1;
        let Some(record) = records.get(&seq) else {
            report.problem(format!("finding under unknown extraction #{seq}"));
            continue;
        };
        if !matches!(record.state, State::Committed { .. }) {
            report.problem(format!("{}: has findings but is {}", record.id, record.state.name().as_str()));
        }
        let finding: FindingRecord = match decode(value.value()) {
            Ok(f) => f,
            Err(e) => {
                report.problem(format!("{}: finding: {e}", record.id));
                continue;
            }
        };
        check_finding_key(&record.id, key_bytes, &finding, report);
        if !seen.insert(*key_bytes) {
            report.problem(format!("finding key {} appears twice (invariant 3)", finding.key));
        }
    }
    Ok(())
}

fn check_results(
    txn: &ReadTransaction,
    records: &BTreeMap<u64, ExtractionRecord>,
    report: &mut Report,
) -> Result<(), Error> {
    let results = txn.open_table(tables::RESULTS)?;
    for entry in results.iter()? {
        let (seq, value) = entry?;
        let seq = seq.value();
        report.results += 1;
        match records.get(&seq) {
            Some(r) if matches!(r.state, State::Committed { .. }) => {}
            Some(r) => report.problem(format!("{}: has a raw result but is {}", r.id, r.state.name().as_str())),
            None => report.problem(format!("raw result under unknown extraction #{seq}")),
        }
        check_result(seq, decode::<ResultRecord>(value.value()), report);
    }
    let retired = txn.open_table(tables::RETIRED)?;
    for (seq, record) in records {
        let dropped = retired_bits(&retired, *seq)? & super::rules::retention::RETIRED_RAW_RESULT != 0;
        if matches!(record.state, State::Committed { .. }) && results.get(*seq)?.is_none() && !dropped {
            report.problem(format!("{}: committed without its raw result (invariant 2)", record.id));
        }
    }
    Ok(())
}
