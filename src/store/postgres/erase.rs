//! Tenant erasure on PostgreSQL: everything of a tenant but its spend totals, in ONE
//! transaction, so it happens entirely or not at all (redb takes small transactions that
//! each leave a valid file; here a reader or a crash never sees half a tenant).
//!
//! It must not race work in flight. The tenant's extraction rows are locked (`FOR
//! UPDATE`) before anything is removed: a result, a staged answer or a claim holding one of
//! them finishes first, and everything that would touch one later (a late provider answer,
//! a worker's post under an old lease, the committer of a staged answer) finds no row and
//! is treated as a stranger, neither committed nor charged. Batches that list the tenant's
//! rows are locked before those rows, the order every batch operation takes (batch, then
//! members), so an erasure and a batch step take turns instead of deadlocking; a batch that
//! took the tenant's work between the two steps sends the erasure round again with it.
//!
//! What each step decides is `store::erase_rules`, shared with the redb store: the
//! erased-spend totals (the `spend` rows stay as they are), intents shedding erased
//! members. Sequence numbers come from a PostgreSQL sequence and are never handed out
//! again, so a submitted batch's member list never comes to name someone else's row.
//!
//! Evaluations lose the tenant's part (`rules::evaluation::erase`) in the same transaction,
//! after the extractions, as on redb. Their locks come first, though: the evaluations the
//! rule changes (name order), then all their trial batches (sequence order), before any
//! provider batch or extraction. Answering or closing a trial batch locks the batch, then
//! its trials, then reads the charged member `FOR KEY SHARE`; taking the trial batches
//! before the extractions means such a step either finished first or waits for the
//! erasure, so the two never wait on each other. The evaluation rows are locked `FOR NO
//! KEY UPDATE`, which a new trial row's foreign key check does not wait for.
//!
//! An evaluation frozen over the tenant's rows between that first read and the locking of
//! the extractions is found by a second read once they are locked, and erased too; its
//! locks are taken `NOWAIT` (out of order, they must not wait), and one not available
//! sends the erasure round again (`lock_late_evaluations`).

use std::collections::{BTreeSet, HashSet};

use tokio_postgres::Transaction;

use super::batches::save_batch;
use super::evaluations::save_evaluation;
use super::rows::{big, unbig};
use super::{Error, pg};
use crate::store::ErasureReport;
use crate::store::codec::decode;
use crate::store::evaluation::EvaluationRecord;
use crate::store::records::{BatchRecord, LedgerRecord, OutboxRecord};
use crate::store::rules::erase::{self, ErasedSpend};
use crate::store::rules::evaluation;

/// Rows read or removed per statement where a tenant can have very many.
const CHUNK: usize = 1000;

/// How often a round that lost a lock race (a deadlock PostgreSQL broke, or a batch that
/// took the tenant's work meanwhile) is tried again before the erasure reports failure.
pub(super) const ROUNDS: usize = 8;

pub(super) enum Round {
    Done(ErasureReport),
    /// Batches listing the tenant's rows that this round had not locked first.
    LockAlso(BTreeSet<i64>),
}

pub(super) fn lost_a_race(e: &Error) -> bool {
    e.is_conflict()
}

