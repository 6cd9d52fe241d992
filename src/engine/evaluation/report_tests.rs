use std::collections::HashMap;

use super::*;
use crate::domain::batch::Usage;
use crate::domain::identity::{ExtractionId, SourceHash};
use crate::store::evaluation::{EvalMember, TrialFinding, TrialOutcome};

const SENT_AT: u64 = 1_000_000;

fn member(i: u32) -> EvalMember {
    EvalMember {
        seq: u64::from(i) + 1,
        id: ExtractionId([i as u8 + 1; 32]),
        source_hash: SourceHash([0xaa; 32]),
        tenant: "t".into(),
        source_id: format!("src-{i}"),
        erased: false,
    }
}

fn evaluation(candidates: &[&str], members: u32) -> EvaluationRecord {
    EvaluationRecord {
        name: "bakeoff".into(),
        tenant: None,
        schema: "findings".into(),
        candidates: candidates.iter().map(|c| c.to_string()).collect(),
        budget_micros: None,
        selection: "ids".into(),
        created_at_ms: 1,
        cancelled_at_ms: None,
        members: (0..members).map(member).collect(),
    }
}

fn valid(ids: &[&str]) -> TrialVerdict {
    TrialVerdict::Valid {
        output_json: "{}".into(),
        findings: ids
            .iter()
            .map(|id| TrialFinding { canonical_identity: id.to_string(), body_json: "{}".into() })
            .collect(),
    }
}

fn truncated() -> TrialVerdict {
    TrialVerdict::Truncated { reason: "max tokens".into() }
}

fn refused() -> TrialVerdict {
    TrialVerdict::Refused { reason: "no".into() }
}

fn failed() -> TrialVerdict {
    TrialVerdict::Failed { reason: "batch expired".into() }
}

fn invalid() -> TrialVerdict {
    TrialVerdict::Invalid { reason: "not the schema".into() }
}

/// An answered trial: `tokens` are (input, output); `None` stands for no usage reported.
fn answered(
    candidate: &str,
    index: u32,
    verdict: TrialVerdict,
    latency_ms: u64,
    cost: u64,
    tokens: Option<(u64, u64)>,
) -> Trial {
    Trial {
        candidate: candidate.into(),
        index,
        record: TrialRecord {
            batch: 1,
            sent_at_ms: SENT_AT,
            outcome: Some(TrialOutcome {
                verdict,
                answered_at_ms: SENT_AT + latency_ms,
                usage: tokens.map(|(input_tokens, output_tokens)| Usage {
                    model: "m".into(),
                    input_tokens,
                    output_tokens,
                    ..Usage::default()
                }),
                cost_micros: cost,
            }),
        },
    }
}

fn waiting(candidate: &str, index: u32) -> Trial {
    Trial { candidate: candidate.into(), index, record: TrialRecord { batch: 1, sent_at_ms: SENT_AT, outcome: None } }
}

/// Members 0..=4 are committed in production; member 5 is not.
fn production() -> HashMap<u32, Vec<String>> {
    let sets: [&[&str]; 5] = [&["a", "b"], &["c"], &[], &["d", "e"], &["f"]];
    (0u32..).zip(sets).map(|(i, ids)| (i, ids.iter().map(|s| s.to_string()).collect())).collect()
}

fn trials() -> Vec<Trial> {
    vec![
        // Superseded by the later trial of the same pair: must not count twice.
        answered("alpha", 0, failed(), 0, 9_999, None),
        answered("alpha", 0, valid(&["a", "b"]), 100, 100, Some((10, 1))),
        answered("alpha", 1, valid(&["c", "x"]), 200, 200, Some((20, 2))),
        answered("alpha", 2, valid(&[]), 300, 300, Some((30, 3))),
        answered("alpha", 3, truncated(), 400, 400, Some((40, 4))),
        answered("alpha", 4, failed(), 450, 0, None),
        answered("alpha", 5, valid(&["z"]), 500, 500, Some((60, 6))),
        answered("beta", 0, valid(&["a"]), 2_500, 50, Some((5, 5))),
        answered("beta", 1, refused(), 61_000, 20, Some((5, 0))),
        answered("beta", 2, valid(&["y"]), 3_700_000, 50, Some((5, 5))),
        answered("beta", 3, valid(&["d", "e", "g"]), 500, 50, Some((5, 5))),
        waiting("beta", 4),
        // Neither a candidate nor a member of the evaluation.
        answered("gamma", 0, valid(&["a"]), 1, 1_000, Some((1, 1))),
        answered("beta", 99, valid(&["a"]), 1, 1_000, Some((1, 1))),
    ]
}

