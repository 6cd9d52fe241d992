//! Every Prometheus series name, so that a call site cannot misspell one into a new
//! series that no dashboard reads. A leaf: whoever counts something names it from here
//! without depending on the exporter (`metrics`), which reads the service at scrape time.
//! docs/OPERATIONS.md names the series too: change both together.

pub const AUTH_REFUSALS_TOTAL: &str = "commitpoint_auth_refusals_total";
pub const BUILD_INFO: &str = "commitpoint_build_info";
pub const COMMITS_TOTAL: &str = "commitpoint_commits_total";
pub const DB_FILE_SIZE_BYTES: &str = "commitpoint_db_file_size_bytes";
pub const EXTRACTIONS: &str = "commitpoint_extractions";
pub const FAILURES_TOTAL: &str = "commitpoint_failures_total";
pub const FINDINGS_UNGROUNDED_TOTAL: &str = "commitpoint_findings_ungrounded_total";
pub const INTAKES_TOTAL: &str = "commitpoint_intakes_total";
pub const LAST_BACKUP_SUCCESS_TIMESTAMP_SECONDS: &str = "commitpoint_last_backup_success_timestamp_seconds";
pub const OLDEST_IN_STATE_AGE_SECONDS: &str = "commitpoint_oldest_in_state_age_seconds";
pub const OUTBOX_DEAD: &str = "commitpoint_outbox_dead";
pub const OUTBOX_DELIVERIES_TOTAL: &str = "commitpoint_outbox_deliveries_total";
pub const OUTBOX_OLDEST_PENDING_AGE_SECONDS: &str = "commitpoint_outbox_oldest_pending_age_seconds";
pub const OUTBOX_PENDING: &str = "commitpoint_outbox_pending";
pub const PROVIDER_BUDGET_RETRIES_TOTAL: &str = "commitpoint_provider_budget_retries_total";
pub const PROVIDER_BATCHES_RECOVERED_TOTAL: &str = "commitpoint_provider_batches_recovered_total";
pub const PROVIDER_BATCHES_SUBMITTED_TOTAL: &str = "commitpoint_provider_batches_submitted_total";
pub const PROVIDER_ERRORS_TOTAL: &str = "commitpoint_provider_errors_total";
pub const PROVIDER_MALFORMED_LINES_TOTAL: &str = "commitpoint_provider_malformed_lines_total";
pub const PROVIDER_MEMBERS_REQUEUED_TOTAL: &str = "commitpoint_provider_members_requeued_total";
pub const PROVIDER_MODEL_REFUSALS_TOTAL: &str = "commitpoint_provider_model_refusals_total";
pub const PROVIDER_OPEN_BATCHES: &str = "commitpoint_provider_open_batches";
pub const PROVIDER_PAUSED: &str = "commitpoint_provider_paused";
pub const PROVIDER_RATE_LIMITED_TOTAL: &str = "commitpoint_provider_rate_limited_total";
pub const PROVIDER_RESULT_LINES_TOTAL: &str = "commitpoint_provider_result_lines_total";
pub const PROVIDER_TRUNCATED_TOTAL: &str = "commitpoint_provider_truncated_total";
pub const REASKS_TOTAL: &str = "commitpoint_reasks_total";
pub const REASK_OUTCOMES_TOTAL: &str = "commitpoint_reask_outcomes_total";
pub const REPLAYS_TOTAL: &str = "commitpoint_replays_total";
pub const RETRIES_TOTAL: &str = "commitpoint_retries_total";
pub const TENANT_BUDGET_MICROS: &str = "commitpoint_tenant_budget_micros";
pub const TENANT_EXTRACTIONS: &str = "commitpoint_tenant_extractions";
pub const TENANT_HELD: &str = "commitpoint_tenant_held";
pub const TENANT_RESERVED_MICROS: &str = "commitpoint_tenant_reserved_micros";
pub const TENANT_OLDEST_PENDING_AGE_SECONDS: &str = "commitpoint_tenant_oldest_pending_age_seconds";
pub const TENANT_SPEND_MICROS: &str = "commitpoint_tenant_spend_micros";
pub const WEBHOOK_REDELIVERIES_TOTAL: &str = "commitpoint_webhook_redeliveries_total";
