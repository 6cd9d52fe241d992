//! Evaluations on redb: the writes `rules::evaluation` plans, in the writer's group
//! commits, and the reads of evaluations, trials and trial batches.

use std::collections::{BTreeSet, HashMap};

use async_trait::async_trait;
use redb::{ReadTransaction, ReadableTable};

use super::batches::load_member;
use super::codec::{decode, encode};
use super::extractions::settle;
use super::ledger::record_charge;
use super::records::{ChargeKind, ExtractionRecord, Fence, StoredContent};
use super::rules::evaluation::{self, TrialWrites};
use super::tables;
use super::write_tables::WriteTables;
use super::{Error, Store};
use crate::domain::batch::BatchMember;
use crate::domain::identity::ExtractionId;
use crate::store::evaluation::{EvalMember, EvaluationRecord, Trial, TrialBatchRecord, TrialRecord};
use crate::store::seam::{
    EvaluationCreated, Evaluations, NewEvaluation, Promotion, Selection, TrialAnswer, TrialsWritten,
};

fn load_evaluation(t: &WriteTables<'_>, name: &str) -> Result<Option<EvaluationRecord>, Error> {
    t.evaluations.get(name)?.map(|v| decode(v.value())).transpose()
}

/// `None` when an erasure deleted it (with its evaluation): whatever was to be written of
/// it is moot.
fn load_trial_batch(t: &WriteTables<'_>, batch: u64) -> Result<Option<TrialBatchRecord>, Error> {
    t.trial_batches.get(batch)?.map(|v| decode(v.value())).transpose()
}

fn save_trial_batch(t: &mut WriteTables<'_>, batch: &TrialBatchRecord) -> Result<(), Error> {
    t.trial_batches.insert(batch.seq, encode(batch)?.as_slice())?;
    Ok(())
}

/// Carries out trial writes (`rules::evaluation::TrialWrites`) and hands them back.
fn apply(t: &mut WriteTables<'_>, writes: TrialWrites) -> Result<TrialWrites, Error> {
    if let Some(batch) = &writes.batch {
        save_trial_batch(t, batch)?;
    }
    for (index, trial) in &writes.trials {
        save_trial(t, &writes.evaluation, &writes.candidate, *index, trial)?;
    }
    Ok(writes)
}

fn load_trial(t: &WriteTables<'_>, batch: &TrialBatchRecord, index: u32) -> Result<Option<TrialRecord>, Error> {
    let key = (batch.evaluation.as_str(), batch.candidate.as_str(), index);
    t.trials.get(key)?.map(|v| decode(v.value())).transpose()
}

fn save_trial(
    t: &mut WriteTables<'_>,
    evaluation: &str,
    candidate: &str,
    index: u32,
    trial: &TrialRecord,
) -> Result<(), Error> {
    t.trials.insert((evaluation, candidate, index), encode(trial)?.as_slice())?;
    Ok(())
}

/// The records a selection is made from: the asked ids (and which are unknown), or every
/// extraction in the sampled states.
fn selection_pool(
    txn: &ReadTransaction,
    select: &Selection,
) -> Result<(Vec<ExtractionRecord>, Vec<ExtractionId>), Error> {
    let extractions = txn.open_table(tables::EXTRACTIONS)?;
    let mut found = Vec::new();
    let mut missing = Vec::new();
    match select {
        Selection::Ids(ids) => {
            for id in ids {
                match super::reads::get(txn, id)? {
                    Some(record) => found.push(record),
                    None => missing.push(*id),
                }
            }
        }
        Selection::Sample { states, .. } => {
            let index = txn.open_table(tables::STATE_INDEX)?;
            for state in states {
                let code = state.code();
                for entry in index.range((code, 0)..=(code, u64::MAX))? {
                    let seq = entry?.0.value().1;
                    if let Some(value) = extractions.get(seq)? {
                        found.push(decode(value.value())?);
                    }
                }
            }
        }
    }
    Ok((found, missing))
}

#[async_trait]
impl Evaluations for Store {
    async fn create_evaluation(&self, new: NewEvaluation) -> Result<EvaluationCreated, Error> {
        crate::store::evaluation_steps::create(self, new).await
    }

    async fn promote(&self, evaluation: String, candidate: String) -> Result<Option<Promotion>, Error> {
        crate::store::evaluation_steps::promote(self, evaluation, candidate).await
    }

    /// From a snapshot: the writer thread never scans.
    async fn selection_pool(&self, new: NewEvaluation) -> Result<(Vec<ExtractionRecord>, Vec<ExtractionId>), Error> {
        self.read(move |txn| selection_pool(txn, &new.select)).await
    }

