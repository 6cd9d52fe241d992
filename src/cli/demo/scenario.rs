//! The demo's script, spoken over HTTP to a running server.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use anyhow::bail;
use serde_json::{Value, json};

use super::api::Api;
use super::corpus::{REVISION, SOURCES};
use crate::simulator;

const COPIES_PER_SOURCE: usize = 4;
const SHORT_LEASE_SECONDS: u64 = 1;
/// The source whose first model answer fails the schema.
const CONFUSED_SOURCE: &str = "etl#9";

#[derive(Debug, Default)]
pub(super) struct Summary {
    failed: Vec<String>,
}

impl Summary {
    pub(super) fn check(&mut self, what: &str, ok: bool) {
        println!("  [{}] {what}", if ok { "ok" } else { "FAILED" });
        if !ok {
            self.failed.push(what.to_string());
        }
    }

    pub(super) fn all_checks_passed(&self) -> bool {
        self.failed.is_empty()
    }
}

pub(super) fn short(id: &Value) -> String {
    id.as_str().unwrap_or("?").chars().take(12).collect()
}

pub(super) async fn run(base: &str) -> anyhow::Result<Summary> {
    let api = Api { base: base.to_string(), http: reqwest::Client::new() };
    let mut summary = Summary::default();
    let ids = intake_with_duplicates(&api, &mut summary).await?;
    let lost = worker_dies_holding_a_lease(&api).await?;
    let reasked = healthy_workers(&api, &mut summary).await?;
    takeover_after_expiry(&api, &lost, reasked.as_deref(), &mut summary).await?;
    stale_worker_posts_late(&api, &lost, &mut summary).await?;
    report(&api, &ids, &mut summary).await?;
    revisions(&api, &mut summary).await?;
    Ok(summary)
}

/// The source that got a second revision: which one is current, and what changed.
async fn revisions(api: &Api, summary: &mut Summary) -> anyhow::Result<()> {
    println!("\n  the revisions of {} (its second intake had new content):", REVISION.source_id);
    let source_id = REVISION.source_id.replace('#', "%23");
    let source = api.get(&format!("/v1/sources/{}/{source_id}?schema=code-review", REVISION.tenant)).await?;
    let revisions = source["revisions"].as_array().cloned().unwrap_or_default();
    for r in &revisions {
        println!(
            "    {} {} (superseded by {})",
            short(&r["extraction_id"]),
            r["state"].as_str().unwrap_or("?"),
            r["superseded_by"].as_str().map_or("nothing: current".to_string(), |s| s.chars().take(12).collect())
        );
    }
    let current = source["current"]["extraction_id"].clone();
    let older_points_at_newer = revisions.len() == 2 && revisions[0]["superseded_by"] == current;
    summary.check("the newer revision is current and supersedes the older one", older_points_at_newer);
    let id = current.as_str().unwrap_or_default();
    let diff = api.get(&format!("/v1/extractions/{id}/diff?against=previous")).await?;
    let counts = &diff["counts"];
    println!(
        "    findings against the previous revision: {} introduced, {} resolved, {} unchanged",
        counts["introduced"], counts["resolved"], counts["unchanged"]
    );
    let older = revisions.first().and_then(|r| r["extraction_id"].as_str()).unwrap_or_default();
    let findings_of = |id: &str| {
        let path = format!("/v1/extractions/{id}/findings?limit=1000");
        async move { Ok::<_, anyhow::Error>(api.get(&path).await?["findings"].as_array().map_or(0, Vec::len) as u64) }
    };
    let (new, old) = (findings_of(id).await?, findings_of(older).await?);
    let count = |k: &str| counts[k].as_u64().unwrap_or(u64::MAX / 4);
    summary.check(
        "the diff accounts for every finding of both revisions",
        count("introduced") + count("unchanged") == new && count("resolved") + count("unchanged") == old,
    );
    Ok(())
}

async fn intake_with_duplicates(api: &Api, summary: &mut Summary) -> anyhow::Result<BTreeSet<String>> {
    println!(
        "== 1. intake: {} sources, each sent {COPIES_PER_SOURCE} times at once (duplicates and redeliveries) ==",
        SOURCES.len()
    );
    let mut requests = tokio::task::JoinSet::new();
    for source in SOURCES {
        for _ in 0..COPIES_PER_SOURCE {
            let api = api.clone();
            requests.spawn(async move { api.intake(source).await });
        }
    }
    let (mut created, mut duplicates, mut ids) = (0, 0, BTreeSet::new());
    while let Some(answer) = requests.join_next().await {
        let (status, body) = answer??;
        match (status, body["created"].as_bool()) {
            (201, Some(true)) => created += 1,
            (200, Some(false)) => duplicates += 1,
            _ => bail!("intake: unexpected answer {status} {body}"),
        }
        ids.insert(body["extraction_id"].as_str().unwrap_or_default().to_string());
    }
    println!(
        "  {} requests → {created} created, {duplicates} acknowledged as duplicates",
        SOURCES.len() * COPIES_PER_SOURCE
    );
    summary.check(
        "one extraction per identity (one `created:true` each)",
        created == SOURCES.len() && ids.len() == SOURCES.len(),
    );
    let (status, body) = api.intake(&REVISION).await?;
    println!(
        "  a new revision of {} → {status}, a new extraction {}",
        REVISION.source_id,
        short(&body["extraction_id"])
    );
    summary.check("changed content under the same source_id is a new extraction", status == 201);
    ids.insert(body["extraction_id"].as_str().unwrap_or_default().to_string());
    Ok(ids)
}

