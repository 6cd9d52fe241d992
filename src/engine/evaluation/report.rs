//! An evaluation's report: per candidate, how its trials ended, what they cost and how long
//! they took, and how its valid answers agree with a reference (production's committed
//! findings, or another candidate's answers). Pure: the caller reads the store.

use std::collections::{BTreeSet, HashMap};
use std::fmt::Write as _;

use serde::Serialize;

use crate::engine::ledger::dollars;

use crate::store::evaluation::{EvaluationRecord, Trial, TrialRecord, TrialVerdict};

/// What a report is computed from.
#[derive(Debug, Clone, Copy)]
pub struct ReportInput<'a> {
    pub evaluation: &'a EvaluationRecord,
    pub trials: &'a [Trial],
    /// For members whose extraction is committed in production: member index -> the
    /// canonical identities of its committed findings (possibly empty).
    pub production: &'a HashMap<u32, Vec<String>>,
    /// The reference the candidates are compared with: `None` = production's committed
    /// findings; `Some(name)` = that candidate's valid answers.
    pub against: Option<&'a str>,
    /// Most disagreements listed per candidate (drill-down).
    pub max_disagreements: usize,
}

#[derive(Debug, Clone, Serialize)]
pub struct EvaluationReport {
    pub name: String,
    pub schema: String,
    pub members: u64,
    /// `production` or `candidate:<name>`.
    pub reference: String,
    /// In the evaluation's candidate order.
    pub candidates: Vec<CandidateReport>,
}

#[derive(Debug, Clone, Serialize)]
pub struct CandidateReport {
    pub candidate: String,
    /// Trials that exist (were sent in a trial batch).
    pub sent: u64,
    /// Sent, no outcome yet.
    pub waiting: u64,
    /// Ended with an answer the provider billed: everything but `failed`.
    pub answered: u64,
    pub valid: u64,
    pub invalid: u64,
    pub truncated: u64,
    pub refused: u64,
    pub failed: u64,
    /// Shares of the finished trials (`sent - waiting`); 0 when none finished.
    pub valid_rate: f64,
    pub invalid_rate: f64,
    pub truncated_rate: f64,
    pub refused_rate: f64,
    pub failed_rate: f64,
    /// Mean findings per valid answer; `None` without a valid answer.
    pub findings_per_answer: Option<f64>,
    pub agreement: Agreement,
    pub input_tokens: u64,
    pub output_tokens: u64,
    pub cost_micros: u64,
    /// `cost_micros / valid`, rounded to the nearest micro-dollar; `None` without a valid answer.
    pub cost_per_valid_micros: Option<u64>,
    pub latency: Latency,
    /// Compared members whose sets differ, by member index, at most `max_disagreements`.
    pub disagreements: Vec<Disagreement>,
    /// All compared members whose sets differ, listed or not.
    pub disagreements_total: u64,
}

/// Agreement of a candidate's valid answers with the reference, over the members where
/// both exist. Sets of canonical identities are compared, micro-averaged over members.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Agreement {
    pub compared: u64,
    pub true_positive: u64,
    pub candidate_findings: u64,
    pub reference_findings: u64,
    pub precision: Option<f64>,
    pub recall: Option<f64>,
    pub f1: Option<f64>,
    /// Compared members whose sets are equal (both empty included).
    pub exact_sets: u64,
    pub exact_set_rate: Option<f64>,
}

/// From sending a trial to its answer, over answered trials; nearest-rank percentiles.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Latency {
    pub p50_ms: Option<u64>,
    pub p95_ms: Option<u64>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Disagreement {
    pub index: u32,
    pub extraction_id: String,
    pub source_id: String,
    /// Canonical identities the candidate found and the reference did not, sorted.
    pub only_candidate: Vec<String>,
    /// Canonical identities the reference holds and the candidate missed, sorted.
    pub only_reference: Vec<String>,
}

/// The trials of one evaluation, by (candidate, member index). The store keeps one trial per
/// pair; should a slice hold two anyway, the later one counts, so nothing is counted twice.
/// Trials of candidates or members the evaluation does not have are left out: they cannot be
/// placed in a column or compared.
struct TrialIndex<'a> {
    by_key: HashMap<(&'a str, u32), &'a TrialRecord>,
}

impl<'a> TrialIndex<'a> {
    fn new(evaluation: &'a EvaluationRecord, trials: &'a [Trial]) -> Self {
        let mut by_key = HashMap::new();
        for trial in trials {
            let in_set = usize::try_from(trial.index).is_ok_and(|i| i < evaluation.members.len());
            if in_set && evaluation.has_candidate(&trial.candidate) {
                by_key.insert((trial.candidate.as_str(), trial.index), &trial.record);
            }
        }
        Self { by_key }
    }