    async fn freeze_evaluation(
        &self,
        new: NewEvaluation,
        members: Vec<EvalMember>,
    ) -> Result<EvaluationCreated, Error> {
        self.writer
            .write(move |t| {
                if let Some(existing) = load_evaluation(t, &new.name)? {
                    return Ok((EvaluationCreated::Exists(existing), false));
                }
                // The pool was read from a snapshot: an erasure may have come between.
                let mut present = 0;
                for member in &members {
                    if t.identity.get(member.id.as_bytes())?.is_some_and(|seq| seq.value() == member.seq) {
                        present += 1;
                    }
                }
                if let Some(reason) = evaluation::gone_meanwhile(members.len(), present) {
                    return Ok((EvaluationCreated::Refused(reason), false));
                }
                let record = evaluation::record(&new, members.clone(), t.now_ms);
                // Retried whole if another job of its group fails, so `members` stays.
                t.evaluations.insert(record.name.as_str(), encode(&record)?.as_slice())?;
                Ok((EvaluationCreated::Created(record), true))
            })
            .await
    }

    async fn evaluation(&self, name: String) -> Result<Option<EvaluationRecord>, Error> {
        self.read(move |txn| {
            txn.open_table(tables::EVALUATIONS)?.get(name.as_str())?.map(|v| decode(v.value())).transpose()
        })
        .await
    }

    async fn evaluations(&self) -> Result<Vec<EvaluationRecord>, Error> {
        self.read(|txn| {
            let mut all: Vec<EvaluationRecord> = Vec::new();
            for entry in txn.open_table(tables::EVALUATIONS)?.iter()? {
                all.push(decode(entry?.1.value())?);
            }
            all.sort_by(|a, b| (a.created_at_ms, &a.name).cmp(&(b.created_at_ms, &b.name)));
            Ok(all)
        })
        .await
    }

    async fn cancel_evaluation(&self, name: String) -> Result<Option<EvaluationRecord>, Error> {
        self.writer
            .write(move |t| {
                let Some(mut record) = load_evaluation(t, &name)? else { return Ok((None, false)) };
                if record.cancelled_at_ms.is_some() {
                    return Ok((Some(record), false));
                }
                record.cancelled_at_ms = Some(t.now_ms);
                t.evaluations.insert(name.as_str(), encode(&record)?.as_slice())?;
                Ok((Some(record), true))
            })
            .await
    }

    async fn trials(&self, name: String) -> Result<Vec<Trial>, Error> {
        self.read(move |txn| {
            let table = txn.open_table(tables::TRIALS)?;
            let mut out = Vec::new();
            for entry in table.range((name.as_str(), "", 0)..)? {
                let (key, value) = entry?;
                let (evaluation, candidate, index) = key.value();
                if evaluation != name {
                    break;
                }
                out.push(Trial { candidate: candidate.to_string(), index, record: decode(value.value())? });
            }
            Ok(out)
        })
        .await
    }

    async fn create_trial_batch(
        &self,
        evaluation: String,
        candidate: String,
        members: Vec<u32>,
    ) -> Result<Option<TrialBatchRecord>, Error> {
        self.writer
            .write(move |t| {
                let Some(record) = load_evaluation(t, &evaluation)? else { return Ok((None, false)) };
                let mut sent = BTreeSet::new();
                for index in &members {
                    if t.trials.get((evaluation.as_str(), candidate.as_str(), *index))?.is_some() {
                        sent.insert(*index);
                    }
                }
                // Never handed out twice, even after an erasure deleted the last batches.
                let seq = t.meta.get(tables::META_TRIAL_BATCH_SEQ)?.map_or(1, |v| v.value());
                let Some(intent) = evaluation::intent(&record, &candidate, &sent, &members, seq, t.now_ms) else {
                    return Ok((None, false));
                };
                t.meta.insert(tables::META_TRIAL_BATCH_SEQ, seq + 1)?;
                Ok((apply(t, TrialWrites::of(intent))?.batch, true))
            })
            .await
    }

    async fn trial_batches(&self, open_only: bool) -> Result<Vec<TrialBatchRecord>, Error> {
        self.read(move |txn| {
            let mut out = Vec::new();
            for entry in txn.open_table(tables::TRIAL_BATCHES)?.iter()? {
                let batch: TrialBatchRecord = decode(entry?.1.value())?;
                if !open_only || batch.closed.is_none() {
                    out.push(batch);
                }
            }
            Ok(out)
        })
        .await
    }

