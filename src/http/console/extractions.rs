//! `/ui/extractions`: the listing (the API's cursors, filtered by tenant and state in
//! the store, by schema and failure class within each page), and one extraction's page:
//! record, timeline, findings, raw result, ledger attempts and outbox events.

use axum::extract::{Path, Query, State};
use maud::{Markup, html};
use serde::Deserialize;

use super::layout::{PageResult, Problem, ago, charge_words, clip, dollars, live_page, page, when};
use super::viewer::Viewer;
use crate::domain::identity::ExtractionId;
use crate::domain::lifecycle::{FailureClass, State as Lifecycle, StateName};
use crate::service::Service;
use crate::store::{ExtractionRecord, OutboxKind};

const PAGE: usize = 50;

#[derive(Debug, Default, Deserialize)]
pub(super) struct Filter {
    tenant: Option<String>,
    state: Option<String>,
    schema: Option<String>,
    failure_class: Option<String>,
    after: Option<String>,
}

fn given(value: &Option<String>) -> Option<&str> {
    value.as_deref().map(str::trim).filter(|v| !v.is_empty())
}

pub(super) async fn list(State(service): State<Service>, viewer: Viewer, Query(f): Query<Filter>) -> PageResult {
    let tenant = match viewer.tenant_scope() {
        Some(own) => {
            if let Some(asked) = given(&f.tenant) {
                viewer.caller().may_reach(asked)?;
            }
            Some(own.to_string())
        }
        None => given(&f.tenant).map(str::to_string),
    };
    let state = match given(&f.state) {
        None => None,
        Some(s) => Some(
            StateName::parse(s).ok_or_else(|| Problem::new(axum::http::StatusCode::BAD_REQUEST, "unknown state"))?,
        ),
    };
    let (records, next) = service.list_page(tenant.clone(), state, false, true, PAGE, given(&f.after)).await?;
    let schema = given(&f.schema);
    let class = given(&f.failure_class);
    let shown: Vec<&ExtractionRecord> = records
        .iter()
        .filter(|r| schema.is_none_or(|s| r.schema == s))
        .filter(|r| class.is_none_or(|c| failure_class(r).is_some_and(|fc| fc.as_str() == c)))
        .collect();
    let query = |after: &str| {
        let mut q = url_pairs(&[
            ("tenant", tenant.as_deref().filter(|_| viewer.tenant_scope().is_none())),
            ("state", given(&f.state)),
            ("schema", schema),
            ("failure_class", class),
        ]);
        q.push_str(&format!("&after={after}"));
        format!("/ui/extractions?{q}")
    };
    let schemas: Vec<String> = service.registry().names().map(str::to_string).collect();
    let mut tenants: Vec<String> = match viewer.tenant_scope() {
        Some(_) => Vec::new(),
        None => service.depth_by_tenant().await?.into_iter().map(|d| d.tenant).collect(),
    };
    tenants.dedup();
    let content = html! {
        h1 { "Extractions" }
        p.muted { "Newest intake first." }
        form.filters method="get" action="/ui/extractions" {
            @if viewer.tenant_scope().is_none() {
                label { "tenant " select name="tenant" {
                    option value="" { "any" }
                    @for t in &tenants { option value=(t) selected[tenant.as_deref() == Some(t.as_str())] { (t) } }
                } }
            }
            label { "state " select name="state" {
                option value="" { "any" }
                @for s in StateName::ALL { option value=(s.as_str()) selected[state == Some(s)] { (s.as_str()) } }
            } }
            label { "schema " select name="schema" {
                option value="" { "any" }
                @for s in &schemas { option value=(s) selected[schema == Some(s.as_str())] { (s) } }
            } }
            label { "failure class " select name="failure_class" {
                option value="" { "any" }
                @for c in FailureClass::ALL { option value=(c.as_str()) selected[class == Some(c.as_str())] { (c.as_str()) } }
            } }
            button type="submit" { "Filter" }
        }
        @if viewer.is_admin() && state == Some(StateName::Failed) {
            form.inline method="post" action="/ui/retry"
                data-confirm="Retry every failed extraction matching this filter (not only this page)?" {
                (viewer.csrf_field())
                @if let Some(t) = &tenant { input type="hidden" name="tenant" value=(t); }
                @if let Some(s) = schema { input type="hidden" name="schema" value=(s); }
                @if let Some(c) = class { input type="hidden" name="failure_class" value=(c); }
                button.danger type="submit" id="retry-matching" { "Retry all matching failures" }
            }
        }
        div.scroll { table id="extractions" {
            thead { tr {
                th { "id" } th { "tenant" } th { "source" } th { "schema" } th { "state" } th { "failure" } th { "attempts" }
                th { "updated" }
            } }
            tbody {
                @for r in &shown {
                    tr {
                        td.mono { a href=(format!("/ui/extractions/{}", r.id.to_hex())) { (short(&r.id)) } }
                        td { (r.tenant) }
                        td.wrap { (r.source_id) }
                        td { (r.schema) }
                        td { (state_badge(&r.state)) }
                        td.wrap.failure {
                            @if let Lifecycle::Failed { class, reason } = &r.state {
                                strong { (class.as_str()) } " " (clip(reason, 140))
                            }
                        }
                        td { (r.attempt) }
                        td { (ago(r.updated_at_ms)) }
                    }
                }
            }
        } }
        @if shown.is_empty() { p.muted { "Nothing on this page matches." } }
        @if let Some(next) = &next { p { a.button href=(query(next)) rel="next" { "Older →" } } }
    };
    Ok(live_page("Extractions", &viewer, content))
}

