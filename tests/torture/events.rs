//! The outbox as the downstream receiver saw it. Receivers deduplicate on `webhook-id`, so
//! what matters is the set of distinct ids: exactly one `extraction.committed` per
//! extraction (for the attempt that committed), one `extraction.failed` per attempt that
//! failed, each id always with the same body and a valid signature, and each finally
//! acknowledged. Redeliveries of an id (a kill between the receiver's 2xx and the server
//! recording it, or a refused attempt) are expected, and counted.

use std::collections::{BTreeMap, BTreeSet};

use serde_json::Value;

use crate::costs::Entry;
use crate::observed::{FailedSeen, Kind};
use crate::receiver::Delivery;
use crate::simfiles::ProviderFiles;

#[derive(Debug, Default)]
pub struct EventSeen {
    pub deliveries: usize,
    pub events: usize,
    pub committed: usize,
    pub failed: usize,
    /// Deliveries the receiver refused (500, 503, 429).
    pub refused: usize,
    /// Events acknowledged (2xx) more than once: redelivered after a kill (never by the
    /// process that was told it was taken).
    pub acknowledged_again: usize,
}

/// What the checks need besides the receiver's log.
#[derive(Debug)]
pub struct Expected<'a> {
    pub records: &'a BTreeMap<String, Value>,
    /// API findings (with `finding_key`) per extraction.
    pub findings: &'a BTreeMap<String, Vec<Value>>,
    pub ledger: &'a [Entry],
    pub failures: &'a [FailedSeen],
    pub files: &'a ProviderFiles,
}

/// The receiver's status code, and the round (so the server process) it answered.
type Answer = (u16, i64);

