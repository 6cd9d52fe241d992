//! Which pending work a batch or a worker's claim takes, so that one tenant's backlog
//! cannot delay every other tenant: deficit round-robin over the tenants with pending
//! work, by source bytes (a tenant of big documents does not win by count), weighted per
//! tenant, within strict priority classes, oldest first within a tenant.
//!
//! A backend hands in its pending work as flows, one per (schema, tenant), in rotation
//! order: the flows after the one the previous pick stopped at, then the wrap-around.
//! What carries over between picks (in the backend's memory: a restart only starts the
//! rotation over) is where the rotation stands and each flow's unspent credit, so a pick
//! costs the work it takes, not the backlog: a pick of n items reaches at most n flows
//! (all of them when priority classes are configured). A tenant's in-flight allowance and
//! budget are shared by its flows.
//!
//! Every tenant's wait is bounded. The first flow of a pick always gets its oldest item,
//! whatever its class, weight or credit; the pick then stops the rotation just before the
//! first flow (in rotation order) that had work it was free to take and got nothing, or,
//! when every flow it reached was served, after the furthest one. Either way the rotation
//! moves on by at least one flow, and a flow passed over is first in the next pick. So a
//! flow with work it may take is served within as many picks as there are such flows,
//! and in the next pick whenever a quantum each fits in it.

use std::collections::HashMap;
use std::iter::Peekable;
use std::sync::Mutex;

use crate::store::Error;

/// A quantum of 4 KiB: a tenant of 1 KiB documents sends four per round, a tenant of
/// 16 KiB documents one every fourth round. Smaller interleaves tenants more finely
/// within one batch, at the cost of reading further down the rotation.
pub const DEFAULT_QUANTUM_BYTES: u64 = 4 * 1024;

/// How tenants share the work: `[scheduler] fair_quantum_bytes` and `[tenants.<name>]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fairness {
    /// Bytes each tenant may take per round, times its weight.
    pub quantum_bytes: u64,
    pub tenants: HashMap<String, TenantShare>,
}

impl Default for Fairness {
    fn default() -> Self {
        Self { quantum_bytes: DEFAULT_QUANTUM_BYTES, tenants: HashMap::new() }
    }
}

impl Fairness {
    pub fn share(&self, tenant: &str) -> TenantShare {
        self.tenants.get(tenant).copied().unwrap_or_default()
    }

    /// Whether any tenant is in a class other than normal: only then must every flow be
    /// listed before the first is served.
    pub(in crate::store) fn ranked(&self) -> bool {
        self.tenants.values().any(|s| s.priority != Priority::Normal)
    }

    fn quantum(&self, tenant: &str) -> u64 {
        self.quantum_bytes.max(1).saturating_mul(u64::from(self.share(tenant).weight.max(1)))
    }
}

/// One tenant's terms.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TenantShare {
    pub weight: u32,
    /// Claimed, submitted and ready work beyond which its pending work waits.
    pub max_in_flight: Option<u64>,
    pub priority: Priority,
}

impl Default for TenantShare {
    fn default() -> Self {
        Self { weight: 1, max_in_flight: None, priority: Priority::Normal }
    }
}

/// Strict classes: a class is served only when the classes before it have nothing left
/// that fits (the rotation's first flow excepted, whatever its class).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Deserialize, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Priority {
    High,
    Normal,
    Low,
}

impl Priority {
    /// As the config spells it.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::High => "high",
            Self::Normal => "normal",
            Self::Low => "low",
        }
    }
}

/// The pending work of one (schema, tenant), oldest first.
pub(in crate::store) struct Flow<T, I: Iterator<Item = Result<T, Error>>> {
    pub schema: String,
    pub tenant: String,
    items: Peekable<I>,
}

impl<T, I: Iterator<Item = Result<T, Error>>> Flow<T, I> {
    pub(in crate::store) fn new(schema: String, tenant: String, items: I) -> Self {
        Self { schema, tenant, items: items.peekable() }
    }
}

/// What a pick may take.
#[derive(Debug, Clone, Copy)]
pub(in crate::store) struct Limits {
    pub count: usize,
    pub bytes: u64,
}

