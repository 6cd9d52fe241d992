//! What both backends decide for an evaluation (docs/EVALUATIONS.md): which extractions a
//! selection freezes, which members a trial batch takes, what an answer writes, how a
//! batch ends, and what a promotion may commit.

use std::collections::{BTreeSet, HashMap};

use crate::domain::batch::BatchMember;
use crate::domain::identity::{ExtractionId, trial_batch_key};
use crate::domain::lifecycle::{self, Event, Outcome, State};
use crate::store::evaluation::{
    EvalMember, EvaluationRecord, MAX_MEMBERS, TrialBatchRecord, TrialOutcome, TrialRecord, TrialVerdict,
};
use crate::store::records::ExtractionRecord;
use crate::store::seam::{Charge, EncodedFinding, Judged, NewEvaluation, Promotion, Selection, TrialAnswer};

/// The members a selection freezes, or why it cannot be made. `found` are the records the
/// backend read for it (for a sample, every extraction in the asked states; a backend may
/// pass more, they are filtered here), `missing` the asked ids it does not hold.
pub(in crate::store) fn choose(
    new: &NewEvaluation,
    found: Vec<ExtractionRecord>,
    missing: &[ExtractionId],
) -> Result<Vec<EvalMember>, String> {
    let fits = |r: &ExtractionRecord| r.schema == new.schema && new.tenant.as_deref().is_none_or(|t| t == r.tenant);
    let mut chosen: Vec<ExtractionRecord> = match &new.select {
        Selection::Ids(ids) => {
            if let Some(id) = missing.first() {
                return Err(format!("{} of the ids are unknown, {} among them", missing.len(), id.to_hex()));
            }
            if let Some(other) = found.iter().find(|r| !fits(r)) {
                return Err(format!(
                    "extraction {} is tenant {:?}'s under {}, outside this evaluation's {}{}",
                    other.id.to_hex(),
                    other.tenant,
                    other.schema,
                    new.schema,
                    new.tenant.as_deref().map(|t| format!(" for tenant {t:?}")).unwrap_or_default()
                ));
            }
            let asked: BTreeSet<ExtractionId> = ids.iter().copied().collect();
            found.into_iter().filter(|r| asked.contains(&r.id)).collect()
        }
        Selection::Sample { count, states, seed } => {
            let mut pool: Vec<ExtractionRecord> =
                found.into_iter().filter(|r| fits(r) && states.contains(&r.state.name())).collect();
            // A seeded order of the pool, independent of the order the backend read it in.
            pool.sort_by_cached_key(|r| draw(*seed, &r.id));
            pool.truncate(usize::try_from(*count).unwrap_or(usize::MAX));
            pool
        }
    };
    chosen.sort_by_key(|r| r.seq);
    chosen.dedup_by_key(|r| r.seq);
    if chosen.is_empty() {
        return Err(format!(
            "the selection holds no extraction of schema {}{}",
            new.schema,
            new.tenant.as_deref().map(|t| format!(" for tenant {t:?}")).unwrap_or_default()
        ));
    }
    if chosen.len() > MAX_MEMBERS {
        return Err(format!(
            "the selection holds {} extractions; an evaluation takes at most {MAX_MEMBERS}",
            chosen.len()
        ));
    }
    Ok(chosen
        .into_iter()
        .map(|r| EvalMember {
            seq: r.seq,
            id: r.id,
            source_hash: r.source_hash,
            tenant: r.tenant,
            source_id: r.source_id,
            erased: false,
        })
        .collect())
}

fn draw(seed: u64, id: &ExtractionId) -> [u8; 32] {
    let mut hasher = blake3::Hasher::new();
    hasher.update(&seed.to_le_bytes());
    hasher.update(id.as_bytes());
    *hasher.finalize().as_bytes()
}

