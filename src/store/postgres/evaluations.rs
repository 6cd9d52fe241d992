//! Evaluations on PostgreSQL: the writes `rules::evaluation` plans, each operation one
//! transaction, as the redb store makes them in its writer's commits (`redb/evaluations.rs`
//! is the twin, method by method), and the reads of evaluations, trials and trial batches.
//!
//! Where redb relied on its single writer, rows are locked in one order: a trial batch's
//! intent locks its evaluation row; answering or closing a trial batch locks the batch,
//! then its trials (in index order), then reads each charged member `FOR KEY SHARE` (so an
//! erasure waits for the charge, or the charge finds the member gone). A promotion locks
//! only extraction rows (in sequence order) and reads the trials as committed: it never
//! waits on a trial while holding a member an answer's charge waits on.

use std::collections::{BTreeSet, HashMap};

use async_trait::async_trait;
use tokio_postgres::Transaction;

use super::drivers::HeldTerms;
use super::ledger::record_charge;
use super::rows::{big, decode_record, unbig};
use super::staging::settle;
use super::{Error, PgStore, pg};
use crate::domain::batch::BatchMember;
use crate::domain::clock;
use crate::domain::identity::ExtractionId;
use crate::store::codec::{decode, encode};
use crate::store::evaluation::{EvalMember, EvaluationRecord, Trial, TrialBatchRecord, TrialRecord};
use crate::store::records::{ChargeKind, ExtractionRecord, Fence, StoredContent};
use crate::store::rules::evaluation::{self, TrialWrites};
use crate::store::rules::staging::Settle;
use crate::store::seam::{
    EvaluationCreated, Evaluations, NewEvaluation, Promotion, Selection, TrialAnswer, TrialsWritten,
};

/// A member index as its column. Every index written is one of a frozen set's (at most
/// `rules::evaluation::MAX_MEMBERS`), so it fits; `None` for one asked that cannot exist.
fn idx(index: u32) -> Option<i32> {
    i32::try_from(index).ok()
}

fn index_of(column: i32) -> Result<u32, Error> {
    u32::try_from(column)
        .map_err(|_| Error::Corrupt { kind: "trial", reason: format!("a trial has the member index {column}") })
}

async fn read_evaluation(tx: &Transaction<'_>, name: &str, lock: bool) -> Result<Option<EvaluationRecord>, Error> {
    let sql = if lock {
        "SELECT record FROM evaluations WHERE name = $1 FOR UPDATE"
    } else {
        "SELECT record FROM evaluations WHERE name = $1"
    };
    let row = tx.query_opt(sql, &[&name]).await.map_err(pg("cannot read an evaluation"))?;
    row.map(|r| decode(r.get(0))).transpose()
}

pub(super) async fn save_evaluation(tx: &Transaction<'_>, record: &EvaluationRecord) -> Result<(), Error> {
    let bytes = encode(record)?;
    tx.execute(
        "UPDATE evaluations SET format = $2, record = $3 WHERE name = $1",
        &[&record.name, &i16::from(bytes[0]), &bytes],
    )
    .await
    .map_err(pg("cannot write an evaluation"))?;
    Ok(())
}

/// The trial batch, locked for the rest of the transaction; `None` when it is gone. A
/// tenant's erasure deletes the trial batches of an evaluation drawn from that tenant
/// alone, while the evaluation driver may still hold the batch's number: the step it was
/// taking then does nothing (as for a provider batch whose rows were erased), it is not
/// corruption.
///
/// Every write of a trial batch is its candidate's driver's: its term is checked first.
async fn lock_trial_batch(
    tx: &Transaction<'_>,
    held: &HeldTerms,
    batch: u64,
) -> Result<Option<TrialBatchRecord>, Error> {
    let row = tx
        .query_opt("SELECT record FROM trial_batches WHERE seq = $1 FOR UPDATE", &[&big(batch)])
        .await
        .map_err(pg("cannot read a trial batch"))?;
    let Some(row) = row else { return Ok(None) };
    let record: TrialBatchRecord = decode(row.get(0))?;
    held.check(tx, &record.candidate).await?;
    Ok(Some(record))
}

async fn save_trial_batch(tx: &Transaction<'_>, batch: &TrialBatchRecord) -> Result<(), Error> {
    let bytes = encode(batch)?;
    tx.execute(
        "INSERT INTO trial_batches (seq, evaluation, open, format, record) VALUES ($1, $2, $3, $4, $5) \
         ON CONFLICT (seq) DO UPDATE SET open = excluded.open, format = excluded.format, record = excluded.record",
        &[&big(batch.seq), &batch.evaluation, &batch.closed.is_none(), &i16::from(bytes[0]), &bytes],
    )
    .await
    .map_err(pg("cannot write a trial batch"))?;
    Ok(())
}