fn run(
    record: &EvaluationRecord,
    trials: &[Trial],
    production: &HashMap<u32, Vec<String>>,
    against: Option<&str>,
    max: usize,
) -> EvaluationReport {
    report(&ReportInput { evaluation: record, trials, production, against, max_disagreements: max })
}

fn fixture(against: Option<&str>, max: usize) -> EvaluationReport {
    run(&evaluation(&["alpha", "beta"], 6), &trials(), &production(), against, max)
}

fn close(actual: Option<f64>, expected: f64) {
    let actual = actual.unwrap();
    assert!((actual - expected).abs() < 1e-9, "{actual} != {expected}");
}

#[test]
fn the_report_names_the_evaluation_and_keeps_the_candidate_order() {
    let r = fixture(None, 50);
    assert_eq!((r.name.as_str(), r.schema.as_str(), r.members), ("bakeoff", "findings", 6));
    assert_eq!(r.reference, "production");
    let names: Vec<&str> = r.candidates.iter().map(|c| c.candidate.as_str()).collect();
    assert_eq!(names, ["alpha", "beta"]);

    let reversed = run(&evaluation(&["beta", "alpha"], 6), &trials(), &production(), Some("alpha"), 50);
    assert_eq!(reversed.reference, "candidate:alpha");
    assert_eq!(reversed.candidates[0].candidate, "beta");
}

#[test]
fn counts_and_rates_follow_the_verdicts() {
    let r = fixture(None, 50);
    let alpha = &r.candidates[0];
    assert_eq!(
        (
            alpha.sent,
            alpha.waiting,
            alpha.answered,
            alpha.valid,
            alpha.invalid,
            alpha.truncated,
            alpha.refused,
            alpha.failed
        ),
        (6, 0, 5, 4, 0, 1, 0, 1)
    );
    close(Some(alpha.valid_rate), 4.0 / 6.0);
    close(Some(alpha.truncated_rate), 1.0 / 6.0);
    close(Some(alpha.failed_rate), 1.0 / 6.0);
    assert_eq!((alpha.refused_rate, alpha.invalid_rate), (0.0, 0.0));
    close(alpha.findings_per_answer, 5.0 / 4.0);

    // The waiting trial is sent but not finished: rates are over the four that finished.
    let beta = &r.candidates[1];
    assert_eq!(
        (beta.sent, beta.waiting, beta.answered, beta.valid, beta.invalid, beta.truncated, beta.refused, beta.failed),
        (5, 1, 4, 3, 0, 0, 1, 0)
    );
    close(Some(beta.valid_rate), 0.75);
    close(Some(beta.refused_rate), 0.25);
    close(beta.findings_per_answer, 5.0 / 3.0);
}

#[test]
fn tokens_cost_and_latency_add_up_per_candidate() {
    let r = fixture(None, 50);
    let alpha = &r.candidates[0];
    assert_eq!((alpha.input_tokens, alpha.output_tokens), (160, 16));
    assert_eq!(alpha.cost_micros, 1_500);
    assert_eq!(alpha.cost_per_valid_micros, Some(375));
    // The failed trial's 450 ms is not an answer's latency: [100, 200, 300, 400, 500].
    assert_eq!(alpha.latency, Latency { p50_ms: Some(300), p95_ms: Some(500) });

    let beta = &r.candidates[1];
    assert_eq!((beta.input_tokens, beta.output_tokens), (20, 15));
    assert_eq!(beta.cost_micros, 170);
    assert_eq!(beta.cost_per_valid_micros, Some(57), "170 / 3 = 56.67, rounded");
    // [500, 2_500, 61_000, 3_700_000]: rank 2 and rank 4.
    assert_eq!(beta.latency, Latency { p50_ms: Some(2_500), p95_ms: Some(3_700_000) });
}

