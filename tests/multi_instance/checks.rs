//! The end-of-run audit: what clients and workers were told, what the simulator billed,
//! what the database holds and what the API answers must agree.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;

use crate::support::postgres::Cluster;
use crate::world::{World, lock};
use commitpoint::simulator::{Stats, review};

/// One extraction as the database holds it.
#[derive(Debug)]
struct Row {
    state: i64,
    findings: u64,
    results: u64,
}

fn rows(cluster: &Cluster, database: &str) -> HashMap<String, Row> {
    let out = cluster.psql(
        database,
        "SELECT encode(e.id, 'hex'), e.state_code, \
           (SELECT count(*) FROM findings f WHERE f.extraction_seq = e.seq), \
           (SELECT count(*) FROM results r WHERE r.extraction_seq = e.seq) \
         FROM extractions e",
    );
    let mut rows = HashMap::new();
    for line in out.lines().filter(|l| !l.is_empty()) {
        let f: Vec<&str> = line.split('|').collect();
        let n = |i: usize| f[i].parse::<u64>().unwrap_or_else(|_| panic!("a number in {line:?}"));
        let row = Row {
            state: f[1].parse().unwrap_or_else(|_| panic!("a state in {line:?}")),
            findings: n(2),
            results: n(3),
        };
        assert!(rows.insert(f[0].to_string(), row).is_none(), "identity {} stored twice", f[0]);
    }
    rows
}

/// One ledger entry: (extraction, provider, request id, replay).
type Entry = (String, String, String, bool);

fn ledger(cluster: &Cluster, database: &str) -> Vec<Entry> {
    let out = cluster.psql(
        database,
        "SELECT encode(e.id, 'hex'), l.provider, coalesce(l.request_id, ''), l.replay \
         FROM ledger l JOIN extractions e ON e.seq = l.extraction_seq",
    );
    out.lines()
        .filter(|l| !l.is_empty())
        .map(|line| {
            let f: Vec<&str> = line.split('|').collect();
            assert_eq!(f.len(), 4, "a ledger row: {line:?}");
            (f[0].to_string(), f[1].to_string(), f[2].to_string(), f[3] == "t")
        })
        .collect()
}

/// Every event the outbox holds, through the API (the sink refuses, so none was delivered
/// and all are listed as pending or dead): (extraction, type) → count.
async fn outbox_events(world: &World, base: &str) -> (BTreeMap<(String, String), u64>, u64) {
    let mut events = BTreeMap::new();
    let mut total = 0;
    for state in ["pending", "dead"] {
        let mut after = 0u64;
        loop {
            let path = format!("/v1/outbox?state={state}&limit=1000&after={after}");
            let (status, page) = world.call(base, &path, None).await.expect("list the outbox");
            assert_eq!(status, 200, "{page}");
            for event in page["events"].as_array().expect("events") {
                let id = event["extraction_id"].as_str().expect("extraction_id").to_string();
                let kind = event["type"].as_str().expect("type").to_string();
                *events.entry((id, kind)).or_default() += 1;
                total += 1;
            }
            match page["next"].as_u64() {
                Some(next) => after = next,
                None => break,
            }
        }
    }
    (events, total)
}

/// Every acknowledged identity, read back through the instances in turn.
async fn acks_readable(world: &Arc<World>, acked: &[String]) {
    let bases = world.live.any();
    assert!(!bases.is_empty(), "no instance is up for the final reads");
    let mut tasks = tokio::task::JoinSet::new();
    for (n, chunk) in acked.chunks(acked.len().div_ceil(16).max(1)).enumerate() {
        let (world, chunk, base) = (Arc::clone(world), chunk.to_vec(), bases[n % bases.len()].clone());
        tasks.spawn(async move {
            for id in chunk {
                let source = lock(&world.sent).get(&id).cloned().expect("an acknowledged id was sent");
                let (status, record) =
                    world.call(&base, &format!("/v1/extractions/{id}"), None).await.expect("read an extraction");
                assert_eq!(status, 200, "acknowledged intake {id} is missing: {record}");
                assert_eq!(
                    (record["tenant"].as_str(), record["source_id"].as_str(), record["state"].as_str()),
                    (Some(source.tenant.as_str()), Some(source.source_id.as_str()), Some("committed")),
                    "{id}: {record}"
                );
            }
        });
    }
    while let Some(done) = tasks.join_next().await {
        if let Err(e) = done {
            std::panic::resume_unwind(e.into_panic());
        }
    }
}

/// What the audit counted, for the summary.
pub struct Audit {
    pub extractions: usize,
    pub acked: usize,
    pub by_batch: u64,
    pub by_workers: u64,
    pub worker_charges: u64,
    pub findings: u64,
    pub replay_entries: u64,
    pub outbox_events: u64,
}

