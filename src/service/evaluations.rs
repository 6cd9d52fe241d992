//! Evaluations (docs/EVALUATIONS.md): a frozen set sent to candidate providers as trials,
//! a report comparing them, and the promotion of one candidate's answers.

use std::collections::{BTreeSet, HashMap};

use super::{Error, Service, check_tenant, invalid};
use crate::domain::identity::ExtractionId;
use crate::domain::lifecycle::StateName;
use crate::engine::evaluation::report::{self, EvaluationReport, ReportInput};
use crate::store::evaluation::{EvaluationRecord, Trial};
use crate::store::{EvaluationCreated, Fence, NewEvaluation, Promotion, Selection};

/// The most candidates one evaluation compares.
pub const MAX_CANDIDATES: usize = 8;
/// Disagreements a report lists per candidate; the count covers them all.
const MAX_DISAGREEMENTS: usize = 50;

/// An evaluation as a caller asks for it.
#[derive(Debug, Clone)]
pub struct EvaluationRequest {
    pub name: String,
    pub tenant: Option<String>,
    pub schema: String,
    pub select: SelectRequest,
    pub candidates: Vec<String>,
    pub budget_micros: Option<u64>,
}

#[derive(Debug, Clone)]
pub enum SelectRequest {
    Ids(Vec<String>),
    Sample { count: u32, state: SampleState, seed: u64 },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SampleState {
    Committed,
    Pending,
    Any,
}

/// How far an evaluation has come, per candidate.
#[derive(Debug, Clone)]
pub struct EvaluationStatus {
    pub record: EvaluationRecord,
    pub candidates: Vec<CandidateProgress>,
    pub spent_micros: u64,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CandidateProgress {
    pub candidate: String,
    /// Members not sent to it yet.
    pub not_sent: u64,
    /// Sent, no answer yet.
    pub waiting: u64,
    pub finished: u64,
    pub spent_micros: u64,
}

impl EvaluationStatus {
    /// Held by its budget: the trials cost it all and none is waiting on a provider.
    pub fn budget_reached(&self) -> bool {
        self.record.budget_micros.is_some_and(|b| self.spent_micros >= b)
            && self.candidates.iter().all(|c| c.waiting == 0)
    }

    pub fn done(&self) -> bool {
        self.candidates.iter().all(|c| c.waiting == 0 && (c.not_sent == 0 || !self.record.is_running()))
    }
}

/// A promotion's outcome and the routing change that sends new work the same way.
#[derive(Debug, Clone)]
pub struct PromotionOutcome {
    pub promotion: Promotion,
    /// The `[routing]` rule, as TOML, that routes this evaluation's schema (and tenant)
    /// to the candidate from now on.
    pub routing_rule: String,
}

fn check_name(name: &str) -> Result<(), Error> {
    let ok = (1..=64).contains(&name.len())
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_' || b == b'.');
    if !ok {
        return Err(invalid("name", "1-64 letters, digits, '-', '_' or '.'"));
    }
    // `/v1/evaluations/..` is not a URL a client sends as written: it is normalised away.
    if name == "." || name == ".." {
        return Err(invalid("name", format!("{name:?} cannot be reached at /v1/evaluations/{{name}}")));
    }
    Ok(())
}

impl Service {
    fn provider_names(&self) -> BTreeSet<String> {
        self.providers.iter().map(|h| h.snapshot().name).collect()
    }

    pub async fn create_evaluation(&self, request: EvaluationRequest) -> Result<EvaluationRecord, Error> {
        check_name(&request.name)?;
        if let Some(tenant) = &request.tenant {
            check_tenant(tenant)?;
        }
        self.judge.registry().get(&request.schema)?;
        if request.candidates.is_empty() || request.candidates.len() > MAX_CANDIDATES {
            return Err(invalid("candidates", format!("name 1 to {MAX_CANDIDATES} configured providers")));
        }
        let known = self.provider_names();
        let mut seen = BTreeSet::new();
        for candidate in &request.candidates {
            if !known.contains(candidate) {
                return Err(Error::UnknownProvider(candidate.clone()));
            }
            if !seen.insert(candidate) {
                return Err(invalid("candidates", format!("{candidate:?} is listed twice")));
            }
        }
        if request.budget_micros == Some(0) {
            return Err(invalid("budget_micros", "must be above 0 (leave it out for no budget)"));
        }
        let select = match request.select {
            SelectRequest::Ids(ids) => {
                if ids.is_empty() || ids.len() > crate::store::evaluation::MAX_MEMBERS {
                    return Err(invalid(
                        "select.ids",
                        format!("list 1 to {} extraction ids", crate::store::evaluation::MAX_MEMBERS),
                    ));
                }
                let parsed: Result<Vec<ExtractionId>, _> = ids.iter().map(|id| id.parse::<ExtractionId>()).collect();
                Selection::Ids(parsed.map_err(|e| invalid("select.ids", e.to_string()))?)
            }
            SelectRequest::Sample { count, state, seed } => {
                if count == 0 || count as usize > crate::store::evaluation::MAX_MEMBERS {
                    return Err(invalid(
                        "select.sample",
                        format!("must be 1 to {}", crate::store::evaluation::MAX_MEMBERS),
                    ));
                }
                let states = match state {
                    SampleState::Committed => vec![StateName::Committed],
                    SampleState::Pending => vec![StateName::Pending],
                    SampleState::Any => StateName::ALL.to_vec(),
                };
                Selection::Sample { count, states, seed }
            }
        };
        let new = NewEvaluation {
            name: request.name,
            tenant: request.tenant,
            schema: request.schema,
            candidates: request.candidates,
            budget_micros: request.budget_micros,
            select,
        };
        match self.store.create_evaluation(new).await? {
            EvaluationCreated::Created(record) => {
                tracing::info!(evaluation = %record.name, members = record.members.len(), candidates = ?record.candidates, "evaluation created");
                self.signals.evaluation_created();
                Ok(record)
            }
            EvaluationCreated::Exists(record) => Err(Error::EvaluationExists(record.name)),
            EvaluationCreated::Refused(reason) => Err(invalid("select", reason)),
        }
    }

