//! `/ui/evaluations` (admin only, as `/v1/evaluations`): every evaluation with its
//! progress per candidate, and one evaluation's side-by-side report (against production's
//! committed findings or another candidate's answers) with its disagreements, and the
//! promote and cancel forms. A promotion redirects back to the evaluation's page, which
//! shows its counts and the routing rule that sends new work to the candidate.

use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::Redirect;
use maud::{Markup, html};
use serde::Deserialize;

use super::extractions::url_pairs;
use super::form::FormBody;
use super::layout::{PageResult, Problem, dollars, page, when};
use super::viewer::Viewer;
use crate::engine::evaluation::report::{CandidateReport, EvaluationReport};
use crate::engine::evaluation::report::{duration, percent};
use crate::service::{EvaluationStatus, Service, routing_rule};

type Done = Result<Redirect, Problem>;

/// As the API says it (`EvaluationView.state`).
fn state(status: &EvaluationStatus) -> &'static str {
    if !status.record.is_running() {
        "cancelled"
    } else if status.done() {
        "done"
    } else {
        "running"
    }
}

fn state_badge(status: &EvaluationStatus) -> Markup {
    let state = state(status);
    let class = match state {
        "done" => "badge ok",
        "running" => "badge warn",
        _ => "badge",
    };
    html! { span class=(class) { (state) } }
}

fn href(name: &str) -> String {
    format!("/ui/evaluations/{name}")
}

fn spend(status: &EvaluationStatus) -> Markup {
    html! {
        (dollars(status.spent_micros))
        @match status.record.budget_micros {
            Some(budget) => {
                " of " (dollars(budget))
                @if status.spent_micros >= budget { " " span.badge.warn { "budget reached" } }
            }
            None => { " (no budget)" }
        }
    }
}

pub(super) async fn list(State(service): State<Service>, viewer: Viewer) -> PageResult {
    viewer.require_admin()?;
    let evaluations = service.evaluations().await?;
    let content = html! {
        h1 { "Evaluations" }
        p.muted { "Provider bake-offs: a frozen set of extractions sent to candidate providers as trials, "
            "compared with production's committed findings. Trials never commit until one candidate is promoted." }
        @if evaluations.is_empty() {
            p.muted id="no-evaluations" { "No evaluation yet. Start one with "
                code { "commitpoint eval start" } " or " code { "POST /v1/evaluations" } "." }
        } @else {
            div.scroll { table id="evaluations" {
                thead { tr { th { "name" } th { "state" } th { "schema" } th { "tenant" } th { "members" }
                    th { "candidates: finished · waiting · not sent" } th { "spent" } th { "created" } } }
                tbody { @for e in &evaluations {
                    @let r = &e.record;
                    tr data-evaluation=(r.name) {
                        td { a href=(href(&r.name)) { (r.name) } }
                        td { (state_badge(e)) }
                        td { (r.schema) }
                        td { (r.tenant.as_deref().unwrap_or("any")) }
                        td { (r.members.len()) }
                        td { @for c in &e.candidates {
                            div data-candidate=(c.candidate) {
                                strong { (c.candidate) } " "
                                span.finished { (c.finished) } " · " span.waiting { (c.waiting) } " · " span.not-sent { (c.not_sent) }
                            }
                        } }
                        td { (spend(e)) }
                        td { (when(r.created_at_ms)) }
                    }
                } }
            } }
        }
    };
    Ok(page("Evaluations", &viewer, content))
}

#[derive(Debug, Default, Deserialize)]
pub(super) struct DetailQuery {
    /// Compare with this candidate instead of production.
    against: Option<String>,
    /// Set by the promote form's redirect: the candidate promoted and what it did.
    promoted: Option<String>,
    committed: Option<u64>,
    already_committed: Option<u64>,
    in_flight: Option<u64>,
    skipped: Option<u64>,
    no_valid_answer: Option<u64>,
}

pub(super) async fn detail(
    State(service): State<Service>,
    viewer: Viewer,
    Path(name): Path<String>,
    Query(q): Query<DetailQuery>,
) -> PageResult {
    viewer.require_admin()?;
    let status = service.evaluation_status(&name).await?;
    let against = q.against.as_deref().map(str::trim).filter(|a| !a.is_empty());
    let report = service.evaluation_report(&name, against).await?;
    let r = &status.record;
    let reference = match against {
        None => "production".to_string(),
        Some(c) => c.to_string(),
    };
    let running = state(&status) == "running";
    let content = html! {
        h1 { "Evaluation " (r.name) }
        p { (state_badge(&status)) }
        (promotion_notice(&status, &q))
        @if running {
            div.actions {
                form.inline method="post" action=(format!("{}/cancel", href(&r.name)))
                    data-confirm="Stop sending trials? Jobs already at a provider are still read (they are paid for)." {
                    (viewer.csrf_field())
                    button.danger type="submit" id="cancel" { "Cancel" }
                }
            }
        }
        section {
            h2 { "Evaluation" }
            dl.record {
                dt { "schema" } dd { (r.schema) }
                dt { "tenant" } dd { (r.tenant.as_deref().unwrap_or("any")) }
                dt { "selection" } dd { (r.selection) }
                dt { "members" } dd id="members" { (r.members.len()) }
                dt { "candidates" } dd { (r.candidates.join(", ")) }
                dt { "spent" } dd id="spent" { (spend(&status)) }
                dt { "created" } dd { (when(r.created_at_ms)) }
                @if let Some(at) = r.cancelled_at_ms { dt { "cancelled" } dd { (when(at)) } }
            }
        }
        section {
            h2 { "Side by side" }
            p.legend id="reference" {
                "Agreement compared with " strong { (reference) } " (by finding identity). Compare with: "
                @if against.is_some() { a href=(href(&r.name)) { "production" } " " }
                @for c in r.candidates.iter().filter(|c| Some(c.as_str()) != against) {
                    a href=(format!("{}?{}", href(&r.name), url_pairs(&[("against", Some(c.as_str()))]))) { (c) } " "
                }
            }
            (comparison(&viewer, &status, &report))
        }
        section id="disagreements" {
            h2 { "Disagreements" }
            @for c in &report.candidates { (disagreements(c, &reference)) }
        }
    };
    Ok(page("Evaluation", &viewer, content))
}

