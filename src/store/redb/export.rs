//! Export: a tenant's committed extractions with their findings, in commit order, read
//! from one snapshot. The walk runs on a blocking thread and hands each extraction to the
//! caller as it goes, so memory holds one extraction at a time however many are exported,
//! and intake committing meanwhile changes nothing the export sees.

use redb::ReadTransaction;

use super::codec::decode;
use super::records::ExtractionRecord;
use super::tables::{self, required};
use super::{Error, Store};
use crate::store::seam::{ExportFilter, Exported};

impl Store {
    /// Folds every extraction the filter selects into `acc`, in commit order (ties within
    /// one millisecond in intake order), on one read snapshot. `f` runs on a blocking
    /// thread and may block (to hand data to a slower consumer); it returns `false` to stop
    /// early. The snapshot pins the pages it reads until the walk ends, so a long export
    /// keeps the file from reusing space freed meanwhile.
    pub async fn export<A, F>(&self, filter: ExportFilter, init: A, mut f: F) -> Result<A, Error>
    where
        A: Send + 'static,
        F: FnMut(&mut A, Exported) -> bool + Send + 'static,
    {
        self.read(move |txn| {
            let mut acc = init;
            walk(txn, &filter, |item| f(&mut acc, item))?;
            Ok(acc)
        })
        .await
    }
}

pub(super) fn walk(
    txn: &ReadTransaction,
    filter: &ExportFilter,
    mut f: impl FnMut(Exported) -> bool,
) -> Result<(), Error> {
    if filter.since_ms >= filter.until_ms {
        return Ok(());
    }
    let index = txn.open_table(tables::COMMIT_INDEX)?;
    let extractions = txn.open_table(tables::EXTRACTIONS)?;
    let findings = txn.open_table(tables::FINDINGS)?;
    let results = txn.open_table(tables::RESULTS)?;
    let tenant = filter.tenant.as_str();
    let (low, high): (&[u8; 32], &[u8; 32]) = (&[0; 32], &[0xff; 32]);
    for entry in index.range((tenant, filter.since_ms, 0)..(tenant, filter.until_ms, 0))? {
        let (_, committed_at_ms, seq) = entry?.0.value();
        let record: ExtractionRecord = decode(&required(extractions.get(seq)?, "extraction", seq)?)?;
        if filter.schema.as_ref().is_some_and(|s| *s != record.schema)
            || filter.latest && record.superseded_by.is_some()
        {
            continue;
        }
        let mut found = Vec::new();
        for finding in findings.range((seq, low)..=(seq, high))? {
            found.push(decode(finding?.1.value())?);
        }
        let output_json = match results.get(seq)? {
            Some(value) => Some(decode::<crate::store::ResultRecord>(value.value())?.output_json),
            None => None,
        };
        if !f(Exported { record, committed_at_ms, findings: found, output_json }) {
            break;
        }
    }
    Ok(())
}
