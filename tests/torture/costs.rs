//! The cost ledger against what was actually paid for. Two independent sources say what
//! was paid: the provider's output files (every success line is a billed call with its
//! own `request_id`) and the worker's own record of its sends (each with its own
//! `request_id`). Every ledger entry must be explained by one of them, every paid call must
//! have exactly one charged entry, and the tenant reports must add up to the entries.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use commitpoint::simulator::{Stats, review};
use serde_json::{Value, json};

use crate::config::{OPENAI_PRICE, WORKER_MODEL, WORKER_PRICE, WORKER_PROVIDER};
use crate::observed::{Kind, WorkerSend};
use crate::simfiles::ProviderFiles;
use crate::workload::World;

/// One ledger entry as `GET /v1/extractions/{id}/costs` shows it.
#[derive(Debug, Clone)]
pub struct Entry {
    pub extraction_id: String,
    pub tenant: String,
    pub kind: Kind,
    pub attempt: u64,
    pub provider: String,
    pub raw: Value,
}

impl Entry {
    fn number(&self, key: &str) -> u64 {
        self.raw[key].as_u64().unwrap_or_else(|| panic!("no {key} in {:#}", self.raw))
    }

    fn request_id(&self) -> &str {
        self.raw["request_id"].as_str().unwrap_or_else(|| panic!("an entry without request_id: {:#}", self.raw))
    }
}

/// What the ledger held, for the summary.
#[derive(Debug, Default)]
pub struct CostSeen {
    pub entries: usize,
    /// (provider, kind) → entries.
    pub by_kind: BTreeMap<(String, Kind), u64>,
    pub charged_micros: u64,
    pub billed_lines: usize,
    pub torn_lines: usize,
    /// Worker calls charged more than once (a lost send charged, then its resend refused
    /// and charged again): see docs/RELIABILITY.md, finding 2.
    pub double_charged_calls: Vec<String>,
}

/// Reads every extraction's entries, checks them against the provider's files and the
/// worker's sends, and the tenant reports against the entries.
pub async fn check(
    world: &World,
    by_id: &BTreeMap<String, Value>,
    tenants: &[&str],
    files: &ProviderFiles,
    sim: &Stats,
) -> (CostSeen, Vec<Entry>) {
    let mut seen = CostSeen::default();
    let mut entries = Vec::new();
    for (id, record) in by_id {
        let reply = world.endpoint.get(&format!("/v1/extractions/{id}/costs")).await;
        assert_eq!(reply.body["tenant"], record["tenant"], "{:#}", reply.body);
        let listed = reply.body["attempts"].as_array().expect("attempts array");
        let sum: u64 = listed.iter().map(|e| e["cost_micros"].as_u64().expect("cost_micros")).sum();
        assert_eq!(reply.body["charged_micros"], json!(sum), "{id}: charged_micros is the sum of its entries");
        seen.charged_micros += sum;
        for raw in listed {
            let entry = Entry {
                extraction_id: id.clone(),
                tenant: record["tenant"].as_str().expect("tenant").to_string(),
                kind: Kind::parse(raw["kind"].as_str().expect("kind")),
                attempt: raw["attempt"].as_u64().expect("attempt"),
                provider: raw["provider"].as_str().expect("provider").to_string(),
                raw: raw.clone(),
            };
            *seen.by_kind.entry((entry.provider.clone(), entry.kind)).or_default() += 1;
            entries.push(entry);
        }
    }
    seen.entries = entries.len();
    for tenant in tenants {
        tenant_report_adds_up(world, tenant, &entries).await;
    }
    provider_entries_match_billed_lines(world, &entries, files, sim);
    seen.billed_lines = files.billed.len();
    seen.torn_lines = files.torn.len();
    // The brief's invariant, spelled out: paid provider attempts in the ledger are the
    // simulator's billed lines, less the torn ones nobody could read.
    let openai = |kind| seen.by_kind.get(&("openai".to_string(), kind)).copied().unwrap_or(0);
    assert_eq!(
        openai(Kind::Fresh) + openai(Kind::FailedValidation),
        sim.lines_completed - files.torn.len() as u64,
        "charged provider entries vs lines_completed ({}) less torn lines ({})",
        sim.lines_completed,
        files.torn.len()
    );
    seen.double_charged_calls = worker_entries_match_sends(&entries, &world.observed.sends());
    let others: Vec<&Entry> =
        entries.iter().filter(|e| e.provider != "openai" && e.provider != WORKER_PROVIDER).collect();
    assert!(others.is_empty(), "entries of a provider nobody used: {others:#?}");
    (seen, entries)
}

