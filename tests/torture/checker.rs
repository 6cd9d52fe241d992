//! The outside checker, run once everything has drained: it trusts only what the clients
//! were told (the ledger), what the simulator counted and served, what the downstream
//! receiver got, and what the API now answers.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};

use commitpoint::simulator::{Stats, review};
use serde_json::{Value, json};

use crate::config::WEBHOOK_TENANT;
use crate::costs::CostSeen;
use crate::events::EventSeen;
use crate::hooks::HookSeen;
use crate::receiver::Receiver;
use crate::simfiles::ProviderFiles;
use crate::workload::{SCHEMA, TENANTS, World};

/// What the checker saw, for the summary and the cross-check with `verify`.
#[derive(Debug, Default)]
pub struct Seen {
    pub extractions: usize,
    pub findings: usize,
    pub acks: usize,
    pub duplicate_acks: usize,
    pub acked_identities: usize,
    pub created_answers: usize,
    pub unacked_sent: usize,
    pub resubmitted_members: usize,
    pub costs: CostSeen,
    pub events: EventSeen,
    pub hooks: HookSeen,
}

fn text<'a>(record: &'a Value, key: &str) -> &'a str {
    record[key].as_str().unwrap_or_else(|| panic!("no {key} in {record:#}"))
}

pub async fn check(world: &World, sim: &Stats, files: &ProviderFiles, receiver: &Receiver) -> Seen {
    let mut seen = Seen::default();
    let listed = world.endpoint.list_all("").await;
    seen.extractions = listed.len();
    let (sent, acks) = {
        let ledger = world.ledger();
        (ledger.sent.clone(), ledger.acks.clone())
    };

    // One record per id and per identity; each is something a client sent, as sent.
    let mut by_id: BTreeMap<String, Value> = BTreeMap::new();
    let mut identities = HashSet::new();
    for record in listed {
        let id = text(&record, "extraction_id").to_string();
        let source =
            sent.get(&id).unwrap_or_else(|| panic!("extraction {id} exists but no client sent it: {record:#}"));
        assert_eq!(
            (text(&record, "tenant"), text(&record, "source_id"), text(&record, "schema")),
            (source.tenant.as_str(), source.source_id.as_str(), SCHEMA),
            "{id}"
        );
        assert_eq!(text(&record, "source_hash"), source.source_hash, "{id}: source hash of the content sent");
        let identity = (source.tenant.clone(), source.source_id.clone(), source.source_hash.clone(), SCHEMA);
        assert!(identities.insert(identity), "two extractions of one identity: {record:#}");
        assert!(by_id.insert(id.clone(), record).is_none(), "{id} listed twice");
    }

    // Listing by tenant shows each tenant's extractions once, and only those.
    let tenants: Vec<&str> = TENANTS.iter().copied().chain([WEBHOOK_TENANT]).collect();
    for tenant in &tenants {
        let mut listed_ids = BTreeSet::new();
        for record in world.endpoint.list_all(&format!("tenant={tenant}&")).await {
            assert_eq!(text(&record, "tenant"), *tenant, "{record:#}");
            let id = text(&record, "extraction_id").to_string();
            assert!(listed_ids.insert(id.clone()), "{id} listed twice for tenant {tenant}");
        }
        let expected: BTreeSet<String> =
            by_id.iter().filter(|(_, r)| r["tenant"] == json!(tenant)).map(|(id, _)| id.clone()).collect();
        assert_eq!(listed_ids, expected, "tenant {tenant}: listing by tenant differs from the full listing");
    }

    // Every acknowledged intake exists under the id it was given; at most one intake of
    // an identity was ever told `created: true`.
    let mut created: HashMap<&str, usize> = HashMap::new();
    for ack in &acks {
        assert!(by_id.contains_key(&ack.id), "intake acknowledged in round {} is gone: {}", ack.round, ack.id);
        if ack.created {
            *created.entry(ack.id.as_str()).or_default() += 1;
        }
    }
    for (id, n) in &created {
        assert_eq!(*n, 1, "{id} was answered `created: true` {n} times");
    }
    seen.acks = acks.len();
    seen.created_answers = created.len();
    let acked: HashSet<&str> = acks.iter().map(|a| a.id.as_str()).collect();
    seen.acked_identities = acked.len();
    seen.duplicate_acks = acks.iter().filter(|a| !a.created).count();
    seen.unacked_sent = sent.keys().filter(|id| !acked.contains(id.as_str())).count();

    // After the drain and the retries, everything is committed with exactly the findings
    // of the simulated reviewer, each stored once.
    let mut finding_keys = HashSet::new();
    let mut stored_findings: BTreeMap<String, Vec<Value>> = BTreeMap::new();
    for (id, record) in &by_id {
        assert_eq!(record["state"], json!("committed"), "not committed after the drain: {record:#}");
        let source = &sent[id];
        let reply = world.endpoint.get(&format!("/v1/extractions/{id}/findings")).await;
        let findings = reply.body["findings"].as_array().expect("findings array");
        stored_findings.insert(id.clone(), findings.clone());
        let mut got: Vec<Value> = Vec::new();
        for finding in findings {
            let key = text(finding, "finding_key").to_string();
            assert!(finding_keys.insert(key.clone()), "finding key {key} stored twice (in {id})");
            let mut finding = finding.clone();
            if let Some(fields) = finding.as_object_mut() {
                fields.remove("finding_key");
            }
            got.push(finding);
        }
        let mut want = review(&source.source_id, &source.content)["findings"].as_array().cloned().unwrap_or_default();
        let order = |f: &Value| f.to_string();
        got.sort_by_key(order);
        want.sort_by_key(order);
        assert_eq!(got, want, "{id} ({} / {}): findings differ from the reviewer's", source.tenant, source.source_id);
        seen.findings += findings.len();
    }

    // DESIGN §6.4 as the provider saw it: no member was ever in two live batches at once,
    // every member sent is a known extraction, and no attempt was bought twice.
    assert_eq!(sim.max_live_batches_per_custom_id, 1, "a member was in two live batches at once: {sim:#?}");
    for (custom_id, submitted) in &sim.submissions_per_custom_id {
        let record = by_id.get(custom_id).unwrap_or_else(|| panic!("the provider got unknown member {custom_id}"));
        let attempts = record["attempts"].as_u64().unwrap_or_default();
        // A batch that failed validation ran nothing and billed nothing: its members come
        // back as the same attempt, so only batches that ran count against the attempts.
        let unrun = sim.unrun_submissions_per_custom_id.get(custom_id).copied().unwrap_or_default();
        let batches = &submitted.saturating_sub(unrun);
        assert!(
            *batches <= attempts,
            "{custom_id} went to the provider in {batches} batches over {attempts} attempts: {record:#}"
        );
        if *batches > 1 {
            seen.resubmitted_members += 1;
        }
    }

    // The ledger against what the provider billed and what the worker sent.
    let (costs, entries) = crate::costs::check(world, &by_id, &tenants, files, sim).await;
    seen.costs = costs;

    // The outbox has delivered everything, and the receiver saw each event as it should.
    for state in ["pending", "dead"] {
        let reply = world.endpoint.get(&format!("/v1/outbox?state={state}")).await;
        assert_eq!(reply.body["events"], json!([]), "{state} outbox events after the drain: {:#}", reply.body);
    }
    let failures = world.observed.failures().clone();
    let expected = crate::events::Expected {
        records: &by_id,
        findings: &stored_findings,
        ledger: &entries,
        failures: &failures,
        files,
    };
    seen.events = crate::events::check(&receiver.deliveries(), &expected);
    seen.hooks = crate::hooks::check(world);
    seen
}
