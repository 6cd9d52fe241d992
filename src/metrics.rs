//! Prometheus metrics. Counters are bumped where things happen (through the `metrics`
//! facade); state gauges, file size and provider health are refreshed at scrape time
//! from the store, so they are always true rather than tracked. Label values come from
//! small fixed sets only (states, classes, provider names, tenants named in the budget
//! config): never ids or arbitrary tenants.

use std::sync::OnceLock;

use metrics::{counter, describe_counter, describe_gauge, gauge};
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};

use crate::clock;
use crate::lifecycle::StateName;
use crate::service::Service;

static HANDLE: OnceLock<Option<PrometheusHandle>> = OnceLock::new();

/// Installs the process-wide recorder once. `None` if another recorder owns the process.
fn handle() -> Option<&'static PrometheusHandle> {
    HANDLE
        .get_or_init(|| match PrometheusBuilder::new().install_recorder() {
            Ok(handle) => {
                describe();
                Some(handle)
            }
            Err(e) => {
                tracing::warn!(error = %e, "metrics are unavailable");
                None
            }
        })
        .as_ref()
}

/// Call at start-up so counters exist (at zero) before the first event.
pub fn init() {
    let _ = handle();
}

fn describe() {
    describe_counter!("commitpoint_intakes_total", "Intake requests acknowledged, by result (created or duplicate).");
    describe_counter!("commitpoint_commits_total", "Extractions committed, by path (worker or provider).");
    describe_counter!(
        "commitpoint_replays_total",
        "Results for already-committed extractions: absorbed, nothing written."
    );
    describe_counter!("commitpoint_failures_total", "Extractions that entered the failed state, by failure class.");
    describe_counter!("commitpoint_retries_total", "Failed extractions sent back to pending by an operator.");
    describe_gauge!("commitpoint_extractions", "Extractions by state.");
    describe_gauge!(
        "commitpoint_oldest_in_state_age_seconds",
        "Age of the longest-waiting extraction in each non-terminal state."
    );
    describe_gauge!("commitpoint_db_file_size_bytes", "Size of commitpoint.redb.");
    describe_gauge!(
        "commitpoint_last_backup_success_timestamp_seconds",
        "Unix time of the last successful online backup."
    );
    describe_gauge!("commitpoint_build_info", "Build metadata; always 1.");
    describe_gauge!("commitpoint_provider_paused", "1 while a provider is paused (auth or budget), else 0.");
    describe_counter!("commitpoint_provider_batches_submitted_total", "Batches submitted to a provider.");
    describe_counter!(
        "commitpoint_provider_batches_recovered_total",
        "Submit intents resolved by finding the job by batch key."
    );
    describe_counter!("commitpoint_provider_rate_limited_total", "Provider calls answered with a rate limit.");
    describe_counter!("commitpoint_provider_result_lines_total", "Result lines read from providers.");
    describe_counter!("commitpoint_provider_malformed_lines_total", "Result lines that could not be parsed.");
    describe_counter!("commitpoint_provider_members_requeued_total", "Batch members requeued as a new attempt.");
    describe_counter!(
        "commitpoint_provider_truncated_total",
        "Answers cut off at their output budget (finish_reason length, stop_reason max_tokens)."
    );
    describe_counter!(
        "commitpoint_provider_budget_retries_total",
        "Truncated answers sent back once with a larger output budget."
    );
    describe_counter!("commitpoint_provider_model_refusals_total", "Answers the model declined (failed refused).");
    describe_counter!(
        "commitpoint_provider_errors_total",
        "Failed provider calls, by provider and class (rate_limited, transient, auth, budget, ...)."
    );
    describe_gauge!("commitpoint_provider_open_batches", "Batches a provider still has to drive (intent or live job).");
    describe_gauge!("commitpoint_outbox_pending", "Outbox events waiting for delivery.");
    describe_gauge!("commitpoint_outbox_dead", "Outbox events given up on (dead-letter list).");
    describe_gauge!("commitpoint_outbox_oldest_pending_age_seconds", "Age of the oldest undelivered outbox event.");
    describe_counter!("commitpoint_outbox_deliveries_total", "Outbox delivery attempts, by outcome.");
    describe_gauge!(
        "commitpoint_tenant_spend_micros",
        "Charged micro-dollars this budget period, for tenants with a budget (bounded by config)."
    );
    describe_gauge!("commitpoint_tenant_budget_micros", "Configured budget per period, per budgeted tenant.");
    describe_gauge!("commitpoint_tenant_held", "1 while a tenant's new work is held for its budget.");
    describe_counter!(
        "commitpoint_webhook_redeliveries_total",
        "Webhook deliveries seen before: answered, nothing written."
    );
    for result in ["created", "duplicate"] {
        counter!("commitpoint_intakes_total", "result" => result).absolute(0);
    }
    counter!("commitpoint_replays_total").absolute(0);
    for class in crate::lifecycle::FailureClass::ALL {
        counter!("commitpoint_failures_total", "class" => class.as_str()).absolute(0);
    }
    counter!("commitpoint_retries_total").absolute(0);
    gauge!("commitpoint_build_info", "version" => env!("CARGO_PKG_VERSION")).set(1.0);
}

