//! Writing a finished batch's output and error files (`BatchRequestOutput` JSONL).
//!
//! Lines are shuffled (deterministically, from the seed and the batch id) because the real
//! API does not promise input order: a client must join on `custom_id`. Error lines come
//! in both documented shapes, alternating: `response` with a non-200 `status_code` and an
//! OpenAI error body, or `response: null` with `error: {code, message}`.

use rand::distr::Alphanumeric;
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use serde_json::{Value, json};

use super::answer::Attempts;
use super::faults::{Faults, every};
use super::input::InputRequest;
use super::model;
use super::strict::{self, Rejection};
use super::wire::{BatchUsage, RequestCounts};

/// What to write for one batch at its terminal moment.
#[derive(Debug)]
pub(super) struct Plan<'a> {
    pub batch_id: &'a str,
    pub requests: &'a [InputRequest],
    /// The first `done` requests (input order) were answered; the rest were not run.
    pub done: usize,
    /// `batch_expired` or `batch_cancelled`, for the requests that were not run.
    pub unfinished_code: &'static str,
    pub faults: &'a Faults,
    pub seed: u64,
    /// Unix seconds used as each completion's `created`.
    pub created: i64,
}

#[derive(Debug, Default)]
pub(super) struct Generated {
    pub output: Vec<u8>,
    pub errors: Vec<u8>,
    pub counts: RequestCounts,
    pub usage: BatchUsage,
    /// Successful (billed) lines whose answer was cut off at the output budget.
    pub truncated: u64,
    /// Successful (billed) lines whose answer was a refusal.
    pub refused: u64,
}

pub(super) fn generate(plan: &Plan<'_>, attempts: &mut Attempts) -> Generated {
    let mut rng = StdRng::seed_from_u64(plan.seed ^ batch_salt(plan.batch_id));
    let mut generated = Generated::default();
    let mut successes = Vec::new();
    let mut failures = Vec::new();
    for (index, request) in plan.requests.iter().enumerate() {
        let position = index + 1;
        if index >= plan.done {
            failures.push(unfinished_line(&mut rng, request, plan.unfinished_code));
        } else if let Err(rejection) = strict::check_body(&request.body) {
            // The real API checks a line's body only when it runs it: a refused schema is
            // a 400 in the error file, unbilled, never a failed batch.
            failures.push(rejected_line(&mut rng, request, &rejection));
        } else if every(plan.faults.failed_line_every, position) {
            let http_shape = failures.len() % 2 == 0;
            failures.push(failed_line(&mut rng, request, http_shape));
        } else {
            let behaviour = attempts.behaviour(plan.faults, position, &model::ask(&request.body));
            let reply = model::respond(&request.body, behaviour);
            generated.truncated += u64::from(reply.finish_reason == "length");
            generated.refused += u64::from(reply.refusal.is_some());
            add_usage(&mut generated.usage, &reply);
            successes.push(success_line(&mut rng, request, &reply, plan.created));
        }
    }
    generated.counts = RequestCounts {
        total: count(plan.requests.len()),
        completed: count(successes.len()),
        failed: count(failures.len()),
    };
    successes.shuffle(&mut rng);
    failures.shuffle(&mut rng);
    for (index, line) in successes.iter().enumerate() {
        let line = line.to_string();
        let position = index + 1;
        let written = if every(plan.faults.malformed_line_every, position) { truncate(&line) } else { &line };
        push_line(&mut generated.output, written);
        if every(plan.faults.duplicate_line_every, position) {
            push_line(&mut generated.output, written);
        }
    }
    for line in &failures {
        push_line(&mut generated.errors, &line.to_string());
    }
    generated
}

fn success_line(rng: &mut StdRng, request: &InputRequest, reply: &model::Reply, created: i64) -> Value {
    json!({
        "id": random_id(rng, "batch_req_", 24),
        "custom_id": request.custom_id,
        "response": {
            "status_code": 200,
            "request_id": random_id(rng, "req_", 32),
            "body": completion(rng, &request.model, reply, created),
        },
        "error": null,
    })
}

/// A `chat.completion` object, as a batch line's body or the synchronous endpoint's answer.
/// A refusal has `content: null` and the refusal text; a cut-off answer
/// `finish_reason: "length"` (OpenAI API reference, `CreateChatCompletionResponse`).
pub(super) fn completion(rng: &mut StdRng, model: &str, reply: &model::Reply, created: i64) -> Value {
    json!({
        "id": random_id(rng, "chatcmpl-", 29),
        "object": "chat.completion",
        "created": created,
        "model": model,
        "choices": [{
            "index": 0,
            "message": {"role": "assistant", "content": reply.content, "refusal": reply.refusal},
            "logprobs": null,
            "finish_reason": reply.finish_reason,
        }],
        "usage": {
            "prompt_tokens": reply.prompt_tokens,
            "completion_tokens": reply.completion_tokens,
            "total_tokens": reply.prompt_tokens + reply.completion_tokens,
            "prompt_tokens_details": {"cached_tokens": 0},
            "completion_tokens_details": {"reasoning_tokens": 0},
        },
        "system_fingerprint": null,
    })
}

