//! Writing an ended batch's results JSONL (`MessageBatchIndividualResponse` lines).
//!
//! Lines are shuffled (deterministically, from the seed and the batch id): the API does not
//! promise input order, so a client must join on `custom_id`. The file-level faults
//! (`malformed_line_every`, `duplicate_line_every`) apply by position in the written file.

use rand::SeedableRng;
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use serde_json::{Value, json};

use super::model;
use super::wire::{Request, RequestCounts};
use crate::simulator::answer::Attempts;
use crate::simulator::faults::{Behaviour, Faults, every};
use crate::simulator::output::{batch_salt, push_line, random_id, truncate};

/// Why the requests after the first `done` did not run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Unfinished {
    Canceled,
    Expired,
}

#[derive(Debug)]
pub(super) struct Plan<'a> {
    pub batch_id: &'a str,
    pub requests: &'a [Request],
    /// The first `done` requests (input order) ran; the rest are `unfinished`.
    pub done: usize,
    pub unfinished: Unfinished,
    pub faults: &'a Faults,
    pub seed: u64,
}

#[derive(Debug, Default)]
pub(super) struct Generated {
    pub jsonl: Vec<u8>,
    pub counts: RequestCounts,
    /// Succeeded (billed) lines cut off at `max_tokens`.
    pub truncated: u64,
    /// Succeeded (billed) lines that declined.
    pub refused: u64,
}

pub(super) fn generate(plan: &Plan<'_>, attempts: &mut Attempts) -> Generated {
    let mut rng = StdRng::seed_from_u64(plan.seed ^ batch_salt(plan.batch_id));
    let mut counts = RequestCounts::default();
    let (mut truncated, mut refused) = (0, 0);
    let mut lines = Vec::with_capacity(plan.requests.len());
    for (index, request) in plan.requests.iter().enumerate() {
        let position = index + 1;
        let result = if index >= plan.done {
            match plan.unfinished {
                Unfinished::Canceled => {
                    counts.canceled += 1;
                    json!({"type": "canceled"})
                }
                Unfinished::Expired => {
                    counts.expired += 1;
                    json!({"type": "expired"})
                }
            }
        } else if every(plan.faults.failed_line_every, position) {
            counts.errored += 1;
            // Alternating two retryable kinds a real batch produces under load.
            let (kind, message) = if counts.errored % 2 == 1 {
                ("overloaded_error", "Overloaded")
            } else {
                ("api_error", "Internal server error")
            };
            errored(&mut rng, kind, &format!("{message} (SIMULATED fault: failed_line_every)"))
        } else {
            let ask = model::ask(&request.params, model::forced_name(&request.params).as_deref());
            let behaviour = attempts.behaviour(plan.faults, position, &ask);
            match model::respond(&request.params, behaviour, &mut rng) {
                Ok(answer) => {
                    counts.succeeded += 1;
                    truncated += u64::from(answer.stop_reason == "max_tokens");
                    refused += u64::from(matches!(behaviour, Behaviour::Refuse { .. }));
                    succeeded(&mut rng, request, answer)
                }
                Err(message) => {
                    counts.errored += 1;
                    errored(&mut rng, "invalid_request_error", &message)
                }
            }
        };
        lines.push(json!({"custom_id": request.custom_id, "result": result}));
    }
    lines.shuffle(&mut rng);
    let mut jsonl = Vec::new();
    for (index, line) in lines.iter().enumerate() {
        let line = line.to_string();
        let position = index + 1;
        let written = if every(plan.faults.malformed_line_every, position) { truncate(&line) } else { &line };
        push_line(&mut jsonl, written);
        if every(plan.faults.duplicate_line_every, position) {
            push_line(&mut jsonl, written);
        }
    }
    Generated { jsonl, counts, truncated, refused }
}

fn succeeded(rng: &mut StdRng, request: &Request, answer: model::Answer) -> Value {
    json!({"type": "succeeded", "message": {
        "id": random_id(rng, "msg_", 24),
        "type": "message",
        "role": "assistant",
        "model": request.params.get("model").cloned().unwrap_or(Value::Null),
        "content": answer.content,
        "stop_reason": answer.stop_reason,
        "stop_sequence": null,
        "usage": {
            "input_tokens": answer.input_tokens,
            "output_tokens": answer.output_tokens,
            "cache_creation_input_tokens": 0,
            "cache_read_input_tokens": 0,
            "service_tier": "batch",
        },
    }})
}