/// Renders the exposition text after refreshing the scrape-time gauges.
pub async fn render(service: &Service) -> Option<String> {
    let handle = handle()?;
    let now = clock::now_ms();
    if let Ok(counts) = service.counts_by_state().await {
        for c in counts {
            gauge!("commitpoint_extractions", "state" => c.state.as_str()).set(c.count as f64);
            if matches!(c.state, StateName::Pending | StateName::Claimed | StateName::Submitted | StateName::Ready) {
                let age = c.oldest_since_ms.map_or(0.0, |since| now.saturating_sub(since) as f64 / 1000.0);
                gauge!("commitpoint_oldest_in_state_age_seconds", "state" => c.state.as_str()).set(age);
            }
        }
    }
    if let Some(size) = service.store().file_size() {
        gauge!("commitpoint_db_file_size_bytes").set(size as f64);
    }
    if let Ok((pending, dead, oldest)) = service.outbox_counts().await {
        gauge!("commitpoint_outbox_pending").set(pending as f64);
        gauge!("commitpoint_outbox_dead").set(dead as f64);
        let age = oldest.map_or(0.0, |since| now.saturating_sub(since) as f64 / 1000.0);
        gauge!("commitpoint_outbox_oldest_pending_age_seconds").set(age);
    }
    if let Ok(rows) = service.budget_status().await {
        for (tenant, spent, budget, held) in rows {
            gauge!("commitpoint_tenant_spend_micros", "tenant" => tenant.clone()).set(spent as f64);
            gauge!("commitpoint_tenant_budget_micros", "tenant" => tenant.clone()).set(budget as f64);
            gauge!("commitpoint_tenant_held", "tenant" => tenant).set(if held { 1.0 } else { 0.0 });
        }
    }
    if let Ok(views) = service.providers().await {
        for view in views {
            gauge!("commitpoint_provider_open_batches", "provider" => view.health.name.clone())
                .set(view.open_batches as f64);
        }
    }
    for p in service.provider_health() {
        let name = p.name.clone();
        let paused = p.paused_until_ms.is_some_and(|until| until > now);
        gauge!("commitpoint_provider_paused", "provider" => name.clone()).set(if paused { 1.0 } else { 0.0 });
        counter!("commitpoint_provider_batches_submitted_total", "provider" => name.clone())
            .absolute(p.batches_submitted);
        counter!("commitpoint_provider_batches_recovered_total", "provider" => name.clone())
            .absolute(p.batches_recovered);
        counter!("commitpoint_provider_rate_limited_total", "provider" => name.clone()).absolute(p.rate_limited);
        counter!("commitpoint_provider_result_lines_total", "provider" => name.clone()).absolute(p.lines_ingested);
        counter!("commitpoint_provider_malformed_lines_total", "provider" => name.clone()).absolute(p.malformed_lines);
        counter!("commitpoint_provider_members_requeued_total", "provider" => name.clone())
            .absolute(p.members_requeued);
        counter!("commitpoint_provider_truncated_total", "provider" => name.clone()).absolute(p.truncated);
        counter!("commitpoint_provider_budget_retries_total", "provider" => name.clone()).absolute(p.budget_retries);
        counter!("commitpoint_provider_model_refusals_total", "provider" => name).absolute(p.model_refusals);
    }
    Some(handle.render())
}