    pub async fn evaluations(&self) -> Result<Vec<EvaluationStatus>, Error> {
        let mut out = Vec::new();
        for record in self.store.evaluations().await? {
            let trials = self.store.trials(record.name.clone()).await?;
            out.push(status(record, &trials));
        }
        Ok(out)
    }

    async fn evaluation_record(&self, name: &str) -> Result<EvaluationRecord, Error> {
        self.store.evaluation(name.to_string()).await?.ok_or_else(|| Error::UnknownEvaluation(name.to_string()))
    }

    pub async fn evaluation_status(&self, name: &str) -> Result<EvaluationStatus, Error> {
        let record = self.evaluation_record(name).await?;
        let trials = self.store.trials(record.name.clone()).await?;
        Ok(status(record, &trials))
    }

    pub async fn cancel_evaluation(&self, name: &str) -> Result<EvaluationStatus, Error> {
        let record = self
            .store
            .cancel_evaluation(name.to_string())
            .await?
            .ok_or_else(|| Error::UnknownEvaluation(name.to_string()))?;
        tracing::info!(evaluation = %record.name, "evaluation cancelled: no more trial batches are sent");
        let trials = self.store.trials(record.name.clone()).await?;
        Ok(status(record, &trials))
    }

    /// The report, against production's committed findings or against `against`.
    pub async fn evaluation_report(&self, name: &str, against: Option<&str>) -> Result<EvaluationReport, Error> {
        let record = self.evaluation_record(name).await?;
        if let Some(reference) = against.filter(|r| !record.has_candidate(r)) {
            return Err(invalid("against", format!("{reference:?} is not a candidate of evaluation {name:?}")));
        }
        let trials = self.store.trials(record.name.clone()).await?;
        let mut production = HashMap::new();
        if against.is_none() {
            for (index, member) in record.members.iter().enumerate() {
                let Some(extraction) = self.store.get(member.id).await? else { continue };
                if extraction.state.name() != StateName::Committed {
                    continue;
                }
                // A commit promoted from a trial is a candidate's answer, not production's:
                // comparing a candidate with it would compare it with itself.
                let promoted =
                    self.store.result(member.id).await?.is_some_and(|r| matches!(r.fence, Fence::Evaluation(_)));
                if promoted {
                    continue;
                }
                let findings = self.store.findings(member.id).await?.unwrap_or_default();
                let index = u32::try_from(index).unwrap_or(u32::MAX);
                production.insert(index, findings.into_iter().map(|f| f.canonical_identity).collect());
            }
        }
        Ok(report::report(&ReportInput {
            evaluation: &record,
            trials: &trials,
            production: &production,
            against,
            max_disagreements: MAX_DISAGREEMENTS,
        }))
    }

    /// Commits `candidate`'s valid answers for the members not committed yet (once, however
    /// often it runs), and says which routing rule would send new work the same way.
    pub async fn promote(&self, name: &str, candidate: &str) -> Result<PromotionOutcome, Error> {
        let record = self.evaluation_record(name).await?;
        if !record.has_candidate(candidate) {
            return Err(invalid("candidate", format!("{candidate:?} is not a candidate of evaluation {name:?}")));
        }
        let promotion = self
            .store
            .promote(name.to_string(), candidate.to_string())
            .await?
            .ok_or_else(|| Error::UnknownEvaluation(name.to_string()))?;
        tracing::info!(
            evaluation = name,
            candidate,
            committed = promotion.committed,
            already = promotion.already_committed,
            "evaluation promoted"
        );
        Ok(PromotionOutcome { promotion, routing_rule: routing_rule(&record, candidate) })
    }
}

/// The `[routing] rules` entry that sends this evaluation's kind of work to `candidate`.
pub fn routing_rule(record: &EvaluationRecord, candidate: &str) -> String {
    match &record.tenant {
        Some(tenant) => {
            format!("{{ schema = {:?}, tenant = {:?}, provider = {:?} }}", record.schema, tenant, candidate)
        }
        None => format!("{{ schema = {:?}, provider = {:?} }}", record.schema, candidate),
    }
}

fn status(record: EvaluationRecord, trials: &[Trial]) -> EvaluationStatus {
    // An erased tenant's members are never sent: they are not waiting for anything.
    let members = record.members.iter().filter(|m| !m.erased).count() as u64;
    let candidates = record
        .candidates
        .iter()
        .map(|candidate| {
            let mine: Vec<&Trial> = trials.iter().filter(|t| &t.candidate == candidate).collect();
            let finished = mine.iter().filter(|t| t.record.outcome.is_some()).count() as u64;
            let spent = mine.iter().filter_map(|t| t.record.outcome.as_ref()).map(|o| o.cost_micros).sum();
            CandidateProgress {
                candidate: candidate.clone(),
                not_sent: members.saturating_sub(mine.len() as u64),
                waiting: mine.len() as u64 - finished,
                finished,
                spent_micros: spent,
            }
        })
        .collect::<Vec<_>>();
    let spent_micros = candidates.iter().map(|c| c.spent_micros).sum();
    EvaluationStatus { record, candidates, spent_micros }
}
