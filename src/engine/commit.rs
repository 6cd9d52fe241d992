//! From an answer to a commit: an output is judged against its schema outside the
//! writer, then committed (or failed) in one transaction under the authority it came with.
//! The scheduler commits providers' staged answers here; the service judges workers'
//! outputs with the same rules.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use serde_json::Value;
use tokio::sync::Notify;

use crate::domain::lifecycle::TransitionError;
use crate::domain::schema::{self, Registry, Schema, SourceText, ValidationIssue};
use crate::store::{
    self, Authority, Charge, ExtractionRecord, PostOutcome, PostResult, ReadyItem, SharedStore, StageReport, Submission,
};

/// Findings one output may hold unless configured otherwise: far above any real review,
/// far below what makes a single commit hold up everyone's intake.
pub const DEFAULT_MAX_FINDINGS: usize = 1000;
/// A failure reason is cut here: it is stored with the record and shown to operators.
pub(crate) const MAX_REASON_CHARS: usize = 2000;

/// How schedulers learn that work arrived: a count of extractions that became pending
/// since start, and one wake-up per scheduler. Clones share the count.
#[derive(Debug, Clone, Default)]
pub struct WorkSignals {
    arrivals: Arc<AtomicU64>,
    /// Evaluations created since start: a scheduler lists evaluations again when it moves.
    evaluations: Arc<AtomicU64>,
    wakes: Vec<Arc<Notify>>,
}

impl WorkSignals {
    pub fn add_scheduler(&mut self, wake: Arc<Notify>) {
        self.wakes.push(wake);
    }

    /// New pending work: counted, and every scheduler looks for work again.
    pub fn arrived(&self) {
        self.arrived_many(1);
    }

    pub fn arrived_many(&self, count: u64) {
        self.arrivals.fetch_add(count, Ordering::Relaxed);
        self.wake_all();
    }

    /// Every scheduler looks for work again (each keeps one wake-up permit).
    pub fn wake_all(&self) {
        self.wakes.iter().for_each(|w| w.notify_one());
    }

    pub fn arrivals(&self) -> u64 {
        self.arrivals.load(Ordering::Relaxed)
    }

    /// An evaluation was created: every scheduler looks at evaluations again.
    pub fn evaluation_created(&self) {
        self.evaluations.fetch_add(1, Ordering::Relaxed);
        self.wake_all();
    }

    pub fn evaluations_created(&self) -> u64 {
        self.evaluations.load(Ordering::Relaxed)
    }
}

/// Why an output is refused.
#[derive(Debug, Clone)]
pub enum Refusal {
    TooManyFindings(usize),
    Invalid(Vec<ValidationIssue>),
}

/// The schemas and the per-output findings cap: what an output is judged by.
#[derive(Debug, Clone)]
pub struct Judge {
    registry: Registry,
    max_findings: usize,
    /// Findings refused as ungrounded since start, per schema that declares grounding
    /// rules; clones (the service's, each scheduler's) share the counts.
    ungrounded: Arc<BTreeMap<String, AtomicU64>>,
}

impl Judge {
    pub fn new(registry: Registry, max_findings: usize) -> Self {
        let ungrounded = registry
            .names()
            .filter(|name| registry.get(name).is_ok_and(|s| s.grounding().is_some()))
            .map(|name| (name.to_string(), AtomicU64::new(0)))
            .collect();
        Self { registry, max_findings, ungrounded: Arc::new(ungrounded) }
    }

    /// The same judge with another findings cap (the counts stay shared).
    pub fn with_max_findings(&self, max_findings: usize) -> Self {
        Self { max_findings, ..self.clone() }
    }

    /// Per schema with grounding rules, the findings refused as ungrounded since start.
    pub fn ungrounded_counts(&self) -> Vec<(String, u64)> {
        self.ungrounded.iter().map(|(name, n)| (name.clone(), n.load(Ordering::Relaxed))).collect()
    }

    pub fn registry(&self) -> &Registry {
        &self.registry
    }

    pub fn max_findings(&self) -> usize {
        self.max_findings
    }