pub(super) async fn detail(State(service): State<Service>, viewer: Viewer, Path(raw): Path<String>) -> PageResult {
    let id: ExtractionId =
        raw.parse().map_err(|e| Problem::new(axum::http::StatusCode::BAD_REQUEST, format!("{raw:?}: {e}")))?;
    let record = service.get(id).await?;
    // Another tenant's extraction answers as a missing one, as in the API.
    if viewer.caller().may_reach(&record.tenant).is_err() {
        return Err(crate::service::Error::NotFound(id).into());
    }
    let (findings, more_findings) = service.findings_page(id, crate::service::MAX_FINDINGS_PAGE, None).await?;
    let raw_result = service.raw_result(id).await?;
    let (_, ledger) = service.extraction_costs(id).await?;
    let events = if viewer.is_admin() { service.outbox_of(id).await? } else { Vec::new() };
    let (revisions, diff) = revisions(&service, &record).await?;
    let mut timeline: Vec<(u64, String)> = vec![(record.created_at_ms, "taken in (attempt 1)".to_string())];
    for e in &ledger {
        timeline.push((
            e.at_ms,
            format!(
                "attempt {} answered by {} ({}, {})",
                e.attempt,
                e.provider,
                charge_words(e.kind),
                dollars(e.cost_micros)
            ),
        ));
    }
    for e in &events {
        timeline.push((e.created_at_ms, format!("outbox event for sink {} ({})", e.sink, kind(&e.kind))));
    }
    for past in &record.past_failures {
        timeline.push((
            past.failed_at_ms,
            format!("attempt {} failed {}: {}", past.attempt, past.class.as_str(), clip(&past.reason, 300)),
        ));
    }
    timeline.push((record.updated_at_ms, format!("now {}", record.state.name().as_str())));
    timeline.sort_by_key(|(at, _)| *at);
    let content = html! {
        h1 { "Extraction " span.mono { (short(&id)) } }
        p { (state_badge(&record.state)) }
        (actions(&viewer, &record))
        section {
            h2 { "Record" }
            dl.record {
                dt { "id" } dd.mono.wrap { (id.to_hex()) }
                dt { "tenant" } dd { (record.tenant) }
                dt { "source" } dd.wrap { (record.source_id) }
                dt { "schema" } dd { (record.schema) }
                dt { "state" } dd id="state" { (record.state.name().as_str()) }
                @if let Lifecycle::Failed { class, reason } = &record.state {
                    dt { "failure" } dd id="failure" { (class.as_str()) ": " (reason) }
                }
                @if let Lifecycle::Claimed { worker, expires_at_ms, .. } = &record.state {
                    dt { "claimed by" } dd { (worker) " until " (when(*expires_at_ms)) }
                }
                dt { "attempts" } dd {
                    (record.attempt) " (re-asks " (record.reasks) ", requeues " (record.requeues) ", claims " (record.claims) ")"
                }
                dt { "content" } dd { (record.content_bytes) " bytes" }
                dt { "created" } dd { (when(record.created_at_ms)) }
                dt { "updated" } dd { (when(record.updated_at_ms)) }
                @if let Some(m) = &record.metadata_json { dt { "metadata" } dd.mono.wrap { (m) } }
            }
        }
        section {
            h2 { "Timeline" }
            p.muted { "From the record, its ledger attempts and its outbox events." }
            ol.timeline { @for (at, what) in &timeline { li { time { (when(*at)) } " " (what) } } }
        }
        section {
            h2 { "Findings (" (findings.len()) @if more_findings.is_some() { "+" } ")" }
            @for f in &findings { pre.json { (pretty(&f.body_json)) } }
        }
        @if let Some(previous) = &record.previous_attempt {
            section {
                @if matches!(record.state, Lifecycle::Failed { .. }) {
                    h2 { "Rejected answer (no re-ask left)" }
                    p.muted { "The issues that failed it, and the answer they are about; a retry asks again with them." }
                } @else {
                    h2 { "Refused answer, asked again" }
                    p.muted { "The issues the re-ask shows the model, and the answer they are about." }
                }
                ul id="reask-issues" {
                    @for issue in &previous.issues {
                        li { code { (if issue.path.is_empty() { "/" } else { issue.path.as_str() }) } " " (issue.message) }
                    }
                }
                pre.json { (pretty(&previous.output)) }
            }
        }
        (revisions)
        (diff)
        section {
            h2 { "Raw result" }
            @match &raw_result {
                Some(r) => {
                    p.muted { "from " (r.producer) " at " (when(r.received_at_ms)) }
                    pre.json { (pretty(&r.output_json)) }
                }
                None => p.muted { "None stored (not committed, or dropped by retention)." },
            }
        }
        section {
            h2 { "Ledger attempts" }
            div.scroll { table {
                thead { tr { th { "at" } th { "attempt" } th { "kind" } th { "provider" } th { "model" } th { "tokens in/out" } th { "cost" } } }
                tbody { @for e in &ledger { tr {
                    td { (when(e.at_ms)) } td { (e.attempt) } td { (charge_words(e.kind)) } td { (e.provider) }
                    td { (e.usage.model) } td { (e.usage.input_tokens) " / " (e.usage.output_tokens) } td { (dollars(e.cost_micros)) }
                } } }
            } }
        }
        @if viewer.is_admin() {
            section {
                h2 { "Outbox events (waiting or dead)" }
                @if events.is_empty() { p.muted { "None." } }
                ul { @for e in &events { li {
                    (e.sink) ": " (kind(&e.kind)) ", " (e.deliveries) " deliveries"
                    @if let Some(err) = &e.last_error { " — " span.error { (err) } }
                } } }
            }
        }
    };
    Ok(page("Extraction", &viewer, content))
}