fn failed_line(rng: &mut StdRng, request: &InputRequest, http_shape: bool) -> Value {
    let id = random_id(rng, "batch_req_", 24);
    if http_shape {
        json!({
            "id": id,
            "custom_id": request.custom_id,
            "response": {
                "status_code": 500,
                "request_id": random_id(rng, "req_", 32),
                "body": {"error": {
                    "message": "The server had an error while processing your request. \
                                (SIMULATED fault: failed_line_every)",
                    "type": "server_error",
                    "param": null,
                    "code": null,
                }},
            },
            "error": null,
        })
    } else {
        json!({
            "id": id,
            "custom_id": request.custom_id,
            "response": null,
            "error": {
                "code": "request_timeout",
                "message": "The request timed out. (SIMULATED fault: failed_line_every)",
            },
        })
    }
}

fn rejected_line(rng: &mut StdRng, request: &InputRequest, rejection: &Rejection) -> Value {
    json!({
        "id": random_id(rng, "batch_req_", 24),
        "custom_id": request.custom_id,
        "response": {
            "status_code": 400,
            "request_id": random_id(rng, "req_", 32),
            "body": {"error": {
                "message": rejection.message,
                "type": "invalid_request_error",
                "param": rejection.param,
                "code": rejection.code,
            }},
        },
        "error": null,
    })
}

fn unfinished_line(rng: &mut StdRng, request: &InputRequest, code: &str) -> Value {
    let message = if code == "batch_expired" {
        "This request could not be executed before the completion window expired."
    } else {
        "This request was not executed because the batch was cancelled."
    };
    json!({
        "id": random_id(rng, "batch_req_", 24),
        "custom_id": request.custom_id,
        "response": null,
        "error": {"code": code, "message": message},
    })
}

fn add_usage(usage: &mut BatchUsage, reply: &model::Reply) {
    usage.input_tokens += reply.prompt_tokens;
    usage.output_tokens += reply.completion_tokens;
    usage.total_tokens += reply.prompt_tokens + reply.completion_tokens;
}

/// Cuts a line in half (on a character boundary): what a torn write looks like.
pub(super) fn truncate(line: &str) -> &str {
    &line[..line.floor_char_boundary(line.len() / 2)]
}

pub(super) fn push_line(file: &mut Vec<u8>, line: &str) {
    file.extend_from_slice(line.as_bytes());
    file.push(b'\n');
}

pub(super) fn random_id(rng: &mut StdRng, prefix: &str, len: usize) -> String {
    let suffix: String = rng.sample_iter(Alphanumeric).take(len).map(char::from).collect();
    format!("{prefix}{suffix}")
}

pub(super) fn batch_salt(batch_id: &str) -> u64 {
    let hash = blake3::hash(batch_id.as_bytes());
    let mut first = [0u8; 8];
    first.copy_from_slice(&hash.as_bytes()[..8]);
    u64::from_le_bytes(first)
}

