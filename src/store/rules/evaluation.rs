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
        budget_reached_at_ms: None,
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
    if !evaluation.is_running() || !evaluation.has_candidate(candidate) || evaluation.budget_reached_at_ms.is_some() {
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
    /// The trial batch these trials belong to.
    pub seq: u64,
    pub batch: Option<TrialBatchRecord>,
    pub trials: Vec<(u32, TrialRecord)>,
    /// Budget reservations to open: (tenant, member index, micro-dollars).
    pub reserve: Vec<(String, u32, u64)>,
    /// Reservations that end (the trial is answered or failed): (tenant, member index).
    pub release: Vec<(String, u32)>,
}

impl TrialWrites {
    /// A batch record with its trials (`intent`, `close`).
    pub(in crate::store) fn of((batch, trials): (TrialBatchRecord, Vec<(u32, TrialRecord)>)) -> Self {
        Self {
            evaluation: batch.evaluation.clone(),
            candidate: batch.candidate.clone(),
            seq: batch.seq,
            batch: Some(batch),
            trials,
            reserve: Vec::new(),
            release: Vec::new(),
        }
    }

    /// Answered trials of `batch`, which itself is unchanged.
    pub(in crate::store) fn answered(batch: &TrialBatchRecord, trials: Vec<(u32, TrialRecord)>) -> Self {
        Self {
            evaluation: batch.evaluation.clone(),
            candidate: batch.candidate.clone(),
            seq: batch.seq,
            batch: None,
            trials,
            reserve: Vec::new(),
            release: Vec::new(),
        }
    }

    /// Ends the reservation of every trial written here with an outcome (a trial is
    /// reserved from its intent until it is answered or failed).
    pub(in crate::store) fn releasing(mut self, evaluation: Option<&EvaluationRecord>) -> Self {
        let Some(evaluation) = evaluation else { return self };
        self.release = self
            .trials
            .iter()
            .filter(|(_, t)| t.outcome.is_some())
            .filter_map(|(i, _)| Some((member_of(evaluation, *i)?.tenant.clone(), *i)))
            .collect();
        self
    }
}

/// What a budgeted trial batch may take, and what it reserves.
#[derive(Debug, Default, PartialEq, Eq)]
pub(in crate::store) struct Reserving {
    /// The member indexes it takes, in the order asked.
    pub members: Vec<u32>,
    /// (tenant, member index, micro-dollars) for each taken member with a cost.
    pub reserve: Vec<(String, u32, u64)>,
    /// The evaluation's budget could not cover the next member.
    pub budget_full: bool,
}

/// Which of the `asked` members (not sent to this candidate yet) a trial batch takes, as
/// production batches take pending work: each is reserved at `estimate` (what its answer
/// may cost at the candidate, from its record in `records`) and taken only while that fits
/// both what the evaluation's budget has left (`evaluation_left`, `None`: no budget; the
/// batch stops at the first that does not fit) and what its tenant's budget has left
/// (`tenant_left`, read once per tenant; `None` inside: no budget; a member that does not
/// fit waits, the others go on). An exhausted budget holds even a member it cannot price.
pub(in crate::store) fn reserving(
    evaluation: &EvaluationRecord,
    asked: &[u32],
    records: &HashMap<u64, ExtractionRecord>,
    estimate: &dyn Fn(&ExtractionRecord) -> u64,
    mut evaluation_left: Option<u64>,
    tenant_left: &mut dyn FnMut(&str) -> Result<Option<u64>, crate::store::Error>,
) -> Result<Reserving, crate::store::Error> {
    let mut out = Reserving::default();
    let mut lefts: HashMap<String, Option<u64>> = HashMap::new();
    for &index in asked {
        let Some(member) = member_of(evaluation, index) else { continue };
        let cost = records.get(&member.seq).filter(|r| r.id == member.id).map_or(0, estimate);
        if let Some(left) = evaluation_left
            && (cost > left || left == 0)
        {
            out.budget_full = true;
            break;
        }
        let left = match lefts.get(&member.tenant) {
            Some(left) => *left,
            None => tenant_left(&member.tenant)?,
        };
        if let Some(room) = left
            && (cost > room || room == 0)
        {
            lefts.insert(member.tenant.clone(), left);
            continue;
        }
        lefts.insert(member.tenant.clone(), left.map(|room| room - cost));
        evaluation_left = evaluation_left.map(|l| l - cost);
        out.members.push(index);
        if cost > 0 {
            out.reserve.push((member.tenant.clone(), index, cost));
        }
    }
    Ok(out)
}

/// What is wrong with a trial reservation of `tenant` for member `index` of `batch`, if
/// anything: it must be held by an unanswered trial of that open batch, of a member of
/// that tenant (`verify`, both backends).
pub(in crate::store) fn reservation_problem(
    batch: Option<&TrialBatchRecord>,
    evaluation: Option<&EvaluationRecord>,
    trial: Option<&TrialRecord>,
    tenant: &str,
    index: u32,
) -> Option<String> {
    let Some(batch) = batch else { return Some("a trial reservation names a trial batch that is gone".into()) };
    if batch.closed.is_some() || !batch.members.contains(&index) {
        return Some("a trial reservation outlived its trial batch (closed, or not its member)".into());
    }
    match (evaluation.and_then(|e| member_of(e, index)), trial) {
        (Some(member), Some(t)) if member.tenant == tenant && t.batch == batch.seq && t.outcome.is_none() => None,
        _ => Some(format!("a trial reservation of {tenant} is held by no unanswered trial of that tenant")),
    }
}

/// What an evaluation's budget has left for more trials: its budget less what its trials
/// cost (`trials`, every candidate's) and what its open trials hold reserved
/// (`reserved`); `None` without a budget.
pub(in crate::store) fn budget_left(
    evaluation: &EvaluationRecord,
    trials: &[TrialRecord],
    reserved: u64,
) -> Option<u64> {
    let budget = evaluation.budget_micros?;
    let spent = trials.iter().filter_map(|t| t.outcome.as_ref()).fold(0u64, |s, o| s.saturating_add(o.cost_micros));
    Some(budget.saturating_sub(spent.saturating_add(reserved)))
}

/// The evaluation once its budget is found full with nothing reserved (nothing can free
/// room): `None` when that is not so, or it was marked already.
pub(in crate::store) fn budget_reached(
    evaluation: &EvaluationRecord,
    taking: &Reserving,
    reserved: u64,
    now_ms: u64,
) -> Option<EvaluationRecord> {
    let reached = taking.budget_full && taking.members.is_empty() && reserved == 0;
    (reached && evaluation.budget_reached_at_ms.is_none())
        .then(|| EvaluationRecord { budget_reached_at_ms: Some(now_ms), ..evaluation.clone() })
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

    /// The trials to write (their reservations ending) and what the chunk did.
    pub(in crate::store) fn finish(
        self,
        evaluation: &EvaluationRecord,
    ) -> (TrialWrites, crate::store::seam::TrialsWritten) {
        let report = crate::store::seam::TrialsWritten { written: self.writes.len() as u64, seen: self.seen };
        let writes = TrialWrites::answered(&self.batch, self.writes).releasing(Some(evaluation));
        (writes, report)
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