/// What the promote form's redirect carries, with the routing rule recomputed from the
/// evaluation (never taken from the address, so a crafted link cannot show a rule).
fn promotion_notice(status: &EvaluationStatus, q: &DetailQuery) -> Markup {
    let Some(candidate) = q.promoted.as_deref().filter(|c| status.record.has_candidate(c)) else {
        return html! {};
    };
    let r = &status.record;
    let n = |v: Option<u64>| v.unwrap_or(0);
    let rule = routing_rule(r, candidate);
    html! {
        section.notice id="promotion" {
            h2 { "Promoted " (candidate) }
            ul {
                li { strong id="promoted-committed" { (n(q.committed)) } " committed now from its trial answers (not charged again)" }
                li { strong id="promoted-already" { (n(q.already_committed)) } " already committed (by production or an earlier promotion): unchanged" }
                li { strong id="promoted-in-flight" { (n(q.in_flight)) } " in flight (claimed or in a production batch): left to their own answer" }
                li { strong id="promoted-no-valid" { (n(q.no_valid_answer)) } " without a valid answer from " (candidate) ": unchanged" }
                @if n(q.skipped) > 0 { li { strong { (n(q.skipped)) } " cancelled or erased: skipped" } }
            }
            p { "To send new work of schema " code { (r.schema) }
                @if let Some(t) = &r.tenant { " for tenant " code { (t) } }
                " to " (candidate) ", add this rule to " code { "[routing] rules" } " in the configuration and reload the server:" }
            pre.json id="routing-rule" { (rule) }
            p { "Or run " code { "commitpoint eval promote " (r.name) " " (candidate) " --apply" }
                ", which adds it to the configuration file (with " code { "--pid" } ", it reloads the server too). "
                "The old provider's known jobs are still polled to completion." }
        }
    }
}

/// One row of the side-by-side table: a key for tests and scripts, a label, a cell per
/// candidate in the evaluation's order.
struct Row {
    key: &'static str,
    label: &'static str,
    cells: Vec<String>,
}

fn or_dash<T>(value: Option<T>, show: impl Fn(T) -> String) -> String {
    value.map_or_else(|| "—".to_string(), show)
}

fn with_rate(count: u64, rate: f64) -> String {
    format!("{count} ({})", percent(rate))
}

fn rows(status: &EvaluationStatus, report: &EvaluationReport) -> Vec<Row> {
    let row = |key, label, cell: &dyn Fn(&CandidateReport) -> String| Row {
        key,
        label,
        cells: report.candidates.iter().map(cell).collect(),
    };
    let not_sent = |c: &CandidateReport| {
        status.candidates.iter().find(|p| p.candidate == c.candidate).map_or(0, |p| p.not_sent).to_string()
    };
    vec![
        row("not-sent", "not sent", &not_sent),
        row("sent", "sent", &|c| c.sent.to_string()),
        row("waiting", "waiting", &|c| c.waiting.to_string()),
        row("valid", "valid", &|c| with_rate(c.valid, c.valid_rate)),
        row("truncated", "truncated", &|c| with_rate(c.truncated, c.truncated_rate)),
        row("refused", "refused", &|c| with_rate(c.refused, c.refused_rate)),
        row("invalid", "invalid", &|c| with_rate(c.invalid, c.invalid_rate)),
        row("failed", "failed", &|c| with_rate(c.failed, c.failed_rate)),
        row("findings-per-answer", "findings/answer", &|c| or_dash(c.findings_per_answer, |f| format!("{f:.2}"))),
        row("precision", "precision", &|c| or_dash(c.agreement.precision, percent)),
        row("recall", "recall", &|c| or_dash(c.agreement.recall, percent)),
        row("f1", "F1", &|c| or_dash(c.agreement.f1, percent)),
        row("exact-set", "exact-set agreement", &|c| or_dash(c.agreement.exact_set_rate, percent)),
        row("compared", "compared", &|c| c.agreement.compared.to_string()),
        row("disagreements", "disagreements", &|c| c.disagreements_total.to_string()),
        row("tokens", "tokens in / out", &|c| format!("{} / {}", c.input_tokens, c.output_tokens)),
        row("cost", "cost", &|c| dollars(c.cost_micros)),
        row("cost-per-valid", "cost per valid answer", &|c| or_dash(c.cost_per_valid_micros, dollars)),
        row("latency-p50", "latency p50", &|c| or_dash(c.latency.p50_ms, duration)),
        row("latency-p95", "latency p95", &|c| or_dash(c.latency.p95_ms, duration)),
    ]
}