fn errored(rng: &mut StdRng, kind: &str, message: &str) -> Value {
    json!({"type": "errored", "error": {
        "type": "error",
        "error": {"type": kind, "message": message},
        "request_id": random_id(rng, "req_", 24),
    }})
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    fn requests(n: usize) -> Vec<Request> {
        (0..n)
            .map(|i| Request {
                custom_id: format!("c{i}"),
                params: json!({"model": "sim", "max_tokens": 100,
                    "messages": [{"role": "user", "content": format!("source_id: s{i}\n\nx.unwrap()")}],
                    "tools": [{"name": "t", "input_schema": {"type": "object"}}],
                    "tool_choice": {"type": "tool", "name": "t"}}),
            })
            .collect()
    }

    fn parsed(jsonl: &[u8]) -> Vec<Result<Value, String>> {
        String::from_utf8(jsonl.to_vec())
            .unwrap()
            .lines()
            .map(|l| serde_json::from_str::<Value>(l).map_err(|_| l.to_string()))
            .collect()
    }

    fn plan<'a>(reqs: &'a [Request], faults: &'a Faults, done: usize, unfinished: Unfinished) -> Plan<'a> {
        Plan { batch_id: "msgbatch_x", requests: reqs, done, unfinished, faults, seed: 3 }
    }

    #[test]
    fn every_request_gets_one_line_joined_by_custom_id() {
        let reqs = requests(12);
        let faults = Faults::default();
        let generated = generate(&plan(&reqs, &faults, 12, Unfinished::Expired), &mut Attempts::default());
        let lines: Vec<Value> = parsed(&generated.jsonl).into_iter().map(Result::unwrap).collect();
        let order: Vec<&str> = lines.iter().map(|l| l["custom_id"].as_str().unwrap()).collect();
        assert_ne!(order, reqs.iter().map(|r| r.custom_id.as_str()).collect::<Vec<_>>(), "shuffled");
        let by_id: BTreeMap<&str, &Value> = lines.iter().map(|l| (l["custom_id"].as_str().unwrap(), l)).collect();
        assert_eq!(by_id.len(), 12);
        for (i, request) in reqs.iter().enumerate() {
            let message = &by_id[request.custom_id.as_str()]["result"]["message"];
            assert_eq!(message["content"][0]["input"]["findings"][0]["file"], format!("s{i}"));
        }
        assert_eq!(generated.counts, RequestCounts { succeeded: 12, ..RequestCounts::default() });
        assert_eq!(
            generate(&plan(&reqs, &faults, 12, Unfinished::Expired), &mut Attempts::default()).jsonl,
            generated.jsonl,
            "seeded"
        );
    }

    #[test]
    fn failed_unfinished_and_garbled_lines() {
        let reqs = requests(8);
        let faults =
            Faults { failed_line_every: 3, malformed_line_every: 4, duplicate_line_every: 5, ..Faults::default() };
        let generated = generate(&plan(&reqs, &faults, 6, Unfinished::Canceled), &mut Attempts::default());
        assert_eq!(
            generated.counts,
            RequestCounts { succeeded: 4, errored: 2, canceled: 2, ..RequestCounts::default() }
        );
        let lines = parsed(&generated.jsonl);
        assert_eq!(lines.len(), 9, "8 lines + 1 duplicate");
        assert_eq!(lines.iter().filter(|l| l.is_err()).count(), 2, "positions 4 and 8 are torn");
        let kinds: Vec<String> = lines
            .iter()
            .flatten()
            .filter(|l| l["result"]["type"] == "errored")
            .map(|l| l["result"]["error"]["error"]["type"].as_str().unwrap().to_string())
            .collect();
        assert!(kinds.iter().all(|k| k == "overloaded_error" || k == "api_error"), "{kinds:?}");
    }
}