pub(super) async fn erase_in(
    tx: &Transaction<'_>,
    tenant: &str,
    known: &BTreeSet<i64>,
    now_ms: u64,
) -> Result<Round, Error> {
    let evaluations = lock_evaluations(tx, tenant).await?;
    let mut batches: BTreeSet<i64> = batches_listing(tx, tenant).await?;
    batches.extend(known);
    let wanted: Vec<i64> = batches.iter().copied().collect();
    tx.query("SELECT seq FROM batches WHERE seq = ANY($1) ORDER BY seq FOR UPDATE", &[&wanted])
        .await
        .map_err(pg("cannot lock the tenant's batches"))?;
    let seqs: Vec<i64> = tx
        .query("SELECT seq FROM extractions WHERE tenant = $1 ORDER BY seq FOR UPDATE", &[&tenant])
        .await
        .map_err(pg("cannot lock the tenant's extractions"))?
        .iter()
        .map(|r| r.get(0))
        .collect();
    // With the rows locked no batch can take them any more: this list is final.
    let listing: BTreeSet<i64> = batches_of(tx, &seqs).await?;
    let missed: BTreeSet<i64> = listing.difference(&batches).copied().collect();
    if !missed.is_empty() {
        return Ok(Round::LockAlso(missed));
    }
    let handled: BTreeSet<String> = evaluations.iter().map(|e| e.name.clone()).collect();
    let late = lock_late_evaluations(tx, tenant, &handled).await?;
    let mut report = ErasureReport { outbox_events: drop_events(tx, tenant).await?, ..ErasureReport::default() };
    let erased: HashSet<u64> = seqs.iter().map(|&s| unbig(s)).collect();
    report.intents_closed = release_intents(tx, &listing, &erased, now_ms).await?;
    let mut spent = ErasedSpend::default();
    for chunk in seqs.chunks(CHUNK) {
        let chunk = chunk.to_vec();
        let delete = |table: &'static str| {
            let sql = format!("DELETE FROM {table} WHERE extraction_seq = ANY($1)");
            let chunk = &chunk;
            async move { tx.execute(sql.as_str(), &[chunk]).await.map_err(pg("cannot erase a tenant's rows")) }
        };
        report.webhook_deliveries += delete("webhook_deliveries").await?;
        report.findings += delete("findings").await?;
        report.raw_results += delete("results").await?;
        report.staged_answers += delete("staged").await?;
        delete("retired").await?;
        delete("batch_members").await?;
        for row in tx
            .query("DELETE FROM ledger WHERE extraction_seq = ANY($1) RETURNING record", &[&chunk])
            .await
            .map_err(pg("cannot erase ledger entries"))?
        {
            spent.add(&decode::<LedgerRecord>(row.get(0))?);
            report.ledger_entries += 1;
        }
        let row = tx
            .query_one(
                "WITH gone AS (DELETE FROM extractions WHERE seq = ANY($1) RETURNING content IS NOT NULL AS kept) \
                 SELECT count(*), count(*) FILTER (WHERE kept) FROM gone",
                &[&chunk],
            )
            .await
            .map_err(pg("cannot erase extractions"))?;
        report.extractions += unbig(row.get(0));
        report.contents += unbig(row.get(1));
    }
    for ((tenant, day), micros) in spent.totals() {
        tx.execute(
            "INSERT INTO erased_spend (tenant, day, micros) VALUES ($1, $2, $3) \
             ON CONFLICT (tenant, day) DO UPDATE SET micros = erased_spend.micros + excluded.micros",
            &[&tenant, &big(day), &big(micros)],
        )
        .await
        .map_err(pg("cannot record erased spend"))?;
    }
    erase_evaluations(tx, tenant, evaluations.into_iter().chain(late)).await?;
    Ok(Round::Done(report))
}

/// Whether the tenant's erasure changes `record` at all.
fn touches(record: &EvaluationRecord, tenant: &str) -> bool {
    evaluation::erase(record, tenant).is_none_or(|(_, erased)| !erased.is_empty())
}

/// The names of the evaluations the erasure changes (other than `skip`), on an unlocked
/// read: the tenant and members of an evaluation are frozen at its creation (only an
/// erasure marks members erased), so the records are re-read under lock and decided again
/// by `erase_evaluations`.
async fn touched_evaluations(
    tx: &Transaction<'_>,
    tenant: &str,
    skip: &BTreeSet<String>,
) -> Result<Vec<String>, Error> {
    let mut touched = Vec::new();
    for row in
        tx.query("SELECT record FROM evaluations ORDER BY name", &[]).await.map_err(pg("cannot read evaluations"))?
    {
        let record: EvaluationRecord = decode(row.get(0))?;
        if !skip.contains(&record.name) && touches(&record, tenant) {
            touched.push(record.name);
        }
    }
    Ok(touched)
}

