//! The differential test of the store seam (issue 24, item 5): one random sequence of store
//! operations — intake with duplicates and webhook redeliveries, claims, valid, invalid
//! and late results, batches with every kind of result line, closes with each leftover,
//! retries, cancels, outbox deliveries, tenant erasure — runs against redb, against a
//! reference model written from the rules, and (with `COMMITPOINT_TEST_STORE=postgres`)
//! against PostgreSQL. After every operation the answers and everything readable through
//! the seam must be the same once wall-clock times, lease tokens and sequence numbers are
//! named by what they stand for.
//!
//! Seeded (`COMMITPOINT_DIFF_SEED` picks another seed); `PROPTEST_CASES` sets how many
//! sequences run (48 on redb, 12 on PostgreSQL by default); `COMMITPOINT_DIFF_TRACE=1`
//! prints each operation and the model's answer; `--nocapture` shows what the sequences
//! made the stores do.

// A test is the outside world: it reads the real clock, not the crate's `clock`.
#![allow(clippy::disallowed_methods)]
#![allow(clippy::expect_used)]

#[path = "support/mod.rs"]
mod support;

#[path = "differential/coverage.rs"]
mod coverage;
#[path = "differential/model.rs"]
mod model;
#[path = "differential/model_batches.rs"]
mod model_batches;
#[path = "differential/model_fair.rs"]
mod model_fair;
#[path = "differential/model_upkeep.rs"]
mod model_upkeep;
#[path = "differential/observe.rs"]
mod observe;
#[path = "differential/ops.rs"]
mod ops;
#[path = "differential/run.rs"]
mod run;
#[path = "differential/subject.rs"]
mod subject;
#[path = "differential/universe.rs"]
mod universe;
#[path = "differential/view.rs"]
mod view;

/// Up to this many operations per sequence.
const MAX_OPS: usize = 40;

#[test]
fn redb_answers_as_the_reference_model() {
    run::check(run::Backends::Redb, 48, MAX_OPS);
}

#[ignore = "PostgreSQL only: COMMITPOINT_TEST_STORE=postgres, --include-ignored (.ci/run does both)"]
#[test]
fn postgres_answers_as_redb_and_the_reference_model() {
    support::postgres::require();
    run::check(run::Backends::RedbAndPostgres, 12, MAX_OPS);
}
