//! What `verify` reports, and the record checks both backends' `verify` apply alike.

use std::collections::BTreeMap;
use std::fmt;

use crate::domain::identity::{ExtractionId, FindingKey, SourceHash};
use crate::store::records::{ChargeKind, ExtractionRecord, FindingRecord, LedgerRecord, ResultRecord, StoredContent};

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

/// A decoded extraction's own checks, whichever backend read it (stored under `seq`):
/// its number, its identity, its attempts; and it is counted. `content` is its stored
/// content, if it has any (which backend may lack it, and why, is the backend's to say).
pub(crate) fn check_record<E: fmt::Display>(
    seq: u64,
    record: &ExtractionRecord,
    content: Option<Result<StoredContent, E>>,
    report: &mut Report,
) {
    report.extractions += 1;
    *report.by_state.entry(record.state.name().as_str()).or_default() += 1;
    if record.seq != seq {
        report.problem(format!("extraction #{seq} says it is #{}", record.seq));
    }
    match content {
        Some(Ok(content)) if SourceHash::compute(content.text.as_bytes(), &record.schema) != record.source_hash => {
            report.problem(format!("{}: content does not match its source hash", record.id));
        }
        Some(Ok(_)) | None => {}
        Some(Err(e)) => report.problem(format!("{}: content: {e}", record.id)),
    }
    let expected = ExtractionId::compute(&record.tenant, &record.source_id, &record.source_hash, &record.schema);
    if expected != record.id {
        report.problem(format!("{}: id does not match (tenant, source_id, source_hash, schema)", record.id));
    }
    check_attempts(record, report);
}

/// A finding's key recomputes from its extraction's identity and its identifying fields,
/// and the key it is stored under is that key.
pub(crate) fn check_finding_key(id: &ExtractionId, stored_under: &[u8], finding: &FindingRecord, report: &mut Report) {
    let expected = FindingKey::compute(id, &finding.canonical_identity);
    if expected.as_bytes() != stored_under || finding.key != expected {
        report.problem(format!("{id}: finding key {} does not match its identifying fields", finding.key));
    }
}

/// A raw result (stored under `seq`) decodes and holds JSON.
pub(crate) fn check_result<E: fmt::Display>(seq: u64, result: Result<ResultRecord, E>, report: &mut Report) {
    match result {
        Ok(result) if serde_json::from_str::<serde_json::Value>(&result.output_json).is_err() => {
            report.problem(format!("raw result #{seq} is not valid JSON"));
        }
        Ok(_) => {}
        Err(e) => report.problem(format!("raw result #{seq}: {e}")),
    }
}

/// A ledger entry (`seq`) names an extraction of its tenant (`named`: the extraction
/// under its number, if one is there); a replay costs nothing; an unusable answer never
/// stays the current attempt's.
pub(crate) fn check_ledger_entry(
    seq: u64,
    entry: &LedgerRecord,
    named: Option<&ExtractionRecord>,
    report: &mut Report,
) {
    match named {
        Some(r) if r.id == entry.extraction_id && r.tenant == entry.tenant => {
            if entry.kind == ChargeKind::Unusable && !left_behind(r, entry.attempt) {
                report.problem(format!(
                    "ledger #{seq}: an unusable answer of attempt {} is {}'s current attempt, which is not failed for it",
                    entry.attempt, r.id
                ));
            }
        }
        _ => report.problem(format!("ledger #{seq} names an extraction or tenant that does not exist")),
    }
    if entry.kind == ChargeKind::Replay && entry.cost_micros != 0 {
        report.problem(format!("ledger #{seq}: a replay was charged"));
    }
}