/// The size a pick is fair by.
pub(in crate::store) trait Queued {
    fn bytes(&self) -> u64;
}

impl Queued for crate::store::ExtractionRecord {
    fn bytes(&self) -> u64 {
        self.content_bytes
    }
}

#[derive(Debug)]
pub(in crate::store) struct Picked<T> {
    pub items: Vec<T>,
    /// What each item is reserved at against its tenant's budget (`None`: no budget).
    pub reserved: Vec<Option<u64>>,
    /// Tenants the pick reached whose next item their budget could not cover.
    pub held: Vec<BudgetHold>,
    /// The pick reached a limit (count or bytes), or stopped at one with eligible work
    /// left over.
    pub full: bool,
    /// How the rotation moves on if the pick is kept.
    pub moves: Moves,
}

/// What bounds a tenant beyond its share, read once for each tenant the pick reaches.
pub(in crate::store) struct Bounds<'a, T> {
    /// Its work in flight (read only for tenants with `max_in_flight`).
    pub in_flight: &'a mut dyn FnMut(&str) -> Result<u64, Error>,
    /// What it may still reserve against its budget; `None`: it has no budget.
    pub headroom: &'a mut dyn FnMut(&str) -> Result<Option<u64>, Error>,
    /// What one item is reserved at.
    pub cost: &'a dyn Fn(&T) -> u64,
}

/// A tenant whose next item did not fit what its budget has left: its work waits.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BudgetHold {
    pub tenant: String,
    /// The estimate of its oldest waiting source, in micro-dollars.
    pub needed_micros: u64,
    /// Its budget less its spend this period and its open reservations.
    pub left_micros: u64,
}

/// The pick itself. `rotation` is where the previous pick left this queue; how this pick
/// moves it on is in `Picked::moves`, for the caller to apply once it keeps the pick.
pub(in crate::store) fn pick<T, I, S>(
    flows: S,
    fairness: &Fairness,
    bounds: Bounds<'_, T>,
    limits: Limits,
    rotation: &Rotation,
) -> Result<Picked<T>, Error>
where
    T: Queued,
    I: Iterator<Item = Result<T, Error>>,
    S: Iterator<Item = Result<Flow<T, I>, Error>>,
{
    let mut taken = Taking {
        items: Vec::new(),
        reserved: Vec::new(),
        held: Vec::new(),
        bounds,
        terms: HashMap::new(),
        fairness,
        credit: &rotation.credit,
        bytes: 0,
        limits,
        full: false,
        unreached: false,
    };
    let mut flows = flows.enumerate().map(|(rank, flow)| flow.map(|flow| (rank, flow)));
    let Some((rank, first)) = flows.next().transpose()? else {
        return Ok(Picked::empty(false));
    };
    // The first flow of the rotation gets at least its oldest item whatever its class
    // and credit: this is what bounds every tenant's wait.
    let mut first = taken.open(rank, first)?;
    let head = first.peek_bytes()?.unwrap_or(0);
    first.deficit = first.deficit.saturating_add(first.quantum).max(head);
    taken.serve(&mut first)?;
    first.visited = true;
    let mut settled = Vec::new();
    if fairness.ranked() {
        let mut rest: Vec<(usize, Flow<T, I>)> = flows.collect::<Result<_, _>>()?;
        // Stable: within a class the rotation order stays.
        rest.sort_by_key(|(_, f)| fairness.share(&f.tenant).priority);
        let mut first = Some(first);
        let mut rest = rest.into_iter().peekable();
        for class in [Priority::High, Priority::Normal, Priority::Low] {
            let had_round: Vec<Open<T, I>> = first.take_if(|f| f.priority == class).into_iter().collect();
            let mut members = Vec::new();
            while let Some(f) = rest.next_if(|(_, f)| fairness.share(&f.tenant).priority == class) {
                members.push(f);
            }
            if taken.done() {
                // Never given a round: each may still be the one the rotation stops at.
                for (rank, flow) in members {
                    settled.push(taken.open(rank, flow)?);
                }
                settled.extend(had_round);
                continue;
            }
            settled.extend(rounds(&mut taken, had_round, members.into_iter().map(Ok), usize::MAX)?);
        }
        settled.extend(first);
    } else {
        settled = rounds(&mut taken, vec![first], flows, limits.count)?;
    }
    let stop = stop_at(&taken, &mut settled);
    let full = taken.full || taken.unreached || taken.items.len() >= limits.count;
    let moves = Moves::of(settled, stop);
    Ok(Picked { items: taken.items, reserved: taken.reserved, held: taken.held, full, moves })
}