/// Why a set read before its write cannot be frozen: some of its extractions were erased
/// in between (`present` of them are still stored).
pub(in crate::store) fn gone_meanwhile(members: usize, present: usize) -> Option<String> {
    (present < members).then(|| {
        format!(
            "{} of the selected extractions were erased while the evaluation was being created; create it again",
            members - present
        )
    })
}

/// The record a new evaluation is stored as.
pub(in crate::store) fn record(new: &NewEvaluation, members: Vec<EvalMember>, now_ms: u64) -> EvaluationRecord {
    let selection = match &new.select {
        Selection::Ids(ids) => format!("{} ids", ids.len()),
        Selection::Sample { count, states, seed } => format!(
            "sample of {count} from {}, seed {seed}",
            states.iter().map(|s| s.as_str()).collect::<Vec<_>>().join("|")
        ),
    };
    EvaluationRecord {
        name: new.name.clone(),
        tenant: new.tenant.clone(),
        schema: new.schema.clone(),
        candidates: new.candidates.clone(),
        budget_micros: new.budget_micros,
        selection,
        created_at_ms: now_ms,
        cancelled_at_ms: None,
        members,
    }
}

/// A trial batch intent: the asked members `candidate` has no trial for yet (each index
/// once, in range), with a trial record for each. `None` when none is left, or when the
/// evaluation no longer runs or does not have the candidate.
pub(in crate::store) fn intent(
    evaluation: &EvaluationRecord,
    candidate: &str,
    sent: &BTreeSet<u32>,
    asked: &[u32],
    seq: u64,
    now_ms: u64,
) -> Option<(TrialBatchRecord, Vec<(u32, TrialRecord)>)> {
    if !evaluation.is_running() || !evaluation.has_candidate(candidate) {
        return None;
    }
    let mut members: Vec<u32> = asked
        .iter()
        .copied()
        .filter(|i| {
            let member = usize::try_from(*i).ok().and_then(|i| evaluation.members.get(i));
            member.is_some_and(|m| !m.erased) && !sent.contains(i)
        })
        .collect();
    members.sort_unstable();
    members.dedup();
    if members.is_empty() {
        return None;
    }
    let batch = TrialBatchRecord {
        seq,
        evaluation: evaluation.name.clone(),
        candidate: candidate.to_string(),
        batch_key: trial_batch_key(&evaluation.name, evaluation.created_at_ms, candidate, seq).to_string(),
        members,
        created_at_ms: now_ms,
        job_id: None,
        next_action_at_ms: now_ms,
        failures: 0,
        note: None,
        closed: None,
    };
    let trials =
        batch.members.iter().map(|i| (*i, TrialRecord { batch: seq, sent_at_ms: now_ms, outcome: None })).collect();
    Some((batch, trials))
}

/// What one answer writes: the trial with its outcome, and whether to charge for it.
/// `None` when the trial is already answered (a result file read again) or belongs to
/// another batch.
pub(in crate::store) fn answer(
    batch: &TrialBatchRecord,
    trial: Option<&TrialRecord>,
    answer: &TrialAnswer,
    now_ms: u64,
) -> Option<AnswerWrite> {
    let trial = trial.filter(|t| t.batch == batch.seq && t.outcome.is_none())?;
    let charge = answer.usage.is_some() && answer.verdict.answered();
    let outcome = TrialOutcome {
        verdict: answer.verdict.clone(),
        answered_at_ms: now_ms,
        usage: answer.usage.clone(),
        cost_micros: 0,
    };
    Some(AnswerWrite { record: TrialRecord { outcome: Some(outcome), ..trial.clone() }, charge })
}

/// Trial writes as data, which each backend's `apply` carries out: a trial batch record
/// (intent, close) and the trials of one evaluation and candidate.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(in crate::store) struct TrialWrites {
    pub evaluation: String,
    pub candidate: String,
    pub batch: Option<TrialBatchRecord>,
    pub trials: Vec<(u32, TrialRecord)>,
}

