use std::collections::HashMap;

use super::fair::*;
use crate::store::Error;

#[derive(Debug, Clone, PartialEq, Eq)]
struct Item {
    tenant: String,
    seq: u64,
    bytes: u64,
}

impl Queued for Item {
    fn bytes(&self) -> u64 {
        self.bytes
    }
}

/// Tenants' queues, as a backend holds them: (tenant, item sizes oldest first), and what
/// budgeted tenants may still reserve.
#[derive(Default, Clone)]
struct Queues(Vec<(String, Vec<Item>)>, HashMap<String, u64>);

impl Queues {
    fn add(mut self, tenant: &str, count: usize, bytes: u64) -> Self {
        let next = self.0.iter().map(|(_, q)| q.len() as u64).sum::<u64>();
        let items = (0..count as u64).map(|i| Item { tenant: tenant.into(), seq: next + i, bytes }).collect();
        self.0.push((tenant.into(), items));
        self.0.sort_by(|a, b| a.0.cmp(&b.0));
        self
    }

    fn budget(mut self, tenant: &str, micros: u64) -> Self {
        self.1.insert(tenant.into(), micros);
        self
    }

    /// One pick in rotation order; what it took leaves the queues.
    fn pick(&mut self, fairness: &Fairness, rotation: &mut Rotation, limits: Limits) -> Picked<Item> {
        self.pick_with(fairness, rotation, limits, &HashMap::new())
    }

    fn pick_with(
        &mut self,
        fairness: &Fairness,
        rotation: &mut Rotation,
        limits: Limits,
        in_flight: &HashMap<&str, u64>,
    ) -> Picked<Item> {
        let mut pairs: Vec<(String, String)> =
            self.0.iter().filter(|(_, q)| !q.is_empty()).map(|(t, _)| ("s@1".to_string(), t.clone())).collect();
        rotate(&mut pairs, rotation.after.as_ref());
        let flows = pairs.into_iter().map(|(schema, tenant)| {
            let items = self.0.iter().find(|(t, _)| *t == tenant).map(|(_, q)| q.clone()).unwrap_or_default();
            Ok(Flow::new(schema, tenant, items.into_iter().map(Ok::<_, Error>)))
        });
        let bounds = Bounds {
            in_flight: &mut |t| Ok(in_flight.get(t).copied().unwrap_or(0)),
            headroom: &mut |t| Ok(self.1.get(t).copied()),
            // A micro-dollar a byte.
            cost: &|item: &Item| item.bytes,
        };
        let mut picked = pick(flows, fairness, bounds, limits, rotation).expect("a pick in memory");
        rotation.apply(std::mem::take(&mut picked.moves));
        for item in &picked.items {
            if let Some((_, q)) = self.0.iter_mut().find(|(t, _)| *t == item.tenant) {
                q.retain(|i| i.seq != item.seq);
            }
        }
        picked
    }
}

fn after(tenant: &str) -> Rotation {
    let mut rotation = Rotation::default();
    rotation.after = Some(("s@1".into(), tenant.into()));
    rotation
}

fn count(n: usize) -> Limits {
    Limits { count: n, bytes: u64::MAX }
}

fn of(picked: &Picked<Item>, tenant: &str) -> usize {
    picked.items.iter().filter(|i| i.tenant == tenant).count()
}

fn bytes_of(picked: &Picked<Item>, tenant: &str) -> u64 {
    picked.items.iter().filter(|i| i.tenant == tenant).map(|i| i.bytes).sum()
}

fn share(weight: u32, max_in_flight: Option<u64>, priority: Priority) -> TenantShare {
    TenantShare { weight, max_in_flight, priority }
}

#[test]
fn one_tenants_backlog_does_not_delay_the_others() {
    let mut queues = Queues::default().add("big", 50_000, 1024).add("small-a", 3, 1024).add("small-b", 2, 1024);
    let picked =
        queues.pick(&Fairness { quantum_bytes: 1024, ..Fairness::default() }, &mut Rotation::default(), count(10));
    assert_eq!((of(&picked, "small-a"), of(&picked, "small-b")), (3, 2), "{picked:?}");
    assert_eq!(of(&picked, "big"), 5, "the backlog takes what is left of the batch");
    assert!(picked.full);
    let within: Vec<u64> = picked.items.iter().filter(|i| i.tenant == "big").map(|i| i.seq).collect();
    assert_eq!(within, vec![0, 1, 2, 3, 4], "oldest first within a tenant");
}

#[test]
fn shares_are_by_bytes_not_by_count() {
    // One tenant sends 16 KiB documents, the other 1 KiB ones.
    let mut queues = Queues::default().add("large", 100, 16 * 1024).add("tiny", 1000, 1024);
    let picked =
        queues.pick(&Fairness { quantum_bytes: 16 * 1024, ..Fairness::default() }, &mut after("tiny"), count(68));
    let (large, tiny) = (bytes_of(&picked, "large"), bytes_of(&picked, "tiny"));
    assert!(large.abs_diff(tiny) <= 16 * 1024, "bytes large {large}, tiny {tiny}");
    assert!(of(&picked, "tiny") >= 8 * of(&picked, "large"), "{} vs {}", of(&picked, "tiny"), of(&picked, "large"));
}