#[test]
fn agreement_with_production_is_micro_averaged_over_compared_members() {
    let r = fixture(None, 50);
    // Members 0, 1, 2 compared (member 3 truncated, 4 failed, 5 not in production):
    // {a,b}={a,b}, {c,x}⊃{c}, {}={}.
    let alpha = &r.candidates[0].agreement;
    assert_eq!(
        (alpha.compared, alpha.true_positive, alpha.candidate_findings, alpha.reference_findings, alpha.exact_sets),
        (3, 3, 4, 3, 2)
    );
    close(alpha.precision, 0.75);
    close(alpha.recall, 1.0);
    close(alpha.f1, 2.0 * 0.75 / 1.75);
    close(alpha.exact_set_rate, 2.0 / 3.0);

    // {a}⊂{a,b}, {y} vs {}, {d,e,g}⊃{d,e}.
    let beta = &r.candidates[1].agreement;
    assert_eq!(
        (beta.compared, beta.true_positive, beta.candidate_findings, beta.reference_findings, beta.exact_sets),
        (3, 3, 5, 4, 0)
    );
    close(beta.precision, 0.6);
    close(beta.recall, 0.75);
    close(beta.f1, 2.0 * 0.6 * 0.75 / 1.35);
    close(beta.exact_set_rate, 0.0);
}

#[test]
fn agreement_with_a_reference_candidate() {
    let r = fixture(Some("alpha"), 50);
    assert_eq!(r.reference, "candidate:alpha");

    // Alpha against itself: its four valid answers, all agreeing.
    let alpha = &r.candidates[0].agreement;
    assert_eq!((alpha.compared, alpha.true_positive, alpha.candidate_findings, alpha.reference_findings), (4, 5, 5, 5));
    assert_eq!(alpha.exact_sets, 4);
    for value in [alpha.precision, alpha.recall, alpha.f1, alpha.exact_set_rate] {
        close(value, 1.0);
    }
    assert!(r.candidates[0].disagreements.is_empty());

    // Beta and alpha are both valid on members 0 ({a} vs {a,b}) and 2 ({y} vs {}) only.
    let beta = &r.candidates[1];
    let a = &beta.agreement;
    assert_eq!(
        (a.compared, a.true_positive, a.candidate_findings, a.reference_findings, a.exact_sets),
        (2, 1, 2, 2, 0)
    );
    close(a.precision, 0.5);
    close(a.recall, 0.5);
    close(a.f1, 0.5);
    let indexes: Vec<u32> = beta.disagreements.iter().map(|d| d.index).collect();
    assert_eq!(indexes, [0, 2]);
    // Counts and costs do not depend on the reference.
    assert_eq!((beta.valid, beta.cost_micros), (3, 170));
}

#[test]
fn an_unknown_reference_candidate_compares_nothing() {
    let r = fixture(Some("delta"), 50);
    for c in &r.candidates {
        assert_eq!(c.agreement, Agreement::default(), "{}", c.candidate);
        assert_eq!(c.disagreements_total, 0);
    }
}