async fn worker_dies_holding_a_lease(api: &Api) -> anyhow::Result<Vec<Value>> {
    println!("\n== 2. worker-lost claims 2 extractions with a {SHORT_LEASE_SECONDS}s lease, then goes silent ==");
    let lost = api.claim("worker-lost", 2, SHORT_LEASE_SECONDS).await?;
    for claim in &lost {
        println!(
            "  worker-lost holds {} ({})",
            short(&claim["extraction_id"]),
            claim["source_id"].as_str().unwrap_or("?")
        );
    }
    Ok(lost)
}

/// Returns the id of the extraction whose answer was re-asked, when worker-a held it.
async fn healthy_workers(api: &Api, summary: &mut Summary) -> anyhow::Result<Option<String>> {
    let mut reasked = None;
    println!("\n== 3. worker-a claims the rest and posts model output ==");
    let claims = api.claim("worker-a", 100, 30).await?;
    summary.check("leased work is not handed out twice", claims.len() == SOURCES.len() + 1 - 2);
    for claim in &claims {
        let source_id = claim["source_id"].as_str().unwrap_or_default();
        if source_id == CONFUSED_SOURCE {
            let (status, body) = api
                .post_result(claim, simulator::broken_review(source_id, claim["content"].as_str().unwrap_or_default()))
                .await?;
            println!(
                "  {source_id}: the model's answer fails the schema → {status} {}: back to the queue to be asked again ({} issue(s))",
                body["error"]["code"],
                body["error"]["details"]["issues"].as_array().map_or(0, Vec::len)
            );
            summary.check(
                "schema-violating output is refused with 422 and re-asked, not failed",
                status == 422 && body["error"]["code"] == "reasked",
            );
            let id = claim["extraction_id"].as_str().unwrap_or_default();
            let record = api.get(&format!("/v1/extractions/{id}")).await?;
            println!(
                "  {source_id}: state {}, attempts {}, re-asks {}",
                record["state"], record["attempts"], record["reasks"]
            );
            summary.check(
                "the re-ask is a new attempt of the same extraction",
                record["state"] == "pending" && record["attempts"] == 2,
            );
            reasked = Some(id.to_string());
            continue;
        }
        let output = simulator::review(source_id, claim["content"].as_str().unwrap_or_default());
        let (status, body) = api.post_result(claim, output.clone()).await?;
        println!("  {source_id}: committed {} findings (replay: {})", body["findings"], body["replay"]);
        if source_id == "payments#102" {
            let (again, body) = api.post_result(claim, output).await?;
            println!(
                "  {source_id}: the same result posted again (a retried HTTP call) → {again}, replay: {}",
                body["replay"]
            );
            summary.check("a re-posted result is a replay", again == 200 && body["replay"] == true);
        }
        if status != 200 {
            bail!("{source_id}: commit failed: {status} {body}");
        }
    }
    Ok(reasked)
}

/// `reasked`: the extraction step 3 sent back to be asked again, whose claim must carry its issues.
async fn takeover_after_expiry(
    api: &Api,
    lost: &[Value],
    reasked: Option<&str>,
    summary: &mut Summary,
) -> anyhow::Result<()> {
    println!("\n== 4. the lease runs out; worker-b takes over the lost work and the re-asked one ==");
    tokio::time::sleep(Duration::from_millis(SHORT_LEASE_SECONDS * 1000 + 200)).await;
    let claims = api.claim("worker-b", 100, 30).await?;
    let lost_ids: BTreeSet<&str> = lost.iter().filter_map(|c| c["extraction_id"].as_str()).collect();
    let taken: BTreeSet<&str> = claims.iter().filter_map(|c| c["extraction_id"].as_str()).collect();
    summary.check("expired leases are handed to another worker with a new token", lost_ids.is_subset(&taken));
    for claim in &claims {
        let source_id = claim["source_id"].as_str().unwrap_or_default();
        if reasked.is_some() && claim["extraction_id"].as_str() == reasked {
            let issues = claim["previous_attempt"]["issues"].as_array().cloned().unwrap_or_default();
            if let Some(first) = issues.first() {
                println!(
                    "  worker-b: {source_id} is a re-ask; its claim carries the refused answer and: {} {}",
                    first["path"], first["message"]
                );
            }
            summary.check("a re-ask's claim carries the refused answer and its issues", !issues.is_empty());
        }
        let output = simulator::review(source_id, claim["content"].as_str().unwrap_or_default());
        let (status, body) = api.post_result(claim, output).await?;
        println!("  worker-b: {source_id} → {status}, {} findings", body["findings"]);
    }
    Ok(())
}

