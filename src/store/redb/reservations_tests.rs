//! Budget reservations through the redb store: a batch reserves what its budgeted
//! members may cost, members that do not fit wait with the reason, and every way out of
//! the provider's hands (a charged answer, a cancellation) ends the reservation in the
//! same write.

use std::collections::HashMap;
use std::sync::Arc;

use super::pending_queue_tests::intake;
use super::rules::intent::{IntentOutcome, IntentRequest};
use super::rules::member::MemberRules;
use super::{Store, verify_file};
use crate::domain::batch::{LineResult, OutputBudget, Usage};
use crate::domain::budget::Budgets;
use crate::domain::identity::ExtractionId;
use crate::domain::lifecycle::{FailureClass, State};
use crate::store::seam::{Batches, Extractions, Ledger, Reserved};
use crate::store::{BudgetHold, MemberEstimate, Policies, ProviderReportedOnly, WorkFilter};

const ESTIMATE: u64 = 3_000;

fn request() -> IntentRequest {
    IntentRequest {
        provider: "p".into(),
        schema: "code-review@1".into(),
        accept: WorkFilter(Arc::new(|_: &str, _: &str| true)),
        max_size: 10,
        max_content_bytes: u64::MAX,
        max_wait_ms: 0,
        minimum: None,
        estimate: Some(MemberEstimate(Arc::new(|_| ESTIMATE))),
    }
}

fn truncated_costing(micros: u64) -> LineResult {
    let usage =
        Usage { model: "m".into(), output_tokens: 1000, provider_cost_micros: Some(micros), ..Usage::default() };
    LineResult::Unusable { class: FailureClass::Truncated, reason: "cut off".into(), usage: Some(usage) }
}

async fn members_of(store: &Store, batch: u64) -> Vec<(String, ExtractionId)> {
    let mut out = Vec::new();
    for member in store.batch_members(batch).await.unwrap() {
        let record = store.get(member.id).await.unwrap().unwrap();
        out.push((record.tenant, member.id));
    }
    out
}

#[tokio::test]
async fn a_batch_reserves_within_the_budget_and_answers_and_cancellations_settle_it() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(super::FILE_NAME);
    let (store, guard) = Store::open(dir.path(), 1 << 20).unwrap();
    let budgets = Budgets { limits: HashMap::from([("acme".to_string(), 10_000)]), ..Budgets::default() };
    store.set_policies(
        Policies::new(Vec::new(), Arc::new(ProviderReportedOnly), Default::default()).with_budgets(budgets),
    );
    for i in 0..4 {
        intake(&store, "acme", "code-review@1", &format!("a{i}")).await;
    }
    for i in 0..2 {
        intake(&store, "beta", "code-review@1", &format!("b{i}")).await;
    }

    let IntentOutcome::Created(batch) = store.create_intent(request()).await.unwrap() else { panic!("no batch") };
    let members = members_of(&store, batch.seq).await;
    let count = |tenant: &str| members.iter().filter(|(t, _)| t == tenant).count();
    assert_eq!((count("acme"), count("beta")), (3, 2), "three estimates fit acme's 10,000; beta has no budget");
    assert_eq!(
        store.reservations().await.unwrap(),
        vec![Reserved { tenant: "acme".into(), micros: 9_000, members: 3 }]
    );
    assert_eq!(
        store.budget_holds(),
        vec![BudgetHold { tenant: "acme".into(), needed_micros: ESTIMATE, left_micros: 1_000 }]
    );

    // A charged answer ends its reservation in the same write: 2,500 spent, 6,000 reserved.
    store.record_job(batch.seq, "job-1".into(), 0).await.unwrap();
    let answered = members.iter().find(|(t, _)| t == "acme").map(|(_, id)| *id).unwrap();
    let rules =
        MemberRules { max_attempts: 3, budget: OutputBudget { default: Some(1000), cap: 3000 }, batch_api: true };
    store.stage_results(batch.seq, vec![(answered, truncated_costing(2_500))], rules).await.unwrap();
    assert_eq!(store.get(answered).await.unwrap().unwrap().state, State::Pending, "requeued with a larger budget");
    assert_eq!(store.reservations().await.unwrap()[0].micros, 6_000);
    // 10,000 - 2,500 - 6,000 leaves 1,500: nothing of acme's fits, and beta has nothing left.
    assert!(matches!(store.create_intent(request()).await.unwrap(), IntentOutcome::Nothing));
    assert_eq!(store.budget_holds()[0].left_micros, 1_500);

    // A cancellation ends one more: 4,500 left, so one estimate fits again.
    let cancelled = members.iter().filter(|(t, _)| t == "acme").nth(1).map(|(_, id)| *id).unwrap();
    store.cancel(cancelled).await.unwrap();
    assert_eq!(store.reservations().await.unwrap()[0], Reserved { tenant: "acme".into(), micros: 3_000, members: 1 });
    let IntentOutcome::Created(next) = store.create_intent(request()).await.unwrap() else { panic!("no batch") };
    assert_eq!(next.members.len(), 1);
    assert_eq!(store.reservations().await.unwrap()[0].micros, 6_000);
    assert_eq!(store.spend_since(vec!["acme".into()], 0).await.unwrap(), vec![("acme".to_string(), 2_500)]);

    drop(store);
    tokio::task::spawn_blocking(move || guard.join()).await.unwrap();
    let report = verify_file(&path).unwrap();
    assert!(report.is_ok(), "{report}");
}
