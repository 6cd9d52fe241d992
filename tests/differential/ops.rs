//! The operations a sequence is made of, named abstractly (an identity by its index, a
//! batch by the order it was created in, a lease token by which grant it was), so one
//! sequence means the same thing to every backend and to the model.

use commitpoint::domain::lifecycle::FailureClass;
use proptest::prelude::*;

use super::universe::{IDENTITY_COUNT, PROVIDERS, SCHEMAS, TENANTS};

/// Which lease token a worker presents.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TokenPick {
    /// The token of the last grant for the extraction.
    Latest,
    /// The one before it (a worker whose lease was taken over).
    Previous,
    /// A token never granted.
    Forged,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AuthorityPick {
    Lease(TokenPick),
    /// The batch created `n`-th (modulo how many exist): a late or stale provider report.
    Batch(usize),
}

/// One result line of a batch, and whom it names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LinePick {
    pub target: LineTarget,
    pub kind: LineKind,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LineTarget {
    /// The batch's `n`-th member (modulo its size).
    Member(usize),
    /// Any identity, member of this batch or not; past the universe, a stranger.
    Identity(usize),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LineKind {
    Answer { ok: bool, findings: Vec<u8>, paid: bool },
    Truncated { output_tokens: u64, paid: bool },
    ModelRefusal { paid: bool },
    ProviderRefusal,
    Retry,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LeftoverPick {
    Requeue,
    Return,
    Fail(FailureClass),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeliveryPick {
    Delivered,
    Retry,
    Dead,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Op {
    Intake {
        identity: usize,
    },
    IntakeDelivery {
        endpoint: usize,
        delivery: usize,
        identity: usize,
    },
    /// `only`: a worker token scoped to this one tenant.
    Claim {
        worker: usize,
        limit: usize,
        short_lease: bool,
        schema: Option<usize>,
        only: Option<usize>,
    },
    /// `paid`: (a latency is known, which of a few request ids the call had).
    /// `identity`: `None` names the extraction granted last. `again`: the same answer is
    /// posted a second time from another paid call (the next request id), as a worker that
    /// retried its model call would.
    Post {
        identity: Option<usize>,
        authority: AuthorityPick,
        ok: bool,
        findings: Vec<u8>,
        paid: Option<(bool, u8)>,
        again: bool,
    },
    /// An intent; with `submit`, the provider's job id is recorded right after, as the
    /// scheduler does once the provider accepted the batch. With `hand_over`, the provider
    /// has a minimum larger than the batch, already waited out, and the other provider as
    /// its `min_batch_fallback`: the intent is bound to that one.
    CreateIntent {
        provider: usize,
        schema: usize,
        max_size: usize,
        small_bytes: bool,
        wait: bool,
        only: Option<usize>,
        submit: bool,
        hand_over: bool,
    },
    RecordJob {
        batch: usize,
        other_job: bool,
    },
    Stage {
        batch: usize,
        lines: Vec<LinePick>,
    },
    Ingest {
        batch: usize,
        lines: Vec<LinePick>,
        later: bool,
    },
    /// The engine's commit of every staged answer, provider by provider.
    CommitReady,
    Close {
        batch: usize,
        leftover: LeftoverPick,
    },
    Retry {
        identity: usize,
    },
    Cancel {
        identity: usize,
    },
    RetryFailed {
        tenant: Option<usize>,
        schema: Option<usize>,
        class: Option<FailureClass>,
        limit: u64,
    },
    Deliver {
        event: usize,
        report: DeliveryPick,
    },
    Redeliver {
        event: usize,
    },
    Erase {
        tenant: usize,
    },
    /// A worker's lease extension (`identity`: `None` names the extraction granted last),
    /// to a lease that expires at once (`short_lease`) or in an hour, as claims do.
    ExtendLease {
        identity: Option<usize>,
        token: TokenPick,
        short_lease: bool,
    },
}

/// An identity, now and then a stranger.
fn identity() -> impl Strategy<Value = usize> {
    prop_oneof![12 => 0..IDENTITY_COUNT, 1 => Just(IDENTITY_COUNT)]
}

fn findings() -> impl Strategy<Value = Vec<u8>> {
    prop::collection::vec(0u8..4, 0..4)
}

fn class() -> impl Strategy<Value = FailureClass> {
    prop::sample::select(vec![FailureClass::Transient, FailureClass::InvalidRequest, FailureClass::Gone])
}

/// A batch by how recent it is: 0 is the newest. Mostly the newest, so a batch's steps
/// (job, lines, close) tend to follow one another.
fn batch() -> impl Strategy<Value = usize> {
    prop_oneof![6 => Just(0usize), 2 => Just(1usize), 1 => 2usize..4]
}

/// The label of the batch `recent` names among `count` created so far.
pub fn batch_label(recent: usize, count: usize) -> Option<usize> {
    (count > 0).then(|| count - 1 - recent % count)
}

/// Whom a post names: mostly an identity, sometimes the one granted last.
fn post_target() -> impl Strategy<Value = Option<usize>> {
    prop_oneof![1 => identity().prop_map(Some), 1 => Just(None)]
}

fn line() -> impl Strategy<Value = LinePick> {
    let target =
        prop_oneof![8 => (0usize..6).prop_map(LineTarget::Member), 1 => identity().prop_map(LineTarget::Identity)];
    let kind = prop_oneof![
        10 => (any::<bool>(), findings(), any::<bool>()).prop_map(|(ok, findings, paid)| LineKind::Answer { ok, findings, paid }),
        2 => (prop::sample::select(vec![500u64, 1000, 3000]), any::<bool>())
            .prop_map(|(output_tokens, paid)| LineKind::Truncated { output_tokens, paid }),
        1 => any::<bool>().prop_map(|paid| LineKind::ModelRefusal { paid }),
        1 => Just(LineKind::ProviderRefusal),
        2 => Just(LineKind::Retry),
    ];
    (target, kind).prop_map(|(target, kind)| LinePick { target, kind })
}

fn lines() -> impl Strategy<Value = Vec<LinePick>> {
    prop::collection::vec(line(), 1..5)
}

fn token() -> impl Strategy<Value = TokenPick> {
    prop_oneof![6 => Just(TokenPick::Latest), 2 => Just(TokenPick::Previous), 1 => Just(TokenPick::Forged)]
}

pub fn op() -> impl Strategy<Value = Op> {
    let authority =
        prop_oneof![5 => token().prop_map(AuthorityPick::Lease), 1 => (0usize..4).prop_map(AuthorityPick::Batch)];
    let tenant = 0..TENANTS.len();
    let schema = 0..SCHEMAS.len();
    let provider = 0..PROVIDERS.len();
    let leftover =
        prop_oneof![Just(LeftoverPick::Requeue), Just(LeftoverPick::Return), class().prop_map(LeftoverPick::Fail)];
    let report = prop::sample::select(vec![DeliveryPick::Delivered, DeliveryPick::Retry, DeliveryPick::Dead]);
    prop_oneof![
        8 => identity().prop_map(|identity| Op::Intake { identity }),
        2 => (0usize..2, 0usize..3, identity())
            .prop_map(|(endpoint, delivery, identity)| Op::IntakeDelivery { endpoint, delivery, identity }),
        5 => (0usize..3, 1usize..4, any::<bool>(), prop::option::of(schema.clone()), prop::option::weighted(0.3, tenant.clone()))
            .prop_map(|(worker, limit, short_lease, schema, only)| Op::Claim { worker, limit, short_lease, schema, only }),
        6 => (post_target(), authority, any::<bool>(), findings(), prop::option::of((any::<bool>(), 0u8..3)))
            .prop_flat_map(|(identity, authority, ok, findings, paid)| {
                prop::bool::weighted(0.3)
                    .prop_map(move |again| Op::Post { identity, authority, ok, findings: findings.clone(), paid, again })
            }),
        5 => (provider, schema.clone(), 1usize..5, prop::bool::weighted(0.2), prop::bool::weighted(0.2),
              prop::option::weighted(0.2, tenant.clone()), prop::bool::weighted(0.7), prop::bool::weighted(0.2))
            .prop_map(|(provider, schema, max_size, small_bytes, wait, only, submit, hand_over)| {
                Op::CreateIntent { provider, schema, max_size, small_bytes, wait, only, submit, hand_over }
            }),
        5 => (batch(), prop::bool::weighted(0.1)).prop_map(|(batch, other_job)| Op::RecordJob { batch, other_job }),
        2 => (batch(), lines()).prop_map(|(batch, lines)| Op::Stage { batch, lines }),
        7 => (batch(), lines(), any::<bool>()).prop_map(|(batch, lines, later)| Op::Ingest { batch, lines, later }),
        3 => Just(Op::CommitReady),
        2 => (batch(), leftover).prop_map(|(batch, leftover)| Op::Close { batch, leftover }),
        2 => identity().prop_map(|identity| Op::Retry { identity }),
        2 => identity().prop_map(|identity| Op::Cancel { identity }),
        1 => (prop::option::of(tenant.clone()), prop::option::of(schema), prop::option::of(class()), 1u64..5)
            .prop_map(|(tenant, schema, class, limit)| Op::RetryFailed { tenant, schema, class, limit }),
        3 => (0usize..8, report).prop_map(|(event, report)| Op::Deliver { event, report }),
        1 => (0usize..4).prop_map(|event| Op::Redeliver { event }),
        1 => tenant.prop_map(|tenant| Op::Erase { tenant }),
        3 => (post_target(), token(), any::<bool>())
            .prop_map(|(identity, token, short_lease)| Op::ExtendLease { identity, token, short_lease }),
    ]
}

/// How a case's providers treat their members (the same for every call of one case).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RulesPick {
    pub max_attempts: u32,
    pub default_budget: bool,
    pub batch_api: bool,
}

pub fn rules() -> impl Strategy<Value = RulesPick> {
    (1u32..4, any::<bool>(), any::<bool>()).prop_map(|(max_attempts, default_budget, batch_api)| RulesPick {
        max_attempts,
        default_budget,
        batch_api,
    })
}

#[derive(Debug, Clone)]
pub struct Case {
    pub rules: RulesPick,
    pub ops: Vec<Op>,
}

/// A few intakes first, so the operations after them find work to act on.
pub fn case(max_ops: usize) -> impl Strategy<Value = Case> {
    let intakes = prop::collection::vec((0..IDENTITY_COUNT).prop_map(|identity| Op::Intake { identity }), 2..7);
    (rules(), intakes, prop::collection::vec(op(), 1..=max_ops.saturating_sub(6).max(1))).prop_map(
        |(rules, mut ops, more)| {
            ops.extend(more);
            Case { rules, ops }
        },
    )
}