/// The trials of `indexes` that exist, locked in index order when `lock`.
async fn read_trials(
    tx: &Transaction<'_>,
    evaluation: &str,
    candidate: &str,
    indexes: &[u32],
    lock: bool,
) -> Result<HashMap<u32, TrialRecord>, Error> {
    let wanted: Vec<i32> = indexes.iter().filter_map(|i| idx(*i)).collect();
    let sql = if lock {
        "SELECT idx, record FROM trials WHERE evaluation = $1 AND candidate = $2 AND idx = ANY($3) \
         ORDER BY idx FOR UPDATE"
    } else {
        "SELECT idx, record FROM trials WHERE evaluation = $1 AND candidate = $2 AND idx = ANY($3)"
    };
    let rows = tx.query(sql, &[&evaluation, &candidate, &wanted]).await.map_err(pg("cannot read trials"))?;
    let mut trials = HashMap::with_capacity(rows.len());
    for row in &rows {
        trials.insert(index_of(row.get(0))?, decode(row.get(1))?);
    }
    Ok(trials)
}

/// Carries out trial writes (`rules::evaluation::TrialWrites`) and hands them back.
async fn apply(tx: &Transaction<'_>, writes: TrialWrites) -> Result<TrialWrites, Error> {
    if let Some(batch) = &writes.batch {
        save_trial_batch(tx, batch).await?;
    }
    for (index, trial) in &writes.trials {
        save_trial(tx, &writes.evaluation, &writes.candidate, *index, trial).await?;
    }
    Ok(writes)
}

async fn save_trial(
    tx: &Transaction<'_>,
    evaluation: &str,
    candidate: &str,
    index: u32,
    trial: &TrialRecord,
) -> Result<(), Error> {
    let index = idx(index).ok_or_else(|| Error::Corrupt {
        kind: "trial",
        reason: format!("member index {index} is beyond any evaluation's members"),
    })?;
    let bytes = encode(trial)?;
    tx.execute(
        "INSERT INTO trials (evaluation, candidate, idx, format, record) VALUES ($1, $2, $3, $4, $5) \
         ON CONFLICT (evaluation, candidate, idx) DO UPDATE SET format = excluded.format, record = excluded.record",
        &[&evaluation, &candidate, &index, &i16::from(bytes[0]), &bytes],
    )
    .await
    .map_err(pg("cannot write a trial"))?;
    Ok(())
}

#[async_trait]
impl Evaluations for PgStore {
    async fn create_evaluation(&self, new: NewEvaluation) -> Result<EvaluationCreated, Error> {
        crate::store::evaluation_steps::create(self, new).await
    }

    async fn promote(&self, evaluation: String, candidate: String) -> Result<Option<Promotion>, Error> {
        crate::store::evaluation_steps::promote(self, evaluation, candidate).await
    }

    /// The records a selection is made from: the asked ids (and which are unknown, each
    /// time it is asked, as redb counts them), or every extraction in the sampled states
    /// of the evaluation's schema (and tenant); `rules::evaluation::choose` filters again.
    async fn selection_pool(&self, new: NewEvaluation) -> Result<(Vec<ExtractionRecord>, Vec<ExtractionId>), Error> {
        let client = self.client().await?;
        match &new.select {
            Selection::Ids(ids) => {
                let wanted: Vec<&[u8]> = ids.iter().map(|id| id.as_bytes().as_slice()).collect();
                let rows = client
                    .query("SELECT record FROM extractions WHERE id = ANY($1)", &[&wanted])
                    .await
                    .map_err(pg("cannot read the selected extractions"))?;
                let mut by_id = HashMap::with_capacity(rows.len());
                for row in &rows {
                    let record = decode_record(row.get(0))?;
                    by_id.insert(record.id, record);
                }
                // In the order asked, as redb looks them up.
                let (mut found, mut missing) = (Vec::new(), Vec::new());
                for id in ids {
                    match by_id.get(id) {
                        Some(record) => found.push(record.clone()),
                        None => missing.push(*id),
                    }
                }
                Ok((found, missing))
            }
            Selection::Sample { states, .. } => {
                let codes: Vec<i16> = states.iter().map(|s| i16::from(s.code())).collect();
                let rows = client
                    .query(
                        "SELECT record FROM extractions WHERE state_code = ANY($1) AND schema_name = $2 \
                         AND ($3::text IS NULL OR tenant = $3) ORDER BY seq",
                        &[&codes, &new.schema, &new.tenant],
                    )
                    .await
                    .map_err(pg("cannot read the extractions to sample"))?;
                let found = rows.iter().map(|r| decode_record(r.get(0))).collect::<Result<Vec<_>, _>>()?;
                Ok((found, Vec::new()))
            }
        }
    }

