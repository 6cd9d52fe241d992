//! `/ui/batches`: the batches the schedulers drive now (refreshed quietly), the history of
//! every batch newest first, and one batch's page with its members as they are now.

use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use maud::{Markup, html};
use serde::Deserialize;

use super::layout::{PageResult, Problem, age, ago, clip, live_page, page, when};
use super::viewer::Viewer;
use crate::domain::lifecycle::State as Lifecycle;
use crate::service::Service;
use crate::store::{BatchRecord, BatchState};

/// Batches per page of the history.
const HISTORY_PAGE: usize = 50;
/// Members listed on a batch's page (a Bedrock job may hold 50,000).
const MEMBERS_SHOWN: usize = 500;

#[derive(Debug, Default, Deserialize)]
pub(super) struct HistoryQuery {
    /// Sequence numbers below this one (the last row of the page before).
    before: Option<u64>,
}

pub(super) async fn list(State(service): State<Service>, viewer: Viewer, Query(q): Query<HistoryQuery>) -> PageResult {
    viewer.require_admin()?;
    let now = crate::domain::clock::now_ms();
    let open = service.open_batches().await?;
    let history = service.batch_history(q.before.unwrap_or(0), HISTORY_PAGE).await?;
    let older = history.last().filter(|_| history.len() == HISTORY_PAGE).map(|b| b.seq);
    let content = html! {
        h1 { "Batches" }
        section {
            h2 { "In flight" }
            @if open.is_empty() { p.muted { "No open batch." } }
            div.scroll { table id="batches" {
                thead { tr { th { "batch" } th { "provider" } th { "job id" } th { "state" } th { "schema" } th { "members" } th { "age" } th { "next poll" } th { "last error" } } }
                tbody { @for b in &open { tr {
                    (identity_cells(b))
                    td { (age(now.saturating_sub(b.created_at_ms) / 1000)) }
                    td { @if b.next_action_at_ms > now { "in " (age((b.next_action_at_ms - now) / 1000)) } @else { "due" } }
                    td.error { (b.last_error.as_deref().unwrap_or("")) }
                } } }
            } }
        }
        section {
            h2 { "History, newest first" }
            @if history.is_empty() { p.muted { "No batch yet." } }
            div.scroll { table id="batch-history" {
                thead { tr { th { "batch" } th { "provider" } th { "job id" } th { "state" } th { "schema" } th { "members" } th { "created" } th { "ended or updated" } } }
                tbody { @for b in &history { tr data-batch=(b.seq) {
                    (identity_cells(b))
                    td { (ago(b.created_at_ms)) }
                    td { (ago(b.updated_at_ms)) }
                } } }
            } }
            @if let Some(before) = older {
                p { a.button href=(format!("/ui/batches?before={before}")) rel="next" { "Older →" } }
            }
        }
    };
    // Only the first page is live: an older page would jump under the reader.
    Ok(if q.before.is_none() { live_page("Batches", &viewer, content) } else { page("Batches", &viewer, content) })
}

pub(super) async fn detail(State(service): State<Service>, viewer: Viewer, Path(seq): Path<String>) -> PageResult {
    viewer.require_admin()?;
    let seq: u64 = seq.parse().map_err(|_| Problem::new(StatusCode::BAD_REQUEST, "a batch is named by its number"))?;
    let (batch, members) = service
        .batch_detail(seq, MEMBERS_SHOWN)
        .await?
        .ok_or_else(|| Problem::new(StatusCode::NOT_FOUND, "no such batch"))?;
    let key = batch.batch_key.as_str();
    let content = html! {
        h1 { "Batch " (batch.seq) }
        div.scroll { table.fields id="batch" {
            tr { th { "provider" } td { (batch.provider.as_str()) } }
            tr { th { "schema" } td { (batch.schema) } }
            tr { th { "state" } td { (state(&batch)) } }
            tr { th { "job id" } td.mono.wrap { (job_id(&batch)) } }
            tr { th { "batch key" } td.mono.wrap { (key) } }
            tr { th { "members" } td { (batch.members.len()) } }
            tr { th { "created" } td { (when(batch.created_at_ms)) } }
            tr { th { "updated" } td { (when(batch.updated_at_ms)) } }
            tr { th { "failed provider calls in a row" } td { (batch.failures) } }
            tr { th { "last error" } td.error.wrap { (batch.last_error.as_deref().unwrap_or("—")) } }
        } }
        h2 { "Members, as they are now" }
        p.muted {
            "Each member's state now: one requeued or retried since may be in a later batch, or waiting."
            @if batch.members.len() > MEMBERS_SHOWN { " The first " (MEMBERS_SHOWN) " of " (batch.members.len()) " are listed." }
            @if members.len() < batch.members.len().min(MEMBERS_SHOWN) { " Erased members are left out." }
        }
        div.scroll { table id="batch-members" {
            thead { tr { th { "id" } th { "tenant" } th { "source" } th { "state" } th { "failure" } th { "now in" } } }
            tbody { @for r in &members { tr {
                td.mono { a href=(format!("/ui/extractions/{}", r.id.to_hex())) { (r.id.to_hex()[..12]) } }
                td { (r.tenant) }
                td.wrap { (r.source_id) }
                td { span class=(format!("badge state-{}", r.state.name().as_str())) { (r.state.name().as_str()) } }
                td.wrap.failure { @if let Lifecycle::Failed { class, reason } = &r.state { strong { (class.as_str()) } " " (clip(reason, 140)) } }
                td { (now_in(&r.state, key)) }
            } } }
        } }
        p { a href="/ui/batches" { "← Batches" } }
    };
    Ok(page(&format!("Batch {}", batch.seq), &viewer, content))
}

/// The cells both tables start with: the batch (linked), provider, job id, state, schema
/// and member count.
fn identity_cells(b: &BatchRecord) -> Markup {
    html! {
        td { a href=(format!("/ui/batches/{}", b.seq)) { "#" (b.seq) } }
        td { (b.provider.as_str()) }
        td.mono.wrap { (job_id(b)) }
        td { (state(b)) }
        td { (b.schema) }
        td { (b.members.len()) }
    }
}

fn job_id(b: &BatchRecord) -> &str {
    match &b.state {
        BatchState::Intent => "—",
        BatchState::Submitted { job_id } => job_id,
        BatchState::Closed { job_id, .. } => job_id.as_deref().unwrap_or("—"),
    }
}

fn state(b: &BatchRecord) -> String {
    match &b.state {
        BatchState::Intent => "submitting".to_string(),
        BatchState::Submitted { .. } => "submitted".to_string(),
        BatchState::Closed { outcome, .. } => format!("closed: {outcome}"),
    }
}

/// Which batch a member's state points at now, if any.
fn now_in(state: &Lifecycle, key: &str) -> &'static str {
    match state.batch_key() {
        Some(k) if k.as_str() == key => "this batch",
        Some(_) => "a later batch",
        None => "—",
    }
}