fn comparison(viewer: &Viewer, status: &EvaluationStatus, report: &EvaluationReport) -> Markup {
    let name = &status.record.name;
    html! {
        div.scroll { table id="report" {
            thead { tr { th { "" } @for c in &report.candidates { th data-candidate=(c.candidate) { (c.candidate) } } } }
            tbody {
                @for row in rows(status, report) {
                    tr data-row=(row.key) {
                        th { (row.label) }
                        @for (c, cell) in report.candidates.iter().zip(&row.cells) {
                            td data-row=(row.key) data-candidate=(c.candidate) { (cell) }
                        }
                    }
                }
                tr {
                    th { "" }
                    @for c in &report.candidates { td {
                        form.inline method="post" action=(format!("{}/promote", href(name)))
                            data-confirm=(format!("Commit {}'s valid answers for the members not committed yet?", c.candidate)) {
                            (viewer.csrf_field())
                            input type="hidden" name="candidate" value=(c.candidate);
                            button type="submit" data-candidate=(c.candidate) { "Promote" }
                        }
                    } }
                }
            }
        } }
        p.muted { "Promote commits a candidate's valid answers for the members not committed yet, once, "
            "without charging again; committed members keep theirs. Rates are shares of finished trials." }
    }
}

fn disagreements(c: &CandidateReport, reference: &str) -> Markup {
    let shown = c.disagreements.len() as u64;
    html! {
        div data-candidate=(c.candidate) {
            h3 { (c.candidate) ": " (c.disagreements_total) " of " (c.agreement.compared) " compared answers differ"
                @if shown < c.disagreements_total { " (the first " (shown) " listed)" } }
            @if c.agreement.compared == 0 {
                p.muted { "Nothing compared yet: no member has both a valid answer and a reference." }
            } @else if c.disagreements.is_empty() {
                p.muted { "None: every compared answer found what " (reference) " found." }
            } @else {
                div.scroll { table {
                    thead { tr { th { "source" } th { "extraction" } th { "only " (c.candidate) } th { "only " (reference) } } }
                    tbody { @for d in &c.disagreements { tr {
                        td.wrap { (d.source_id) }
                        td.mono { a href=(format!("/ui/extractions/{}", d.extraction_id)) { (d.extraction_id.get(..12).unwrap_or(&d.extraction_id)) } }
                        td { ul { @for i in &d.only_candidate { li.mono.wrap { (i) } } } }
                        td { ul { @for i in &d.only_reference { li.mono.wrap { (i) } } } }
                    } } }
                } }
            }
        }
    }
}

#[derive(Debug, Deserialize)]
pub(super) struct PromoteForm {
    csrf: Option<String>,
    candidate: Option<String>,
}

pub(super) async fn promote(
    State(service): State<Service>,
    viewer: Viewer,
    Path(name): Path<String>,
    FormBody(form): FormBody<PromoteForm>,
) -> Done {
    viewer.check_csrf(form.csrf.as_deref())?;
    viewer.require_admin()?;
    let candidate = form
        .candidate
        .filter(|c| !c.trim().is_empty())
        .ok_or_else(|| Problem::new(StatusCode::BAD_REQUEST, "the form names no candidate"))?;
    let outcome = service.promote(&name, &candidate).await?;
    let p = outcome.promotion;
    let counts = [
        ("committed", p.committed),
        ("already_committed", p.already_committed),
        ("in_flight", p.in_flight),
        ("skipped", p.skipped),
        ("no_valid_answer", p.no_valid_answer),
    ]
    .map(|(k, v)| (k, v.to_string()));
    let mut pairs = vec![("promoted", Some(candidate.as_str()))];
    pairs.extend(counts.iter().map(|(k, v)| (*k, Some(v.as_str()))));
    // The service found the evaluation by this name: it is one of the checked names'
    // characters (letters, digits, `-`, `_`, `.`), safe in a path as it is.
    Ok(Redirect::to(&format!("{}?{}", href(&name), url_pairs(&pairs))))
}

#[derive(Debug, Deserialize)]
pub(super) struct CancelForm {
    csrf: Option<String>,
}

pub(super) async fn cancel(
    State(service): State<Service>,
    viewer: Viewer,
    Path(name): Path<String>,
    FormBody(form): FormBody<CancelForm>,
) -> Done {
    viewer.check_csrf(form.csrf.as_deref())?;
    viewer.require_admin()?;
    let status = service.cancel_evaluation(&name).await?;
    Ok(Redirect::to(&href(&status.record.name)))
}