impl TrialWrites {
    /// A batch record with its trials (`intent`, `close`).
    pub(in crate::store) fn of((batch, trials): (TrialBatchRecord, Vec<(u32, TrialRecord)>)) -> Self {
        Self { evaluation: batch.evaluation.clone(), candidate: batch.candidate.clone(), batch: Some(batch), trials }
    }

    /// Answered trials of `batch`, which itself is unchanged.
    pub(in crate::store) fn answered(batch: &TrialBatchRecord, trials: Vec<(u32, TrialRecord)>) -> Self {
        Self { evaluation: batch.evaluation.clone(), candidate: batch.candidate.clone(), batch: None, trials }
    }
}

/// A chunk of answers being written: each new answer's trial, the charges they make once
/// the backend read the members' records, and how many answers were seen before.
#[derive(Debug)]
pub(in crate::store) struct Answering {
    batch: TrialBatchRecord,
    charged_seqs: Vec<(usize, u64, Charge)>,
    writes: Vec<(u32, TrialRecord)>,
    seen: u64,
}

/// `answer` for each of a chunk (an index answered twice in one chunk is seen the second
/// time); `trials` are the stored trials of the answered indexes. A charge is planned for
/// each new answer the provider billed, on its member's extraction.
pub(in crate::store) fn answers(
    batch: &TrialBatchRecord,
    evaluation: &EvaluationRecord,
    mut trials: HashMap<u32, TrialRecord>,
    chunk: &[TrialAnswer],
    batch_api: bool,
    now_ms: u64,
) -> Answering {
    let mut answering = Answering { batch: batch.clone(), charged_seqs: Vec::new(), writes: Vec::new(), seen: 0 };
    for asked in chunk {
        let Some(write) = answer(batch, trials.get(&asked.index), asked, now_ms) else {
            answering.seen += 1;
            continue;
        };
        if write.charge
            && let Some(member) = member_of(evaluation, asked.index)
        {
            answering.charged_seqs.push((answering.writes.len(), member.seq, charge(batch, asked, batch_api)));
        }
        trials.insert(asked.index, write.record.clone());
        answering.writes.push((asked.index, write.record));
    }
    answering
}

impl Answering {
    /// The extraction sequences whose records the charges need.
    pub(in crate::store) fn to_read(&self) -> Vec<u64> {
        self.charged_seqs.iter().map(|(_, seq, _)| *seq).collect()
    }