    fn get(&self, candidate: &str, index: u32) -> Option<&'a TrialRecord> {
        self.by_key.get(&(candidate, index)).copied()
    }

    /// The set of canonical identities of a candidate's valid answer for a member.
    fn valid_set(&self, candidate: &str, index: u32) -> Option<BTreeSet<&'a str>> {
        valid_set(self.get(candidate, index)?)
    }
}

fn valid_set(record: &TrialRecord) -> Option<BTreeSet<&str>> {
    match &record.outcome.as_ref()?.verdict {
        TrialVerdict::Valid { findings, .. } => Some(findings.iter().map(|f| f.canonical_identity.as_str()).collect()),
        _ => None,
    }
}

pub fn report(input: &ReportInput<'_>) -> EvaluationReport {
    let evaluation = input.evaluation;
    let trials = TrialIndex::new(evaluation, input.trials);
    // Indexes are u32 in the store; a set cannot be larger, and capping here keeps every
    // member the loops below visit addressable.
    let members = evaluation.members.len().min(u32::MAX as usize);
    let references: Vec<Option<BTreeSet<&str>>> = (0..members as u32)
        .map(|index| match input.against {
            None => input.production.get(&index).map(|ids| ids.iter().map(String::as_str).collect()),
            Some(candidate) => trials.valid_set(candidate, index),
        })
        .collect();
    let candidates = evaluation
        .candidates
        .iter()
        .map(|candidate| candidate_report(input, &trials, &references, candidate))
        .collect();
    EvaluationReport {
        name: evaluation.name.clone(),
        schema: evaluation.schema.clone(),
        members: evaluation.members.len() as u64,
        reference: match input.against {
            None => "production".to_string(),
            Some(candidate) => format!("candidate:{candidate}"),
        },
        candidates,
    }
}

fn candidate_report(
    input: &ReportInput<'_>,
    trials: &TrialIndex<'_>,
    references: &[Option<BTreeSet<&str>>],
    candidate: &str,
) -> CandidateReport {
    let mut r = CandidateReport {
        candidate: candidate.to_string(),
        sent: 0,
        waiting: 0,
        answered: 0,
        valid: 0,
        invalid: 0,
        truncated: 0,
        refused: 0,
        failed: 0,
        valid_rate: 0.0,
        invalid_rate: 0.0,
        truncated_rate: 0.0,
        refused_rate: 0.0,
        failed_rate: 0.0,
        findings_per_answer: None,
        agreement: Agreement::default(),
        input_tokens: 0,
        output_tokens: 0,
        cost_micros: 0,
        cost_per_valid_micros: None,
        latency: Latency::default(),
        disagreements: Vec::new(),
        disagreements_total: 0,
    };
    let mut findings_in_valid: u64 = 0;
    let mut latencies: Vec<u64> = Vec::new();
    let mut a = Agreement::default();

    // `references` was built over u32 indexes, so the zip never runs out of them.
    for (index, (member, reference)) in (0u32..).zip(input.evaluation.members.iter().zip(references)) {
        let Some(record) = trials.get(candidate, index) else { continue };
        r.sent += 1;
        let Some(outcome) = &record.outcome else {
            r.waiting += 1;
            continue;
        };
        match &outcome.verdict {
            TrialVerdict::Valid { findings, .. } => {
                r.valid += 1;
                findings_in_valid = findings_in_valid.saturating_add(findings.len() as u64);
            }
            TrialVerdict::Invalid { .. } => r.invalid += 1,
            TrialVerdict::Truncated { .. } => r.truncated += 1,
            TrialVerdict::Refused { .. } => r.refused += 1,
            TrialVerdict::Failed { .. } => r.failed += 1,
        }
        if outcome.verdict.answered() {
            r.answered += 1;
            // A clock step back must not wrap into an absurd latency.
            latencies.push(outcome.answered_at_ms.saturating_sub(record.sent_at_ms));
        }
        if let Some(usage) = &outcome.usage {
            r.input_tokens = r.input_tokens.saturating_add(usage.input_tokens);
            r.output_tokens = r.output_tokens.saturating_add(usage.output_tokens);
        }
        r.cost_micros = r.cost_micros.saturating_add(outcome.cost_micros);

        let (Some(mine), Some(theirs)) = (valid_set(record), reference.as_ref()) else { continue };
        a.compared += 1;
        let common = mine.intersection(theirs).count() as u64;
        a.true_positive += common;
        a.candidate_findings += mine.len() as u64;
        a.reference_findings += theirs.len() as u64;
        if &mine == theirs {
            a.exact_sets += 1;
            continue;
        }
        r.disagreements_total += 1;
        if r.disagreements.len() < input.max_disagreements {
            r.disagreements.push(Disagreement {
                index,
                extraction_id: member.id.to_hex(),
                source_id: member.source_id.clone(),
                only_candidate: mine.difference(theirs).map(|s| s.to_string()).collect(),
                only_reference: theirs.difference(&mine).map(|s| s.to_string()).collect(),
            });
        }
    }

    let finished = r.sent - r.waiting;
    r.valid_rate = share(r.valid, finished);
    r.invalid_rate = share(r.invalid, finished);
    r.truncated_rate = share(r.truncated, finished);
    r.refused_rate = share(r.refused, finished);
    r.failed_rate = share(r.failed, finished);
    r.findings_per_answer = ratio(findings_in_valid, r.valid);
    r.cost_per_valid_micros = (r.valid > 0).then(|| divide_rounded(r.cost_micros, r.valid));

    a.precision = ratio(a.true_positive, a.candidate_findings);
    a.recall = ratio(a.true_positive, a.reference_findings);
    a.f1 = match (a.precision, a.recall) {
        (Some(p), Some(r)) if p + r > 0.0 => Some(2.0 * p * r / (p + r)),
        _ => None,
    };
    a.exact_set_rate = ratio(a.exact_sets, a.compared);
    r.agreement = a;

    latencies.sort_unstable();
    r.latency = Latency { p50_ms: nearest_rank(&latencies, 50), p95_ms: nearest_rank(&latencies, 95) };
    r
}