    async fn freeze_evaluation(
        &self,
        new: NewEvaluation,
        members: Vec<EvalMember>,
    ) -> Result<EvaluationCreated, Error> {
        // A second creation of one name waits for the first's commit, then inserts nothing.
        let record = evaluation::record(&new, members, clock::now_ms());
        let bytes = encode(&record)?;
        let seqs: Vec<i64> = record.members.iter().map(|m| big(m.seq)).collect();
        let written = record.clone();
        // The pool was read without locks: the members are locked against an erasure's
        // delete while the evaluation is written, and one already erased refuses it.
        let inserted = self
            .in_transaction("evaluation commit failed", move |tx, _| {
                Box::pin(async move {
                    let present: i64 = tx
                        .query_one(
                            "SELECT count(*) FROM (SELECT 1 FROM extractions WHERE seq = ANY($1) FOR KEY SHARE) AS kept",
                            &[&seqs],
                        )
                        .await
                        .map_err(pg("cannot lock an evaluation's members"))?
                        .get(0);
                    let present = usize::try_from(present).unwrap_or(0);
                    if let Some(reason) = evaluation::gone_meanwhile(seqs.len(), present) {
                        return Ok(Err(reason));
                    }
                    let inserted = tx
                        .execute(
                            "INSERT INTO evaluations (name, created_at_ms, format, record) VALUES ($1, $2, $3, $4) \
                             ON CONFLICT (name) DO NOTHING",
                            &[&written.name, &big(written.created_at_ms), &i16::from(bytes[0]), &bytes],
                        )
                        .await
                        .map_err(pg("cannot create an evaluation"))?;
                    Ok(Ok(inserted))
                })
            })
            .await?;
        match inserted {
            Err(reason) => return Ok(EvaluationCreated::Refused(reason)),
            Ok(1) => return Ok(EvaluationCreated::Created(record)),
            Ok(_) => {}
        }
        match self.evaluation(new.name).await? {
            Some(existing) => Ok(EvaluationCreated::Exists(existing)),
            None => {
                Err(Error::Corrupt { kind: "evaluation", reason: "its name conflicted, but it is not stored".into() })
            }
        }
    }

    async fn evaluation(&self, name: String) -> Result<Option<EvaluationRecord>, Error> {
        let client = self.client().await?;
        let row = client
            .query_opt("SELECT record FROM evaluations WHERE name = $1", &[&name])
            .await
            .map_err(pg("cannot read an evaluation"))?;
        row.map(|r| decode(r.get(0))).transpose()
    }

    async fn evaluations(&self) -> Result<Vec<EvaluationRecord>, Error> {
        let client = self.client().await?;
        let rows = client
            .query("SELECT record FROM evaluations ORDER BY created_at_ms, name", &[])
            .await
            .map_err(pg("cannot list evaluations"))?;
        rows.iter().map(|r| decode(r.get(0))).collect()
    }

    async fn cancel_evaluation(&self, name: String) -> Result<Option<EvaluationRecord>, Error> {
        self.in_transaction("cancel commit failed", move |tx, now_ms| {
            Box::pin(async move {
                let Some(mut record) = read_evaluation(tx, &name, true).await? else { return Ok(None) };
                if record.cancelled_at_ms.is_some() {
                    return Ok(Some(record));
                }
                record.cancelled_at_ms = Some(now_ms);
                save_evaluation(tx, &record).await?;
                Ok(Some(record))
            })
        })
        .await
    }

    async fn trials(&self, name: String) -> Result<Vec<Trial>, Error> {
        let client = self.client().await?;
        let rows = client
            .query("SELECT candidate, idx, record FROM trials WHERE evaluation = $1 ORDER BY candidate, idx", &[&name])
            .await
            .map_err(pg("cannot read trials"))?;
        rows.iter()
            .map(|r| Ok(Trial { candidate: r.get(0), index: index_of(r.get(1))?, record: decode(r.get(2))? }))
            .collect()
    }

