//! `verify`'s questions that SQL answers alone: which rows may exist beside which
//! extraction state (invariants 2 and 4), unique finding keys (invariant 3), per-day spend
//! against the charged ledger entries, per-state counters against the rows, and sequences
//! that will not hand a number out twice.

use tokio_postgres::{Row, Transaction};

use super::each_row;
use crate::domain::lifecycle::StateName;
use crate::store::Error;
use crate::store::Report;
use crate::store::postgres::pg;
use crate::store::postgres::rows::{big, unbig};
use crate::store::seam::DAY_MS;

/// One question: each row the query returns is one violation, worded by `says`.
struct Rule {
    sql: &'static str,
    says: fn(&Row) -> String,
}

fn state(row: &Row) -> &'static str {
    StateName::from_code(row.get::<_, i16>("state_code").into()).map_or("of an unknown state", StateName::as_str)
}

fn id(row: &Row) -> String {
    row.get("id")
}

fn seq(row: &Row) -> u64 {
    unbig(row.get("seq"))
}

/// Codes: 2 claimed, 3 committed, 5 submitted, 6 ready (`StateName::code`); batch state 2 is closed.
const RULES: [Rule; 20] = [
    Rule {
        sql: "SELECT encode(e.id, 'hex') AS id, e.state_code FROM extractions e \
              WHERE e.reserved_micros IS NOT NULL AND e.state_code NOT IN (2, 5, 6) ORDER BY e.seq",
        says: |r| format!("{}: a budget reservation is open for it in state {}", id(r), state(r)),
    },
    Rule {
        sql: "SELECT DISTINCT f.extraction_seq AS seq FROM findings f \
              WHERE NOT EXISTS (SELECT 1 FROM extractions e WHERE e.seq = f.extraction_seq) ORDER BY 1",
        says: |r| format!("finding under unknown extraction #{}", seq(r)),
    },
    Rule {
        sql: "SELECT encode(e.id, 'hex') AS id, e.state_code FROM extractions e WHERE e.state_code <> 3 \
              AND EXISTS (SELECT 1 FROM findings f WHERE f.extraction_seq = e.seq) ORDER BY e.seq",
        says: |r| format!("{}: has findings but is {}", id(r), state(r)),
    },
    Rule {
        sql: "SELECT encode(key, 'hex') AS key FROM findings GROUP BY key HAVING count(*) > 1 ORDER BY 1",
        says: |r| format!("finding key {} appears twice (invariant 3)", r.get::<_, String>("key")),
    },
    Rule {
        sql: "SELECT r.extraction_seq AS seq FROM results r \
              WHERE NOT EXISTS (SELECT 1 FROM extractions e WHERE e.seq = r.extraction_seq) ORDER BY 1",
        says: |r| format!("raw result under unknown extraction #{}", seq(r)),
    },
    Rule {
        sql: "SELECT encode(e.id, 'hex') AS id, e.state_code FROM extractions e WHERE e.state_code <> 3 \
              AND EXISTS (SELECT 1 FROM results r WHERE r.extraction_seq = e.seq) ORDER BY e.seq",
        says: |r| format!("{}: has a raw result but is {}", id(r), state(r)),
    },
    Rule {
        sql: "SELECT encode(e.id, 'hex') AS id FROM extractions e WHERE e.state_code = 3 \
              AND NOT EXISTS (SELECT 1 FROM results r WHERE r.extraction_seq = e.seq) \
              AND NOT EXISTS (SELECT 1 FROM retired t WHERE t.extraction_seq = e.seq AND t.bits & 2 <> 0) \
              ORDER BY e.seq",
        says: |r| format!("{}: committed without its raw result, and retention did not drop it (invariant 2)", id(r)),
    },
    // Retention marks: what the store says it dropped is gone, and only that.
    Rule {
        sql: "SELECT encode(e.id, 'hex') AS id, e.state_code FROM retired t JOIN extractions e ON e.seq = t.extraction_seq \
              WHERE e.state_code <> 3 ORDER BY e.seq",
        says: |r| format!("{}: marked as retired but is {} (only committed work is retired)", id(r), state(r)),
    },
    Rule {
        sql: "SELECT t.extraction_seq AS seq FROM retired t WHERE t.bits <= 0 OR t.bits & ~3 <> 0 ORDER BY 1",
        says: |r| format!("retention mark of extraction #{} holds unknown bits", seq(r)),
    },
    Rule {
        sql: "SELECT encode(e.id, 'hex') AS id FROM extractions e \
              WHERE (e.content IS NULL) <> EXISTS \
                    (SELECT 1 FROM retired t WHERE t.extraction_seq = e.seq AND t.bits & 1 <> 0) \
              ORDER BY e.seq",
        says: |r| format!("{}: its content is missing without a retention mark, or marked dropped but present", id(r)),
    },
    Rule {
        sql: "SELECT encode(e.id, 'hex') AS id FROM retired t JOIN extractions e ON e.seq = t.extraction_seq \
              WHERE t.bits & 2 <> 0 AND EXISTS (SELECT 1 FROM results r WHERE r.extraction_seq = e.seq) ORDER BY e.seq",
        says: |r| format!("{}: its raw result is marked dropped but present", id(r)),
    },
    Rule {
        sql: "SELECT s.extraction_seq AS seq FROM staged s \
              WHERE NOT EXISTS (SELECT 1 FROM extractions e WHERE e.seq = s.extraction_seq) ORDER BY 1",
        says: |r| format!("staged answer under unknown extraction #{}", seq(r)),
    },
    Rule {
        sql: "SELECT encode(e.id, 'hex') AS id, e.state_code FROM extractions e WHERE e.state_code <> 6 \
              AND EXISTS (SELECT 1 FROM staged s WHERE s.extraction_seq = e.seq) ORDER BY e.seq",
        says: |r| format!("{}: has a staged answer but is {}", id(r), state(r)),
    },
    Rule {
        sql: "SELECT encode(e.id, 'hex') AS id FROM extractions e WHERE e.state_code = 6 \
              AND NOT EXISTS (SELECT 1 FROM staged s WHERE s.extraction_seq = e.seq) ORDER BY e.seq",
        says: |r| format!("{}: ready without its staged answer", id(r)),
    },
    // A submitted member belongs to the live batch its batch key names, which lists it.
    Rule {
        sql: "SELECT encode(e.id, 'hex') AS id, e.fence FROM extractions e WHERE e.state_code = 5 AND NOT EXISTS \
              (SELECT 1 FROM batches b JOIN batch_members m ON m.batch_seq = b.seq AND m.extraction_seq = e.seq \
               WHERE b.batch_key = e.fence AND b.state_code <> 2) ORDER BY e.seq",
        says: |r| {
            let key = r.get::<_, Option<String>>("fence").unwrap_or_default();
            format!("{}: belongs to batch {key}, which is not live or does not list it", id(r))
        },
    },
    // A ready answer may outlive its batch (closed while the commit was pending), but the
    // batch it came from still lists it.
    Rule {
        sql: "SELECT encode(e.id, 'hex') AS id, e.fence FROM extractions e WHERE e.state_code = 6 AND NOT EXISTS \
              (SELECT 1 FROM batches b JOIN batch_members m ON m.batch_seq = b.seq AND m.extraction_seq = e.seq \
               WHERE b.batch_key = e.fence) ORDER BY e.seq",
        says: |r| {
            let key = r.get::<_, Option<String>>("fence").unwrap_or_default();
            format!("{}: ready with an answer of batch {key}, which does not list it", id(r))
        },
    },
    // Invariant 4. A live batch may still list a member it released for retry, and that
    // member may since be in a newer batch; it can never be bound to the older one again,
    // since batches take only pending work and number themselves as they do.
    Rule {
        sql: "SELECT encode(e.id, 'hex') AS id, own.batch_key AS bound, b.batch_key AS other FROM extractions e \
              JOIN batches own ON own.batch_key = e.fence JOIN batch_members m ON m.extraction_seq = e.seq \
              JOIN batches b ON b.seq = m.batch_seq WHERE e.state_code = 5 AND b.state_code <> 2 AND b.seq > own.seq \
              ORDER BY e.seq, b.seq",
        says: |r| {
            format!(
                "{} is a member of two live batches (invariant 4): bound to {}, listed by the newer {}",
                id(r),
                r.get::<_, String>("bound"),
                r.get::<_, String>("other")
            )
        },
    },
    Rule {
        sql: "SELECT m.batch_seq AS seq, m.extraction_seq FROM batch_members m \
              WHERE NOT EXISTS (SELECT 1 FROM batches b WHERE b.seq = m.batch_seq) \
              OR NOT EXISTS (SELECT 1 FROM extractions e WHERE e.seq = m.extraction_seq) ORDER BY 1, 2",
        says: |r| {
            format!(
                "batch #{} lists extraction #{}, and one of them does not exist",
                seq(r),
                unbig(r.get("extraction_seq"))
            )
        },
    },
    // The per-state counters (migration V6: the folded counts plus the deltas not yet
    // folded) are what status and `/metrics` read instead of counting.
    Rule {
        sql: "SELECT state_code, coalesce(k.counted, 0) AS counted, coalesce(x.stored, 0) AS stored FROM \
              (SELECT state_code, count(*) AS counted FROM extractions GROUP BY 1) k FULL JOIN \
              (SELECT state_code, sum(n)::bigint AS stored FROM (SELECT state_code, n FROM state_counts \
               UNION ALL SELECT state_code, delta FROM state_deltas) c GROUP BY 1) x USING (state_code) \
              WHERE coalesce(k.counted, 0) <> coalesce(x.stored, 0) ORDER BY 1",
        says: |r| {
            format!(
                "the counter of state {} says {} extractions, but {} are in it",
                state(r),
                r.get::<_, i64>("stored"),
                r.get::<_, i64>("counted")
            )
        },
    },
    Rule {
        sql: "SELECT w.endpoint, w.delivery_id FROM webhook_deliveries w \
              WHERE NOT EXISTS (SELECT 1 FROM extractions e WHERE e.seq = w.extraction_seq) ORDER BY 1, 2",
        says: |r| {
            format!(
                "webhook {} delivery {} points at no extraction",
                r.get::<_, String>("endpoint"),
                r.get::<_, String>("delivery_id")
            )
        },
    },
];

