//! What `verify` checks of evaluations, the same on both backends: every trial belongs to
//! an evaluation, a candidate and a batch that lists it; a closed batch leaves no trial
//! waiting; each extraction's `evaluation` ledger entries add up to what its trials cost
//! (so the tenant's spend includes them); and an answer committed from a trial (a
//! promotion) is that candidate's valid answer of an evaluation that holds it.

use std::collections::{BTreeMap, HashMap};

use crate::domain::identity::ExtractionId;
use crate::store::evaluation::{EvaluationRecord, Trial, TrialBatchRecord, TrialVerdict};
use crate::store::rules::verify::Report;

/// Everything of evaluations a backend read for `verify`.
#[derive(Debug, Default)]
pub(crate) struct Stored {
    pub evaluations: Vec<EvaluationRecord>,
    /// (evaluation name, trial).
    pub trials: Vec<(String, Trial)>,
    pub batches: Vec<TrialBatchRecord>,
    /// Per extraction sequence, the cost of its `evaluation` ledger entries.
    pub ledger: BTreeMap<u64, u64>,
    /// Committed answers fenced by an evaluation: (extraction seq, id, producer, evaluation).
    pub promoted: Vec<(u64, ExtractionId, String, String)>,
}

impl Stored {
    /// Counts a ledger entry if it charged a trial.
    pub(crate) fn count_ledger(&mut self, entry: &crate::store::records::LedgerRecord) {
        if entry.kind == crate::store::records::ChargeKind::Evaluation {
            *self.ledger.entry(entry.extraction_seq).or_default() += entry.cost_micros;
        }
    }
}

/// `exists(seq)`: the extraction is still stored (an erased one's entries went with it).
pub(crate) fn check(stored: &Stored, exists: impl Fn(u64) -> bool, report: &mut Report) {
    let evaluations: HashMap<&str, &EvaluationRecord> =
        stored.evaluations.iter().map(|e| (e.name.as_str(), e)).collect();
    let batches: HashMap<u64, &TrialBatchRecord> = stored.batches.iter().map(|b| (b.seq, b)).collect();
    let mut trial_cost: BTreeMap<u64, u64> = BTreeMap::new();
    for (name, trial) in &stored.trials {
        let at = format!("trial {name}/{}/{}", trial.candidate, trial.index);
        let Some(evaluation) = evaluations.get(name.as_str()) else {
            report.problem(format!("{at} has no evaluation"));
            continue;
        };
        if !evaluation.has_candidate(&trial.candidate) {
            report.problem(format!("{at}: {} is not a candidate of the evaluation", trial.candidate));
        }
        let Some(member) = usize::try_from(trial.index).ok().and_then(|i| evaluation.members.get(i)) else {
            report.problem(format!("{at} names no member of the evaluation"));
            continue;
        };
        match batches.get(&trial.record.batch) {
            Some(b) if b.evaluation == *name && b.candidate == trial.candidate && b.members.contains(&trial.index) => {
                if b.closed.is_some() && trial.record.outcome.is_none() {
                    report.problem(format!("{at} still waits on trial batch #{}, which is closed", b.seq));
                }
            }
            _ => report.problem(format!("{at}: trial batch #{} does not list it", trial.record.batch)),
        }
        if member.erased {
            report.problem(format!("{at} outlived its member's erasure"));
        }
        if let Some(outcome) = &trial.record.outcome {
            *trial_cost.entry(member.seq).or_default() += outcome.cost_micros;
        }
    }
    for batch in &stored.batches {
        if !evaluations.contains_key(batch.evaluation.as_str()) {
            report.problem(format!("trial batch #{} has no evaluation {:?}", batch.seq, batch.evaluation));
        }
    }
    let seqs: std::collections::BTreeSet<u64> = trial_cost.keys().chain(stored.ledger.keys()).copied().collect();
    for seq in seqs.into_iter().filter(|s| exists(*s)) {
        let (charged, cost) =
            (stored.ledger.get(&seq).copied().unwrap_or(0), trial_cost.get(&seq).copied().unwrap_or(0));
        if charged != cost {
            report.problem(format!(
                "extraction #{seq}: its evaluation ledger entries charge {charged} µ$, its trials cost {cost} µ$"
            ));
        }
    }
    for (seq, id, producer, name) in &stored.promoted {
        let valid = evaluations.get(name.as_str()).is_some_and(|e| {
            e.members.iter().position(|m| m.id == *id).is_some_and(|index| {
                stored.trials.iter().any(|(n, t)| {
                    n == name
                        && t.candidate == *producer
                        && usize::try_from(t.index).is_ok_and(|i| i == index)
                        && matches!(t.record.outcome.as_ref().map(|o| &o.verdict), Some(TrialVerdict::Valid { .. }))
                })
            })
        });
        if !valid {
            report.problem(format!(
                "extraction #{seq} was committed from evaluation {name:?}, which holds no valid answer of {producer} for it"
            ));
        }
    }
}

#[cfg(test)]
#[path = "evaluation_checks_tests.rs"]
mod tests;