#[test]
fn a_weight_multiplies_a_tenants_share() {
    let mut queues = Queues::default().add("gold", 1000, 1024).add("plain", 1000, 1024);
    let fairness = Fairness {
        quantum_bytes: 1024,
        tenants: HashMap::from([("gold".to_string(), share(3, None, Priority::Normal))]),
    };
    let picked = queues.pick(&fairness, &mut after("plain"), count(40));
    assert_eq!((of(&picked, "gold"), of(&picked, "plain")), (30, 10));
}

#[test]
fn work_beyond_a_tenants_in_flight_limit_waits() {
    let mut queues = Queues::default().add("capped", 100, 1024).add("free", 100, 1024);
    let fairness = Fairness {
        quantum_bytes: 1024,
        tenants: HashMap::from([("capped".to_string(), share(1, Some(5), Priority::Normal))]),
    };
    let in_flight = HashMap::from([("capped", 3)]);
    let picked = queues.pick_with(&fairness, &mut Rotation::default(), count(50), &in_flight);
    assert_eq!(of(&picked, "capped"), 2, "5 allowed in flight, 3 are");
    assert_eq!(of(&picked, "free"), 48);
    let at_limit = HashMap::from([("capped", 5)]);
    let picked = queues.pick_with(&fairness, &mut Rotation::default(), count(50), &at_limit);
    assert_eq!(of(&picked, "capped"), 0);
}

#[test]
fn a_higher_class_goes_first_but_the_rotations_first_tenant_always_gets_one() {
    let mut queues = Queues::default().add("a-low", 100, 1024).add("b-normal", 100, 1024).add("c-high", 100, 1024);
    let fairness = Fairness {
        quantum_bytes: 1024,
        tenants: HashMap::from([
            ("a-low".to_string(), share(1, None, Priority::Low)),
            ("c-high".to_string(), share(1, None, Priority::High)),
        ]),
    };
    let mut rotation = Rotation::default();
    let picked = queues.pick(&fairness, &mut rotation, count(20));
    assert_eq!(of(&picked, "a-low"), 1, "first in the rotation: its oldest item");
    assert_eq!(of(&picked, "c-high"), 19, "the high class takes the rest");
    assert_eq!(of(&picked, "b-normal"), 0);
    assert_eq!(rotation.after, Some(("s@1".into(), "a-low".into())), "it stops before b-normal, which got nothing");
    let picked = queues.pick(&fairness, &mut rotation, count(20));
    assert_eq!(of(&picked, "b-normal"), 1, "passed over by the high class: first in the next pick");
    assert_eq!(of(&picked, "c-high"), 19);
    // Once the high class has nothing left, the normal class is served before the low.
    let picked = queues.pick(&fairness, &mut Rotation::default(), count(200));
    assert_eq!((of(&picked, "c-high"), of(&picked, "b-normal")), (62, 99));
    assert_eq!(of(&picked, "a-low"), 39);
}

#[test]
fn every_tenant_is_served_within_as_many_picks_as_there_are_tenants() {
    // 50 tenants with deep backlogs of small documents and one with a single document
    // far bigger than a quantum: the worst case for deficit round-robin without memory.
    let mut queues = Queues::default();
    for n in 0..50 {
        queues = queues.add(&format!("t{n:02}"), 1000, 1024);
    }
    queues = queues.add("whale", 1, 4 << 20);
    for quantum_bytes in [1024, 16 * 1024, 64 * 1024] {
        let mut queues = queues.clone();
        let fairness = Fairness { quantum_bytes, ..Fairness::default() };
        let mut rotation = Rotation::default();
        let mut first_served: HashMap<String, usize> = HashMap::new();
        for round in 0..51 {
            let picked = queues.pick(&fairness, &mut rotation, Limits { count: 10, bytes: 8 << 20 });
            assert!(!picked.items.is_empty());
            for item in &picked.items {
                first_served.entry(item.tenant.clone()).or_insert(round);
            }
        }
        assert_eq!(first_served.len(), 51, "quantum {quantum_bytes}: {} served", first_served.len());
        let latest = first_served.values().max().copied().unwrap_or(usize::MAX);
        assert!(latest <= 50, "quantum {quantum_bytes}: the last tenant first waited {latest} picks");
        if quantum_bytes == 1024 {
            // A quantum of one document each: ten tenants per pick.
            let small_latest = first_served.iter().filter(|(t, _)| t.starts_with('t')).map(|(_, r)| *r).max();
            assert!(small_latest <= Some(5), "{small_latest:?}");
        }
    }
}

#[test]
fn a_source_bigger_than_the_byte_limit_goes_alone_and_the_limit_holds_otherwise() {
    let mut queues = Queues::default().add("a", 1, 10_000).add("b", 10, 100);
    let picked = queues.pick(&Fairness::default(), &mut Rotation::default(), Limits { count: 100, bytes: 1_000 });
    assert_eq!(picked.items.len(), 1, "{picked:?}");
    assert!(picked.full);
    let picked = queues.pick(&Fairness::default(), &mut Rotation::default(), Limits { count: 100, bytes: 450 });
    assert_eq!(picked.items.len(), 4);
    assert!(picked.full);
    let picked = queues.pick(&Fairness::default(), &mut Rotation::default(), Limits { count: 100, bytes: 10_000 });
    assert_eq!(picked.items.len(), 6);
    assert!(!picked.full, "everything fitted: a batch of it waits for more work or its age");
}

