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
use super::rules::evaluation::{self, PromoteStep};
use super::tables;
use super::write_tables::WriteTables;
use super::{Error, Store};
use crate::domain::batch::BatchMember;
use crate::domain::identity::{ExtractionId, trial_id};
use crate::store::evaluation::{EvaluationRecord, Trial, TrialBatchRecord, TrialRecord};
use crate::store::seam::{
    EvaluationCreated, Evaluations, NewEvaluation, Promotion, Selection, TrialAnswer, TrialsWritten,
};

fn load_evaluation(t: &WriteTables<'_>, name: &str) -> Result<Option<EvaluationRecord>, Error> {
    t.evaluations.get(name)?.map(|v| decode(v.value())).transpose()
}

fn load_trial_batch(t: &WriteTables<'_>, batch: u64) -> Result<TrialBatchRecord, Error> {
    let value = t
        .trial_batches
        .get(batch)?
        .ok_or_else(|| Error::Corrupt { kind: "trial_batch", reason: format!("trial batch #{batch} has no record") })?;
    decode(value.value())
}

fn save_trial_batch(t: &mut WriteTables<'_>, batch: &TrialBatchRecord) -> Result<(), Error> {
    t.trial_batches.insert(batch.seq, encode(batch)?.as_slice())?;
    Ok(())
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
        // The pool is read from a snapshot first (the writer thread never scans); the
        // write then re-checks the name, so two creations of one name cannot both win.
        let select = new.select.clone();
        let (found, missing) = self.read(move |txn| selection_pool(txn, &select)).await?;
        let members = match evaluation::choose(&new, found, &missing) {
            Ok(members) => members,
            Err(reason) => return Ok(EvaluationCreated::Refused(reason)),
        };
        self.writer
            .write(move |t| {
                if let Some(existing) = load_evaluation(t, &new.name)? {
                    return Ok((EvaluationCreated::Exists(existing), false));
                }
                let record = evaluation::record(&new, members.clone(), t.now_ms);
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
                let seq = t.trial_batches.last()?.map_or(1, |(k, _)| k.value() + 1);
                let Some((batch, trials)) = evaluation::intent(&record, &candidate, &sent, &members, seq, t.now_ms)
                else {
                    return Ok((None, false));
                };
                for (index, trial) in &trials {
                    save_trial(t, &evaluation, &candidate, *index, trial)?;
                }
                save_trial_batch(t, &batch)?;
                Ok((Some(batch), true))
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
            for index in batch.members {
                let Some(member) = usize::try_from(index).ok().and_then(|i| evaluation.members.get(i)) else {
                    out.push((index, None));
                    continue;
                };
                let record: Option<ExtractionRecord> =
                    extractions.get(member.seq)?.map(|v| decode(v.value())).transpose()?;
                let content: Option<StoredContent> =
                    contents.get(member.seq)?.map(|v| decode(v.value())).transpose()?;
                let line = match (record, content) {
                    (Some(record), Some(content)) if record.id == member.id => Some(BatchMember {
                        id: trial_id(&batch.evaluation, &batch.candidate, &member.id),
                        source_id: record.source_id,
                        content: content.text,
                        output_budget: None,
                        previous_attempt: None,
                    }),
                    _ => None,
                };
                out.push((index, line));
            }
            Ok(out)
        })
        .await
    }

    async fn record_trial_job(&self, batch: u64, job_id: String, next_action_at_ms: u64) -> Result<(), Error> {
        self.writer
            .write(move |t| {
                let mut record = load_trial_batch(t, batch)?;
                if record.job_id.as_deref() == Some(job_id.as_str()) {
                    return Ok(((), false));
                }
                record.job_id = Some(job_id);
                record.next_action_at_ms = next_action_at_ms;
                record.failures = 0;
                save_trial_batch(t, &record)?;
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
                let record = load_trial_batch(t, batch)?;
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
                let record = load_trial_batch(t, batch)?;
                let Some(evaluation) = load_evaluation(t, &record.evaluation)? else {
                    return Ok((TrialsWritten::default(), false));
                };
                let mut report = TrialsWritten::default();
                for answer in &answers {
                    let trial = load_trial(t, &record, answer.index)?;
                    let Some(mut write) = evaluation::answer(&record, trial.as_ref(), answer, t.now_ms) else {
                        report.seen += 1;
                        continue;
                    };
                    if write.charge {
                        let member = usize::try_from(answer.index).ok().and_then(|i| evaluation.members.get(i));
                        let extraction = match member {
                            Some(m) => load_member(t, m.seq)?.filter(|r| r.id == m.id),
                            None => None,
                        };
                        if let Some(extraction) = extraction {
                            let charge = evaluation::charge(&record, answer, batch_api);
                            let cost = record_charge(t, &extraction, &charge, ChargeKind::Evaluation)?;
                            if let Some(outcome) = write.record.outcome.as_mut() {
                                outcome.cost_micros = cost;
                            }
                        }
                    }
                    save_trial(t, &record.evaluation, &record.candidate, answer.index, &write.record)?;
                    report.written += 1;
                }
                let wrote = report.written > 0;
                Ok((report, wrote))
            })
            .await
    }

    async fn close_trial_batch(&self, batch: u64, outcome: String, unanswered: String) -> Result<u64, Error> {
        self.writer
            .write(move |t| {
                let record = load_trial_batch(t, batch)?;
                let mut trials = HashMap::new();
                for index in &record.members {
                    if let Some(trial) = load_trial(t, &record, *index)? {
                        trials.insert(*index, trial);
                    }
                }
                let Some((closed, failed)) = evaluation::close(&record, &trials, outcome, &unanswered, t.now_ms) else {
                    return Ok((0, false));
                };
                for (index, trial) in &failed {
                    save_trial(t, &closed.evaluation, &closed.candidate, *index, trial)?;
                }
                save_trial_batch(t, &closed)?;
                Ok((failed.len() as u64, true))
            })
            .await
    }

    async fn promote(&self, name: String, candidate: String) -> Result<Option<Promotion>, Error> {
        let Some(record) = self.evaluation(name.clone()).await? else { return Ok(None) };
        if !record.has_candidate(&candidate) {
            return Ok(None);
        }
        let mut report = Promotion::default();
        // In chunks, each one write: a crash midway leaves whole chunks committed, and the
        // next run finds them committed and carries on.
        let indexes: Vec<u32> = (0..record.members.len()).filter_map(|i| u32::try_from(i).ok()).collect();
        for chunk in indexes.chunks(PROMOTE_CHUNK) {
            let (chunk, name, candidate, members) =
                (chunk.to_vec(), name.clone(), candidate.clone(), record.members.clone());
            let part = self
                .writer
                .write(move |t| {
                    let mut part = Promotion::default();
                    for index in chunk {
                        let Some(member) = usize::try_from(index).ok().and_then(|i| members.get(i)) else { continue };
                        let trial: Option<TrialRecord> = t
                            .trials
                            .get((name.as_str(), candidate.as_str(), index))?
                            .map(|v| decode(v.value()))
                            .transpose()?;
                        let mut extraction = t.extractions.get(member.seq)?.map(|v| decode(v.value())).transpose()?;
                        let step = evaluation::promote(member, extraction.as_ref(), trial.as_ref(), t.now_ms);
                        step.count(&mut part);
                        if let (PromoteStep::Commit { next, answer }, Some(extraction)) = (step, extraction.as_mut()) {
                            settle(
                                t,
                                extraction,
                                next,
                                &answer,
                                None,
                                candidate.clone(),
                                Fence::Evaluation(name.clone()),
                            )?;
                        }
                    }
                    let wrote = part.committed > 0;
                    Ok((part, wrote))
                })
                .await?;
            report.add(part);
        }
        Ok(Some(report))
    }
}

/// Members promoted in one write.
const PROMOTE_CHUNK: usize = 256;