#[test]
fn disagreements_list_the_differences_by_member_and_are_capped() {
    let r = fixture(None, 50);
    let alpha = &r.candidates[0];
    assert_eq!(alpha.disagreements_total, 1);
    assert_eq!(
        alpha.disagreements,
        [Disagreement {
            index: 1,
            extraction_id: ExtractionId([2; 32]).to_hex(),
            source_id: "src-1".into(),
            only_candidate: vec!["x".into()],
            only_reference: vec![],
        }]
    );

    let beta = &r.candidates[1];
    assert_eq!(beta.disagreements_total, 3);
    let listed: Vec<(u32, Vec<String>, Vec<String>)> =
        beta.disagreements.iter().map(|d| (d.index, d.only_candidate.clone(), d.only_reference.clone())).collect();
    assert_eq!(
        listed,
        [(0, vec![], vec!["b".to_string()]), (2, vec!["y".to_string()], vec![]), (3, vec!["g".to_string()], vec![]),]
    );

    let capped = fixture(None, 2);
    let beta = &capped.candidates[1];
    assert_eq!(beta.disagreements_total, 3, "the total counts past the cap");
    assert_eq!(beta.disagreements.iter().map(|d| d.index).collect::<Vec<_>>(), [0, 2]);
    assert!(fixture(None, 0).candidates.iter().all(|c| c.disagreements.is_empty()));
}

#[test]
fn duplicate_identities_in_an_answer_compare_as_a_set() {
    let record = evaluation(&["alpha"], 1);
    let production = HashMap::from([(0, vec!["a".to_string()])]);
    let trials = [answered("alpha", 0, valid(&["a", "a"]), 1, 1, None)];
    let r = run(&record, &trials, &production, None, 50);
    let a = &r.candidates[0].agreement;
    assert_eq!((a.true_positive, a.candidate_findings, a.exact_sets), (1, 1, 1));
    assert!(r.candidates[0].disagreements.is_empty());
}

#[test]
fn without_valid_answers_the_ratios_are_none() {
    let record = evaluation(&["gamma", "idle"], 3);
    let trials = [
        answered("gamma", 0, failed(), 10, 0, None),
        answered("gamma", 1, invalid(), 20, 7, None),
        waiting("gamma", 2),
    ];
    let r = run(&record, &trials, &production(), None, 50);

    let gamma = &r.candidates[0];
    assert_eq!(
        (gamma.sent, gamma.waiting, gamma.answered, gamma.valid, gamma.invalid, gamma.failed),
        (3, 1, 1, 0, 1, 1)
    );
    assert_eq!((gamma.valid_rate, gamma.invalid_rate, gamma.failed_rate), (0.0, 0.5, 0.5));
    assert_eq!(gamma.findings_per_answer, None);
    assert_eq!(gamma.agreement, Agreement::default());
    assert_eq!(gamma.cost_micros, 7);
    assert_eq!(gamma.cost_per_valid_micros, None);
    // Only the invalid answer was answered.
    assert_eq!(gamma.latency, Latency { p50_ms: Some(20), p95_ms: Some(20) });

    let idle = &r.candidates[1];
    assert_eq!((idle.sent, idle.waiting, idle.answered), (0, 0, 0));
    assert_eq!(idle.valid_rate, 0.0);
    assert_eq!(idle.latency, Latency::default());
}

#[test]
fn with_nothing_finished_the_rates_are_zero() {
    let record = evaluation(&["alpha"], 2);
    let trials = [waiting("alpha", 0), waiting("alpha", 1)];
    let c = &run(&record, &trials, &production(), None, 50).candidates[0];
    assert_eq!((c.sent, c.waiting), (2, 2));
    for rate in [c.valid_rate, c.invalid_rate, c.truncated_rate, c.refused_rate, c.failed_rate] {
        assert_eq!(rate, 0.0);
    }
    assert_eq!((c.findings_per_answer, c.cost_per_valid_micros), (None, None));
}

#[test]
fn f1_is_none_when_precision_and_recall_are_both_zero_or_one_is_missing() {
    let record = evaluation(&["alpha"], 1);
    let trials = [answered("alpha", 0, valid(&["y"]), 1, 1, None)];

    let disjoint = HashMap::from([(0, vec!["z".to_string()])]);
    let a = run(&record, &trials, &disjoint, None, 50).candidates[0].agreement.clone();
    assert_eq!((a.precision, a.recall, a.f1), (Some(0.0), Some(0.0), None));

    let empty = HashMap::from([(0, vec![])]);
    let a = run(&record, &trials, &empty, None, 50).candidates[0].agreement.clone();
    assert_eq!((a.precision, a.recall, a.f1), (Some(0.0), None, None));
}