/// The source's revisions (this one marked), and this one's findings diff against the
/// previous committed revision when there is one to compare with.
async fn revisions(service: &Service, record: &ExtractionRecord) -> Result<(Markup, Markup), crate::service::Error> {
    let source = service.source(&record.tenant, &record.source_id, &record.schema).await?;
    let list = html! {
        section id="revisions" {
            h2 { "Revisions of this source (" (source.revisions.len()) ")" }
            p.muted { "Same tenant, source id and schema name; the newest intake is current." }
            ol { @for r in &source.revisions { li {
                a.mono href=(format!("/ui/extractions/{}", r.id.to_hex())) { (short(&r.id)) }
                " " (r.schema) " " (state_badge(&r.state))
                @if r.id == record.id { " (this one)" }
                @if r.id == source.current.id { " current" }
                @if let Some(by) = &r.superseded_by { " superseded by " span.mono { (short(by)) } }
            } } }
        }
    };
    if !matches!(record.state, Lifecycle::Committed { .. }) {
        return Ok((list, html! {}));
    }
    let diff = match service.revision_diff(record.id, crate::service::Against::Previous).await {
        Ok(d) => {
            let c = d.diff.counts();
            html! { section id="diff" {
                h2 { "Findings against the previous revision " span.mono { (short(&d.from.id)) } }
                p { (c.introduced) " introduced, " (c.resolved) " resolved, " (c.unchanged) " unchanged" }
                @for (label, list) in [("introduced", &d.diff.introduced), ("resolved", &d.diff.resolved)] {
                    @if !list.is_empty() {
                        h3 { (label) }
                        ul { @for identity in list { li.mono.wrap { (identity) } } }
                    }
                }
            } }
        }
        Err(crate::service::Error::NotComparable(why)) => html! { section id="diff" {
            // `why` names extractions by their whole id: let it break anywhere.
            h2 { "Findings against the previous revision" } p.muted.wrap { (why) }
        } },
        Err(e) => return Err(e),
    };
    Ok((list, diff))
}

