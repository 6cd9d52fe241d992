//! `/ui`: counts by state, the last hour's throughput, the oldest waiting work, the
//! providers (with pause and resume), batches in flight, the outbox, findings refused as
//! ungrounded per schema, and budgets. The numbers come from the calls `GET /v1/stats` and
//! `GET /v1/admin/providers` make (the ungrounded counts from the metrics' own counters).

use axum::extract::State;
use axum::response::{IntoResponse, Redirect, Response};
use maud::html;

use super::layout::{Problem, age, dollars, live_page, when};
use super::svg::{Bar, Unit, bars};
use super::viewer::Viewer;
use crate::domain::lifecycle::StateName;
use crate::http::access::Caller;
use crate::service::Service;

/// The (tenant, schema) rows the overview shows: those with the most unfinished work.
const TENANT_ROWS: usize = 50;

pub(super) async fn show(State(service): State<Service>, viewer: Viewer) -> Result<Response, Problem> {
    if !viewer.is_admin() {
        // The overview is the whole store; a tenant's home is its extractions.
        return Ok(Redirect::to("/ui/extractions").into_response());
    }
    let now = crate::domain::clock::now_ms();
    let counts = service.counts_by_state().await?;
    let total: u64 = counts.iter().map(|c| c.count).sum();
    let providers = service.providers().await?;
    let batches = service.open_batches().await?;
    let (outbox_pending, outbox_dead, oldest_pending) = service.outbox_counts().await?;
    let budgets = service.budget_status().await?;
    let mut tenants = service.depth_by_tenant().await?;
    // Stable: equal pairs keep the store's (tenant, schema) order.
    tenants.sort_by_key(|d| std::cmp::Reverse(d.unfinished()));
    let more_tenants = tenants.len().saturating_sub(TENANT_ROWS);
    tenants.truncate(TENANT_ROWS);
    let ungrounded = service.ungrounded_findings();
    let store = service.store_status().await?;
    let driver_of = |name: &str| store.drivers.iter().find(|d| d.provider == name).and_then(|d| d.instance.clone());
    let hour = service.throughput();
    let chart: Vec<Bar> = hour
        .iter()
        .map(|m| {
            let at = when(m.minute * 60_000);
            Bar { tick: at[11..16].to_string(), label: at, values: vec![m.committed, m.failed], sampled: m.sampled }
        })
        .collect();
    let done_last_hour: u64 = hour.iter().map(|m| m.committed).sum();
    let failed_last_hour: u64 = hour.iter().map(|m| m.failed).sum();
    let content = html! {
        h1 { "Overview" }
        p.legend id="store" { "Store: " strong { (store.backend) } " · this instance: " code { (store.instance) } }
        section.cards {
            @for c in &counts {
                a.card href=(format!("/ui/extractions?state={}", c.state.as_str())) {
                    span.label { (c.state.as_str()) }
                    span.value id=(format!("count-{}", c.state.as_str())) { (c.count) }
                }
            }
            div.card { span.label { "total" } span.value id="count-total" { (total) } }
        }
        section {
            h2 { "Throughput, last hour" }
            p.legend {
                "Totals for the hour: "
                span.key.committed {} "committed " strong id="hour-committed" { (done_last_hour) } " · "
                span.key.failed {} "failed " strong id="hour-failed" { (failed_last_hour) }
            }
            (bars("Extractions committed and failed per minute", &chart, &["committed", "failed"], Unit::Count))
            p.muted {
                "Bars: extractions per minute (UTC), stacked. Counted by this server since it started; "
                "shaded minutes were not sampled."
            }
        }
        section {
            h2 { "Oldest waiting work" }
            table {
                thead { tr { th { "state" } th { "oldest for" } th { "since" } } }
                tbody {
                    @for c in counts.iter().filter(|c| !c.state.is_terminal()) {
                        tr {
                            td { (c.state.as_str()) }
                            @if let Some(since) = c.oldest_since_ms {
                                td { (age(now.saturating_sub(since) / 1000)) } td { (when(since)) }
                            } @else { td { "—" } td { "—" } }
                        }
                    }
                }
            }
        }
        section {
            h2 { "Tenants" }
            @if tenants.is_empty() { p.muted { "No extractions yet." } }
            @else {
                div.scroll { table id="tenants" {
                    thead { tr { th { "tenant" } th { "schema" } @for s in StateName::ALL { th { (s.as_str()) } } th { "oldest pending" } } }
                    tbody {
                        @for d in &tenants {
                            tr data-tenant=(d.tenant) {
                                td { a href=(format!("/ui/extractions?tenant={}", d.tenant)) { (d.tenant) } }
                                td { (d.schema) }
                                @for s in StateName::ALL { td { (d.count(s)) } }
                                @if let Some(since) = d.oldest_pending_since_ms {
                                    td { (age(now.saturating_sub(since) / 1000)) }
                                } @else { td { "—" } }
                            }
                        }
                    }
                } }
                @if more_tenants > 0 {
                    p.muted { "The " (TENANT_ROWS) " busiest (tenant, schema) pairs; " (more_tenants) " more in " code { "GET /v1/stats" } "." }
                }
            }
        }
        section {
            h2 { "Providers" }
            @if providers.is_empty() { p { "No provider is configured: external workers claim the work." } }
            div.scroll { table id="providers" {
                thead { tr { th { "name" } th { "state" } th { "driven by" } th { "open batches" } th { "submitted" } th { "last error" } th { "" } } }
                tbody {
                    @for p in &providers {
                        @let h = &p.health;
                        tr data-provider=(h.name) {
                            td { (h.name) }
                            td.provider-state {
                                @if h.operator_paused { span.badge.warn { "paused" } }
                                @else if let Some(until) = h.paused_until_ms.filter(|u| *u > now) {
                                    span.badge.warn { "backing off until " (when(until)) }
                                } @else { span.badge.ok { "running" } }
                                @if let Some(reason) = &h.pause_reason { " " small { (reason) } }
                                @if let Some(waiting) = &h.waiting_for_minimum {
                                    " " span.badge.warn { "under its minimum" } " " small.waiting-minimum { (waiting) }
                                }
                            }
                            td.driver {
                                @match driver_of(&h.name) {
                                    Some(instance) if instance == store.instance => { "this instance" }
                                    Some(instance) => { code { (instance) } }
                                    None => { span.badge.warn { "no instance" } }
                                }
                            }
                            td { (p.open_batches) }
                            td { (h.batches_submitted) }
                            td.error { (h.last_error.as_deref().unwrap_or("")) }
                            td {
                                @if h.operator_paused {
                                    form.inline method="post" action=(format!("/ui/providers/{}/resume", h.name)) {
                                        (viewer.csrf_field())
                                        button type="submit" { "Resume" }
                                    }
                                } @else if matches!(viewer.caller(), Caller::Open) {
                                    small { "Pausing needs a token; use " code { "commitpoint ctl pause-provider" } }
                                } @else {
                                    form.inline method="post" action=(format!("/ui/providers/{}/pause", h.name))
                                        data-confirm=(format!("Pause provider {}? Its known jobs are still polled.", h.name)) {
                                        (viewer.csrf_field())
                                        button.danger type="submit" { "Pause" }
                                    }
                                }
                            }
                        }
                    }
                }
            } }
        }
        section.split {
            div {
                h2 { "Batches in flight" }
                p { a href="/ui/batches" { strong id="batches-open" { (batches.len()) } " open" } }
            }
            div {
                h2 { "Outbox" }
                p { strong { (outbox_pending) } " waiting · " a href="/ui/dead-letters" { strong id="outbox-dead" { (outbox_dead) } " dead" } }
                @if let Some(oldest) = oldest_pending { p { "oldest waiting since " (when(oldest)) } }
            }
            div {
                h2 { "Ungrounded findings" }
                @if ungrounded.is_empty() { p { "No schema declares grounding rules." } }
                ul id="ungrounded" {
                    @for (schema, findings) in &ungrounded {
                        li data-schema=(schema) { code { (schema) } ": " strong { (findings) } " refused since start" }
                    }
                }
            }
            div {
                h2 { "Budgets" }
                @if budgets.is_empty() { p { "No tenant has a budget." } }
                ul {
                    @for line in &budgets {
                        li data-tenant=(line.tenant) {
                            a href=(format!("/ui/costs?tenant={}", line.tenant)) { (line.tenant) } ": "
                            (dollars(line.spent_micros)) " spent"
                            @if line.reserved_micros > 0 {
                                ", " (dollars(line.reserved_micros)) " reserved for " (line.reserved_members) " in flight"
                            }
                            " of " (dollars(line.limit_micros))
                            @if line.held { " " span.badge.warn { "held" } }
                            @if let Some(wait) = &line.waiting {
                                " " span.badge.warn { "waiting" } " next source needs ~" (dollars(wait.needed_micros))
                                ", " (dollars(wait.left_micros)) " left"
                            }
                        }
                    }
                }
            }
        }
        p.muted { "Last backup: " (service.last_backup_ms().map(when).unwrap_or_else(|| "none since start".to_string())) }
    };
    Ok(live_page("Overview", &viewer, content).into_response())
}