    /// The submission an output makes, and why it is refused if it is. An output over the
    /// cap is refused whole: a truncated answer would look complete to whoever reads it.
    ///
    /// `source` is the extraction's source (its `source_id` and content), read only for a
    /// schema with grounding rules ([`Schema::grounding`]); a finding that breaks one is a
    /// validation issue at its path. `None` skips grounding: only for a source no longer
    /// stored.
    pub fn judge(
        &self,
        schema: &Schema,
        output: Value,
        source: Option<SourceText<'_>>,
    ) -> (Submission, Option<Refusal>) {
        let validated = schema.validate(&output);
        if matches!(&validated, Ok(findings) if findings.len() > self.max_findings) {
            return self.verdict(schema, validated, output);
        }
        let report = match source {
            Some(source) if schema.grounding().is_some() => schema.ground(&output, source),
            _ => return self.verdict(schema, validated, output),
        };
        if report.ungrounded > 0 {
            self.count_ungrounded(schema.name(), report.ungrounded);
        }
        let validated = match validated {
            Ok(_) if !report.issues.is_empty() => Err(report.issues),
            Ok(findings) => Ok(findings),
            Err(mut issues) => {
                issues.extend(report.issues);
                issues.truncate(schema::MAX_REPORTED_ISSUES);
                Err(issues)
            }
        };
        self.verdict(schema, validated, output)
    }

    fn count_ungrounded(&self, schema: &str, findings: usize) {
        // `commitpoint_findings_ungrounded_total` is read from these at scrape time.
        if let Some(count) = self.ungrounded.get(schema) {
            count.fetch_add(findings as u64, Ordering::Relaxed);
        }
    }

    fn verdict(
        &self,
        schema: &Schema,
        validated: Result<Vec<schema::ValidatedFinding>, Vec<ValidationIssue>>,
        output: Value,
    ) -> (Submission, Option<Refusal>) {
        match validated {
            Ok(findings) if findings.len() > self.max_findings => {
                let reason = format!(
                    "{} findings, more than the {} allowed per output (limits.max_findings_per_output)",
                    findings.len(),
                    self.max_findings
                );
                let issues = vec![ValidationIssue { path: String::new(), message: reason.clone() }];
                (refused(schema, issues, reason, output.to_string()), Some(Refusal::TooManyFindings(findings.len())))
            }
            Ok(findings) => (Submission::Valid { findings, output }, None),
            Err(issues) => {
                let reason = summarize(&issues);
                (refused(schema, issues.clone(), reason, output.to_string()), Some(Refusal::Invalid(issues)))
            }
        }
    }

    /// The submission a provider's raw answer makes: parsed, normalised for the dialect's
    /// quirks, then judged (grounded in `source` as [`Judge::judge`] says). CPU work, kept
    /// off the writer thread. A refused answer keeps the text the model gave, which is what
    /// its re-ask shows it.
    pub fn judge_answer(&self, schema: &Schema, raw: &str, source: Option<SourceText<'_>>) -> Submission {
        match serde_json::from_str::<Value>(raw) {
            Ok(mut output) => {
                schema.normalize_provider_answer(&mut output);
                match self.judge(schema, output, source).0 {
                    Submission::Invalid { reason, issues, reask_limit, .. } => {
                        Submission::Invalid { reason, issues, output: raw.to_string(), reask_limit }
                    }
                    valid => valid,
                }
            }
            Err(e) => {
                let reason = format!("the model's answer is not JSON: {e}");
                let issues = vec![ValidationIssue { path: String::new(), message: reason.clone() }];
                refused(schema, issues, reason, raw.to_string())
            }
        }
    }
}

/// An invalid answer under its schema's re-ask limit.
fn refused(schema: &Schema, issues: Vec<ValidationIssue>, reason: String, output: String) -> Submission {
    Submission::Invalid { reason, issues, output, reask_limit: schema.reask_limit() }
}

