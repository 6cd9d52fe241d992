//! The operator lists: a tenant's costs (with a per-day chart) and the outbox's dead
//! letters.

use axum::extract::{Query, State};
use maud::{Markup, html};
use serde::Deserialize;

use super::layout::{PageResult, dollars, page, when};
use super::svg::{Bar, Unit, bars};
use super::viewer::Viewer;
use crate::engine::ledger::{Bucket, CostQuery, GroupBy, Split};
use crate::service::Service;
use crate::store::OutboxFilter;

const DAYS: u64 = 30;
const DEAD_PAGE: usize = 200;

#[derive(Debug, Default, Deserialize)]
pub(super) struct CostsQuery {
    tenant: Option<String>,
}

pub(super) async fn costs(State(service): State<Service>, viewer: Viewer, Query(q): Query<CostsQuery>) -> PageResult {
    let asked = q.tenant.as_deref().map(str::trim).filter(|t| !t.is_empty());
    let tenant = match (viewer.tenant_scope(), asked) {
        (Some(own), Some(asked)) => {
            viewer.caller().may_reach(asked)?;
            Some(own.to_string())
        }
        (Some(own), None) => Some(own.to_string()),
        (None, asked) => asked.map(str::to_string),
    };
    let now = crate::domain::clock::now_ms();
    let day_ms = crate::store::store_day_ms();
    let from_ms = (now / day_ms + 1 - DAYS) * day_ms;
    let report = match &tenant {
        Some(t) => Some(
            service
                .costs(CostQuery { tenant: t.clone(), from_ms, to_ms: now + 1, group_by: Some(GroupBy::Day) })
                .await?,
        ),
        None => None,
    };
    let budgets = if viewer.is_admin() { service.budget_status().await? } else { Vec::new() };
    let content = html! {
        h1 { "Costs" }
        @if viewer.tenant_scope().is_none() {
            form.filters method="get" action="/ui/costs" {
                label { "tenant " input name="tenant" value=(tenant.as_deref().unwrap_or("")) size="16" required; }
                button type="submit" { "Show" }
            }
            @if !budgets.is_empty() {
                p { "Budgeted tenants: " @for line in &budgets { a href=(format!("/ui/costs?tenant={}", line.tenant)) { (line.tenant) } " " } }
            }
        }
        @if let Some(report) = &report {
            h2 { (report.tenant) ", last " (DAYS) " days" }
            p { "Charged " strong id="charged" { (dollars(report.charged_micros)) }
                @if report.erased_micros > 0 { " (plus " (dollars(report.erased_micros)) " of erased entries)" } }
            @let unpriced = report.totals.unpriced_attempts();
            @if unpriced > 0 {
                p.warning id="unpriced" { strong { (unpriced) " unpriced attempts" }
                    " were booked at $0: their models have no price row, so the charge above is short of the bill. "
                    "Add [[prices]] rows (" code { "commitpoint config check" } " lists the gaps)." }
            }
            (split_table(&report.totals))
            h2 { "Per day" }
            p.legend { span.key.fresh {} "fresh " span.key.failed {} "failed validation " span.key.unusable {} "unusable " span.key.evaluation {} "evaluation trials" }
            @let days: Vec<Bar> = (0..DAYS).map(|i| {
                let day = from_ms / day_ms + i;
                let key = crate::domain::clock::format_ms(day * day_ms)[..10].to_string();
                let split = report.groups.as_ref().and_then(|g| g.get(&key));
                let cost = |pick: fn(&Split) -> &Bucket| split.map_or(0, |s| pick(s).cost_micros);
                Bar { tick: key[5..].to_string(), label: key.clone(), sampled: true,
                    values: vec![cost(|s| &s.fresh), cost(|s| &s.failed_validation), cost(|s| &s.unusable), cost(|s| &s.evaluation)] }
            }).collect();
            (bars("Cost per day in dollars", &days, &["fresh", "failed", "unusable", "evaluation"], Unit::Micros))
            p.muted { "Bars: dollars charged per UTC day, stacked by bucket; replays cost nothing and are not drawn." }
        } @else {
            p.muted { "Pick a tenant to see its costs." }
        }
    };
    Ok(page("Costs", &viewer, content))
}

fn split_table(split: &Split) -> Markup {
    let row = |name: &str, b: &Bucket| {
        html! { tr { td { (name) } td { (b.attempts) } td { (b.input_tokens) } td { (b.output_tokens) } td { (dollars(b.cost_micros)) } td { (b.unpriced_attempts) } } }
    };
    html! {
        div.scroll { table id="cost-totals" {
            thead { tr { th { "" } th { "attempts" } th { "input tokens" } th { "output tokens" } th { "cost" } th { "unpriced" } } }
            tbody {
                (row("fresh", &split.fresh))
                (row("replay", &split.replay))
                (row("failed validation", &split.failed_validation))
                (row("unusable", &split.unusable))
                (row("evaluation trials", &split.evaluation))
            }
        } }
    }
}

pub(super) async fn dead_letters(State(service): State<Service>, viewer: Viewer) -> PageResult {
    viewer.require_admin()?;
    let dead = service.outbox(OutboxFilter::Dead, 0, DEAD_PAGE).await?;
    let mut payloads = Vec::with_capacity(dead.len());
    for event in &dead {
        // An event whose extraction was erased since has no body left to show.
        let body = service.outbox_payload(event).await.ok();
        payloads.push(body.map(|b| {
            serde_json::from_slice::<serde_json::Value>(&b).map_or_else(
                |_| String::from_utf8_lossy(&b).into_owned(),
                |v| serde_json::to_string_pretty(&v).unwrap_or_default(),
            )
        }));
    }
    let mut sinks: Vec<&str> = dead.iter().map(|e| e.sink.as_str()).collect();
    sinks.sort_unstable();
    sinks.dedup();
    let content = html! {
        h1 { "Dead letters" }
        @if dead.is_empty() { p.muted { "No dead outbox event." } }
        @if !sinks.is_empty() {
            p { "A sink a receiver disabled with 410 Gone takes deliveries again once re-enabled: "
                @for sink in &sinks {
                    form.inline method="post" action=(format!("/ui/sinks/{sink}/enable")) {
                        (viewer.csrf_field())
                        button type="submit" { "Re-enable " (sink) }
                    }
                }
            }
        }
        div.scroll { table id="dead-letters" {
            thead { tr { th { "event" } th { "sink" } th { "extraction" } th { "tenant" } th { "deliveries" } th { "created" } th { "last error" } th { "" } } }
            tbody { @for (e, payload) in dead.iter().zip(&payloads) { tr {
                td { (e.seq) }
                td { (e.sink) }
                td.mono { a href=(format!("/ui/extractions/{}", e.extraction_id.to_hex())) { (e.extraction_id.to_hex()[..12]) } }
                td { (e.tenant) }
                td { (e.deliveries) }
                td { (when(e.created_at_ms)) }
                td.error {
                    (e.last_error.as_deref().unwrap_or(""))
                    details.payload {
                        summary { "payload" }
                        pre.json { (payload.as_deref().unwrap_or("(no body: the extraction is gone)")) }
                    }
                }
                td { form.inline method="post" action=(format!("/ui/dead-letters/{}/redeliver", e.seq)) {
                    (viewer.csrf_field())
                    button type="submit" { "Redeliver" }
                } }
            } } }
        } }
    };
    // Not refreshed by itself: each row's payload is built from the store, and dead
    // letters change only when an operator acts.
    Ok(page("Dead letters", &viewer, content))
}
