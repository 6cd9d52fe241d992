//! `verify` for what retention leaves behind: every mark belongs to a committed
//! extraction and agrees with what is really gone.

use std::collections::BTreeMap;

use redb::{ReadTransaction, ReadableTable};

use super::Error;
use super::records::ExtractionRecord;
use super::tables::{self, RETIRED_CONTENT, RETIRED_RAW_RESULT};
use super::verify::Report;
use crate::lifecycle::State;

pub(super) fn check_retired(
    txn: &ReadTransaction,
    records: &BTreeMap<u64, ExtractionRecord>,
    report: &mut Report,
) -> Result<(), Error> {
    let retired = txn.open_table(tables::RETIRED)?;
    let contents = txn.open_table(tables::CONTENTS)?;
    let results = txn.open_table(tables::RESULTS)?;
    for entry in retired.iter()? {
        let (seq, bits) = entry?;
        let (seq, bits) = (seq.value(), bits.value());
        let Some(record) = records.get(&seq) else {
            report.problem(format!("retention mark under unknown extraction #{seq}"));
            continue;
        };
        if !matches!(record.state, State::Committed { .. }) {
            report.problem(format!("{}: retention dropped data of an extraction that is not committed", record.id));
        }
        if bits == 0 || bits & !(RETIRED_CONTENT | RETIRED_RAW_RESULT) != 0 {
            report.problem(format!("{}: retention mark {bits} is not a known set of bits", record.id));
        }
        if bits & RETIRED_CONTENT != 0 && contents.get(seq)?.is_some() {
            report.problem(format!("{}: content marked dropped is still stored", record.id));
        }
        if bits & RETIRED_RAW_RESULT != 0 && results.get(seq)?.is_some() {
            report.problem(format!("{}: raw result marked dropped is still stored", record.id));
        }
    }
    Ok(())
}
