//! End-to-end tests of the real `commitpoint` binary: one server process per test on
//! `127.0.0.1:0` over its own temp data directory, driven over HTTP and the CLI.
//!
//! Run with `cargo test --test integration`.

// clippy.toml's allow-expect-in-tests covers #[test] functions only; the harness helpers
// fail a test the same way, by panicking with a message.
#![allow(clippy::expect_used)]
// A test is the outside world: it reads the real clock, not the crate's `clock`.
#![allow(clippy::disallowed_methods)]

#[path = "it/answer_bounds.rs"]
mod answer_bounds;
#[path = "it/bad_input.rs"]
mod bad_input;
#[path = "it/cancel.rs"]
mod cancel;
#[path = "it/cli.rs"]
mod cli;
#[path = "it/compaction.rs"]
mod compaction;
#[path = "it/config_mistakes.rs"]
mod config_mistakes;
#[path = "it/console.rs"]
mod console;
#[path = "it/console_evaluations.rs"]
mod console_evaluations;
#[path = "it/console_history.rs"]
mod console_history;
#[path = "it/crash.rs"]
mod crash;
#[path = "it/cross_site.rs"]
mod cross_site;
#[path = "it/delivery.rs"]
mod delivery;
#[path = "it/driver_lease.rs"]
mod driver_lease;
#[path = "it/early_refusal.rs"]
mod early_refusal;
#[path = "it/erasure.rs"]
mod erasure;
#[path = "it/erasure_inflight.rs"]
mod erasure_inflight;
#[path = "it/evaluations.rs"]
mod evaluations;
#[path = "it/export.rs"]
mod export;
#[path = "it/export_backends.rs"]
mod export_backends;
#[path = "it/fair_share.rs"]
mod fair_share;
#[path = "it/gcs_emulator.rs"]
mod gcs_emulator;
#[path = "it/grounding.rs"]
mod grounding;
#[path = "it/guessing.rs"]
mod guessing;
#[path = "it/hostile_net.rs"]
mod hostile_net;
#[path = "it/intake.rs"]
mod intake;
#[path = "it/large_outputs.rs"]
mod large_outputs;
#[path = "it/leases.rs"]
mod leases;
#[path = "it/log_format.rs"]
mod log_format;
#[path = "it/migrate.rs"]
mod migrate;
#[path = "it/money.rs"]
mod money;
#[path = "it/moto.rs"]
mod moto;
#[path = "it/ops.rs"]
mod ops;
#[path = "it/postgres.rs"]
mod postgres;
#[path = "it/postgres_verify.rs"]
mod postgres_verify;
#[path = "it/private_files.rs"]
mod private_files;
#[path = "it/provider.rs"]
mod provider;
#[path = "it/provider_answers.rs"]
mod provider_answers;
#[path = "it/provider_batchlevel.rs"]
mod provider_batchlevel;
#[path = "it/provider_check.rs"]
mod provider_check;
#[path = "it/provider_crash.rs"]
mod provider_crash;
#[path = "it/provider_faults.rs"]
mod provider_faults;
#[path = "it/provider_fidelity.rs"]
mod provider_fidelity;
#[path = "it/providers_e2e.rs"]
mod providers_e2e;
#[path = "it/providers_e2e_anthropic.rs"]
mod providers_e2e_anthropic;
#[path = "it/providers_e2e_azure.rs"]
mod providers_e2e_azure;
#[path = "it/providers_e2e_bedrock.rs"]
mod providers_e2e_bedrock;
#[path = "it/providers_e2e_bedrock_fallback.rs"]
mod providers_e2e_bedrock_fallback;
#[path = "it/providers_e2e_chat.rs"]
mod providers_e2e_chat;
#[path = "it/providers_e2e_compat.rs"]
mod providers_e2e_compat;
#[path = "it/providers_e2e_gemini.rs"]
mod providers_e2e_gemini;
#[path = "it/providers_e2e_generic.rs"]
mod providers_e2e_generic;
#[path = "it/providers_e2e_mistral.rs"]
mod providers_e2e_mistral;
#[path = "it/providers_e2e_pause.rs"]
mod providers_e2e_pause;
#[path = "it/providers_e2e_vertex.rs"]
mod providers_e2e_vertex;
#[path = "it/providers_named.rs"]
mod providers_named;
#[path = "it/python_venv.rs"]
mod python_venv;
#[path = "it/raw.rs"]
mod raw;
#[path = "it/readiness.rs"]
mod readiness;
#[path = "it/redaction.rs"]
mod redaction;
#[path = "it/results.rs"]
mod results;
#[path = "it/retention.rs"]
mod retention;
#[path = "it/revisions.rs"]
mod revisions;
#[path = "it/schemas.rs"]
mod schemas;
#[path = "it/simulator_schemas.rs"]
mod simulator_schemas;
#[path = "it/stalled_readers.rs"]
mod stalled_readers;
#[path = "it/state_counts.rs"]
mod state_counts;
#[path = "it/supervision.rs"]
mod supervision;
#[path = "support/mod.rs"]
mod support;
#[path = "it/tenancy.rs"]
mod tenancy;
#[path = "it/tenant_depth.rs"]
mod tenant_depth;
#[path = "it/traces.rs"]
mod traces;
#[path = "it/trickle.rs"]
mod trickle;
#[path = "it/tutorial.rs"]
mod tutorial;
#[path = "it/util.rs"]
mod util;
#[path = "it/worker_tokens.rs"]
mod worker_tokens;