fn count(n: usize) -> u64 {
    u64::try_from(n).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    fn requests(n: usize) -> Vec<InputRequest> {
        (0..n)
            .map(|i| InputRequest {
                custom_id: format!("c{i}"),
                model: "sim".to_string(),
                body: json!({"model": "sim", "messages": [
                    {"role": "user", "content": format!("source_id: s{i}\n\nline\nx.unwrap()")}
                ], "response_format": {"type": "json_schema", "json_schema": {"name": "t", "schema": {}}}}),
            })
            .collect()
    }

    fn lines(file: &[u8]) -> Vec<String> {
        String::from_utf8(file.to_vec()).unwrap().lines().map(str::to_string).collect()
    }

    fn plan<'a>(reqs: &'a [InputRequest], faults: &'a Faults, done: usize) -> Plan<'a> {
        Plan {
            batch_id: "batch_x",
            requests: reqs,
            done,
            unfinished_code: "batch_expired",
            faults,
            seed: 7,
            created: 1,
        }
    }

    #[test]
    fn shuffled_lines_join_back_by_custom_id() {
        let reqs = requests(20);
        let faults = Faults::default();
        let generated = generate(&plan(&reqs, &faults, 20), &mut Attempts::default());
        let out = lines(&generated.output);
        let order: Vec<String> = out
            .iter()
            .map(|l| serde_json::from_str::<Value>(l).unwrap()["custom_id"].as_str().unwrap().to_string())
            .collect();
        let input_order: Vec<String> = reqs.iter().map(|r| r.custom_id.clone()).collect();
        assert_ne!(order, input_order, "output must not follow input order");
        let by_id: BTreeMap<String, Value> = out
            .iter()
            .map(|l| {
                let v: Value = serde_json::from_str(l).unwrap();
                (v["custom_id"].as_str().unwrap().to_string(), v)
            })
            .collect();
        assert_eq!(by_id.len(), 20);
        for (i, request) in reqs.iter().enumerate() {
            let line = &by_id[&request.custom_id];
            let content = line["response"]["body"]["choices"][0]["message"]["content"].as_str().unwrap();
            let review: Value = serde_json::from_str(content).unwrap();
            assert_eq!(review["findings"][0]["file"], format!("s{i}"));
        }
        assert!(generated.errors.is_empty());
        assert_eq!(generated.counts, RequestCounts { total: 20, completed: 20, failed: 0 });
        let again = generate(&plan(&reqs, &faults, 20), &mut Attempts::default());
        assert_eq!(again.output, generated.output, "the seed makes files reproducible");
    }

    #[test]
    fn failed_lines_alternate_shapes_and_unfinished_lines_are_errors() {
        let reqs = requests(8);
        let faults = Faults { failed_line_every: 2, ..Faults::default() };
        let generated = generate(&plan(&reqs, &faults, 6), &mut Attempts::default());
        let errors: Vec<Value> = lines(&generated.errors).iter().map(|l| serde_json::from_str(l).unwrap()).collect();
        let http = errors.iter().filter(|e| e["response"]["status_code"] == 500).count();
        let timeouts = errors.iter().filter(|e| e["error"]["code"] == "request_timeout").count();
        let expired = errors.iter().filter(|e| e["error"]["code"] == "batch_expired").count();
        assert_eq!((http, timeouts, expired), (2, 1, 2));
        assert_eq!(generated.counts, RequestCounts { total: 8, completed: 3, failed: 5 });
        assert_eq!(lines(&generated.output).len(), 3);
    }

    #[test]
    fn truncated_and_refused_lines_are_billed_successes() {
        let mut reqs = requests(4);
        for request in &mut reqs {
            request.body["max_completion_tokens"] = json!(100);
        }
        let faults = Faults { truncate_every: 2, refuse_every: 3, ..Faults::default() };
        let generated = generate(&plan(&reqs, &faults, 4), &mut Attempts::default());
        assert_eq!((generated.truncated, generated.refused), (2, 1));
        assert_eq!(generated.counts.completed, 4, "cut-off and declined answers are billed");
        let by_id: BTreeMap<String, Value> = lines(&generated.output)
            .iter()
            .map(|l| {
                let v: Value = serde_json::from_str(l).unwrap();
                (v["custom_id"].as_str().unwrap().to_string(), v)
            })
            .collect();
        let choice = |id: &str| by_id[id]["response"]["body"]["choices"][0].clone();
        assert_eq!(choice("c1")["finish_reason"], "length");
        assert_eq!(by_id["c1"]["response"]["body"]["usage"]["completion_tokens"], 100);
        assert!(choice("c1")["message"]["content"].as_str().is_some_and(|c| serde_json::from_str::<Value>(c).is_ok()));
        assert_eq!(choice("c2")["message"]["content"], Value::Null);
        assert_eq!(choice("c2")["message"]["refusal"], model::REFUSAL);
        assert_eq!(choice("c3")["finish_reason"], "length");
        assert!(serde_json::from_str::<Value>(choice("c3")["message"]["content"].as_str().unwrap()).is_err());
        assert_eq!(choice("c0")["finish_reason"], "stop");
    }

    #[test]
    fn output_file_faults_garble_and_duplicate_lines() {
        let reqs = requests(6);
        let faults =
            Faults { malformed_line_every: 3, duplicate_line_every: 2, invalid_output_every: 6, ..Faults::default() };
        let generated = generate(&plan(&reqs, &faults, 6), &mut Attempts::default());
        let out = lines(&generated.output);
        assert_eq!(out.len(), 9, "6 lines + 3 duplicates");
        let garbage = out.iter().filter(|l| serde_json::from_str::<Value>(l).is_err()).count();
        assert_eq!(garbage, 3, "lines 3 and 6, the latter duplicated");
        for line in out.iter().filter_map(|l| serde_json::from_str::<Value>(l).ok()) {
            let content = line["response"]["body"]["choices"][0]["message"]["content"].as_str().unwrap();
            assert_eq!(content.contains("urgent"), line["custom_id"] == "c5", "only input line 6 is invalid");
        }
        assert_eq!(generated.counts.completed, 6, "garbled lines were still billed");
    }
}