/// Where the rotation stops for the next pick: just before the first flow (in rotation
/// order) that had work it was free to take and got nothing, so that flow is first next
/// time and gets its oldest item; when every flow reached was served, after the furthest
/// one reached.
fn stop_at<T: Queued, I: Iterator<Item = Result<T, Error>>>(
    taken: &Taking<'_, '_, T>,
    settled: &mut [Open<T, I>],
) -> Option<(String, String)> {
    settled.sort_by_key(|f| f.rank);
    let wanting = settled.iter_mut().position(|f| f.served == 0 && taken.may_take(f) && f.has_work());
    let at = match wanting {
        Some(0) | None => settled.iter().rposition(|f| f.visited),
        Some(i) => Some(i - 1),
    };
    at.and_then(|i| settled.get(i)).map(|f| (f.flow.schema.clone(), f.flow.tenant.clone()))
}

/// Deficit round-robin over `flows` until the pick is done or they have nothing left
/// it may take. The first round opens flows as it reaches them, at most `reach` in all
/// (a pick of n items serves at most n flows; the rest wait for the rotation to reach
/// them); the later rounds skip the rounds in which no flow could be served.
fn rounds<T, I>(
    taken: &mut Taking<'_, '_, T>,
    mut opened: Vec<Open<T, I>>,
    mut flows: impl Iterator<Item = Result<(usize, Flow<T, I>), Error>>,
    reach: usize,
) -> Result<Vec<Open<T, I>>, Error>
where
    T: Queued,
    I: Iterator<Item = Result<T, Error>>,
{
    while !taken.done() && opened.len() < reach {
        let Some((rank, flow)) = flows.next().transpose()? else { break };
        let mut f = taken.open(rank, flow)?;
        f.deficit = f.deficit.saturating_add(f.quantum);
        taken.serve(&mut f)?;
        f.visited = true;
        opened.push(f);
    }
    if taken.done() || opened.len() >= reach {
        // Work the pick did not reach: the batch is as full as this pick can make it.
        taken.unreached |= flows.next().is_some();
    }
    loop {
        let mut skip = u64::MAX;
        let mut any = false;
        for f in opened.iter_mut() {
            if taken.may_take(f) && f.has_work() {
                let head = f.peek_bytes()?.unwrap_or(0);
                skip = skip.min(head.saturating_sub(f.deficit).div_ceil(f.quantum).max(1));
                any = true;
            }
        }
        if taken.done() || !any {
            break;
        }
        for f in opened.iter_mut() {
            if taken.may_take(f) && f.has_work() {
                f.deficit = f.deficit.saturating_add(f.quantum.saturating_mul(skip));
                taken.serve(f)?;
                if taken.done() {
                    break;
                }
            }
        }
    }
    Ok(opened)
}

impl<T> Picked<T> {
    pub(in crate::store) fn empty(full: bool) -> Self {
        Self { items: Vec::new(), reserved: Vec::new(), held: Vec::new(), full, moves: Moves::default() }
    }
}

struct Open<T, I: Iterator<Item = Result<T, Error>>> {
    flow: Flow<T, I>,
    deficit: u64,
    quantum: u64,
    /// Its next item did not fit its tenant's budget.
    blocked: bool,
    /// Items taken from it in this pick.
    served: usize,
    /// It had its first round.
    visited: bool,
    /// Its place in the rotation.
    rank: usize,
    priority: Priority,
}

/// A tenant's bounds for the rest of the pick, shared by its flows (one per schema).
#[derive(Debug, Clone, Copy)]
struct Terms {
    /// How many more it may take before its in-flight limit (`None`: no limit).
    allowance: Option<u64>,
    /// What its budget has left to reserve (`None`: no budget).
    budget: Option<u64>,
}

