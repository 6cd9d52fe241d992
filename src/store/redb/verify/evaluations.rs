//! `verify` for evaluations: the rules' checks (`rules::evaluation_checks`) over what
//! this file holds.

use std::collections::BTreeMap;

use redb::{ReadTransaction, ReadableTable};

use super::Report;
use crate::store::Error;
use crate::store::codec::decode;
use crate::store::evaluation::{EvaluationRecord, Trial, TrialBatchRecord};
use crate::store::records::{ExtractionRecord, Fence, LedgerRecord, ResultRecord};
use crate::store::redb::tables;
use crate::store::rules::evaluation_checks::{Stored, check};

pub(super) fn check_evaluations(
    txn: &ReadTransaction,
    records: &BTreeMap<u64, ExtractionRecord>,
    report: &mut Report,
) -> Result<(), Error> {
    let mut stored = Stored::default();
    for entry in txn.open_table(tables::EVALUATIONS)?.iter()? {
        let (name, value) = entry?;
        match decode::<EvaluationRecord>(value.value()) {
            Ok(record) => stored.evaluations.push(record),
            Err(e) => report.problem(format!("evaluation {:?}: {e}", name.value())),
        }
    }
    for entry in txn.open_table(tables::TRIALS)?.iter()? {
        let (key, value) = entry?;
        let (evaluation, candidate, index) = key.value();
        match decode(value.value()) {
            Ok(record) => {
                stored.trials.push((evaluation.to_string(), Trial { candidate: candidate.to_string(), index, record }))
            }
            Err(e) => report.problem(format!("trial {evaluation}/{candidate}/{index}: {e}")),
        }
    }
    for entry in txn.open_table(tables::TRIAL_BATCHES)?.iter()? {
        let (seq, value) = entry?;
        match decode::<TrialBatchRecord>(value.value()) {
            Ok(batch) => stored.batches.push(batch),
            Err(e) => report.problem(format!("trial batch #{}: {e}", seq.value())),
        }
    }
    for entry in txn.open_table(tables::LEDGER)?.iter()? {
        // Undecodable entries are named by the ledger's own check.
        if let Ok(entry) = decode::<LedgerRecord>(entry?.1.value()) {
            stored.count_ledger(&entry);
        }
    }
    for entry in txn.open_table(tables::RESULTS)?.iter()? {
        let (seq, value) = entry?;
        let seq = seq.value();
        if let (Ok(result), Some(record)) = (decode::<ResultRecord>(value.value()), records.get(&seq))
            && let Fence::Evaluation(name) = result.fence
        {
            stored.promoted.push((seq, record.id, result.producer, name));
        }
    }
    check(&stored, |seq| records.contains_key(&seq), report);
    Ok(())
}
