//! `verify` for evaluations, the twin of redb's `verify/evaluations.rs`: the rules' checks
//! (`rules::evaluation_checks`) over what the database holds, read in the same snapshot,
//! and each row's columns against the record they were written from.

use std::collections::BTreeSet;

use tokio_postgres::Transaction;

use super::{decoded, each_row, format_agrees};
use crate::domain::identity::ExtractionId;
use crate::store::Error;
use crate::store::Report;
use crate::store::codec::decode;
use crate::store::evaluation::{EvaluationRecord, Trial, TrialBatchRecord, TrialRecord};
use crate::store::postgres::pg;
use crate::store::postgres::rows::{big, unbig};
use crate::store::records::{Fence, LedgerRecord, ResultRecord};
use crate::store::rules::evaluation_checks::{Stored, check};

fn column_problems(report: &mut Report, what: &str, columns: &[(&'static str, bool)]) {
    for (column, _) in columns.iter().filter(|(_, agrees)| !agrees) {
        report.problem(format!("{what}: its {column} column disagrees with its record"));
    }
}

pub(super) async fn check_evaluations(tx: &Transaction<'_>, report: &mut Report) -> Result<(), Error> {
    let mut stored = Stored::default();
    each_row(tx, "SELECT name, created_at_ms, format, record FROM evaluations ORDER BY name", &[], |row| {
        let name: &str = row.get("name");
        let bytes: &[u8] = row.get("record");
        let Some(record) = decoded::<EvaluationRecord>(bytes, || format!("evaluation {name:?}"), report) else {
            return;
        };
        let columns = [
            ("name", record.name == name),
            ("created_at_ms", row.get::<_, i64>("created_at_ms") == big(record.created_at_ms)),
            ("format", format_agrees(&row, bytes)),
        ];
        column_problems(report, &format!("evaluation {name:?}"), &columns);
        stored.evaluations.push(record);
    })
    .await?;
    const TRIALS: &str = "SELECT evaluation, candidate, idx, format, record FROM trials ORDER BY 1, 2, 3";
    each_row(tx, TRIALS, &[], |row| {
        let (evaluation, candidate, index): (String, String, i32) =
            (row.get("evaluation"), row.get("candidate"), row.get("idx"));
        let what = format!("trial {evaluation}/{candidate}/{index}");
        let bytes: &[u8] = row.get("record");
        let Some(record) = decoded::<TrialRecord>(bytes, || what.clone(), report) else { return };
        column_problems(report, &what, &[("format", format_agrees(&row, bytes))]);
        let Ok(index) = u32::try_from(index) else {
            report.problem(format!("{what}: its member index is negative"));
            return;
        };
        stored.trials.push((evaluation, Trial { candidate, index, record }));
    })
    .await?;
    const BATCHES: &str = "SELECT seq, evaluation, open, format, record FROM trial_batches ORDER BY seq";
    each_row(tx, BATCHES, &[], |row| {
        let seq = unbig(row.get("seq"));
        let bytes: &[u8] = row.get("record");
        let Some(batch) = decoded::<TrialBatchRecord>(bytes, || format!("trial batch #{seq}"), report) else {
            return;
        };
        let columns = [
            ("seq", batch.seq == seq),
            ("evaluation", row.get::<_, &str>("evaluation") == batch.evaluation),
            ("open", row.get::<_, bool>("open") == batch.closed.is_none()),
            ("format", format_agrees(&row, bytes)),
        ];
        column_problems(report, &format!("trial batch #{seq}"), &columns);
        stored.batches.push(batch);
    })
    .await?;
    each_row(tx, "SELECT record FROM ledger ORDER BY seq", &[], |row| {
        // Undecodable entries are named by the ledger's own check.
        if let Ok(entry) = decode::<LedgerRecord>(row.get("record")) {
            stored.count_ledger(&entry);
        }
    })
    .await?;
    // A result under no extraction is `links`'s problem; it names no committed answer here.
    const RESULTS: &str = "SELECT r.extraction_seq, r.record, e.id FROM results r \
                           JOIN extractions e ON e.seq = r.extraction_seq ORDER BY 1";
    each_row(tx, RESULTS, &[], |row| {
        let seq = unbig(row.get("extraction_seq"));
        let id = <[u8; 32]>::try_from(row.get::<_, &[u8]>("id")).ok().map(ExtractionId);
        if let (Ok(result), Some(id)) = (decode::<ResultRecord>(row.get("record")), id)
            && let Fence::Evaluation(name) = result.fence
        {
            stored.promoted.push((seq, id, result.producer, name));
        }
    })
    .await?;
    let exists = existing(tx, &stored).await?;
    check(&stored, |seq| exists.contains(&seq), report);
    Ok(())
}

/// Which of the extractions `check` asks about are stored: those charged for a trial, and
/// every member a trial was sent for.
async fn existing(tx: &Transaction<'_>, stored: &Stored) -> Result<BTreeSet<u64>, Error> {
    let mut asked: BTreeSet<u64> = stored.ledger.keys().copied().collect();
    for evaluation in &stored.evaluations {
        asked.extend(evaluation.members.iter().map(|m| m.seq));
    }
    let asked: Vec<i64> = asked.into_iter().map(big).collect();
    let rows = tx
        .query("SELECT seq FROM extractions WHERE seq = ANY($1)", &[&asked])
        .await
        .map_err(pg("cannot read the extractions of evaluations"))?;
    Ok(rows.iter().map(|r| unbig(r.get(0))).collect())
}