struct Taking<'b, 'p, T> {
    items: Vec<T>,
    reserved: Vec<Option<u64>>,
    held: Vec<BudgetHold>,
    bounds: Bounds<'b, T>,
    terms: HashMap<String, Terms>,
    fairness: &'p Fairness,
    credit: &'p HashMap<(String, String), u64>,
    bytes: u64,
    limits: Limits,
    /// Stopped at the count or byte limit.
    full: bool,
    /// Flows with work were left unreached.
    unreached: bool,
}

impl<T: Queued> Taking<'_, '_, T> {
    fn done(&self) -> bool {
        self.full || self.items.len() >= self.limits.count
    }

    /// The flow, with its credit, and its tenant's bounds read once per pick.
    fn open<I: Iterator<Item = Result<T, Error>>>(
        &mut self,
        rank: usize,
        flow: Flow<T, I>,
    ) -> Result<Open<T, I>, Error> {
        let share = self.fairness.share(&flow.tenant);
        if !self.terms.contains_key(&flow.tenant) {
            let allowance = match share.max_in_flight {
                Some(max) => Some(max.saturating_sub((self.bounds.in_flight)(&flow.tenant)?)),
                None => None,
            };
            let budget = (self.bounds.headroom)(&flow.tenant)?;
            self.terms.insert(flow.tenant.clone(), Terms { allowance, budget });
        }
        let deficit = self.credit.get(&(flow.schema.clone(), flow.tenant.clone())).copied().unwrap_or(0);
        let quantum = self.fairness.quantum(&flow.tenant);
        Ok(Open { deficit, quantum, blocked: false, served: 0, visited: false, rank, priority: share.priority, flow })
    }

    fn may_take<I: Iterator<Item = Result<T, Error>>>(&self, f: &Open<T, I>) -> bool {
        !f.blocked && self.terms.get(&f.flow.tenant).is_none_or(|t| t.allowance != Some(0))
    }

    /// Takes from `f` while its deficit covers its oldest item and the pick has room.
    /// An item past the byte limit ends the pick, unless it would be the only one: a
    /// source bigger than the limit still goes, alone.
    fn serve<I: Iterator<Item = Result<T, Error>>>(&mut self, f: &mut Open<T, I>) -> Result<(), Error> {
        while !self.done() && self.may_take(f) {
            let Some(bytes) = f.peek_bytes()? else { break };
            if bytes > f.deficit {
                break;
            }
            if !self.items.is_empty() && self.bytes.saturating_add(bytes) > self.limits.bytes {
                self.full = true;
                break;
            }
            let terms = self.terms.get(&f.flow.tenant).copied();
            let budget = terms.and_then(|t| t.budget);
            if let (Some(left), Some(Ok(next))) = (budget, f.flow.items.peek()) {
                let needed = (self.bounds.cost)(next);
                // An exhausted budget holds even work it cannot price.
                if needed > left || left == 0 {
                    f.blocked = true;
                    let tenant = f.flow.tenant.clone();
                    self.held.push(BudgetHold { tenant, needed_micros: needed, left_micros: left });
                    break;
                }
            }
            let Some(item) = f.flow.items.next().transpose()? else { break };
            f.deficit -= bytes;
            f.served += 1;
            let reserved = budget.map(|left| (self.bounds.cost)(&item).min(left));
            if let Some(t) = self.terms.get_mut(&f.flow.tenant) {
                t.allowance = t.allowance.map(|a| a.saturating_sub(1));
                t.budget = t.budget.zip(reserved).map(|(left, r)| left - r);
            }
            self.bytes = self.bytes.saturating_add(bytes);
            self.items.push(item);
            self.reserved.push(reserved);
        }
        Ok(())
    }
}

impl<T: Queued, I: Iterator<Item = Result<T, Error>>> Open<T, I> {
    fn peek_bytes(&mut self) -> Result<Option<u64>, Error> {
        match self.flow.items.peek() {
            None => Ok(None),
            Some(Ok(item)) => Ok(Some(item.bytes())),
            Some(Err(_)) => match self.flow.items.next() {
                Some(Err(e)) => Err(e),
                _ => Ok(None),
            },
        }
    }

    fn has_work(&mut self) -> bool {
        self.flow.items.peek().is_some()
    }
}