#[test]
fn the_rotation_continues_after_the_furthest_tenant_served() {
    let mut pairs: Vec<(&str, &str)> = vec![("s", "a"), ("s", "b"), ("s", "c"), ("s", "d")];
    rotate(&mut pairs, Some(&("s".to_string(), "b".to_string())));
    assert_eq!(pairs, vec![("s", "c"), ("s", "d"), ("s", "a"), ("s", "b")]);
    rotate(&mut pairs, None);
    assert_eq!(pairs[0], ("s", "c"), "no rotation given: the order stays");
    let mut sorted: Vec<(&str, &str)> = vec![("s", "a"), ("s", "c")];
    rotate(&mut sorted, Some(&("s".to_string(), "b".to_string())));
    assert_eq!(sorted, vec![("s", "c"), ("s", "a")], "a tenant that left the queue still places the rotation");
}

#[test]
fn a_budgeted_tenant_takes_what_its_budget_covers_and_the_rest_waits_with_the_reason() {
    let mut queues = Queues::default()
        .add("budgeted", 100, 1000)
        .add("free", 100, 1000)
        .budget("budgeted", 5_500)
        .budget("spent", 0);
    let fairness = Fairness { quantum_bytes: 1000, ..Fairness::default() };
    let picked = queues.pick(&fairness, &mut Rotation::default(), count(40));
    assert_eq!((of(&picked, "budgeted"), of(&picked, "free")), (5, 35));
    let reserved: Vec<Option<u64>> =
        picked.items.iter().zip(&picked.reserved).filter(|(i, _)| i.tenant == "budgeted").map(|(_, r)| *r).collect();
    assert_eq!(reserved, vec![Some(1000); 5], "each at its estimate");
    assert!(picked.items.iter().zip(&picked.reserved).all(|(i, r)| i.tenant == "budgeted" || r.is_none()));
    assert_eq!(
        picked.held,
        vec![BudgetHold { tenant: "budgeted".into(), needed_micros: 1000, left_micros: 500 }],
        "held, with what it needs and has left"
    );
    // A spent budget holds even work that costs nothing to estimate (a worker's claim).
    let mut spent = Queues::default().add("spent", 3, 10).budget("spent", 0);
    let bounds_free = spent.pick(&fairness, &mut Rotation::default(), count(10));
    assert!(bounds_free.items.is_empty());
    assert_eq!(bounds_free.held.len(), 1);
}

#[test]
fn a_flow_passed_over_in_the_middle_of_a_pick_is_first_in_the_next() {
    // One 1 MiB source among 4 KiB ones, picks of two: without the stop before it, the
    // picks alternate [a, m] and [y, z] and m waits ~500 picks for its credit.
    let mut queues = Queues::default().add("a", 100, 4096).add("m", 1, 1 << 20).add("y", 100, 4096).add("z", 100, 4096);
    let fairness = Fairness::default();
    let mut rotation = Rotation::default();
    let mut served_in = None;
    for n in 0..4 {
        let picked = queues.pick(&fairness, &mut rotation, count(2));
        if of(&picked, "m") == 1 {
            served_in = Some(n);
            break;
        }
    }
    assert_eq!(served_in, Some(1), "passed over once, then first");
}

#[test]
fn a_tenants_budget_and_in_flight_limit_hold_across_its_schemas() {
    let item = |tenant: &str, seq: u64| Item { tenant: tenant.into(), seq, bytes: 100 };
    let flows = |n: u64| {
        ["s1@1", "s2@1"].into_iter().map(move |schema| {
            let items: Vec<Item> = (0..n).map(|i| item("acme", i)).collect();
            Ok(Flow::new(schema.to_string(), "acme".to_string(), items.into_iter().map(Ok::<_, Error>)))
        })
    };
    // A budget of 250 at 100 a source: two sources, not two per schema.
    let bounds = Bounds { in_flight: &mut |_| Ok(0), headroom: &mut |_| Ok(Some(250)), cost: &|i: &Item| i.bytes };
    let picked = pick(flows(5), &Fairness::default(), bounds, count(10), &Rotation::default()).expect("pick");
    assert_eq!(picked.items.len(), 2, "{picked:?}");
    // Three in flight of at most five: two more, across both schemas.
    let fairness = Fairness {
        tenants: HashMap::from([("acme".to_string(), share(1, Some(5), Priority::Normal))]),
        ..Fairness::default()
    };
    let bounds = Bounds { in_flight: &mut |_| Ok(3), headroom: &mut |_| Ok(None), cost: &|_: &Item| 0 };
    let picked = pick(flows(5), &fairness, bounds, count(10), &Rotation::default()).expect("pick");
    assert_eq!(picked.items.len(), 2, "{picked:?}");
}