#[test]
fn a_clock_step_back_counts_as_no_latency() {
    let record = evaluation(&["alpha"], 1);
    let mut trial = answered("alpha", 0, valid(&[]), 0, 0, None);
    trial.record.sent_at_ms = SENT_AT + 5_000;
    let c = &run(&record, &[trial], &production(), None, 50).candidates[0];
    assert_eq!(c.latency.p50_ms, Some(0));
}

#[test]
fn nearest_rank_percentiles() {
    let twenty: Vec<u64> = (1..=20).collect();
    assert_eq!(nearest_rank(&twenty, 50), Some(10));
    assert_eq!(nearest_rank(&twenty, 95), Some(19));
    assert_eq!(nearest_rank(&twenty, 100), Some(20));
    assert_eq!(nearest_rank(&[7], 50), Some(7));
    assert_eq!(nearest_rank(&[7], 95), Some(7));
    assert_eq!(nearest_rank(&[1, 2], 50), Some(1));
    assert_eq!(nearest_rank(&[1, 2], 95), Some(2));
    assert_eq!(nearest_rank(&[], 50), None);
}

#[test]
fn division_rounds_half_up() {
    assert_eq!(divide_rounded(10, 4), 3);
    assert_eq!(divide_rounded(10, 3), 3);
    assert_eq!(divide_rounded(11, 3), 4);
    assert_eq!(divide_rounded(u64::MAX, 1), u64::MAX);
    assert_eq!(divide_rounded(u64::MAX, u64::MAX), 1);
}

#[test]
fn formats() {
    assert_eq!(dollars(1_234), "$0.001234");
    assert_eq!(dollars(12_345_678), "$12.345678");
    assert_eq!(percent(2.0 / 3.0), "66.7%");
    assert_eq!(duration(999), "999 ms");
    assert_eq!(duration(2_500), "2.5 s");
    assert_eq!(duration(61_000), "1m 01s");
    assert_eq!(duration(3_700_000), "1h 01m");
}

/// The table row that starts with `label`, split into its cells after the label.
fn row<'t>(table: &'t str, label: &str) -> Vec<&'t str> {
    let line = table.lines().skip(1).find(|l| l.starts_with(label) && l[label.len()..].starts_with("  ")).unwrap();
    line[label.len()..].split("  ").map(str::trim).filter(|s| !s.is_empty()).collect()
}

#[test]
fn the_table_puts_candidates_side_by_side() {
    let text = table(&fixture(None, 50));
    let first = text.lines().next().unwrap();
    for part in ["bakeoff", "findings", "6 members", "production"] {
        assert!(first.contains(part), "{first}");
    }
    assert_eq!(row(&text, "sent"), ["6", "5"]);
    assert_eq!(row(&text, "valid rate"), ["66.7%", "75.0%"]);
    assert_eq!(row(&text, "findings/answer"), ["1.25", "1.67"]);
    assert_eq!(row(&text, "precision"), ["75.0%", "60.0%"]);
    assert_eq!(row(&text, "recall"), ["100.0%", "75.0%"]);
    assert_eq!(row(&text, "F1"), ["85.7%", "66.7%"]);
    assert_eq!(row(&text, "exact-set agreement"), ["66.7%", "0.0%"]);
    assert_eq!(row(&text, "cost"), ["$0.001500", "$0.000170"]);
    assert_eq!(row(&text, "cost per valid answer"), ["$0.000375", "$0.000057"]);
    assert_eq!(row(&text, "latency p50"), ["300 ms", "2.5 s"]);
    assert_eq!(row(&text, "latency p95"), ["500 ms", "1h 01m"]);
    assert_eq!(row(&text, "input tokens"), ["160", "20"]);

    // Aligned: every line under the title is equally wide, and each column ends in one place.
    let lines: Vec<&str> = text.lines().skip(1).collect();
    assert_eq!(lines.len(), 1 + ROWS.len());
    let width = lines[0].chars().count();
    assert!(lines.iter().all(|l| l.chars().count() == width), "{text}");
    let end_of = |line: &str, cell: &str| line.find(cell).unwrap() + cell.len();
    assert_eq!(end_of(lines[0], "alpha"), end_of(lines[1], "6"), "{text}");
    assert_eq!(end_of(lines[0], "beta"), width, "{text}");
}

