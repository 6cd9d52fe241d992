//! Prometheus metrics. Counters are bumped where things happen (through the `metrics`
//! facade); state gauges, file size and provider health are refreshed at scrape time
//! from the store, so they are always true rather than tracked. Label values come from
//! small fixed sets only (states, classes, provider names, tenants named in the budget
//! config): never ids or arbitrary tenants.

use std::sync::OnceLock;

use metrics::{counter, describe_counter, describe_gauge, gauge};
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};

use crate::domain::clock;
use crate::domain::lifecycle::StateName;
use crate::domain::metric_names as names;
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
pub(crate) fn init() {
    let _ = handle();
}

fn describe() {
    describe_counter!(names::INTAKES_TOTAL, "Intake requests acknowledged, by result (created or duplicate).");
    describe_counter!(names::COMMITS_TOTAL, "Extractions committed, by path (worker or provider).");
    describe_counter!(names::REPLAYS_TOTAL, "Results for already-committed extractions: absorbed, nothing written.");
    describe_counter!(names::FAILURES_TOTAL, "Extractions that entered the failed state, by failure class.");
    describe_counter!(names::RETRIES_TOTAL, "Failed extractions sent back to pending by an operator.");
    describe_counter!(
        names::FINDINGS_UNGROUNDED_TOTAL,
        "Findings refused as ungrounded in their source (x-commitpoint-grounding), by schema."
    );
    describe_gauge!(names::EXTRACTIONS, "Extractions by state.");
    describe_gauge!(
        names::OLDEST_IN_STATE_AGE_SECONDS,
        "Age of the longest-waiting extraction in each non-terminal state."
    );
    describe_gauge!(names::DB_FILE_SIZE_BYTES, "Size of commitpoint.redb.");
    describe_gauge!(names::LAST_BACKUP_SUCCESS_TIMESTAMP_SECONDS, "Unix time of the last successful online backup.");
    describe_gauge!(names::BUILD_INFO, "Build metadata; always 1.");
    describe_gauge!(names::PROVIDER_PAUSED, "1 while a provider is paused (auth or budget), else 0.");
    describe_counter!(names::PROVIDER_BATCHES_SUBMITTED_TOTAL, "Batches submitted to a provider.");
    describe_counter!(
        names::PROVIDER_BATCHES_RECOVERED_TOTAL,
        "Submit intents resolved by finding the job by batch key."
    );
    describe_counter!(names::PROVIDER_RATE_LIMITED_TOTAL, "Provider calls answered with a rate limit.");
    describe_counter!(names::PROVIDER_RESULT_LINES_TOTAL, "Result lines read from providers.");
    describe_counter!(names::PROVIDER_MALFORMED_LINES_TOTAL, "Result lines that could not be parsed.");
    describe_counter!(names::PROVIDER_MEMBERS_REQUEUED_TOTAL, "Batch members requeued as a new attempt.");
    describe_counter!(
        names::PROVIDER_TRUNCATED_TOTAL,
        "Answers cut off at their output budget (finish_reason length, stop_reason max_tokens)."
    );
    describe_counter!(
        names::PROVIDER_BUDGET_RETRIES_TOTAL,
        "Truncated answers sent back once with a larger output budget."
    );
    describe_counter!(names::PROVIDER_MODEL_REFUSALS_TOTAL, "Answers the model declined (failed refused).");
    describe_counter!(
        names::PROVIDER_ERRORS_TOTAL,
        "Failed provider calls, by provider and class (rate_limited, transient, auth, budget, ...)."
    );
    describe_gauge!(names::PROVIDER_OPEN_BATCHES, "Batches a provider still has to drive (intent or live job).");
    describe_gauge!(names::OUTBOX_PENDING, "Outbox events waiting for delivery.");
    describe_gauge!(names::OUTBOX_DEAD, "Outbox events given up on (dead-letter list).");
    describe_gauge!(names::OUTBOX_OLDEST_PENDING_AGE_SECONDS, "Age of the oldest undelivered outbox event.");
    describe_counter!(names::OUTBOX_DELIVERIES_TOTAL, "Outbox delivery attempts, by outcome.");
    describe_gauge!(
        names::TENANT_SPEND_MICROS,
        "Charged micro-dollars this budget period, for tenants with a budget (bounded by config)."
    );
    describe_gauge!(
        names::TENANT_RESERVED_MICROS,
        "Micro-dollars reserved against a tenant's budget for batch members with a provider, not yet charged."
    );
    describe_gauge!(names::TENANT_BUDGET_MICROS, "Configured budget per period, per budgeted tenant.");
    describe_gauge!(names::TENANT_HELD, "1 while a tenant's new work is held for its budget.");
    describe_counter!(
        names::AUTH_REFUSALS_TOTAL,
        "Wrong tokens and failed console logins (reason bad_token, bad_login), and credentials not checked \
         because the address guessed too often (rate_limited)."
    );
    describe_counter!(names::WEBHOOK_REDELIVERIES_TOTAL, "Webhook deliveries seen before: answered, nothing written.");
    for result in ["created", "duplicate"] {
        counter!(names::INTAKES_TOTAL, "result" => result).absolute(0);
    }
    counter!(names::REPLAYS_TOTAL).absolute(0);
    for class in crate::domain::lifecycle::FailureClass::ALL {
        counter!(names::FAILURES_TOTAL, "class" => class.as_str()).absolute(0);
    }
    counter!(names::RETRIES_TOTAL).absolute(0);
    gauge!(names::BUILD_INFO, "version" => env!("CARGO_PKG_VERSION")).set(1.0);
}