/// A truncated or refused answer never stays the current attempt's answer: the extraction
/// was requeued (a later attempt) or failed for it in the same transaction.
fn left_behind(record: &ExtractionRecord, attempt: u32) -> bool {
    use crate::domain::lifecycle::{FailureClass as C, State};
    attempt < record.attempt
        || matches!(record.state, State::Failed { class: C::Truncated | C::Refused | C::AttemptsExhausted, .. })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::lifecycle::{FailureClass, State};
    use crate::store::ProviderReportedOnly;
    use crate::store::rules::fixtures::record;
    use crate::store::rules::ledger::plan_charge;
    use crate::store::seam::Charge;

    /// A record whose identity and source hash recompute from its fields and `text`.
    fn sound(text: &str) -> ExtractionRecord {
        let mut r = record(State::Pending);
        r.source_hash = SourceHash::compute(text.as_bytes(), &r.schema);
        r.id = ExtractionId::compute(&r.tenant, &r.source_id, &r.source_hash, &r.schema);
        r
    }

    fn content(text: &str) -> Option<Result<StoredContent, String>> {
        Some(Ok(StoredContent { text: text.into() }))
    }

    #[test]
    fn a_sound_record_is_counted_and_passes_and_each_broken_part_is_named() {
        let mut report = Report::default();
        check_record(1, &sound("body"), content("body"), &mut report);
        check_record(1, &sound("body"), None::<Result<StoredContent, String>>, &mut report);
        assert!(report.is_ok(), "{report}");
        assert_eq!((report.extractions, report.by_state.get("pending")), (2, Some(&2)));
        let mut moved = sound("body");
        moved.tenant = "other".into();
        let cases = [
            (2, sound("body"), content("body"), "says it is #1"),
            (1, sound("body"), content("changed"), "does not match its source hash"),
            (1, sound("body"), Some(Err("bad format byte".to_string())), "content: bad format byte"),
            (1, moved, None, "id does not match"),
        ];
        for (seq, record, content, expected) in cases {
            let mut report = Report::default();
            check_record(seq, &record, content, &mut report);
            assert_eq!(report.problems.len(), 1, "{report}");
            assert!(report.problems[0].contains(expected), "{report}");
        }
    }

    #[test]
    fn a_finding_key_must_recompute_and_be_the_key_it_is_stored_under() {
        let id = sound("body").id;
        let key = FindingKey::compute(&id, "{\"line\":1}");
        let finding = FindingRecord {
            key,
            canonical_identity: "{\"line\":1}".into(),
            body_json: "{}".into(),
            committed_at_ms: 0,
        };
        let mut report = Report::default();
        check_finding_key(&id, key.as_bytes(), &finding, &mut report);
        assert!(report.is_ok(), "{report}");
        check_finding_key(&id, &[0; 32], &finding, &mut report);
        let other = FindingRecord { canonical_identity: "{\"line\":2}".into(), ..finding };
        check_finding_key(&id, key.as_bytes(), &other, &mut report);
        assert_eq!(report.problems.len(), 2, "{report}");
    }

    #[test]
    fn a_raw_result_must_decode_and_hold_json() {
        let result = |output: &str| ResultRecord {
            output_json: output.into(),
            producer: "w".into(),
            fence: crate::store::records::Fence::Lease(crate::domain::names::LeaseToken::new("lt-1")),
            usage: None,
            latency_ms: None,
            received_at_ms: 0,
        };
        let mut report = Report::default();
        check_result(3, Ok::<_, String>(result("{\"a\":1}")), &mut report);
        assert!(report.is_ok(), "{report}");
        check_result(3, Ok::<_, String>(result("{\"a\":")), &mut report);
        check_result(4, Err("truncated".to_string()), &mut report);
        assert_eq!(report.problems, vec!["raw result #3 is not valid JSON", "raw result #4: truncated"]);
    }

    #[test]
    fn a_ledger_entry_names_its_extraction_costs_nothing_as_a_replay_and_leaves_no_unusable_answer_current() {
        let charged = |r: &ExtractionRecord, kind| {
            let usage = crate::domain::batch::Usage { provider_cost_micros: Some(9), ..Default::default() };
            let charge = Charge { provider: "p".into(), job_id: None, usage, latency_ms: None, batch: false };
            plan_charge(5, &ProviderReportedOnly, r, &charge, kind, false, 0).entry
        };
        let mut r = sound("body");
        let mut report = Report::default();
        check_ledger_entry(5, &charged(&r, ChargeKind::Fresh), Some(&r), &mut report);
        assert!(report.is_ok(), "{report}");
        check_ledger_entry(5, &charged(&r, ChargeKind::Fresh), None, &mut report);
        assert!(report.problems[0].contains("names an extraction or tenant that does not exist"), "{report}");
        let mut paid_replay = charged(&r, ChargeKind::Replay);
        paid_replay.cost_micros = 9;
        check_ledger_entry(5, &paid_replay, Some(&r), &mut report);
        assert!(report.problems[1].contains("a replay was charged"), "{report}");
        let unusable = charged(&r, ChargeKind::Unusable);
        check_ledger_entry(5, &unusable, Some(&r), &mut report);
        assert!(report.problems[2].contains("an unusable answer of attempt 1"), "{report}");
        assert_eq!(report.problems.len(), 3);
        r.state = State::Failed { class: FailureClass::Truncated, reason: "cut".into() };
        let mut failed_for_it = Report::default();
        check_ledger_entry(5, &unusable, Some(&r), &mut failed_for_it);
        assert!(failed_for_it.is_ok(), "{failed_for_it}");
    }
}