#[derive(Debug, thiserror::Error)]
pub enum CommitError {
    #[error(transparent)]
    Schema(#[from] schema::Error),
    #[error(transparent)]
    Transition(TransitionError),
    #[error(transparent)]
    Store(#[from] store::Error),
}

/// Commits providers' staged answers.
#[derive(Debug, Clone)]
pub struct Committer {
    store: SharedStore,
    judge: Judge,
    signals: WorkSignals,
}

impl Committer {
    pub fn new(store: SharedStore, judge: Judge, signals: WorkSignals) -> Self {
        Self { store, judge, signals }
    }

    pub fn judge(&self) -> &Judge {
        &self.judge
    }

    /// Counts answers ingestion judged and committed (or failed, or sent back to be asked
    /// again) as it took them, as `commit_ready` counts the staged ones.
    pub fn count_ingested(&self, report: &StageReport, schema: &str, provider: &str) {
        if report.committed > 0 {
            metrics::counter!(crate::domain::metric_names::COMMITS_TOTAL, "path" => "provider")
                .increment(report.committed);
        }
        if report.failed_validation > 0 {
            metrics::counter!(crate::domain::metric_names::FAILURES_TOTAL, "class" => "validation")
                .increment(report.failed_validation);
        }
        count_reasks(schema, provider, report.reasked, report.reasks_committed, report.reasks_failed);
        if report.failed_validation > 0 || report.reasked > 0 {
            self.signals.wake_all();
        }
    }

    /// Validates a provider's staged answer and commits it (or fails it) under the
    /// authority of the batch it came from. `batch_api`: the answer came through a batch
    /// API and is priced at its discount (never for a synchronous provider). `reask`: the
    /// provider's override of the schema's re-ask limit.
    pub async fn commit_ready(
        &self,
        item: ReadyItem,
        batch_api: bool,
        reask: Option<u32>,
    ) -> Result<PostOutcome, CommitError> {
        let id = item.record.id;
        let Some(batch_key) = item.record.state.batch_key().cloned() else {
            return Err(CommitError::Transition(TransitionError::StaleBatch));
        };
        let schema = self.judge.registry.get(&item.record.schema)?;
        let charge = item.staged.usage.clone().map(|usage| Charge {
            provider: item.staged.provider.clone(),
            job_id: Some(item.staged.job_id.clone()).filter(|j| !j.is_empty()),
            usage,
            latency_ms: item.staged.latency_ms,
            batch: batch_api,
        });
        // Read only for a schema with grounding rules: the others pay nothing.
        let sources = match schema.grounding() {
            Some(_) => self.store.sources(vec![id]).await?,
            None => Default::default(),
        };
        let source = sources.get(&id).map(|s| SourceText { id: &s.source_id, text: &s.content });
        let submission = self.judge.judge_answer(&schema, &item.staged.output_json, source);
        let submission = submission.with_reask_limit(reask);
        let outcome = self
            .store
            .post_result(PostResult { id, authority: Authority::Batch(batch_key), submission, charge })
            .await?;
        count_outcome(&outcome, "provider", &item.record, &item.staged.provider);
        if matches!(outcome, PostOutcome::Failed { .. } | PostOutcome::Reasked { .. }) {
            self.signals.wake_all();
        }
        Ok(outcome)
    }
}

/// What a post came to, as a trace span's `outcome`.
pub(crate) fn outcome_name(outcome: &PostOutcome) -> &'static str {
    match outcome {
        PostOutcome::Committed { .. } => "committed",
        PostOutcome::Replay { .. } => "replay",
        PostOutcome::Failed { .. } => "failed",
        PostOutcome::Reasked { .. } => "reasked",
        PostOutcome::NotFound => "not_found",
        PostOutcome::Rejected(_) => "rejected",
    }
}

/// Counts a post's outcome by the path it came through (`worker` or `provider`); `record`
/// is the extraction as it was before the post, `provider` who answered (`worker` for an
/// external worker).
pub(crate) fn count_outcome(outcome: &PostOutcome, path: &'static str, record: &ExtractionRecord, provider: &str) {
    let answers_reask = u64::from(record.reasks > 0);
    match outcome {
        PostOutcome::Committed { .. } => {
            metrics::counter!(crate::domain::metric_names::COMMITS_TOTAL, "path" => path).increment(1);
            count_reasks(&record.schema, provider, 0, answers_reask, 0);
        }
        PostOutcome::Replay { .. } => metrics::counter!(crate::domain::metric_names::REPLAYS_TOTAL).increment(1),
        PostOutcome::Failed { .. } => {
            metrics::counter!(crate::domain::metric_names::FAILURES_TOTAL, "class" => "validation").increment(1);
            count_reasks(&record.schema, provider, 0, 0, answers_reask);
        }
        PostOutcome::Reasked { .. } => count_reasks(&record.schema, provider, 1, 0, 0),
        PostOutcome::NotFound | PostOutcome::Rejected(_) => {}
    }
}

/// Re-asks sent, and how the answers to re-asks ended: the success rate of a re-ask is
/// `outcome="committed"` over both outcomes.
fn count_reasks(schema: &str, provider: &str, reasked: u64, committed: u64, failed: u64) {
    use crate::domain::metric_names::{REASK_OUTCOMES_TOTAL, REASKS_TOTAL};
    let labels = |extra: Option<&'static str>| {
        let mut labels = vec![("schema", schema.to_string()), ("provider", provider.to_string())];
        labels.extend(extra.map(|o| ("outcome", o.to_string())));
        labels
    };
    if reasked > 0 {
        metrics::counter!(REASKS_TOTAL, &labels(None)).increment(reasked);
    }
    if committed > 0 {
        metrics::counter!(REASK_OUTCOMES_TOTAL, &labels(Some("committed"))).increment(committed);
    }
    if failed > 0 {
        metrics::counter!(REASK_OUTCOMES_TOTAL, &labels(Some("failed"))).increment(failed);
    }
}