pub async fn run(world: &Arc<World>, cluster: &Cluster, database: &str, stats: &Stats) -> Audit {
    let rows = rows(cluster, database);
    let sent = lock(&world.sent).clone();
    let acks = lock(&world.acks).clone();
    let mut acked: Vec<String> = acks.keys().cloned().collect();
    acked.sort();

    // Every acknowledged intake is there, once; nothing is there that no client sent.
    for id in &acked {
        assert!(rows.contains_key(id), "acknowledged intake {id} ({:?}) is not in the database", sent.get(id));
    }
    for id in rows.keys() {
        assert!(sent.contains_key(id), "the database holds {id}, which no client sent");
    }
    for (id, n) in lock(&world.created).iter() {
        assert_eq!(*n, 1, "{id} was answered `201 created` {n} times");
    }
    acks_readable(world, &acked).await;

    // Committed once: one raw result and the reviewer's findings once.
    let mut findings = 0;
    for (id, row) in &rows {
        let source = &sent[id];
        let expected = review(&source.source_id, &source.content)["findings"].as_array().map_or(0, Vec::len) as u64;
        assert_eq!(row.state, 3, "{id} is not committed after the drain: {row:?}");
        assert_eq!(row.results, 1, "{id}: raw results {row:?}");
        assert_eq!(row.findings, expected, "{id}: findings stored vs the reviewer's answer {row:?}");
        findings += row.findings;
    }

    // Money: every paid call is charged once (a resend of the same call is a replay), a
    // batch answer once per member, and a worker's call whether or not its answer was
    // used (a stale worker still paid for its model call).
    let entries = ledger(cluster, database);
    let mut charged: HashMap<(String, String, String), u64> = HashMap::new();
    let mut by_batch: HashMap<String, u64> = HashMap::new();
    let mut worker_calls: HashSet<String> = HashSet::new();
    let mut replays = 0;
    for (id, provider, request_id, replay) in &entries {
        if *replay {
            replays += 1;
            continue;
        }
        *charged.entry((id.clone(), provider.clone(), request_id.clone())).or_default() += 1;
        match provider.as_str() {
            "openai" => *by_batch.entry(id.clone()).or_default() += 1,
            "external" => {
                worker_calls.insert(request_id.clone());
            }
            other => panic!("a ledger entry of provider {other:?}"),
        }
    }
    for (key, n) in &charged {
        assert!(key.2.is_empty() || *n == 1, "one call charged {n} times: {key:?}");
    }
    for (id, n) in &by_batch {
        assert_eq!(*n, 1, "{id}: the batch answer charged {n} times");
    }
    for id in rows.keys() {
        let paid = charged.keys().any(|(charged_id, _, _)| charged_id == id);
        assert!(paid, "{id} is committed with no charge");
    }
    let posted = lock(&world.posted_calls).clone();
    for call in lock(&world.answered_calls).iter() {
        assert!(worker_calls.contains(call), "the answered worker call {call} is not charged");
    }
    for call in &worker_calls {
        assert!(posted.contains(call), "a charge for worker call {call}, which no worker made");
    }
    // A fresh commit a worker was told of is the one stored (not the batch's).
    for id in lock(&world.fresh).keys() {
        assert!(!by_batch.contains_key(id), "{id}: a worker was told it committed, but the batch answer is charged");
    }
    let by_batch = by_batch.len() as u64;

    // The provider: no member in two live batches, nothing submitted twice, and the
    // ledger charges exactly the lines it billed.
    assert_eq!(stats.max_live_batches_per_custom_id, 1, "a member was in two live batches at once: {stats:#?}");
    for (custom_id, n) in &stats.submissions_per_custom_id {
        let unrun = stats.unrun_submissions_per_custom_id.get(custom_id).copied().unwrap_or(0);
        assert_eq!(n - unrun, 1, "{custom_id} was submitted {n} times ({unrun} never run)");
    }
    assert_eq!((stats.lines_failed, stats.lines_truncated, stats.lines_refused), (0, 0, 0), "{stats:#?}");
    assert_eq!(by_batch, stats.lines_completed, "ledger entries of openai vs lines the simulator billed");
    assert_eq!(stats.submissions_per_custom_id.len() as u64, stats.lines_completed, "{stats:#?}");
    // Every batch the provider created, also by a driver paused or cut off meanwhile, is
    // one the store knows and has finished: none was orphaned.
    let known: u64 = cluster
        .psql(database, "SELECT count(DISTINCT job_id) FROM batches WHERE job_id IS NOT NULL")
        .parse()
        .expect("a count");
    assert_eq!(stats.batches_created, known, "batches created at the provider vs known to the store: {stats:#?}");
    let unfinished = cluster.psql(database, "SELECT count(*) FROM batches WHERE state_code <> 2");
    assert_eq!(unfinished, "0", "batches left open after the drain");

    // One `committed` event per extraction for the one sink, and nothing else.
    let base = world.live.any().first().cloned().expect("an instance is up");
    let (events, listed) = outbox_events(world, &base).await;
    let in_db: u64 = cluster.psql(database, "SELECT count(*) FROM outbox").parse().expect("a count");
    assert_eq!(listed, in_db, "every outbox event is pending or dead (the sink refuses all)");
    for id in rows.keys() {
        let n = events.get(&(id.clone(), "extraction.committed".to_string())).copied().unwrap_or(0);
        assert_eq!(n, 1, "{id}: {n} committed events");
    }
    assert_eq!(listed, rows.len() as u64, "events other than one `committed` per extraction: {events:?}");

    Audit {
        extractions: rows.len(),
        acked: acked.len(),
        by_batch,
        by_workers: rows.len() as u64 - by_batch,
        worker_charges: worker_calls.len() as u64,
        findings,
        replay_entries: replays,
        outbox_events: listed,
    }
}