fn bucket(entries: &[&Entry], kind: Kind) -> Value {
    let of_kind: Vec<&&Entry> = entries.iter().filter(|e| e.kind == kind).collect();
    let sum = |key: &str| of_kind.iter().map(|e| e.number(key)).sum::<u64>();
    // A paid entry no price row priced; replays cost nothing, priced or not.
    let unpriced = of_kind.iter().filter(|e| e.kind != Kind::Replay && e.raw["cost_source"] == "unpriced").count();
    json!({
        "attempts": of_kind.len(),
        "input_tokens": sum("input_tokens"),
        "output_tokens": sum("output_tokens"),
        "cost_micros": sum("cost_micros"),
        "unpriced_attempts": unpriced,
    })
}

/// The tenant's report, split by kind and grouped by provider, is the sum of its entries.
async fn tenant_report_adds_up(world: &World, tenant: &str, entries: &[Entry]) {
    let path = format!("/v1/tenants/{tenant}/costs?from=2000-01-01&to=2100-01-01&group_by=provider");
    let report = world.endpoint.get(&path).await.body;
    let mine: Vec<&Entry> = entries.iter().filter(|e| e.tenant == tenant).collect();
    for (name, kind) in
        [("fresh", Kind::Fresh), ("replay", Kind::Replay), ("failed_validation", Kind::FailedValidation)]
    {
        assert_eq!(report[name], bucket(&mine, kind), "tenant {tenant}: {name} differs from its entries: {report:#}");
        let providers: BTreeSet<&str> = mine.iter().map(|e| e.provider.as_str()).collect();
        for provider in providers {
            let theirs: Vec<&Entry> = mine.iter().copied().filter(|e| e.provider == provider).collect();
            assert_eq!(
                report["groups"][provider][name],
                bucket(&theirs, kind),
                "tenant {tenant}, {provider}: {report:#}"
            );
        }
    }
    let charged: u64 = mine.iter().map(|e| e.number("cost_micros")).sum();
    assert_eq!(report["charged_micros"], json!(charged), "tenant {tenant}: {report:#}");
}

/// Every success line the provider billed has exactly one charged entry (failed_validation
/// when its answer breaks the schema), on its member, naming its batch, with its tokens
/// and the batch price; replays name a billed line too and cost nothing. Torn lines were
/// billed but cannot be read, so they have no entry: they are the only difference between
/// the simulator's count of billed lines and the ledger.
fn provider_entries_match_billed_lines(world: &World, entries: &[Entry], files: &ProviderFiles, sim: &Stats) {
    assert!(files.live.is_empty(), "batches still live at the provider after the drain: {:?}", files.live);
    assert_eq!(
        (files.billed.len() + files.torn.len()) as u64,
        sim.lines_completed,
        "billed lines read back (intact + torn) vs the simulator's count"
    );
    let mut charged: HashMap<&str, u64> = HashMap::new();
    for entry in entries.iter().filter(|e| e.provider == "openai") {
        let request_id = entry.request_id();
        let line = files.billed.get(request_id).unwrap_or_else(|| {
            panic!("a provider entry for no billed line: {:#} (of {})", entry.raw, entry.extraction_id)
        });
        assert_eq!(line.custom_id, entry.extraction_id, "{request_id}: entry on another extraction");
        assert_eq!(entry.raw["job_id"], json!(line.batch_id), "{request_id}: {:#}", entry.raw);
        let usage = (entry.raw["model"].as_str(), entry.number("input_tokens"), entry.number("output_tokens"));
        assert_eq!(usage, (Some(line.model.as_str()), line.input_tokens, line.output_tokens), "{request_id}");
        let list = OPENAI_PRICE.cost(line.input_tokens, line.output_tokens, true);
        let cost = if entry.kind.charged() { list } else { 0 };
        assert_eq!((entry.number("list_cost_micros"), entry.number("cost_micros")), (list, cost), "{:#}", entry.raw);
        assert_eq!(entry.raw["cost_source"], json!("price_table"), "{:#}", entry.raw);
        if entry.kind.charged() {
            *charged.entry(request_id).or_default() += 1;
            let source = world.source(&line.custom_id).expect("a billed member was sent");
            let valid =
                serde_json::from_str::<Value>(&line.content).ok() == Some(review(&source.source_id, &source.content));
            let want = if valid { Kind::Fresh } else { Kind::FailedValidation };
            assert_eq!(entry.kind, want, "{request_id}: the answer was {}", line.content);
        }
    }
    for (request_id, line) in &files.billed {
        let n = charged.get(request_id.as_str()).copied().unwrap_or(0);
        assert_eq!(n, 1, "billed line {request_id} ({} in {}) has {n} charged entries", line.custom_id, line.batch_id);
    }
}

