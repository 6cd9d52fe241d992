//! What both backends decide for an evaluation (docs/EVALUATIONS.md): which extractions a
//! selection freezes, which members a trial batch takes, what an answer writes, how a
//! batch ends, and what a promotion may commit.

use std::collections::{BTreeSet, HashMap};

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
        batch_key: trial_batch_key(&evaluation.name, candidate, seq).to_string(),
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

#[derive(Debug, Clone, PartialEq, Eq)]
pub(in crate::store) struct AnswerWrite {
    /// Its `cost_micros` is filled in with what the ledger entry charged.
    pub record: TrialRecord,
    pub charge: bool,
}

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