/// Locks the evaluations `names` (name order) and then their trial batches (sequence
/// order), and returns the evaluations' records as locked. With `nowait`, a lock another
/// transaction holds is not waited for: the statement fails as a lost race instead.
async fn lock_named(tx: &Transaction<'_>, names: &[String], nowait: bool) -> Result<Vec<EvaluationRecord>, Error> {
    if names.is_empty() {
        return Ok(Vec::new());
    }
    let (evaluations, trial_batches) = if nowait {
        (
            "SELECT record FROM evaluations WHERE name = ANY($1) ORDER BY name FOR NO KEY UPDATE NOWAIT",
            "SELECT seq FROM trial_batches WHERE evaluation = ANY($1) ORDER BY seq FOR UPDATE NOWAIT",
        )
    } else {
        (
            "SELECT record FROM evaluations WHERE name = ANY($1) ORDER BY name FOR NO KEY UPDATE",
            "SELECT seq FROM trial_batches WHERE evaluation = ANY($1) ORDER BY seq FOR UPDATE",
        )
    };
    let rows = tx.query(evaluations, &[&names]).await.map_err(raced(nowait, "cannot lock the tenant's evaluations"))?;
    let locked = rows.iter().map(|row| decode(row.get(0))).collect::<Result<Vec<EvaluationRecord>, _>>()?;
    tx.query(trial_batches, &[&names]).await.map_err(raced(nowait, "cannot lock the tenant's trial batches"))?;
    Ok(locked)
}

/// `pg`, where a `NOWAIT` lock that was not available is also a lost race.
fn raced(nowait: bool, context: &'static str) -> impl FnOnce(tokio_postgres::Error) -> Error {
    move |e| {
        if nowait && e.code() == Some(&tokio_postgres::error::SqlState::LOCK_NOT_AVAILABLE) {
            let failure = Error::Postgres { context, source: Box::new(e) };
            return Error::Conflict { reason: context.to_string(), cause: Some(Box::new(failure)) };
        }
        pg(context)(e)
    }
}

/// The evaluations the erasure changes, locked, with their trial batches (see the module's
/// note on lock order).
async fn lock_evaluations(tx: &Transaction<'_>, tenant: &str) -> Result<Vec<EvaluationRecord>, Error> {
    let touched = touched_evaluations(tx, tenant, &BTreeSet::new()).await?;
    lock_named(tx, &touched, false).await
}

/// The evaluations frozen over the tenant's rows after `lock_evaluations` read the table
/// and before the tenant's extractions were locked (`handled` are those it locked), locked
/// with their trial batches. Called with the extractions locked: a `freeze_evaluation`
/// takes `FOR KEY SHARE` on its members, so it has either committed by now (and a new
/// statement sees it, READ COMMITTED) or waits for this erasure and then finds its members
/// gone and is refused; this second read misses none.
///
/// These locks come after the extractions, against the module's lock order, so they are
/// taken `NOWAIT` to stay deadlock-free: a trial step holding one of them may be waiting
/// for an extraction this erasure holds. One not available fails the round as a lost race
/// (`lost_a_race`), and the next round's first read finds the evaluation and locks it in
/// order, before the extractions.
async fn lock_late_evaluations(
    tx: &Transaction<'_>,
    tenant: &str,
    handled: &BTreeSet<String>,
) -> Result<Vec<EvaluationRecord>, Error> {
    let late = touched_evaluations(tx, tenant, handled).await?;
    lock_named(tx, &late, true).await
}

