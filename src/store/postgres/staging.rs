//! Staging a provider's answers on PostgreSQL. One chunk of result lines is one
//! transaction: it locks the batch row, then the members the lines name, asks
//! `rules::staging` what the lines write (the plan the redb store writes too), and writes
//! it. A judged answer commits in that transaction; an unjudged one is staged `Ready` for
//! the committer. A chunk applied twice (a re-fetched file) changes nothing the second
//! time but a replay count.

use std::collections::HashMap;

use tokio_postgres::Transaction;

use super::batches::lock_batch;
use super::drivers::HeldTerms;
use super::extractions::carry_out;
use super::ledger::record_charge;
use super::rows::{big, lock_by_id, transition};
use super::{Error, pg};
use crate::store::codec::encode;
use crate::store::rules::member::Move;
use crate::store::rules::post;
use crate::store::rules::staging::{self, Settle, StageWrite};
use crate::store::{IngestLine, MemberRules, Policies, StageReport, StagedAnswer};

pub(super) async fn stage_in(
    tx: &Transaction<'_>,
    held: &HeldTerms,
    policies: &Policies,
    now_ms: u64,
    batch: u64,
    lines: &[IngestLine],
    rules: &MemberRules,
) -> Result<StageReport, Error> {
    // The batch row is locked first: a close or a second staging of it waits its turn.
    let record = lock_batch(tx, held, batch).await?;
    let mut members = HashMap::with_capacity(lines.len());
    for id in staging::named(lines) {
        if let Some(member) = lock_by_id(tx, id.as_bytes()).await? {
            members.insert(id, member);
        }
    }
    let plan = staging::plan(&record, members, lines, rules, now_ms)?;
    for write in plan.writes {
        match write {
            StageWrite::Charge { member, charge, kind } => {
                record_charge(tx, policies, now_ms, &member, &charge, kind).await?;
            }
            StageWrite::Stage { seq, answer } => stage(tx, seq, &answer).await?,
            StageWrite::Move(Move { mut member, next }) => transition(tx, policies, now_ms, &mut member, next).await?,
            StageWrite::Settle(settling) => settle(tx, policies, now_ms, settling).await?,
        }
    }
    Ok(plan.report)
}

async fn stage(tx: &Transaction<'_>, seq: u64, answer: &StagedAnswer) -> Result<(), Error> {
    let bytes = encode(answer)?;
    tx.execute(
        "INSERT INTO staged (extraction_seq, format, record) VALUES ($1, $2, $3) \
         ON CONFLICT (extraction_seq) DO UPDATE SET format = excluded.format, record = excluded.record",
        &[&big(seq), &i16::from(bytes[0]), &bytes],
    )
    .await
    .map_err(pg("cannot stage an answer"))?;
    Ok(())
}

/// Commits (or fails) a judged answer in the staging transaction, by the same plan a
/// worker's post is carried out by (`rules::post::plan_settle`). Nothing was staged for
/// it, so there is no staged row to drop.
pub(super) async fn settle(
    tx: &Transaction<'_>,
    policies: &Policies,
    now_ms: u64,
    settling: Settle<'_>,
) -> Result<(), Error> {
    let Settle { mut member, next, answer, charge, producer, fence } = settling;
    let plan = post::plan_settle(&member, next, answer, charge.as_ref(), producer, fence, now_ms)?;
    carry_out(tx, policies, now_ms, &mut member, plan).await.map(|_| ())
}
