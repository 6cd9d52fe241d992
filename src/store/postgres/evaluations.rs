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

use super::ledger::record_charge;
use super::rows::{big, decode_record, unbig};
use super::staging::settle;
use super::{Error, PgStore, pg};
use crate::domain::batch::BatchMember;
use crate::domain::clock;
use crate::domain::identity::{ExtractionId, trial_id};
use crate::store::codec::{decode, encode};
use crate::store::evaluation::{EvalMember, EvaluationRecord, Trial, TrialBatchRecord, TrialRecord};
use crate::store::records::{ChargeKind, ExtractionRecord, Fence, StoredContent};
use crate::store::rules::evaluation::{self, PromoteStep};
use crate::store::rules::staging::Settle;
use crate::store::seam::{
    EvaluationCreated, Evaluations, NewEvaluation, Promotion, Selection, TrialAnswer, TrialsWritten,
};

/// Members promoted in one transaction.
const PROMOTE_CHUNK: usize = 256;

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

/// The trial batch, locked for the rest of the transaction.
async fn lock_trial_batch(tx: &Transaction<'_>, batch: u64) -> Result<TrialBatchRecord, Error> {
    let row = tx
        .query_opt("SELECT record FROM trial_batches WHERE seq = $1 FOR UPDATE", &[&big(batch)])
        .await
        .map_err(pg("cannot read a trial batch"))?
        .ok_or_else(|| Error::Corrupt { kind: "trial_batch", reason: format!("trial batch #{batch} has no record") })?;
    decode(row.get(0))
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

impl PgStore {
    /// The records a selection is made from: the asked ids (and which are unknown, each
    /// time it is asked, as redb counts them), or every extraction in the sampled states
    /// of the evaluation's schema (and tenant); `rules::evaluation::choose` filters again.
    async fn selection_pool(&self, new: &NewEvaluation) -> Result<(Vec<ExtractionRecord>, Vec<ExtractionId>), Error> {
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

    /// One chunk of a promotion, in one transaction.
    async fn promote_chunk(
        &self,
        name: &str,
        candidate: &str,
        members: &[EvalMember],
        chunk: &[u32],
    ) -> Result<Promotion, Error> {
        let policies = self.policies();
        let (name, candidate) = (name.to_string(), candidate.to_string());
        let chunk: Vec<(u32, Option<EvalMember>)> = chunk
            .iter()
            .map(|&index| (index, usize::try_from(index).ok().and_then(|i| members.get(i)).cloned()))
            .collect();
        self.in_transaction("promotion commit failed", move |tx, now_ms| {
            Box::pin(async move {
                // Read as committed, unlocked (see the module's note on lock order).
                let indexes: Vec<u32> = chunk.iter().map(|(index, _)| *index).collect();
                let trials = read_trials(tx, &name, &candidate, &indexes, false).await?;
                let mut part = Promotion::default();
                for (index, member) in chunk {
                    let Some(member) = member else { continue };
                    let row = tx
                        .query_opt("SELECT record FROM extractions WHERE seq = $1 FOR UPDATE", &[&big(member.seq)])
                        .await
                        .map_err(pg("cannot read an extraction to promote"))?;
                    let extraction = row.map(|r| decode_record(r.get(0))).transpose()?;
                    let step = evaluation::promote(&member, extraction.as_ref(), trials.get(&index), now_ms);
                    step.count(&mut part);
                    if let (PromoteStep::Commit { next, answer }, Some(extraction)) = (step, extraction) {
                        let settling = Settle {
                            member: extraction,
                            next,
                            answer: &answer,
                            charge: None,
                            producer: candidate.clone(),
                            fence: Fence::Evaluation(name.clone()),
                        };
                        settle(tx, &policies, now_ms, settling).await?;
                    }
                }
                Ok(part)
            })
        })
        .await
    }
}

#[async_trait]
impl Evaluations for PgStore {
    async fn create_evaluation(&self, new: NewEvaluation) -> Result<EvaluationCreated, Error> {
        // The pool is read first; the insert then re-checks the name, so two creations of
        // one name cannot both win (the second waits for the first's commit).
        let (found, missing) = self.selection_pool(&new).await?;
        let members = match evaluation::choose(&new, found, &missing) {
            Ok(members) => members,
            Err(reason) => return Ok(EvaluationCreated::Refused(reason)),
        };
        let record = evaluation::record(&new, members, clock::now_ms());
        let bytes = encode(&record)?;
        let client = self.client().await?;
        let inserted = client
            .execute(
                "INSERT INTO evaluations (name, created_at_ms, format, record) VALUES ($1, $2, $3, $4) \
                 ON CONFLICT (name) DO NOTHING",
                &[&record.name, &big(record.created_at_ms), &i16::from(bytes[0]), &bytes],
            )
            .await
            .map_err(pg("cannot create an evaluation"))?;
        if inserted == 1 {
            return Ok(EvaluationCreated::Created(record));
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
        self.in_transaction("trial batch intent commit failed", move |tx, now_ms| {
            Box::pin(async move {
                // The evaluation's row is the intents' turnstile: a second intent for the
                // same candidate sees the trials the first one wrote.
                let Some(record) = read_evaluation(tx, &evaluation, true).await? else { return Ok(None) };
                let sent: BTreeSet<u32> =
                    read_trials(tx, &evaluation, &candidate, &members, false).await?.into_keys().collect();
                // Asked first with no number: a sequence number is taken only for a batch.
                if evaluation::intent(&record, &candidate, &sent, &members, 0, now_ms).is_none() {
                    return Ok(None);
                }
                let seq = super::ledger::next_seq(tx, "trial_batch_seq").await?;
                let Some((batch, trials)) = evaluation::intent(&record, &candidate, &sent, &members, seq, now_ms)
                else {
                    return Ok(None);
                };
                save_trial_batch(tx, &batch).await?;
                for (index, trial) in &trials {
                    save_trial(tx, &evaluation, &candidate, *index, trial).await?;
                }
                Ok(Some(batch))
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
            let line = match member_of(index).and_then(|m| found.get(&m.seq).map(|f| (m, f))) {
                // Retention empties the content of committed work only: such a member has
                // no source to send, as on redb where its content entry is gone.
                Some((member, (record, Some(content)))) if record.id == member.id => {
                    let content: StoredContent = decode(content)?;
                    Some(BatchMember {
                        id: trial_id(&batch.evaluation, &batch.candidate, &member.id),
                        source_id: record.source_id.clone(),
                        content: content.text,
                        output_budget: None,
                        previous_attempt: None,
                    })
                }
                _ => None,
            };
            out.push((index, line));
        }
        Ok(out)
    }

    async fn record_trial_job(&self, batch: u64, job_id: String, next_action_at_ms: u64) -> Result<(), Error> {
        self.in_transaction("trial job id commit failed", move |tx, _now_ms| {
            Box::pin(async move {
                let mut record = lock_trial_batch(tx, batch).await?;
                if record.job_id.as_deref() == Some(job_id.as_str()) {
                    return Ok(());
                }
                record.job_id = Some(job_id);
                record.next_action_at_ms = next_action_at_ms;
                record.failures = 0;
                save_trial_batch(tx, &record).await
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
        self.in_transaction("trial batch reschedule commit failed", move |tx, _now_ms| {
            Box::pin(async move {
                let record = lock_trial_batch(tx, batch).await?;
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
        self.in_transaction("trial answers commit failed", move |tx, now_ms| {
            Box::pin(async move {
                let record = lock_trial_batch(tx, batch).await?;
                let Some(evaluation) = read_evaluation(tx, &record.evaluation, false).await? else {
                    return Ok(TrialsWritten::default());
                };
                // Every trial answered here, locked at once in index order.
                let asked: Vec<u32> = answers.iter().map(|a| a.index).collect();
                let mut trials = read_trials(tx, &record.evaluation, &record.candidate, &asked, true).await?;
                let mut report = TrialsWritten::default();
                for answer in &answers {
                    let trial = trials.get(&answer.index);
                    let Some(mut write) = evaluation::answer(&record, trial, answer, now_ms) else {
                        report.seen += 1;
                        continue;
                    };
                    if write.charge {
                        let member = usize::try_from(answer.index).ok().and_then(|i| evaluation.members.get(i));
                        let extraction = match member {
                            Some(m) => tx
                                .query_opt(
                                    "SELECT record FROM extractions WHERE seq = $1 FOR KEY SHARE",
                                    &[&big(m.seq)],
                                )
                                .await
                                .map_err(pg("cannot read a trial's extraction"))?
                                .map(|r| decode_record(r.get(0)))
                                .transpose()?
                                .filter(|r| r.id == m.id),
                            None => None,
                        };
                        if let Some(extraction) = extraction {
                            let charge = evaluation::charge(&record, answer, batch_api);
                            let cost =
                                record_charge(tx, &policies, now_ms, &extraction, &charge, ChargeKind::Evaluation)
                                    .await?;
                            if let Some(outcome) = write.record.outcome.as_mut() {
                                outcome.cost_micros = cost;
                            }
                        }
                    }
                    save_trial(tx, &record.evaluation, &record.candidate, answer.index, &write.record).await?;
                    // The same index answered twice in one call is seen the second time.
                    trials.insert(answer.index, write.record);
                    report.written += 1;
                }
                Ok(report)
            })
        })
        .await
    }

    async fn close_trial_batch(&self, batch: u64, outcome: String, unanswered: String) -> Result<u64, Error> {
        self.in_transaction("trial batch close commit failed", move |tx, now_ms| {
            Box::pin(async move {
                let record = lock_trial_batch(tx, batch).await?;
                let trials = read_trials(tx, &record.evaluation, &record.candidate, &record.members, true).await?;
                let Some((closed, failed)) = evaluation::close(&record, &trials, outcome, &unanswered, now_ms) else {
                    return Ok(0);
                };
                for (index, trial) in &failed {
                    save_trial(tx, &closed.evaluation, &closed.candidate, *index, trial).await?;
                }
                save_trial_batch(tx, &closed).await?;
                Ok(failed.len() as u64)
            })
        })
        .await
    }

    async fn promote(&self, name: String, candidate: String) -> Result<Option<Promotion>, Error> {
        let Some(record) = self.evaluation(name.clone()).await? else { return Ok(None) };
        if !record.has_candidate(&candidate) {
            return Ok(None);
        }
        let mut report = Promotion::default();
        // In chunks, each one transaction: a crash midway leaves whole chunks committed,
        // and the next run finds them committed and carries on. A chunk that lost a lock
        // race (a deadlock PostgreSQL broke) wrote nothing and is made again.
        let indexes: Vec<u32> = (0..record.members.len()).filter_map(|i| u32::try_from(i).ok()).collect();
        for chunk in indexes.chunks(PROMOTE_CHUNK) {
            let mut round = 1;
            let part = loop {
                match self.promote_chunk(&name, &candidate, &record.members, chunk).await {
                    Err(e) if e.is_conflict() && round < super::erase::ROUNDS => round += 1,
                    other => break other?,
                }
            };
            report.add(part);
        }
        Ok(Some(report))
    }
}