    async fn create_trial_batch(
        &self,
        evaluation: String,
        candidate: String,
        members: Vec<u32>,
    ) -> Result<Option<TrialBatchRecord>, Error> {
        let held = self.held.clone();
        self.in_transaction("trial batch intent commit failed", move |tx, now_ms| {
            Box::pin(async move {
                // The evaluation's row is the intents' turnstile: a second intent for the
                // same candidate sees the trials the first one wrote.
                held.check(tx, &candidate).await?;
                let Some(record) = read_evaluation(tx, &evaluation, true).await? else { return Ok(None) };
                let sent: BTreeSet<u32> =
                    read_trials(tx, &evaluation, &candidate, &members, false).await?.into_keys().collect();
                // Asked first with no number: a sequence number is taken only for a batch.
                if evaluation::intent(&record, &candidate, &sent, &members, 0, now_ms).is_none() {
                    return Ok(None);
                }
                let seq = super::ledger::next_seq(tx, "trial_batch_seq").await?;
                let Some(intent) = evaluation::intent(&record, &candidate, &sent, &members, seq, now_ms) else {
                    return Ok(None);
                };
                Ok(apply(tx, TrialWrites::of(intent)).await?.batch)
            })
        })
        .await
    }

    async fn trial_batches(&self, open_only: bool) -> Result<Vec<TrialBatchRecord>, Error> {
        let client = self.client().await?;
        let rows = client
            .query("SELECT record FROM trial_batches WHERE open OR NOT $1 ORDER BY seq", &[&open_only])
            .await
            .map_err(pg("cannot list trial batches"))?;
        rows.iter().map(|r| decode(r.get(0))).collect()
    }

    async fn trial_batch_members(&self, batch: u64) -> Result<Vec<(u32, Option<BatchMember>)>, Error> {
        let mut client = self.client().await?;
        // One snapshot: the batch, its evaluation and the members as of one moment.
        let tx = super::snapshot(&mut client).await?;
        let Some(row) = tx
            .query_opt("SELECT record FROM trial_batches WHERE seq = $1", &[&big(batch)])
            .await
            .map_err(pg("cannot read a trial batch"))?
        else {
            return Ok(Vec::new());
        };
        let batch: TrialBatchRecord = decode(row.get(0))?;
        let Some(row) = tx
            .query_opt("SELECT record FROM evaluations WHERE name = $1", &[&batch.evaluation])
            .await
            .map_err(pg("cannot read an evaluation"))?
        else {
            return Ok(Vec::new());
        };
        let evaluation: EvaluationRecord = decode(row.get(0))?;
        let member_of = |index: u32| usize::try_from(index).ok().and_then(|i| evaluation.members.get(i));
        let seqs: Vec<i64> = batch.members.iter().filter_map(|i| member_of(*i)).map(|m| big(m.seq)).collect();
        let rows = tx
            .query("SELECT seq, record, content FROM extractions WHERE seq = ANY($1)", &[&seqs])
            .await
            .map_err(pg("cannot read trial batch members"))?;
        let mut found: HashMap<u64, (ExtractionRecord, Option<Vec<u8>>)> = HashMap::with_capacity(rows.len());
        for row in &rows {
            found.insert(unbig(row.get(0)), (decode_record(row.get(1))?, row.get(2)));
        }
        tx.commit().await.map_err(pg("cannot end a read snapshot"))?;
        let mut out = Vec::with_capacity(batch.members.len());
        for &index in &batch.members {
            let member = member_of(index);
            let stored = member.and_then(|m| found.get(&m.seq));
            // Retention empties the content of committed work only: such a member has no
            // source to send, as on redb where its content entry is gone.
            let text = match stored.and_then(|(_, content)| content.as_deref()) {
                Some(bytes) => Some(decode::<StoredContent>(bytes)?.text),
                None => None,
            };
            out.push((index, evaluation::member_line(&batch, member, stored.map(|(record, _)| record), text)));
        }
        Ok(out)
    }

    async fn record_trial_job(&self, batch: u64, job_id: String, next_action_at_ms: u64) -> Result<(), Error> {
        let held = self.held.clone();
        self.in_transaction("trial job id commit failed", move |tx, _now_ms| {
            Box::pin(async move {
                let Some(record) = lock_trial_batch(tx, &held, batch).await? else { return Ok(()) };
                match evaluation::job_recorded(record, job_id, next_action_at_ms) {
                    Some(recorded) => save_trial_batch(tx, &recorded).await,
                    None => Ok(()),
                }
            })
        })
        .await
    }

    async fn reschedule_trial_batch(
        &self,
        batch: u64,
        next_action_at_ms: u64,
        note: Option<String>,
        count_failure: bool,
    ) -> Result<(), Error> {
        let held = self.held.clone();
        self.in_transaction("trial batch reschedule commit failed", move |tx, _now_ms| {
            Box::pin(async move {
                let Some(record) = lock_trial_batch(tx, &held, batch).await? else { return Ok(()) };
                save_trial_batch(tx, &evaluation::reschedule(record, next_action_at_ms, note, count_failure)).await
            })
        })
        .await
    }

