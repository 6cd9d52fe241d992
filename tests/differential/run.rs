//! Runs the sequences: opens fresh stores per case, applies each operation to the model
//! and every backend, and compares answers and snapshots, reporting the first difference.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

use commitpoint::store::postgres::{PgOptions, PgStore};
use commitpoint::store::{Drivers, Policies, SharedStore, Store, WriterGuard};
use proptest::test_runner::{Config, RngAlgorithm, TestCaseError, TestRng, TestRunner};

use super::model::Model;
use super::ops::{self, Case, Op};
use super::subject::Subject;
use super::universe::{SINKS, TestPricing};
use super::view::Answer;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backends {
    Redb,
    RedbAndPostgres,
}

const DEFAULT_SEED: u64 = 0x2024_0005;

pub fn check(backends: Backends, default_cases: u32, max_ops: usize) {
    let cases = std::env::var("PROPTEST_CASES").ok().and_then(|c| c.parse().ok()).unwrap_or(default_cases);
    let seed = std::env::var("COMMITPOINT_DIFF_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or(DEFAULT_SEED);
    let config = Config {
        cases,
        failure_persistence: None,
        // Each shrink step opens fresh stores (a database on PostgreSQL).
        max_shrink_iters: if backends == Backends::Redb { 400 } else { 60 },
        ..Config::default()
    };
    let mut seed_bytes = [0u8; 32];
    seed_bytes[..8].copy_from_slice(&seed.to_le_bytes());
    let mut runner = TestRunner::new_with_rng(config, TestRng::from_seed(RngAlgorithm::ChaCha, &seed_bytes));
    let runtime =
        tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("a runtime");
    let result = runner.run(&ops::case(max_ops), |case| run_case(&runtime, backends, &case));
    super::coverage::print();
    if let Err(e) = result {
        panic!("seed {seed}: {e}");
    }
}

fn policies() -> Policies {
    let budgets = commitpoint::domain::budget::Budgets {
        period: commitpoint::domain::budget::BudgetPeriod::Month,
        limits: [(super::universe::BUDGETED.to_string(), super::universe::BUDGET_MICROS)].into(),
    };
    Policies::new(SINKS.iter().map(|s| s.to_string()).collect(), Arc::new(TestPricing), Default::default())
        .with_budgets(budgets)
}

/// A fresh redb store in its own temp dir; the guard and the dir must outlive it.
fn open_redb() -> (SharedStore, WriterGuard, tempfile::TempDir) {
    let dir = tempfile::tempdir().expect("a temp dir");
    let (store, guard) = Store::open(dir.path(), 8 << 20).expect("open redb");
    store.set_policies(policies());
    (Arc::new(store), guard, dir)
}

static DATABASES: AtomicU32 = AtomicU32::new(0);

/// A fresh database of the test cluster, by its URL.
fn create_postgres() -> String {
    let name = format!("diff_{}_{}", std::process::id(), DATABASES.fetch_add(1, Ordering::Relaxed));
    let cluster = crate::support::postgres::cluster();
    cluster.create_database(&name);
    cluster.url(&name)
}

/// One case on fresh stores. The redb writer is joined outside the runtime, once every
/// handle is gone.
fn run_case(runtime: &tokio::runtime::Runtime, backends: Backends, case: &Case) -> Result<(), TestCaseError> {
    let (redb, guard, dir) = open_redb();
    let postgres = (backends == Backends::RedbAndPostgres).then(create_postgres);
    let result = runtime.block_on(async move {
        let mut subjects = vec![Subject::new(redb, case.rules)];
        if let Some(url) = postgres {
            let store = PgStore::open(&PgOptions { url, password: None })
                .await
                .map_err(|e| TestCaseError::fail(format!("open PostgreSQL: {e:#}")))?;
            store.set_policies(policies());
            // Batch writes are a driver's, checked against its term of the provider's lease.
            for provider in super::universe::PROVIDERS {
                let term = store
                    .acquire_driver(provider.to_string(), std::time::Duration::from_secs(3600))
                    .await
                    .map_err(|e| TestCaseError::fail(format!("take {provider}'s lease: {e:#}")))?;
                if term.is_none() {
                    return Err(TestCaseError::fail(format!("{provider}'s lease is held on a fresh database")));
                }
            }
            subjects.push(Subject::new(Arc::new(store), case.rules));
        }
        compare(case, &mut subjects).await
    });
    guard.join();
    drop(dir);
    result
}

async fn compare(case: &Case, subjects: &mut [Subject]) -> Result<(), TestCaseError> {
    let trace = std::env::var_os("COMMITPOINT_DIFF_TRACE").is_some();
    let mut model = Model::new(case.rules);
    for (index, op) in case.ops.iter().enumerate() {
        let expected = model.apply(index, op);
        super::coverage::note(&expected);
        if trace {
            eprintln!("#{index} {op:?}\n    => {expected:?}");
        }
        let what = format!("op #{index} {op:?}");
        for subject in subjects.iter_mut() {
            let got = subject.apply(index, op).await.map_err(|e| failed(&what, subject, &e))?;
            same(&format!("{what}: the answer"), "the model", &expected, subject.backend(), &got)?;
        }
        if matches!(op, Op::Claim { .. } | Op::ExtendLease { .. }) {
            // Leases are ordered by expiry time: the next claim or extension must come a
            // millisecond later.
            tokio::time::sleep(std::time::Duration::from_millis(2)).await;
        }
        // Every side agreed that nothing was done: nothing to read again.
        if expected == Answer::Skipped {
            continue;
        }
        let expected = model.snapshot();
        for subject in subjects.iter() {
            let got = subject.snapshot().await.map_err(|e| failed(&what, subject, &e))?;
            same(&format!("after {what}: the state"), "the model", &expected, subject.backend(), &got)?;
        }
        if let [first, second] = subjects {
            let a = first.identifiers().await.map_err(|e| failed(&what, first, &e))?;
            let b = second.identifiers().await.map_err(|e| failed(&what, second, &e))?;
            same(&format!("after {what}: event ids and batch keys"), first.backend(), &a, second.backend(), &b)?;
        }
    }
    Ok(())
}

fn failed(what: &str, subject: &Subject, e: &commitpoint::store::Error) -> TestCaseError {
    TestCaseError::fail(format!("{what} failed on {}: {e:#}", subject.backend()))
}

/// Fails with the first lines where the two pretty-printed values differ.
fn same<T: std::fmt::Debug + PartialEq>(
    what: &str,
    left: &str,
    a: &T,
    right: &str,
    b: &T,
) -> Result<(), TestCaseError> {
    if a == b {
        return Ok(());
    }
    let (a, b) = (format!("{a:#?}"), format!("{b:#?}"));
    let (a, b): (Vec<&str>, Vec<&str>) = (a.lines().collect(), b.lines().collect());
    let first = a.iter().zip(&b).position(|(x, y)| x != y).unwrap_or(a.len().min(b.len()));
    let from = first.saturating_sub(4);
    let show = |lines: &[&str]| lines.iter().skip(from).take(30).copied().collect::<Vec<_>>().join("\n");
    Err(TestCaseError::fail(format!(
        "{what} differs from line {first}:\n--- {left}:\n{}\n--- {right}:\n{}",
        show(&a),
        show(&b)
    )))
}
