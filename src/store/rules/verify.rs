//! What `verify` reports, and the record checks both backends' `verify` apply alike.

use std::collections::BTreeMap;
use std::fmt;

use crate::store::records::ExtractionRecord;

/// Problems beyond this many are counted, not listed.
const MAX_LISTED: usize = 50;

#[derive(Debug, Default)]
pub struct Report {
    pub extractions: u64,
    pub by_state: BTreeMap<&'static str, u64>,
    pub findings: u64,
    pub results: u64,
    pub ledger_entries: u64,
    pub outbox_events: u64,
    pub problems: Vec<String>,
    pub unlisted_problems: u64,
}

impl Report {
    pub fn is_ok(&self) -> bool {
        self.problems.is_empty()
    }

    pub(crate) fn problem(&mut self, text: String) {
        if self.problems.len() < MAX_LISTED {
            self.problems.push(text);
        } else {
            self.unlisted_problems += 1;
        }
    }
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "extractions: {}", self.extractions)?;
        for (state, n) in &self.by_state {
            writeln!(f, "  {state}: {n}")?;
        }
        writeln!(f, "findings: {}", self.findings)?;
        writeln!(f, "raw results: {}", self.results)?;
        writeln!(f, "ledger entries: {}", self.ledger_entries)?;
        writeln!(f, "outbox events: {}", self.outbox_events)?;
        if self.is_ok() {
            return writeln!(f, "ok: every invariant holds");
        }
        writeln!(f, "PROBLEMS ({}):", self.problems.len() as u64 + self.unlisted_problems)?;
        for p in &self.problems {
            writeln!(f, "  - {p}")?;
        }
        if self.unlisted_problems > 0 {
            writeln!(f, "  … and {} more", self.unlisted_problems)?;
        }
        Ok(())
    }
}

/// Every requeue is a new attempt, and a truncation retry always leaves its raised budget.
/// (PostgreSQL's `verify` applies it too.)
pub(crate) fn check_attempts(record: &ExtractionRecord, report: &mut Report) {
    if record.attempt == 0 || record.requeues >= record.attempt {
        report.problem(format!(
            "{}: {} requeues cannot fit in attempt {} (each requeue is a new attempt)",
            record.id, record.requeues, record.attempt
        ));
    }
    if record.output_budget == Some(0) {
        report.problem(format!("{}: an output budget of 0 tokens", record.id));
    }
    if record.truncation_retried && record.output_budget.is_none() {
        report.problem(format!("{}: retried after a truncation without a raised output budget", record.id));
    }
}

/// A truncated or refused answer never stays the current attempt's answer: the extraction
/// was requeued (a later attempt) or failed for it in the same transaction.
pub(crate) fn left_behind(record: &ExtractionRecord, attempt: u32) -> bool {
    use crate::domain::lifecycle::{FailureClass as C, State};
    attempt < record.attempt
        || matches!(record.state, State::Failed { class: C::Truncated | C::Refused | C::AttemptsExhausted, .. })
}