fn actions(viewer: &Viewer, record: &ExtractionRecord) -> Markup {
    let id = record.id.to_hex();
    let failed = matches!(record.state, Lifecycle::Failed { .. });
    let finished = matches!(record.state, Lifecycle::Committed { .. } | Lifecycle::Cancelled { .. });
    html! {
        div.actions {
            @if failed && viewer.is_admin() {
                form.inline method="post" action=(format!("/ui/extractions/{id}/retry")) {
                    (viewer.csrf_field())
                    button type="submit" id="retry" { "Retry" }
                }
            }
            @if !finished {
                form.inline method="post" action=(format!("/ui/extractions/{id}/cancel"))
                    data-confirm="Cancel this extraction for good?" {
                    (viewer.csrf_field())
                    button.danger type="submit" id="cancel" { "Cancel" }
                }
            }
        }
    }
}

fn failure_class(r: &ExtractionRecord) -> Option<FailureClass> {
    match &r.state {
        Lifecycle::Failed { class, .. } => Some(*class),
        _ => None,
    }
}

fn state_badge(state: &Lifecycle) -> Markup {
    let name = state.name().as_str();
    html! { span class=(format!("badge state-{name}")) { (name) } }
}

fn kind(k: &OutboxKind) -> String {
    match k {
        OutboxKind::Committed => "committed".to_string(),
        OutboxKind::Failed { class, .. } => format!("failed {}", class.as_str()),
        OutboxKind::Cancelled => "cancelled".to_string(),
        OutboxKind::Revision { supersedes, .. } => format!("committed, supersedes {}", short(supersedes)),
        OutboxKind::Superseded { by } => format!("superseded by {}", short(by)),
    }
}

fn short(id: &ExtractionId) -> String {
    id.to_hex()[..12].to_string()
}

fn pretty(json: &str) -> String {
    serde_json::from_str::<serde_json::Value>(json)
        .ok()
        .and_then(|v| serde_json::to_string_pretty(&v).ok())
        .unwrap_or_else(|| json.to_string())
}

/// `key=value` pairs (given ones only), form-encoded.
pub(super) fn url_pairs(pairs: &[(&str, Option<&str>)]) -> String {
    pairs.iter().filter_map(|(k, v)| v.map(|v| format!("{k}={}", encode(v)))).collect::<Vec<_>>().join("&")
}

fn encode(value: &str) -> String {
    value
        .bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}