async fn stale_worker_posts_late(api: &Api, lost: &[Value], summary: &mut Summary) -> anyhow::Result<()> {
    println!("\n== 5. worker-lost wakes up and posts its (different) answers with its old lease tokens ==");
    for claim in lost {
        let id = claim["extraction_id"].as_str().unwrap_or_default();
        let before = api.get(&format!("/v1/extractions/{id}/findings")).await?;
        let stale_output =
            json!({"findings": [{"rule": "late", "severity": "low", "file": "x", "line": 1, "summary": "late"}]});
        let (status, body) = api.post_result(claim, stale_output).await?;
        let after = api.get(&format!("/v1/extractions/{id}/findings")).await?;
        println!(
            "  {} → {status}, replay: {} (findings unchanged: {})",
            short(&claim["extraction_id"]),
            body["replay"],
            before == after
        );
        summary.check(
            "a late post after takeover is a replay and changes nothing",
            status == 200 && body["replay"] == true && before == after,
        );
    }
    Ok(())
}

async fn report(api: &Api, ids: &BTreeSet<String>, summary: &mut Summary) -> anyhow::Result<()> {
    println!("\n== 6. what is committed ==");
    println!(
        "  {:<8} {:<14} {:<12} {:<10} {:>8} {:>6} {:>8}",
        "tenant", "source_id", "extraction", "state", "attempts", "claims", "findings"
    );
    let mut states: BTreeMap<String, usize> = BTreeMap::new();
    let mut expected_findings_ok = true;
    let mut richest: (usize, String) = (0, String::new());
    for tenant in ["acme", "globex"] {
        let page = api.get(&format!("/v1/extractions?tenant={tenant}&limit=100")).await?;
        for record in page["extractions"].as_array().cloned().unwrap_or_default() {
            let id = record["extraction_id"].as_str().unwrap_or_default();
            let findings = api.get(&format!("/v1/extractions/{id}/findings")).await?;
            let count = findings["findings"].as_array().map_or(0, Vec::len);
            if count > richest.0 {
                richest = (count, id.to_string());
            }
            *states.entry(record["state"].as_str().unwrap_or("?").to_string()).or_default() += 1;
            let source_id = record["source_id"].as_str().unwrap_or_default();
            let content = SOURCES.iter().chain([&REVISION]).find(|s| {
                s.source_id == source_id
                    && crate::domain::identity::SourceHash::compute(s.content.as_bytes(), "code-review@1").to_hex()
                        == record["source_hash"]
            });
            let expected = content.map_or(usize::MAX, |s| distinct_findings(source_id, s.content));
            expected_findings_ok &= expected == count;
            println!(
                "  {:<8} {:<14} {:<12} {:<10} {:>8} {:>6} {:>8}",
                tenant,
                source_id,
                short(&record["extraction_id"]),
                record["state"].as_str().unwrap_or("?"),
                record["attempts"].as_u64().unwrap_or(0),
                record["claims"].as_u64().unwrap_or(0),
                count
            );
        }
    }
    let total: usize = states.values().sum();
    summary.check("every identity has exactly one extraction", total == ids.len());
    summary.check("every extraction is committed", states.get("committed") == Some(&total));
    summary.check("each extraction holds exactly the model's findings (upserted by finding key)", expected_findings_ok);
    let late = redeliver_everything(api).await?;
    summary.check("a redelivery after commit returns the committed extraction, creating nothing", late);
    let id = richest.1;
    if !id.is_empty() {
        let findings = api.get(&format!("/v1/extractions/{id}/findings")).await?;
        let shown: String = id.chars().take(12).collect();
        println!(
            "\n  findings of {shown}…:\n{}",
            serde_json::to_string_pretty(&findings["findings"]).unwrap_or_default()
        );
    }
    Ok(())
}

/// A queue that redelivers every message once more, long after the work was done.
async fn redeliver_everything(api: &Api) -> anyhow::Result<bool> {
    let mut all_known_and_committed = true;
    for source in SOURCES.iter().chain([&REVISION]) {
        let (status, body) = api.intake(source).await?;
        all_known_and_committed &= status == 200 && body["created"] == false && body["state"] == "committed";
    }
    println!(
        "\n  every source redelivered once more → all acknowledged as existing and committed: {all_known_and_committed}"
    );
    Ok(all_known_and_committed)
}

fn distinct_findings(source_id: &str, content: &str) -> usize {
    let review = simulator::review(source_id, content);
    let keys: BTreeSet<String> = review["findings"]
        .as_array()
        .map(|f| f.iter().map(|f| format!("{}|{}|{}", f["rule"], f["file"], f["line"])).collect())
        .unwrap_or_default();
    keys.len()
}