fn share(part: u64, whole: u64) -> f64 {
    ratio(part, whole).unwrap_or(0.0)
}

fn ratio(part: u64, whole: u64) -> Option<f64> {
    (whole > 0).then(|| part as f64 / whole as f64)
}

/// `n / d` to the nearest integer, halves up; `d` must not be 0. Truncating would make every
/// cheap candidate look a little cheaper than it is.
fn divide_rounded(n: u64, d: u64) -> u64 {
    // The remainder is below `d`, so doubling it cannot overflow for any `d` a count reaches;
    // saturating keeps that true for every `d`.
    n / d + u64::from((n % d).saturating_mul(2) >= d)
}

/// Nearest-rank percentile of sorted values: the smallest value with at least `p`% of the
/// values at or below it. Always one of the observed values, never an interpolation.
fn nearest_rank(sorted: &[u64], p: usize) -> Option<u64> {
    let rank = p.saturating_mul(sorted.len()).div_ceil(100).max(1);
    sorted.get(rank - 1).copied()
}

/// A rate as a percentage with one decimal, as the report's table and the console show it.
pub fn percent(rate: f64) -> String {
    format!("{:.1}%", rate * 100.0)
}

fn or_na<T>(value: Option<T>, show: impl Fn(T) -> String) -> String {
    value.map_or_else(|| "n/a".to_string(), show)
}

/// Trials take from seconds (synchronous providers) to hours (batch APIs): a unit that
/// fits keeps the number readable at either end.
pub fn duration(ms: u64) -> String {
    match ms {
        0..1_000 => format!("{ms} ms"),
        1_000..60_000 => format!("{:.1} s", ms as f64 / 1_000.0),
        60_000..3_600_000 => format!("{}m {:02}s", ms / 60_000, ms % 60_000 / 1_000),
        _ => format!("{}h {:02}m", ms / 3_600_000, ms % 3_600_000 / 60_000),
    }
}