    /// The charges to write: (which write, the record charged, the charge). A member whose
    /// record is gone, or is another extraction now, is a stranger and charged nothing.
    pub(in crate::store) fn charges<'a>(
        &self,
        evaluation: &EvaluationRecord,
        records: &'a HashMap<u64, ExtractionRecord>,
    ) -> Vec<(usize, &'a ExtractionRecord, Charge)> {
        self.charged_seqs
            .iter()
            .filter_map(|(write, seq, charge)| {
                let index = self.writes.get(*write)?.0;
                let member = member_of(evaluation, index)?;
                let record = records.get(seq).filter(|r| r.id == member.id)?;
                Some((*write, record, charge.clone()))
            })
            .collect()
    }

    /// What a write's ledger entry charged, kept with its trial.
    pub(in crate::store) fn charged(&mut self, write: usize, cost_micros: u64) {
        if let Some(outcome) = self.writes.get_mut(write).and_then(|(_, t)| t.outcome.as_mut()) {
            outcome.cost_micros = cost_micros;
        }
    }

    /// The trials to write and what the chunk did.
    pub(in crate::store) fn finish(self) -> (TrialWrites, crate::store::seam::TrialsWritten) {
        let report = crate::store::seam::TrialsWritten { written: self.writes.len() as u64, seen: self.seen };
        (TrialWrites::answered(&self.batch, self.writes), report)
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub(in crate::store) struct AnswerWrite {
    pub record: TrialRecord,
    pub charge: bool,
}

pub(in crate::store) fn member_of(evaluation: &EvaluationRecord, index: u32) -> Option<&EvalMember> {
    usize::try_from(index).ok().and_then(|i| evaluation.members.get(i))
}

/// What a trial member is sent as: the extraction's source under the trial's own custom id
/// (`identity::trial_id`), as a first ask; `None` when the member's extraction or its
/// content is no longer stored.
pub(in crate::store) fn member_line(
    batch: &TrialBatchRecord,
    member: Option<&EvalMember>,
    record: Option<&ExtractionRecord>,
    content: Option<String>,
) -> Option<BatchMember> {
    let member = member?;
    let record = record.filter(|r| r.id == member.id)?;
    Some(BatchMember {
        id: crate::domain::identity::trial_id(&batch.evaluation, &batch.candidate, &member.id),
        source_id: record.source_id.clone(),
        content: content?,
        output_budget: None,
        previous_attempt: None,
    })
}

/// What one chunk of a promotion does: the counts, and the commits to make as
/// (extraction sequence, next state, answer). `trials` are the candidate's trials of the
/// chunk's indexes, `extractions` the members' records by sequence.
pub(in crate::store) fn promote_chunk(
    evaluation: &EvaluationRecord,
    chunk: &[u32],
    trials: &HashMap<u32, TrialRecord>,
    extractions: &HashMap<u64, ExtractionRecord>,
    now_ms: u64,
) -> (Promotion, Vec<(u64, State, Judged)>) {
    let mut part = Promotion::default();
    let mut commits = Vec::new();
    for &index in chunk {
        let Some(member) = member_of(evaluation, index) else { continue };
        let step = promote(member, extractions.get(&member.seq), trials.get(&index), now_ms);
        step.count(&mut part);
        if let PromoteStep::Commit { next, answer } = step {
            commits.push((member.seq, next, answer));
        }
    }
    (part, commits)
}

/// The member indexes a promotion walks, in chunks of one write each: a crash midway
/// leaves whole chunks committed, and the next run finds them committed and goes on.
pub(in crate::store) fn promote_chunks(evaluation: &EvaluationRecord) -> Vec<Vec<u32>> {
    let indexes: Vec<u32> = (0..evaluation.members.len()).filter_map(|i| u32::try_from(i).ok()).collect();
    indexes.chunks(PROMOTE_CHUNK).map(<[u32]>::to_vec).collect()
}

/// Members promoted in one write.
const PROMOTE_CHUNK: usize = 256;

/// A batch's end: the batch closed, and each member of it still unanswered failed.
pub(in crate::store) fn close(
    batch: &TrialBatchRecord,
    trials: &HashMap<u32, TrialRecord>,
    outcome: String,
    unanswered: &str,
    now_ms: u64,
) -> Option<(TrialBatchRecord, Vec<(u32, TrialRecord)>)> {
    if batch.closed.is_some() {
        return None;
    }
    let failed = batch
        .members
        .iter()
        .filter_map(|i| {
            let trial = trials.get(i).filter(|t| t.batch == batch.seq && t.outcome.is_none())?;
            let outcome = TrialOutcome {
                verdict: TrialVerdict::Failed { reason: unanswered.to_string() },
                answered_at_ms: now_ms,
                usage: None,
                cost_micros: 0,
            };
            Some((*i, TrialRecord { outcome: Some(outcome), ..trial.clone() }))
        })
        .collect();
    Some((TrialBatchRecord { closed: Some(outcome), ..batch.clone() }, failed))
}

/// A trial batch with the provider's job id, polled from `next_action_at_ms`; `None` when
/// it holds that id already (the write is a repeat).
pub(in crate::store) fn job_recorded(
    batch: TrialBatchRecord,
    job_id: String,
    next_action_at_ms: u64,
) -> Option<TrialBatchRecord> {
    if batch.job_id.as_deref() == Some(job_id.as_str()) {
        return None;
    }
    Some(TrialBatchRecord { job_id: Some(job_id), next_action_at_ms, failures: 0, ..batch })
}

/// A rescheduled trial batch (a failed call counted, or just a later look).
pub(in crate::store) fn reschedule(
    batch: TrialBatchRecord,
    next_action_at_ms: u64,
    note: Option<String>,
    count_failure: bool,
) -> TrialBatchRecord {
    let failures = if count_failure { batch.failures.saturating_add(1) } else { 0 };
    TrialBatchRecord { next_action_at_ms, note, failures, ..batch }
}

/// A trial's ledger charge: the candidate's call, at the batch price where it went
/// through a batch API.
pub(in crate::store) fn charge(batch: &TrialBatchRecord, answer: &TrialAnswer, batch_api: bool) -> Charge {
    Charge {
        provider: batch.candidate.clone(),
        job_id: batch.job_id.clone(),
        usage: answer.usage.clone().unwrap_or_default(),
        latency_ms: None,
        batch: batch_api,
    }
}

/// What a promotion does with one member.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(in crate::store) enum PromoteStep {
    /// Commit this answer: the record's next state and the answer as the commit takes it.
    Commit {
        next: State,
        answer: Judged,
    },
    Already,
    InFlight,
    Skipped,
    NoValidAnswer,
}