/// Renders the exposition text after refreshing the scrape-time gauges.
pub(crate) async fn render(service: &Service) -> Option<String> {
    let handle = handle()?;
    let now = clock::now_ms();
    if let Ok(counts) = service.counts_by_state().await {
        for c in counts {
            gauge!(names::EXTRACTIONS, "state" => c.state.as_str()).set(c.count as f64);
            if matches!(c.state, StateName::Pending | StateName::Claimed | StateName::Submitted | StateName::Ready) {
                let age = c.oldest_since_ms.map_or(0.0, |since| now.saturating_sub(since) as f64 / 1000.0);
                gauge!(names::OLDEST_IN_STATE_AGE_SECONDS, "state" => c.state.as_str()).set(age);
            }
        }
    }
    let per_tenant = match service.tenant_series() {
        0 => String::new(),
        cap => service
            .depth_by_tenant()
            .await
            .map_or_else(|_| String::new(), |d| super::tenant_series::render(&d, cap, now)),
    };
    if let Some(size) = service.store().file_size() {
        gauge!(names::DB_FILE_SIZE_BYTES).set(size as f64);
    }
    if let Ok((pending, dead, oldest)) = service.outbox_counts().await {
        gauge!(names::OUTBOX_PENDING).set(pending as f64);
        gauge!(names::OUTBOX_DEAD).set(dead as f64);
        let age = oldest.map_or(0.0, |since| now.saturating_sub(since) as f64 / 1000.0);
        gauge!(names::OUTBOX_OLDEST_PENDING_AGE_SECONDS).set(age);
    }
    if let Ok(rows) = service.budget_status().await {
        for line in rows {
            let tenant = line.tenant;
            gauge!(names::TENANT_SPEND_MICROS, "tenant" => tenant.clone()).set(line.spent_micros as f64);
            gauge!(names::TENANT_RESERVED_MICROS, "tenant" => tenant.clone()).set(line.reserved_micros as f64);
            gauge!(names::TENANT_BUDGET_MICROS, "tenant" => tenant.clone()).set(line.limit_micros as f64);
            gauge!(names::TENANT_HELD, "tenant" => tenant).set(if line.held { 1.0 } else { 0.0 });
        }
    }
    if let Ok(views) = service.providers().await {
        for view in views {
            gauge!(names::PROVIDER_OPEN_BATCHES, "provider" => view.health.name.clone()).set(view.open_batches as f64);
        }
    }
    for (schema, findings) in service.ungrounded_findings() {
        counter!(names::FINDINGS_UNGROUNDED_TOTAL, "schema" => schema).absolute(findings);
    }
    for p in service.provider_health() {
        let name = p.name.clone();
        let paused = p.paused_until_ms.is_some_and(|until| until > now);
        gauge!(names::PROVIDER_PAUSED, "provider" => name.clone()).set(if paused { 1.0 } else { 0.0 });
        counter!(names::PROVIDER_BATCHES_SUBMITTED_TOTAL, "provider" => name.clone()).absolute(p.batches_submitted);
        counter!(names::PROVIDER_BATCHES_RECOVERED_TOTAL, "provider" => name.clone()).absolute(p.batches_recovered);
        counter!(names::PROVIDER_RATE_LIMITED_TOTAL, "provider" => name.clone()).absolute(p.rate_limited);
        counter!(names::PROVIDER_RESULT_LINES_TOTAL, "provider" => name.clone()).absolute(p.lines_ingested);
        counter!(names::PROVIDER_MALFORMED_LINES_TOTAL, "provider" => name.clone()).absolute(p.malformed_lines);
        counter!(names::PROVIDER_MEMBERS_REQUEUED_TOTAL, "provider" => name.clone()).absolute(p.members_requeued);
        counter!(names::PROVIDER_TRUNCATED_TOTAL, "provider" => name.clone()).absolute(p.truncated);
        counter!(names::PROVIDER_BUDGET_RETRIES_TOTAL, "provider" => name.clone()).absolute(p.budget_retries);
        counter!(names::PROVIDER_MODEL_REFUSALS_TOTAL, "provider" => name).absolute(p.model_refusals);
    }
    let mut text = handle.render();
    text.push_str(&per_tenant);
    Some(text)
}