pub fn check(log: &[Delivery], expected: &Expected<'_>) -> EventSeen {
    let mut seen = EventSeen { deliveries: log.len(), ..EventSeen::default() };
    // Per event id: its one body, and the receiver's answers in order.
    let mut events: BTreeMap<&str, (&[u8], Vec<Answer>)> = BTreeMap::new();
    for delivery in log {
        assert_eq!(delivery.signature, Ok(()), "delivery of {} does not verify", delivery.id);
        let (body, answers) = events.entry(delivery.id.as_str()).or_insert((&delivery.body, Vec::new()));
        assert_eq!(
            *body,
            delivery.body.as_slice(),
            "event {} delivered with two bodies:\n{}\n{}",
            delivery.id,
            String::from_utf8_lossy(body),
            String::from_utf8_lossy(&delivery.body)
        );
        answers.push((delivery.status, delivery.round));
    }
    seen.events = events.len();
    seen.refused = log.iter().filter(|d| !(200..300).contains(&d.status)).count();
    // (extraction, attempt) → event ids, per type; failure class per failed event.
    let mut committed: BTreeMap<(&str, u64), BTreeSet<&str>> = BTreeMap::new();
    let mut failed: BTreeMap<(&str, u64), (BTreeSet<&str>, String)> = BTreeMap::new();
    let mut superseded: BTreeMap<&str, BTreeSet<&str>> = BTreeMap::new();
    for (id, (body, answers)) in &events {
        let last = answers.last().copied().unwrap_or_default();
        assert!((200..300).contains(&last.0), "event {id} was never acknowledged: answers (status, round) {answers:?}");
        let taken: Vec<i64> = answers.iter().filter(|(s, _)| (200..300).contains(s)).map(|(_, r)| *r).collect();
        if taken.len() > 1 {
            seen.acknowledged_again += 1;
        }
        assert!(
            taken.windows(2).all(|w| w[0] != w[1]),
            "event {id} redelivered by the process that had it taken: {answers:?}"
        );
        let event: Value = serde_json::from_slice(body).unwrap_or_else(|e| panic!("event {id} is not JSON: {e}"));
        let data = &event["data"];
        let named = data["id"].as_str().unwrap_or_else(|| panic!("event {id} names no extraction: {event:#}"));
        let (extraction, record) =
            expected.records.get_key_value(named).unwrap_or_else(|| panic!("event {id} for unknown {named}"));
        let extraction = extraction.as_str();
        for key in ["tenant", "source_id", "schema"] {
            assert_eq!(data[key], record[key], "event {id}: {key}: {event:#}");
        }
        let attempt = data["attempt"].as_u64().unwrap_or_else(|| panic!("event {id} has no attempt: {event:#}"));
        match event["type"].as_str() {
            Some("extraction.committed") => {
                assert_findings(id, extraction, data, expected);
                committed.entry((extraction, attempt)).or_default().insert(id);
            }
            Some("extraction.failed") => {
                let class = data["failure"]["class"].as_str().unwrap_or_default().to_string();
                let (ids, known) =
                    failed.entry((extraction, attempt)).or_insert_with(|| (BTreeSet::new(), class.clone()));
                ids.insert(id);
                assert_eq!(*known, class, "two failed events of {extraction} attempt {attempt} disagree on the class");
            }
            // A committed revision a newer one superseded: once, naming the link its record holds.
            Some("extraction.superseded") => {
                assert_eq!(data["superseded_by"], record["superseded_by"], "event {id}: {event:#}");
                assert!(data["superseded_by"].is_string(), "event {id} names no newer revision: {event:#}");
                superseded.entry(extraction).or_default().insert(id);
            }
            other => panic!("event {id} has type {other:?}"),
        }
    }
    for (extraction, ids) in &superseded {
        assert_eq!(ids.len(), 1, "{extraction}: a link is never rewritten, yet superseded events {ids:?}");
    }
    seen.committed = committed.len();
    seen.failed = failed.len();

    // One committed event per extraction, for the attempt that committed; none for others.
    for (id, record) in expected.records {
        let attempts = record["attempts"].as_u64().expect("attempts");
        let mine: Vec<(&(&str, u64), &BTreeSet<&str>)> =
            committed.range((id.as_str(), 0)..=(id.as_str(), u64::MAX)).collect();
        assert_eq!(mine.len(), 1, "{id}: committed events for attempts {:?}, committed at {attempts}", mine);
        assert_eq!((mine[0].0.1, mine[0].1.len()), (attempts, 1), "{id}: committed events {mine:?}");
    }

    // A failed event for every attempt that failed, and only before the one that committed.
    for ((extraction, attempt), (ids, class)) in &failed {
        assert_eq!(ids.len(), 1, "{extraction} attempt {attempt}: failed events {ids:?}");
        let attempts = expected.records[*extraction]["attempts"].as_u64().expect("attempts");
        assert!(*attempt < attempts, "{extraction}: a failed event for attempt {attempt}, committed at {attempts}");
        assert!(
            matches!(class.as_str(), "validation" | "invalid_request" | "transient"),
            "{extraction} attempt {attempt}: failure class {class:?}"
        );
    }
    for seen_failed in expected.failures {
        let key = (seen_failed.id.as_str(), seen_failed.attempt);
        let event =
            failed.get(&key).unwrap_or_else(|| panic!("no failed event for an observed failure: {seen_failed:?}"));
        assert_eq!(event.1, seen_failed.class, "{seen_failed:?}");
    }
    // Each failed_validation entry of the ledger is a validation failure's, or a re-ask's: the
    // refused answer of an attempt the re-ask followed (no failed event, a later attempt).
    let by_ledger: BTreeSet<(&str, u64)> = expected
        .ledger
        .iter()
        .filter(|e| e.kind == Kind::FailedValidation)
        .map(|e| (e.extraction_id.as_str(), e.attempt))
        .collect();
    let by_events: BTreeSet<(&str, u64)> =
        failed.iter().filter(|(_, (_, class))| class == "validation").map(|(key, _)| *key).collect();
    assert!(by_events.is_subset(&by_ledger), "validation-failed events without a failed_validation entry");
    for (extraction, attempt) in by_ledger.difference(&by_events) {
        let attempts = expected.records[*extraction]["attempts"].as_u64().expect("attempts");
        assert!(
            *attempt < attempts,
            "{extraction}: a failed_validation charge for attempt {attempt} with neither a failed event nor a re-ask after it"
        );
    }
    // Each batch the provider failed refused the members on the lines it named, once.
    let mut by_batches: BTreeMap<&str, usize> = BTreeMap::new();
    for members in expected.files.failed_batches.values() {
        for member in members {
            *by_batches.entry(member.as_str()).or_default() += 1;
        }
    }
    let mut invalid: BTreeMap<&str, usize> = BTreeMap::new();
    for ((extraction, _), _) in failed.iter().filter(|(_, (_, class))| class == "invalid_request") {
        *invalid.entry(extraction).or_default() += 1;
    }
    assert_eq!(invalid, by_batches, "invalid_request failed events vs members of batches the provider failed");
    seen
}

/// A committed event carries exactly the stored findings.
fn assert_findings(id: &str, extraction: &str, data: &Value, expected: &Expected<'_>) {
    let stored = &expected.findings[extraction];
    let mut want: Vec<(String, Value)> = stored
        .iter()
        .map(|f| {
            let mut body = f.clone();
            let key = body.as_object_mut().and_then(|o| o.remove("finding_key")).unwrap_or(Value::Null);
            (key.as_str().unwrap_or_default().to_string(), body)
        })
        .collect();
    let mut got: Vec<(String, Value)> = data["findings"]
        .as_array()
        .unwrap_or_else(|| panic!("event {id} has no findings"))
        .iter()
        .map(|f| {
            // The API's shape; the old `key`/`finding` (kept a release) say the same again.
            let mut body = f.clone();
            let fields = body.as_object_mut().unwrap_or_else(|| panic!("event {id}: a finding is not an object"));
            let key = fields.remove("finding_key").unwrap_or(Value::Null);
            assert_eq!(fields.remove("key").as_ref(), Some(&key), "event {id}: the old key differs");
            let old = fields.remove("finding").unwrap_or(Value::Null);
            assert_eq!(old, Value::Object(fields.clone()), "event {id}: the old body differs");
            (key.as_str().unwrap_or_default().to_string(), body)
        })
        .collect();
    want.sort_by(|a, b| a.0.cmp(&b.0));
    got.sort_by(|a, b| a.0.cmp(&b.0));
    assert_eq!(got, want, "event {id} of {extraction}: findings differ from the stored ones");
}