fn summarize(issues: &[ValidationIssue]) -> String {
    let mut text = issues
        .iter()
        .map(|i| format!("{}: {}", if i.path.is_empty() { "/" } else { &i.path }, i.message))
        .collect::<Vec<_>>()
        .join("; ");
    if text.chars().count() > MAX_REASON_CHARS {
        text = text.chars().take(MAX_REASON_CHARS).collect::<String>() + "…";
    }
    text
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::domain::schema::BUILTIN_CODE_REVIEW;

    const SOURCE: SourceText<'static> = SourceText { id: "pay#1", text: "fn pay() {\n    card.unwrap();\n}\n" };

    fn review(file: &str, line: u64) -> Value {
        json!({"findings": [{"rule": "no-unwrap", "severity": "low", "file": file, "line": line, "summary": "s"}]})
    }

    #[test]
    fn ungrounded_findings_are_issues_and_counted() {
        let judge = Judge::new(Registry::builtin(), DEFAULT_MAX_FINDINGS);
        let schema = judge.registry().get(BUILTIN_CODE_REVIEW).unwrap();
        let (ok, refusal) = judge.judge(&schema, review("pay#1", 2), Some(SOURCE));
        assert!(matches!(ok, Submission::Valid { .. }) && refusal.is_none());
        let (bad, refusal) = judge.judge(&schema, review("pay#1", 7), Some(SOURCE));
        let Submission::Invalid { reason, issues, .. } = bad else { panic!("line 7 of a 3-line source committed") };
        assert_eq!(issues[0].path, "/findings/0/line");
        assert!(reason.contains("/findings/0/line: ungrounded (rule `line`)"), "{reason}");
        assert!(matches!(refusal, Some(Refusal::Invalid(i)) if i == issues));
        // The clone a scheduler holds shares the count; another cap keeps it.
        let other = judge.with_max_findings(5);
        let _ = other.judge_answer(&schema, &review("other.rs", 1).to_string(), Some(SOURCE));
        assert_eq!(judge.ungrounded_counts(), vec![(BUILTIN_CODE_REVIEW.to_string(), 2)]);
    }

    #[test]
    fn grounding_issues_join_the_schemas_and_need_a_source() {
        let judge = Judge::new(Registry::builtin(), DEFAULT_MAX_FINDINGS);
        let schema = judge.registry().get(BUILTIN_CODE_REVIEW).unwrap();
        let mut output = review("elsewhere.rs", 2);
        output["findings"][0]["severity"] = json!("urgent");
        let (Submission::Invalid { issues, .. }, _) = judge.judge(&schema, output.clone(), Some(SOURCE)) else {
            panic!("committed")
        };
        let paths: Vec<&str> = issues.iter().map(|i| i.path.as_str()).collect();
        assert_eq!(paths, ["/findings/0/severity", "/findings/0/file"], "{issues:?}");
        // No source stored: the schema alone judges.
        let (valid, _) = judge.judge(&schema, review("elsewhere.rs", 2), None);
        assert!(matches!(valid, Submission::Valid { .. }));
    }

    #[test]
    fn schemas_without_rules_are_not_counted() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("plain@1.json"), json!({"x-commitpoint-identity": ["/k"]}).to_string()).unwrap();
        let judge = Judge::new(Registry::load(Some(dir.path())).unwrap(), DEFAULT_MAX_FINDINGS);
        let counted: Vec<String> = judge.ungrounded_counts().into_iter().map(|(name, _)| name).collect();
        assert_eq!(counted, [BUILTIN_CODE_REVIEW]);
        let schema = judge.registry().get("plain@1").unwrap();
        let (valid, _) = judge.judge(&schema, json!({"findings": [{"k": 1}]}), Some(SOURCE));
        assert!(matches!(valid, Submission::Valid { .. }));
    }
}