pub(super) async fn check(tx: &Transaction<'_>, report: &mut Report) -> Result<(), Error> {
    for rule in &RULES {
        each_row(tx, rule.sql, &[], |row| report.problem((rule.says)(&row))).await?;
    }
    check_spend(tx, report).await?;
    check_sequences(tx, report).await
}

/// Per tenant and UTC day, the spend row equals the sum of the charged ledger entries plus
/// what a tenant erasure removed of them (kept in `erased_spend`, so budgets still add up).
async fn check_spend(tx: &Transaction<'_>, report: &mut Report) -> Result<(), Error> {
    const SQL: &str = "WITH charged AS (SELECT tenant, day, sum(micros)::bigint AS micros FROM \
                       (SELECT tenant, at_ms / $1 AS day, cost_micros AS micros FROM ledger WHERE cost_micros > 0 \
                        UNION ALL SELECT tenant, day, micros FROM erased_spend) parts GROUP BY 1, 2) \
                       SELECT coalesce(s.tenant, c.tenant) AS tenant, coalesce(s.day, c.day) AS day, \
                       s.micros AS stored FROM spend s FULL JOIN charged c ON c.tenant = s.tenant AND c.day = s.day \
                       WHERE s.micros IS DISTINCT FROM c.micros ORDER BY 1, 2";
    each_row(tx, SQL, &[&big(DAY_MS)], |row| {
        let (tenant, day) = (row.get::<_, String>("tenant"), row.get::<_, i64>("day"));
        match row.get::<_, Option<i64>>("stored") {
            Some(_) => report.problem(format!(
                "spend of {tenant} on day {day} disagrees with its ledger entries (and erased spend)"
            )),
            None => report.problem(format!("charged entries of {tenant} on day {day} have no spend row")),
        }
    })
    .await
}

/// Each sequence's next number is past every row numbered from it: an intake, entry,
/// event, batch or trial batch would otherwise collide with (or, for extractions, be
/// refused by) a row that exists.
async fn check_sequences(tx: &Transaction<'_>, report: &mut Report) -> Result<(), Error> {
    for (sequence, table) in [
        ("extraction_seq", "extractions"),
        ("ledger_seq", "ledger"),
        ("outbox_seq", "outbox"),
        ("batch_seq", "batches"),
        ("trial_batch_seq", "trial_batches"),
    ] {
        let sql = format!("SELECT s.last_value, s.is_called, (SELECT max(seq) FROM {table}) FROM {sequence} s");
        let row = tx.query_one(&sql, &[]).await.map_err(pg("verify cannot read a sequence"))?;
        let (last, called, max): (i64, bool, Option<i64>) = (row.get(0), row.get(1), row.get(2));
        let next = if called { last.saturating_add(1) } else { last };
        if let Some(max) = max.filter(|&max| max >= next) {
            report.problem(format!("sequence {sequence} would hand out #{next} next, but {table} holds up to #{max}"));
        }
    }
    Ok(())
}
