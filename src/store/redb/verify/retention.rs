//! `verify` for what retention leaves behind: every mark belongs to a committed
//! extraction and agrees with what is really gone.

use std::collections::BTreeMap;

use redb::{ReadTransaction, ReadableTable};

use super::Report;
use crate::domain::lifecycle::State;
use crate::store::Error;
use crate::store::records::ExtractionRecord;
use crate::store::redb::tables;
use crate::store::rules::retention::{RETIRED_CONTENT, RETIRED_RAW_RESULT};

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

#[cfg(test)]
mod tests {
    use crate::store::seam::{Extractions, Upkeep};
    use redb::{Database, ReadableDatabase};

    use super::*;
    use crate::domain::identity::{ExtractionId, SourceHash};
    use crate::store::NewExtraction;
    use crate::store::redb::verify::verify_file;
    use crate::store::{RetentionPolicy, Store};

    fn problems(path: &std::path::Path) -> Vec<String> {
        verify_file(path).unwrap().problems
    }

    /// Content is only allowed to be missing where retention marked it dropped, and only a
    /// committed extraction may carry a mark.
    #[tokio::test]
    async fn a_missing_content_needs_its_mark_and_marks_need_committed_work() {
        let dir = tempfile::tempdir().unwrap();
        let (store, guard) = Store::open(dir.path(), 1 << 20).unwrap();
        let hash = SourceHash::compute(b"x", "code-review@1");
        let id = ExtractionId::compute("t", "s", &hash, "code-review@1");
        let new = NewExtraction {
            id,
            tenant: "t".into(),
            source_id: "s".into(),
            source_hash: hash,
            schema: "code-review@1".into(),
            metadata_json: None,
            content: "x".into(),
        };
        let seq = store.intake(new).await.unwrap().record.seq;
        // Pending work is never touched, whatever the policy.
        let policy = RetentionPolicy { content_after_ms: Some(0), raw_results_after_ms: Some(0) };
        let step = store.retention_step(policy, 0, 10).await.unwrap();
        assert_eq!((step.contents_dropped, step.next_after), (0, None));
        drop(store);
        tokio::task::spawn_blocking(move || guard.join()).await.unwrap();
        let path = dir.path().join(crate::store::FILE_NAME);
        assert!(problems(&path).is_empty());
        {
            let db = Database::open(&path).unwrap();
            let txn = db.begin_write().unwrap();
            txn.open_table(tables::CONTENTS).unwrap().remove(seq).unwrap();
            txn.commit().unwrap();
            assert!(db.begin_read().unwrap().open_table(tables::RETIRED).unwrap().get(seq).unwrap().is_none());
        }
        assert!(problems(&path).iter().any(|p| p.contains("content is missing")), "{:?}", problems(&path));
        {
            let db = Database::open(&path).unwrap();
            let txn = db.begin_write().unwrap();
            txn.open_table(tables::RETIRED).unwrap().insert(seq, RETIRED_CONTENT).unwrap();
            txn.commit().unwrap();
        }
        let found = problems(&path);
        assert!(!found.iter().any(|p| p.contains("content is missing")), "the mark explains it: {found:?}");
        assert!(found.iter().any(|p| p.contains("not committed")), "but pending work is never retired: {found:?}");
    }
}