/// The tenant's part of each (locked) evaluation (`rules::evaluation::erase`), the twin
/// of redb's `erase_evaluations`: an evaluation drawn from the tenant alone goes whole,
/// its trials and trial batches first (they refer to it); in any other, the tenant's
/// members lose their source ids and their trials.
async fn erase_evaluations(
    tx: &Transaction<'_>,
    tenant: &str,
    locked: impl IntoIterator<Item = EvaluationRecord>,
) -> Result<(), Error> {
    for record in locked {
        let name = record.name.as_str();
        match evaluation::erase(&record, tenant) {
            None => {
                for sql in [
                    "DELETE FROM trials WHERE evaluation = $1",
                    "DELETE FROM trial_batches WHERE evaluation = $1",
                    "DELETE FROM evaluations WHERE name = $1",
                ] {
                    tx.execute(sql, &[&name]).await.map_err(pg("cannot erase an evaluation"))?;
                }
            }
            Some((kept, erased)) if !erased.is_empty() => {
                // Every index is a member's (at most `MAX_MEMBERS`), so each fits the column.
                let indexes: Vec<i32> = erased.iter().filter_map(|i| i32::try_from(*i).ok()).collect();
                tx.execute("DELETE FROM trials WHERE evaluation = $1 AND idx = ANY($2)", &[&name, &indexes])
                    .await
                    .map_err(pg("cannot erase the tenant's trials"))?;
                save_evaluation(tx, &kept).await?;
            }
            Some(_) => {}
        }
    }
    Ok(())
}

/// Batches listing any of the tenant's extractions, read without locks (a first guess).
async fn batches_listing(tx: &Transaction<'_>, tenant: &str) -> Result<BTreeSet<i64>, Error> {
    let rows = tx
        .query(
            "SELECT DISTINCT m.batch_seq FROM batch_members m JOIN extractions e ON e.seq = m.extraction_seq \
             WHERE e.tenant = $1",
            &[&tenant],
        )
        .await
        .map_err(pg("cannot find the tenant's batches"))?;
    Ok(rows.iter().map(|r| r.get(0)).collect())
}

async fn batches_of(tx: &Transaction<'_>, seqs: &[i64]) -> Result<BTreeSet<i64>, Error> {
    let mut found = BTreeSet::new();
    for chunk in seqs.chunks(CHUNK) {
        let rows = tx
            .query("SELECT DISTINCT batch_seq FROM batch_members WHERE extraction_seq = ANY($1)", &[&chunk.to_vec()])
            .await
            .map_err(pg("cannot find the tenant's batches"))?;
        found.extend(rows.iter().map(|r| r.get::<_, i64>(0)));
    }
    Ok(found)
}

/// The tenant's outbox events, whatever their state. The outbox has no tenant column, so
/// every event is read, a page at a time; none can be added for the locked rows meanwhile.
async fn drop_events(tx: &Transaction<'_>, tenant: &str) -> Result<u64, Error> {
    let (mut after, mut dropped) = (0i64, 0u64);
    loop {
        let rows = tx
            .query("SELECT seq, record FROM outbox WHERE seq > $1 ORDER BY seq LIMIT $2", &[&after, &big(CHUNK as u64)])
            .await
            .map_err(pg("cannot read the outbox"))?;
        let mut gone = Vec::new();
        for row in &rows {
            after = row.get(0);
            if decode::<OutboxRecord>(row.get(1))?.tenant == tenant {
                gone.push(after);
            }
        }
        if !gone.is_empty() {
            dropped += tx
                .execute("DELETE FROM outbox WHERE seq = ANY($1)", &[&gone])
                .await
                .map_err(pg("cannot erase outbox events"))?;
        }
        if rows.len() < CHUNK {
            return Ok(dropped);
        }
    }
}

/// Applies `rules::erase::release_intents` to the (locked) batches; returns how many closed.
async fn release_intents(
    tx: &Transaction<'_>,
    batches: &BTreeSet<i64>,
    erased: &HashSet<u64>,
    now_ms: u64,
) -> Result<u64, Error> {
    let wanted: Vec<i64> = batches.iter().copied().collect();
    let rows = tx
        .query("SELECT record FROM batches WHERE seq = ANY($1) ORDER BY seq", &[&wanted])
        .await
        .map_err(pg("cannot read the tenant's batches"))?;
    let listing = rows.iter().map(|row| decode::<BatchRecord>(row.get(0))).collect::<Result<Vec<_>, _>>()?;
    let mut closed = 0;
    for (batch, emptied) in erase::release_intents(listing, erased, now_ms) {
        closed += u64::from(emptied);
        save_batch(tx, &batch).await?;
    }
    Ok(closed)
}
