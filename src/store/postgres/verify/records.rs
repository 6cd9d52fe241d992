//! `verify`'s look at the rows beside the extractions: each record decodes, says what its
//! columns say, and (findings) carries the key its identifying fields give.

use tokio_postgres::Transaction;

use super::{decoded, each_row, format_agrees};
use crate::domain::identity::ExtractionId;
use crate::store::Error;
use crate::store::Report;
use crate::store::StagedAnswer;
use crate::store::codec::decode;
use crate::store::postgres::batches::{job_of, state_code};
use crate::store::postgres::outbox::{DEAD, DELIVERED, DUE};
use crate::store::postgres::pg;
use crate::store::postgres::rows::{big, unbig};
use crate::store::records::{
    BatchRecord, ChargeKind, DeliveryState, ExtractionRecord, FindingRecord, LedgerRecord, OutboxRecord, ResultRecord,
};
use crate::store::rules::verify::{check_finding_key, check_ledger_entry, check_result};

fn column_problem(report: &mut Report, what: &str, columns: &[(&'static str, bool)]) {
    for (column, _) in columns.iter().filter(|(_, agrees)| !agrees) {
        report.problem(format!("{what}: its {column} column disagrees with its record"));
    }
}

/// Every finding decodes and its key recomputes from its extraction's identity and its
/// identifying fields. (Which extractions may have findings is `links`'s.)
pub(super) async fn check_findings(tx: &Transaction<'_>, report: &mut Report) -> Result<(), Error> {
    const SQL: &str = "SELECT f.extraction_seq, f.key, f.format, f.record, e.id AS extraction_id \
                       FROM findings f LEFT JOIN extractions e ON e.seq = f.extraction_seq ORDER BY 1, 2";
    each_row(tx, SQL, &[], |row| {
        report.findings += 1;
        let seq = unbig(row.get("extraction_seq"));
        let bytes: &[u8] = row.get("record");
        let Some(finding) = decoded::<FindingRecord>(bytes, || format!("finding of #{seq}"), report) else {
            return;
        };
        let Some(id) = row.get::<_, Option<&[u8]>>("extraction_id").and_then(|b| <[u8; 32]>::try_from(b).ok()) else {
            return;
        };
        let id = ExtractionId(id);
        check_finding_key(&id, row.get::<_, &[u8]>("key"), &finding, report);
        if !format_agrees(&row, bytes) {
            report.problem(format!("{id}: finding {}: its format column disagrees with its record", finding.key));
        }
    })
    .await
}

/// Every raw result decodes and holds JSON.
pub(super) async fn check_results(tx: &Transaction<'_>, report: &mut Report) -> Result<(), Error> {
    each_row(tx, "SELECT extraction_seq, format, record FROM results ORDER BY 1", &[], |row| {
        report.results += 1;
        let seq = unbig(row.get("extraction_seq"));
        let bytes: &[u8] = row.get("record");
        check_result(seq, decode::<ResultRecord>(bytes), report);
        column_problem(report, &format!("raw result #{seq}"), &[("format", format_agrees(&row, bytes))]);
    })
    .await
}

pub(super) async fn check_staged(tx: &Transaction<'_>, report: &mut Report) -> Result<(), Error> {
    each_row(tx, "SELECT extraction_seq, format, record FROM staged ORDER BY 1", &[], |row| {
        let seq = unbig(row.get("extraction_seq"));
        let bytes: &[u8] = row.get("record");
        if let Err(e) = decode::<StagedAnswer>(bytes) {
            report.problem(format!("staged answer #{seq}: {e}"));
        }
        column_problem(report, &format!("staged answer #{seq}"), &[("format", format_agrees(&row, bytes))]);
    })
    .await
}

/// Every batch decodes, its columns say what its record says, and its member rows are
/// its record's members.
pub(super) async fn check_batches(tx: &Transaction<'_>, report: &mut Report) -> Result<(), Error> {
    let mut unrowed: Vec<(String, u64)> = Vec::new();
    const SQL: &str = "SELECT b.seq, b.batch_key, b.provider, b.state_code, b.job_id, b.next_action_at_ms, \
                       b.created_at_ms, b.format, b.record, ARRAY(SELECT m.extraction_seq FROM batch_members m \
                       WHERE m.batch_seq = b.seq ORDER BY 1) AS members FROM batches b ORDER BY b.seq";
    each_row(tx, SQL, &[], |row| {
        let seq = unbig(row.get("seq"));
        let bytes: &[u8] = row.get("record");
        let Some(batch) = decoded::<BatchRecord>(bytes, || format!("batch #{seq}"), report) else {
            return;
        };
        let mut listed: Vec<u64> = batch.members.clone();
        listed.sort_unstable();
        listed.dedup();
        let rows: Vec<u64> = row.get::<_, Vec<i64>>("members").into_iter().map(unbig).collect();
        let columns = [
            ("seq", batch.seq == seq),
            ("batch_key", row.get::<_, &str>("batch_key") == batch.batch_key.as_str()),
            ("provider", row.get::<_, &str>("provider") == batch.provider.as_str()),
            ("state_code", row.get::<_, i16>("state_code") == state_code(&batch.state)),
            ("job_id", row.get::<_, Option<&str>>("job_id") == job_of(&batch.state)),
            ("next_action_at_ms", row.get::<_, i64>("next_action_at_ms") == big(batch.next_action_at_ms)),
            ("created_at_ms", row.get::<_, i64>("created_at_ms") == big(batch.created_at_ms)),
            ("format", format_agrees(&row, bytes)),
        ];
        column_problem(report, &format!("batch {}", batch.batch_key), &columns);
        // A tenant erasure deletes its member rows and leaves a sent batch's record as the
        // provider knows it; a listed member without a row must be such an erased one.
        let missing: Vec<u64> = listed.iter().copied().filter(|m| rows.binary_search(m).is_err()).collect();
        if rows.iter().any(|r| listed.binary_search(r).is_err()) {
            report.problem(format!("batch {}: it has member rows its record does not list", batch.batch_key));
        }
        unrowed.extend(missing.into_iter().map(|m| (batch.batch_key.as_str().to_string(), m)));
    })
    .await?;
    let seqs: Vec<i64> = unrowed.iter().map(|(_, m)| big(*m)).collect();
    let present = tx
        .query("SELECT seq FROM extractions WHERE seq = ANY($1)", &[&seqs])
        .await
        .map_err(pg("cannot read the extractions of batch members"))?;
    for row in present {
        let seq = unbig(row.get("seq"));
        for (batch_key, _) in unrowed.iter().filter(|(_, m)| *m == seq) {
            report.problem(format!("batch {batch_key}: member #{seq} exists but has no member row"));
        }
    }
    Ok(())
}

/// Every ledger entry decodes, names an extraction of its tenant, says what its columns
/// say; a replay costs nothing; an unusable answer never stays the current attempt's.
/// (Per-day spend is summed in SQL by `links`.)
pub(super) async fn check_ledger(tx: &Transaction<'_>, report: &mut Report) -> Result<(), Error> {
    const SQL: &str = "SELECT l.seq, l.tenant, l.at_ms, l.extraction_seq, l.provider, l.request_id, l.replay, \
                       l.cost_micros, l.format, l.record, e.record AS extraction \
                       FROM ledger l LEFT JOIN extractions e ON e.seq = l.extraction_seq ORDER BY l.seq";
    each_row(tx, SQL, &[], |row| {
        let seq = unbig(row.get("seq"));
        let bytes: &[u8] = row.get("record");
        let Some(e) = decoded::<LedgerRecord>(bytes, || format!("ledger #{seq}"), report) else {
            return;
        };
        report.ledger_entries += 1;
        // An undecodable extraction is reported with the extractions, and names nothing here.
        let named = row.get::<_, Option<&[u8]>>("extraction").and_then(|b| decode::<ExtractionRecord>(b).ok());
        check_ledger_entry(seq, &e, named.as_ref(), report);
        let columns = [
            ("seq", e.seq == seq),
            ("tenant", row.get::<_, &str>("tenant") == e.tenant),
            ("at_ms", row.get::<_, i64>("at_ms") == big(e.at_ms)),
            ("extraction_seq", row.get::<_, i64>("extraction_seq") == big(e.extraction_seq)),
            ("provider", row.get::<_, &str>("provider") == e.provider),
            ("request_id", row.get::<_, Option<&str>>("request_id") == e.usage.request_id.as_deref()),
            ("replay", row.get::<_, bool>("replay") == (e.kind == ChargeKind::Replay)),
            ("cost_micros", row.get::<_, i64>("cost_micros") == big(e.cost_micros)),
            ("format", format_agrees(&row, bytes)),
        ];
        column_problem(report, &format!("ledger #{seq}"), &columns);
    })
    .await
}

/// Every outbox event decodes, its state column puts it on the list its state needs (due,
/// delivered, dead), and it names an existing extraction.
pub(super) async fn check_outbox(tx: &Transaction<'_>, report: &mut Report) -> Result<(), Error> {
    // Read a page at a time: the extraction each event names is looked up per page.
    const SQL: &str = "SELECT seq, event_id, sink, state_code, next_attempt_at_ms, format, record FROM outbox \
                       WHERE seq > $1 ORDER BY seq LIMIT $2";
    const PAGE: i64 = 10_000;
    let mut after = 0i64;
    loop {
        // (event, extraction seq, extraction id) of this page's events.
        let mut named: (Vec<i64>, Vec<i64>, Vec<Vec<u8>>) = Default::default();
        let (mut rows, from) = (0i64, after);
        each_row(tx, SQL, &[&from, &PAGE], |row| {
            rows += 1;
            after = row.get("seq");
            if let Some(e) = check_event(&row, report) {
                named.0.push(big(e.seq));
                named.1.push(big(e.extraction_seq));
                named.2.push(e.extraction_id.as_bytes().to_vec());
            }
        })
        .await?;
        let orphans = tx
            .query(
                "SELECT x.seq FROM unnest($1::bigint[], $2::bigint[], $3::bytea[]) AS x (seq, extraction_seq, id) \
                 LEFT JOIN extractions e ON e.seq = x.extraction_seq WHERE e.id IS DISTINCT FROM x.id ORDER BY 1",
                &[&named.0, &named.1, &named.2],
            )
            .await
            .map_err(pg("verify cannot read the database"))?;
        for row in orphans {
            report.problem(format!("outbox #{} names an extraction that does not exist", unbig(row.get(0))));
        }
        if rows < PAGE {
            return Ok(());
        }
    }
}

/// One event's own checks; the event, if it decodes.
fn check_event(row: &tokio_postgres::Row, report: &mut Report) -> Option<OutboxRecord> {
    let seq = unbig(row.get("seq"));
    let bytes: &[u8] = row.get("record");
    let e = decoded::<OutboxRecord>(bytes, || format!("outbox #{seq}"), report)?;
    report.outbox_events += 1;
    let (code, due) = (row.get::<_, i16>("state_code"), row.get::<_, i64>("next_attempt_at_ms"));
    let listed = match e.state {
        DeliveryState::Pending => code == DUE,
        DeliveryState::Delivered { .. } => code == DELIVERED,
        DeliveryState::Dead { .. } => code == DEAD,
    };
    if !listed {
        report.problem(format!("outbox #{seq} is not on the list its state needs"));
    }
    // A claimed pending event is pushed ahead in its column while it is being sent;
    // its record keeps the real due time.
    let due_agrees = match e.state {
        DeliveryState::Pending => due >= big(e.next_attempt_at_ms),
        _ => due == big(e.next_attempt_at_ms),
    };
    let columns = [
        ("seq", e.seq == seq),
        ("event_id", row.get::<_, &str>("event_id") == e.event_id),
        ("sink", row.get::<_, &str>("sink") == e.sink),
        ("next_attempt_at_ms", due_agrees),
        ("format", format_agrees(row, bytes)),
    ];
    column_problem(report, &format!("outbox #{seq}"), &columns);
    // The lookup is by the row's number, which the report names.
    Some(OutboxRecord { seq, ..e })
}