    async fn record_trials(
        &self,
        batch: u64,
        answers: Vec<TrialAnswer>,
        batch_api: bool,
    ) -> Result<TrialsWritten, Error> {
        let policies = self.policies();
        let held = self.held.clone();
        self.in_transaction("trial answers commit failed", move |tx, now_ms| {
            Box::pin(async move {
                let Some(record) = lock_trial_batch(tx, &held, batch).await? else {
                    return Ok(TrialsWritten::default());
                };
                let Some(evaluation) = read_evaluation(tx, &record.evaluation, false).await? else {
                    return Ok(TrialsWritten::default());
                };
                // Every trial answered here, locked at once in index order.
                let asked: Vec<u32> = answers.iter().map(|a| a.index).collect();
                let trials = read_trials(tx, &record.evaluation, &record.candidate, &asked, true).await?;
                let mut answering = evaluation::answers(&record, &evaluation, trials, &answers, batch_api, now_ms);
                // The charged members, read under a key-share lock an erasure's delete waits for.
                let seqs: Vec<i64> = answering.to_read().into_iter().map(big).collect();
                let rows = tx
                    .query(
                        "SELECT seq, record FROM extractions WHERE seq = ANY($1) ORDER BY seq FOR KEY SHARE",
                        &[&seqs],
                    )
                    .await
                    .map_err(pg("cannot read trials' extractions"))?;
                let mut records = HashMap::with_capacity(rows.len());
                for row in &rows {
                    records.insert(unbig(row.get(0)), decode_record(row.get(1))?);
                }
                for (write, extraction, charge) in answering.charges(&evaluation, &records) {
                    let cost =
                        record_charge(tx, &policies, now_ms, extraction, &charge, ChargeKind::Evaluation).await?;
                    answering.charged(write, cost);
                }
                let (writes, report) = answering.finish();
                apply(tx, writes).await?;
                Ok(report)
            })
        })
        .await
    }

    async fn close_trial_batch(&self, batch: u64, outcome: String, unanswered: String) -> Result<u64, Error> {
        let held = self.held.clone();
        self.in_transaction("trial batch close commit failed", move |tx, now_ms| {
            Box::pin(async move {
                let Some(record) = lock_trial_batch(tx, &held, batch).await? else { return Ok(0) };
                let trials = read_trials(tx, &record.evaluation, &record.candidate, &record.members, true).await?;
                let Some(closing) = evaluation::close(&record, &trials, outcome, &unanswered, now_ms) else {
                    return Ok(0);
                };
                Ok(apply(tx, TrialWrites::of(closing)).await?.trials.len() as u64)
            })
        })
        .await
    }

    /// One chunk of a promotion, in one transaction.
    async fn promote_chunk(
        &self,
        evaluation: std::sync::Arc<EvaluationRecord>,
        candidate: String,
        chunk: Vec<u32>,
    ) -> Result<Promotion, Error> {
        let policies = self.policies();
        let record = evaluation;
        self.in_transaction("promotion commit failed", move |tx, now_ms| {
            Box::pin(async move {
                // Trials read as committed, unlocked (see the module's note on lock order);
                // the members' extractions locked in sequence order.
                let trials = read_trials(tx, &record.name, &candidate, &chunk, false).await?;
                let seqs: Vec<i64> =
                    chunk.iter().filter_map(|i| evaluation::member_of(&record, *i)).map(|m| big(m.seq)).collect();
                let rows = tx
                    .query("SELECT seq, record FROM extractions WHERE seq = ANY($1) ORDER BY seq FOR UPDATE", &[&seqs])
                    .await
                    .map_err(pg("cannot read extractions to promote"))?;
                let mut extractions = HashMap::with_capacity(rows.len());
                for row in &rows {
                    extractions.insert(unbig(row.get(0)), decode_record(row.get(1))?);
                }
                let (part, commits) = evaluation::promote_chunk(&record, &chunk, &trials, &extractions, now_ms);
                for (seq, next, answer) in commits {
                    let Some(member) = extractions.remove(&seq) else { continue };
                    let settling = Settle {
                        member,
                        next,
                        answer: &answer,
                        charge: None,
                        producer: candidate.clone(),
                        fence: Fence::Evaluation(record.name.clone()),
                    };
                    settle(tx, &policies, now_ms, settling).await?;
                }
                Ok(part)
            })
        })
        .await
    }
}