#[test]
fn the_table_shows_missing_values_as_na() {
    let record = evaluation(&["gamma"], 1);
    let trials = [answered("gamma", 0, failed(), 10, 0, None)];
    let text = table(&run(&record, &trials, &production(), Some("gamma"), 50));
    assert!(text.lines().next().unwrap().contains("candidate:gamma"));
    for label in
        ["findings/answer", "precision", "recall", "F1", "exact-set agreement", "cost per valid answer", "latency p50"]
    {
        assert_eq!(row(&text, label), ["n/a"], "{label}");
    }
    assert_eq!(row(&text, "valid rate"), ["0.0%"]);
}

#[test]
fn the_csv_has_every_number_per_candidate() {
    let text = csv(&fixture(None, 50));
    assert!(text.ends_with("\r\n"));
    let rows: Vec<Vec<&str>> = text.split_terminator("\r\n").map(|l| l.split(',').collect()).collect();
    assert_eq!(rows.len(), 3);
    assert_eq!(rows[0], CSV_COLUMNS);
    assert!(rows.iter().all(|r| r.len() == CSV_COLUMNS.len()));
    let field = |row: usize, column: &str| rows[row][CSV_COLUMNS.iter().position(|c| *c == column).unwrap()];

    assert_eq!(field(1, "candidate"), "alpha");
    assert_eq!(field(1, "valid"), "4");
    assert_eq!(field(1, "precision"), "0.75");
    assert_eq!(field(1, "recall"), "1");
    assert_eq!(field(1, "true_positive"), "3");
    assert_eq!(field(1, "cost_micros"), "1500");
    assert_eq!(field(1, "cost_per_valid_micros"), "375");
    assert_eq!(field(1, "latency_p95_ms"), "500");
    assert_eq!(field(2, "candidate"), "beta");
    assert_eq!(field(2, "waiting"), "1");
    assert_eq!(field(2, "valid_rate"), "0.75");
    assert_eq!(field(2, "disagreements"), "3");
    assert_eq!(field(2, "latency_p50_ms"), "2500");
}

#[test]
fn the_csv_leaves_none_empty_and_quotes_names_that_need_it() {
    let record = evaluation(&["odd, \"quoted\""], 1);
    let trials = [answered("odd, \"quoted\"", 0, failed(), 10, 0, None)];
    let text = csv(&run(&record, &trials, &production(), None, 50));
    let row = text.split_terminator("\r\n").nth(1).unwrap();
    let rest = row.strip_prefix("\"odd, \"\"quoted\"\"\",").unwrap();
    let fields: Vec<&str> = rest.split(',').collect();
    assert_eq!(fields.len(), CSV_COLUMNS.len() - 1);
    let field = |column: &str| fields[CSV_COLUMNS.iter().position(|c| *c == column).unwrap() - 1];
    for column in [
        "findings_per_answer",
        "precision",
        "recall",
        "f1",
        "exact_set_rate",
        "cost_per_valid_micros",
        "latency_p50_ms",
    ] {
        assert_eq!(field(column), "", "{column}");
    }
    assert_eq!(field("failed"), "1");
    assert_eq!(field("valid_rate"), "0");
}

#[test]
fn the_report_serializes_for_the_api() {
    let value = serde_json::to_value(fixture(None, 50)).unwrap();
    assert_eq!(value["candidates"][0]["agreement"]["precision"], 0.75);
    assert_eq!(value["candidates"][1]["disagreements"][0]["only_reference"][0], "b");
    assert_eq!(value["candidates"][1]["latency"]["p95_ms"], 3_700_000);
}