impl PromoteStep {
    pub(in crate::store) fn count(&self, report: &mut Promotion) {
        match self {
            PromoteStep::Commit { .. } => report.committed += 1,
            PromoteStep::Already => report.already_committed += 1,
            PromoteStep::InFlight => report.in_flight += 1,
            PromoteStep::Skipped => report.skipped += 1,
            PromoteStep::NoValidAnswer => report.no_valid_answer += 1,
        }
    }
}

/// The lifecycle decides (`Event::Promote`): only pending or failed work commits, so an
/// answer a worker or a production batch is bringing is never overtaken.
pub(in crate::store) fn promote(
    member: &EvalMember,
    record: Option<&ExtractionRecord>,
    trial: Option<&TrialRecord>,
    now_ms: u64,
) -> PromoteStep {
    let Some(record) = record.filter(|r| r.id == member.id) else {
        return PromoteStep::Skipped;
    };
    let valid = trial.and_then(|t| t.outcome.as_ref()).and_then(|o| match &o.verdict {
        TrialVerdict::Valid { output_json, findings } => Some(Judged::Valid {
            output_json: output_json.clone(),
            findings: findings
                .iter()
                .map(|f| EncodedFinding {
                    canonical_identity: f.canonical_identity.clone(),
                    body_json: f.body_json.clone(),
                })
                .collect(),
        }),
        _ => None,
    });
    match lifecycle::apply(&record.state, Event::Promote, now_ms) {
        Ok(Outcome::Replay) => PromoteStep::Already,
        Ok(Outcome::Changed(next)) => match valid {
            Some(answer) => PromoteStep::Commit { next, answer },
            None => PromoteStep::NoValidAnswer,
        },
        Err(_) if matches!(record.state, State::Cancelled { .. }) => PromoteStep::Skipped,
        Err(_) => PromoteStep::InFlight,
    }
}

/// What a tenant's erasure leaves of an evaluation: `None` when the evaluation was drawn
/// from that tenant alone (it goes whole); else the record with the tenant's members
/// marked erased (their source ids dropped) and the member indexes whose trials go.
pub(in crate::store) fn erase(evaluation: &EvaluationRecord, tenant: &str) -> Option<(EvaluationRecord, Vec<u32>)> {
    if evaluation.tenant.as_deref() == Some(tenant) {
        return None;
    }
    let mut kept = evaluation.clone();
    let mut erased = Vec::new();
    for (index, member) in kept.members.iter_mut().enumerate() {
        if member.tenant == tenant && !member.erased {
            member.erased = true;
            member.source_id.clear();
            erased.extend(u32::try_from(index).ok());
        }
    }
    Some((kept, erased))
}

#[cfg(test)]
#[path = "evaluation_tests.rs"]
mod tests;