/// Each answered send wrote exactly the entry its answer implies, each lost one at most
/// one; nothing else wrote an `external` entry. Returns the calls charged more than once,
/// after checking each is the known pattern (a lost send charged, resends refused 409).
fn worker_entries_match_sends(entries: &[Entry], sends: &[WorkerSend]) -> Vec<String> {
    let by_request: HashMap<&str, &WorkerSend> = sends.iter().map(|s| (s.request_id.as_str(), s)).collect();
    let mut found: HashMap<&str, Vec<&Entry>> = HashMap::new();
    for entry in entries.iter().filter(|e| e.provider == WORKER_PROVIDER) {
        let request_id = entry.request_id();
        let send = by_request
            .get(request_id)
            .unwrap_or_else(|| panic!("a worker entry no send explains: {:#} ({})", entry.raw, entry.extraction_id));
        assert_eq!(send.extraction_id, entry.extraction_id, "{request_id}");
        let usage = (entry.raw["model"].as_str(), entry.number("input_tokens"), entry.number("output_tokens"));
        assert_eq!(usage, (Some(WORKER_MODEL), send.input_tokens, send.output_tokens), "{request_id}");
        let list = WORKER_PRICE.cost(send.input_tokens, send.output_tokens, false);
        let cost = if entry.kind.charged() { list } else { 0 };
        assert_eq!((entry.number("list_cost_micros"), entry.number("cost_micros")), (list, cost), "{:#}", entry.raw);
        found.entry(request_id).or_default().push(entry);
    }
    let mut calls: BTreeMap<u64, Vec<(&WorkerSend, Option<Kind>)>> = BTreeMap::new();
    for send in sends {
        let got = found.get(send.request_id.as_str()).map(Vec::as_slice).unwrap_or_default();
        let kinds: Vec<Kind> = got.iter().map(|e| e.kind).collect();
        match send.expect {
            Some(kind) => assert_eq!(kinds, vec![kind], "send {} answered {}", send.request_id, send.answer),
            None => assert!(kinds.len() <= 1, "lost send {} has entries {kinds:?}", send.request_id),
        }
        calls.entry(send.call).or_default().push((send, kinds.first().copied()));
    }
    let mut double = Vec::new();
    for (call, sends) in calls {
        let charged: Vec<&(&WorkerSend, Option<Kind>)> =
            sends.iter().filter(|(_, k)| k.is_some_and(Kind::charged)).collect();
        if charged.len() <= 1 {
            continue;
        }
        let pattern = charged[0].0.expect.is_none()
            && charged[1..].iter().all(|(s, k)| *k == Some(Kind::Fresh) && s.answer.starts_with("409"));
        let story: Vec<String> = sends.iter().map(|(s, k)| format!("{} {k:?} ({})", s.request_id, s.answer)).collect();
        assert!(pattern, "worker call {call} charged {} times, not the known pattern: {story:#?}", charged.len());
        double.push(format!("{} on {}", story.join(" → "), sends[0].0.extraction_id));
    }
    double
}