type Row = (&'static str, fn(&CandidateReport) -> String);

/// The table's rows, in the order a decision reads them: did it answer, is it right, what
/// does it cost, how long does it take.
const ROWS: &[Row] = &[
    ("sent", |c| c.sent.to_string()),
    ("waiting", |c| c.waiting.to_string()),
    ("answered", |c| c.answered.to_string()),
    ("valid", |c| c.valid.to_string()),
    ("valid rate", |c| percent(c.valid_rate)),
    ("truncated", |c| c.truncated.to_string()),
    ("refused", |c| c.refused.to_string()),
    ("invalid", |c| c.invalid.to_string()),
    ("failed", |c| c.failed.to_string()),
    ("findings/answer", |c| or_na(c.findings_per_answer, |f| format!("{f:.2}"))),
    ("compared", |c| c.agreement.compared.to_string()),
    ("precision", |c| or_na(c.agreement.precision, percent)),
    ("recall", |c| or_na(c.agreement.recall, percent)),
    ("F1", |c| or_na(c.agreement.f1, percent)),
    ("exact-set agreement", |c| or_na(c.agreement.exact_set_rate, percent)),
    ("disagreements", |c| c.disagreements_total.to_string()),
    ("input tokens", |c| c.input_tokens.to_string()),
    ("output tokens", |c| c.output_tokens.to_string()),
    ("cost", |c| dollars(c.cost_micros)),
    ("cost per valid answer", |c| or_na(c.cost_per_valid_micros, dollars)),
    ("latency p50", |c| or_na(c.latency.p50_ms, duration)),
    ("latency p95", |c| or_na(c.latency.p95_ms, duration)),
];

/// Side by side: one row per metric, one column per candidate.
pub fn table(report: &EvaluationReport) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "evaluation {} (schema {}): {} members, compared with {}",
        report.name, report.schema, report.members, report.reference
    );
    let header: Vec<String> = report.candidates.iter().map(|c| c.candidate.clone()).collect();
    let cells: Vec<Vec<String>> = ROWS.iter().map(|(_, cell)| report.candidates.iter().map(cell).collect()).collect();
    let label_width = ROWS.iter().map(|(label, _)| label.chars().count()).max().unwrap_or(0);
    let widths: Vec<usize> = (0..header.len())
        .map(|col| {
            std::iter::once(&header[col])
                .chain(cells.iter().map(|row| &row[col]))
                .map(|s| s.chars().count())
                .max()
                .unwrap_or(0)
        })
        .collect();
    let mut line = |label: &str, values: &[String]| {
        let mut text = format!("{label:<label_width$}");
        for (value, width) in values.iter().zip(&widths) {
            let _ = write!(text, "  {value:>width$}");
        }
        let _ = writeln!(out, "{}", text.trim_end());
    };
    line("", &header);
    for ((label, _), values) in ROWS.iter().zip(&cells) {
        line(label, values);
    }
    out
}

const CSV_COLUMNS: &[&str] = &[
    "candidate",
    "sent",
    "waiting",
    "answered",
    "valid",
    "invalid",
    "truncated",
    "refused",
    "failed",
    "valid_rate",
    "invalid_rate",
    "truncated_rate",
    "refused_rate",
    "failed_rate",
    "findings_per_answer",
    "compared",
    "true_positive",
    "candidate_findings",
    "reference_findings",
    "precision",
    "recall",
    "f1",
    "exact_sets",
    "exact_set_rate",
    "disagreements",
    "input_tokens",
    "output_tokens",
    "cost_micros",
    "cost_per_valid_micros",
    "latency_p50_ms",
    "latency_p95_ms",
];

/// One row per candidate with every number, unformatted, for a spreadsheet; `None` is empty.
pub fn csv(report: &EvaluationReport) -> String {
    fn opt<T: ToString>(value: Option<T>) -> String {
        value.map(|v| v.to_string()).unwrap_or_default()
    }
    let mut out = String::new();
    push_row(&mut out, CSV_COLUMNS.iter().map(|c| c.to_string()));
    for c in &report.candidates {
        let a = &c.agreement;
        push_row(
            &mut out,
            [
                c.candidate.clone(),
                c.sent.to_string(),
                c.waiting.to_string(),
                c.answered.to_string(),
                c.valid.to_string(),
                c.invalid.to_string(),
                c.truncated.to_string(),
                c.refused.to_string(),
                c.failed.to_string(),
                c.valid_rate.to_string(),
                c.invalid_rate.to_string(),
                c.truncated_rate.to_string(),
                c.refused_rate.to_string(),
                c.failed_rate.to_string(),
                opt(c.findings_per_answer),
                a.compared.to_string(),
                a.true_positive.to_string(),
                a.candidate_findings.to_string(),
                a.reference_findings.to_string(),
                opt(a.precision),
                opt(a.recall),
                opt(a.f1),
                a.exact_sets.to_string(),
                opt(a.exact_set_rate),
                c.disagreements_total.to_string(),
                c.input_tokens.to_string(),
                c.output_tokens.to_string(),
                c.cost_micros.to_string(),
                opt(c.cost_per_valid_micros),
                opt(c.latency.p50_ms),
                opt(c.latency.p95_ms),
            ],
        );
    }
    out
}

/// RFC 4180: a field with a comma, quote or line break is quoted, its quotes doubled; rows
/// end in CRLF.
fn push_row(out: &mut String, fields: impl IntoIterator<Item = String>) {
    let fields: Vec<String> = fields
        .into_iter()
        .map(|f| if f.contains([',', '"', '\n', '\r']) { format!("\"{}\"", f.replace('"', "\"\"")) } else { f })
        .collect();
    out.push_str(&fields.join(","));
    out.push_str("\r\n");
}

#[cfg(test)]
#[path = "report_tests.rs"]
mod tests;