/// Where one queue's rotation stands.
#[derive(Debug, Default)]
pub(in crate::store) struct Rotation {
    /// The next pick starts after this (schema, tenant).
    pub after: Option<(String, String)>,
    /// Unspent credit of flows that still had work when a pick ended.
    credit: HashMap<(String, String), u64>,
    /// The tenants the last pick left waiting on their budgets.
    pub held: Vec<BudgetHold>,
}

/// A queue that lost its flows (tenants erased, schemas retired) would otherwise keep
/// their credit forever.
const MAX_CREDITS: usize = 100_000;

/// A pick's effect on its rotation: each reached flow's credit (`None`: it keeps none),
/// and where the next pick starts after.
#[derive(Debug, Default)]
pub(in crate::store) struct Moves {
    credit: Vec<((String, String), Option<u64>)>,
    stop: Option<(String, String)>,
}

impl Moves {
    fn of<T: Queued, I: Iterator<Item = Result<T, Error>>>(
        flows: Vec<Open<T, I>>,
        stop: Option<(String, String)>,
    ) -> Self {
        let credit = flows
            .into_iter()
            .map(|mut f| {
                // DRR: a flow that ran dry keeps no credit.
                let kept = (f.has_work() && f.deficit > 0).then_some(f.deficit);
                ((f.flow.schema, f.flow.tenant), kept)
            })
            .collect();
        Self { credit, stop }
    }
}

impl Rotation {
    /// Keeps `picked` (a claim always does): the rotation moves on and records who waits.
    pub(in crate::store) fn keep<T>(&mut self, picked: &mut Picked<T>) {
        self.held = std::mem::take(&mut picked.held);
        self.apply(std::mem::take(&mut picked.moves));
    }

    /// Moves the rotation on as a kept pick says.
    pub(in crate::store) fn apply(&mut self, moves: Moves) {
        for (key, kept) in moves.credit {
            match kept {
                Some(credit) => self.credit.insert(key, credit),
                None => self.credit.remove(&key),
            };
        }
        if self.credit.len() > MAX_CREDITS {
            self.credit.clear();
        }
        if moves.stop.is_some() {
            self.after = moves.stop;
        }
    }
}

/// Each queue's rotation, kept in memory by the backend.
#[derive(Debug, Default)]
pub(in crate::store) struct Rotations(Mutex<HashMap<String, Rotation>>);

impl Rotations {
    /// The queue's rotation, out of the map until it is put back (a concurrent pick of the
    /// same queue, possible on PostgreSQL, starts from a fresh one meanwhile).
    pub(in crate::store) fn take(&self, queue: &str) -> Rotation {
        self.0.lock().ok().and_then(|mut m| m.remove(queue)).unwrap_or_default()
    }

    pub(in crate::store) fn put(&self, queue: &str, rotation: Rotation) {
        if let Ok(mut m) = self.0.lock() {
            m.insert(queue.to_string(), rotation);
        }
    }

    /// Every queue's budget holds, one per tenant (the largest need).
    pub(in crate::store) fn holds(&self) -> Vec<BudgetHold> {
        let mut by_tenant: HashMap<String, BudgetHold> = HashMap::new();
        if let Ok(m) = self.0.lock() {
            for hold in m.values().flat_map(|r| &r.held) {
                let kept = by_tenant.entry(hold.tenant.clone()).or_insert_with(|| hold.clone());
                if hold.needed_micros > kept.needed_micros {
                    *kept = hold.clone();
                }
            }
        }
        let mut holds: Vec<BudgetHold> = by_tenant.into_values().collect();
        holds.sort_by(|a, b| a.tenant.cmp(&b.tenant));
        holds
    }
}

/// `pairs` (sorted by (schema, tenant)) in rotation order: those after `after`, then the
/// wrap-around up to and including it.
pub(in crate::store) fn rotate<P: AsRef<str>>(pairs: &mut [(P, P)], after: Option<&(String, String)>) {
    let Some((schema, tenant)) = after else { return };
    let split = pairs.partition_point(|(s, t)| (s.as_ref(), t.as_ref()) <= (schema.as_str(), tenant.as_str()));
    pairs.rotate_left(split);
}