    async fn trial_batch_members(&self, batch: u64) -> Result<Vec<(u32, Option<BatchMember>)>, Error> {
        self.read(move |txn| {
            let Some(value) = txn.open_table(tables::TRIAL_BATCHES)?.get(batch)? else { return Ok(Vec::new()) };
            let batch: TrialBatchRecord = decode(value.value())?;
            let Some(value) = txn.open_table(tables::EVALUATIONS)?.get(batch.evaluation.as_str())? else {
                return Ok(Vec::new());
            };
            let evaluation: EvaluationRecord = decode(value.value())?;
            let extractions = txn.open_table(tables::EXTRACTIONS)?;
            let contents = txn.open_table(tables::CONTENTS)?;
            let mut out = Vec::with_capacity(batch.members.len());
            for &index in &batch.members {
                let member = evaluation::member_of(&evaluation, index);
                let (mut record, mut content) = (None, None);
                if let Some(member) = member {
                    record = extractions.get(member.seq)?.map(|v| decode::<ExtractionRecord>(v.value())).transpose()?;
                    content = contents.get(member.seq)?.map(|v| decode::<StoredContent>(v.value())).transpose()?;
                }
                let text = content.map(|c| c.text);
                out.push((index, evaluation::member_line(&batch, member, record.as_ref(), text)));
            }
            Ok(out)
        })
        .await
    }

    async fn record_trial_job(&self, batch: u64, job_id: String, next_action_at_ms: u64) -> Result<(), Error> {
        self.writer
            .write(move |t| {
                let Some(record) = load_trial_batch(t, batch)? else {
                    return Ok(((), false));
                };
                let Some(recorded) = evaluation::job_recorded(record, job_id, next_action_at_ms) else {
                    return Ok(((), false));
                };
                save_trial_batch(t, &recorded)?;
                Ok(((), true))
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
        self.writer
            .write(move |t| {
                let Some(record) = load_trial_batch(t, batch)? else {
                    return Ok(((), false));
                };
                save_trial_batch(t, &evaluation::reschedule(record, next_action_at_ms, note, count_failure))?;
                Ok(((), true))
            })
            .await
    }

    async fn record_trials(
        &self,
        batch: u64,
        answers: Vec<TrialAnswer>,
        batch_api: bool,
    ) -> Result<TrialsWritten, Error> {
        self.writer
            .write(move |t| {
                let Some(record) = load_trial_batch(t, batch)? else {
                    return Ok((TrialsWritten::default(), false));
                };
                let Some(evaluation) = load_evaluation(t, &record.evaluation)? else {
                    return Ok((TrialsWritten::default(), false));
                };
                let mut trials = HashMap::new();
                for answer in &answers {
                    if let Some(trial) = load_trial(t, &record, answer.index)? {
                        trials.insert(answer.index, trial);
                    }
                }
                let mut answering = evaluation::answers(&record, &evaluation, trials, &answers, batch_api, t.now_ms);
                let mut records = HashMap::new();
                for seq in answering.to_read() {
                    if let Some(found) = load_member(t, seq)? {
                        records.insert(seq, found);
                    }
                }
                for (write, extraction, charge) in answering.charges(&evaluation, &records) {
                    answering.charged(write, record_charge(t, extraction, &charge, ChargeKind::Evaluation)?);
                }
                let (writes, report) = answering.finish();
                apply(t, writes)?;
                Ok((report, report.written > 0))
            })
            .await
    }

    async fn close_trial_batch(&self, batch: u64, outcome: String, unanswered: String) -> Result<u64, Error> {
        self.writer
            .write(move |t| {
                let Some(record) = load_trial_batch(t, batch)? else {
                    return Ok((0, false));
                };
                let mut trials = HashMap::new();
                for index in &record.members {
                    if let Some(trial) = load_trial(t, &record, *index)? {
                        trials.insert(*index, trial);
                    }
                }
                let Some(closing) = evaluation::close(&record, &trials, outcome, &unanswered, t.now_ms) else {
                    return Ok((0, false));
                };
                Ok((apply(t, TrialWrites::of(closing))?.trials.len() as u64, true))
            })
            .await
    }

    async fn promote_chunk(
        &self,
        record: std::sync::Arc<EvaluationRecord>,
        candidate: String,
        chunk: Vec<u32>,
    ) -> Result<Promotion, Error> {
        self.writer
            .write(move |t| {
                let name = record.name.as_str();
                let (mut trials, mut extractions) = (HashMap::new(), HashMap::new());
                for &index in &chunk {
                    if let Some(value) = t.trials.get((name, candidate.as_str(), index))? {
                        trials.insert(index, decode::<TrialRecord>(value.value())?);
                    }
                    if let Some(member) = evaluation::member_of(&record, index)
                        && let Some(found) = load_member(t, member.seq)?
                    {
                        extractions.insert(member.seq, found);
                    }
                }
                let (part, commits) = evaluation::promote_chunk(&record, &chunk, &trials, &extractions, t.now_ms);
                for (seq, next, answer) in commits {
                    if let Some(extraction) = extractions.get_mut(&seq) {
                        let fence = Fence::Evaluation(name.to_string());
                        settle(t, extraction, next, &answer, None, candidate.clone(), fence)?;
                    }
                }
                let wrote = part.committed > 0;
                Ok((part, wrote))
            })
            .await
    }
}
