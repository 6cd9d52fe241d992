//! A succeeded batch's output. Inline batches answer inline
//! (`output.inlinedResponses.inlinedResponses[]`, each `{response|error, metadata}` with the
//! request's metadata echoed, in input order); file batches get a responses file of JSONL
//! lines `{"key", "response"|"error"}` ("the request with the key defined as request-1
//! will have its response annotated with the same key name", batch guide). The file-level
//! faults (`malformed_line_every`, `duplicate_line_every`) apply by position in the file;
//! an inline array has no lines to tear.

use bytes::Bytes;
use rand::SeedableRng;
use rand::rngs::StdRng;
use serde_json::{Value, json};

use super::lifecycle::Request;
use super::model;
use crate::domain::batch::approx_tokens;
use crate::simulator::faults::{Behaviour, Faults, every};
use crate::simulator::output::{batch_salt, push_line, truncate};
use crate::simulator::state::Inner;

#[derive(Clone, Debug)]
pub(super) enum Output {
    Inline(Vec<Value>),
    File { name: String },
}

impl Output {
    pub(super) fn to_json(&self) -> Value {
        match self {
            Output::Inline(entries) => json!({"inlinedResponses": {"inlinedResponses": entries}}),
            Output::File { name } => json!({"responsesFile": name}),
        }
    }
}

#[derive(Debug)]
pub(super) struct Generated {
    pub output: Output,
    pub succeeded: u64,
    pub failed: u64,
}

pub(super) fn generate(
    batch: &str,
    model_name: &str,
    requests: &[Request],
    to_file: bool,
    faults: &Faults,
    inner: &mut Inner,
) -> Generated {
    let mut rng = StdRng::seed_from_u64(inner.seed ^ batch_salt(batch));
    let (mut succeeded, mut failed) = (0, 0);
    let mut entries = Vec::with_capacity(requests.len());
    for (index, request) in requests.iter().enumerate() {
        let position = index + 1;
        // A per-request error is a bare google.rpc.Status: an integer gRPC code and a
        // message, no `status` name (python-genai `JobError`; python-genai#2693).
        let input_tokens = approx_tokens(request.request.to_string().len() as u64);
        let mut entry = if faults.max_input_tokens > 0 && input_tokens > faults.max_input_tokens {
            failed += 1;
            let message = format!(
                "The input token count ({input_tokens}) exceeds the maximum number of tokens allowed ({}).",
                faults.max_input_tokens
            );
            json!({"error": {"code": 3, "message": message}})
        } else if every(faults.failed_line_every, position) {
            failed += 1;
            // Alternating two retryable codes a batch produces under load: 8
            // RESOURCE_EXHAUSTED, 13 INTERNAL.
            let (code, message) = if failed % 2 == 1 {
                (8, "Resource has been exhausted (e.g. check quota).")
            } else {
                (13, "An internal error has occurred.")
            };
            let message = format!("{message} (SIMULATED fault: failed_line_every)");
            json!({"error": {"code": code, "message": message}})
        } else {
            let behaviour = inner.attempts.behaviour(faults, position, &model::ask(&request.request));
            let mut response = model::respond(&request.request, behaviour, model_name, &mut rng);
            if every(faults.unfinished_every, position)
                && let Some(candidate) = response.pointer_mut("/candidates/0").and_then(Value::as_object_mut)
            {
                candidate.remove("finishReason");
            }
            succeeded += 1;
            let finish = response.pointer("/candidates/0/finishReason").and_then(Value::as_str);
            inner.stats.lines_truncated += u64::from(finish == Some("MAX_TOKENS"));
            inner.stats.lines_refused += u64::from(matches!(behaviour, Behaviour::Refuse { .. }));
            json!({"response": response})
        };
        let keyless =
            entry.get("error").is_some() && every(faults.keyless_error_every, usize::try_from(failed).unwrap_or(0));
        if let Some(key) = request.key.as_ref().filter(|_| !keyless) {
            if to_file {
                entry["key"] = json!(key);
            } else {
                entry["metadata"] = json!({"key": key});
            }
        }
        entries.push(entry);
    }
    inner.stats.lines_completed += succeeded;
    inner.stats.lines_failed += failed;
    if !to_file {
        return Generated { output: Output::Inline(entries), succeeded, failed };
    }
    let mut jsonl = Vec::new();
    for (index, entry) in entries.iter().enumerate() {
        let line = entry.to_string();
        let position = index + 1;
        let written = if every(faults.malformed_line_every, position) { truncate(&line) } else { &line };
        push_line(&mut jsonl, written);
        if every(faults.duplicate_line_every, position) {
            push_line(&mut jsonl, written);
        }
    }
    let name = format!("files/{}", batch.trim_start_matches("batches/").replace('/', "-"));
    let name = format!("{name}-responses");
    inner.gemini.store_file(name.clone(), format!("{batch} responses"), Bytes::from(jsonl));
    Generated { output: Output::File { name }, succeeded, failed }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::simulator::state::Shared;

    fn requests(n: usize) -> Vec<Request> {
        (0..n)
            .map(|i| Request {
                key: Some(format!("k{i}")),
                request: json!({"contents": [{"parts": [{"text": format!("source_id: s{i}\n\nx.unwrap()")}]}],
                    "generationConfig": {"responseMimeType": "application/json"}}),
            })
            .collect()
    }

    fn shared() -> Shared {
        Shared::new(None, Duration::from_millis(10), 3, Faults::default(), "http://x".into())
    }

    #[test]
    fn inline_entries_echo_their_key_in_input_order() {
        let shared = shared();
        let mut inner = shared.lock();
        let generated = generate("batches/b1", "m", &requests(4), false, &Faults::default(), &mut inner);
        let Output::Inline(entries) = &generated.output else { panic!() };
        let keys: Vec<&str> = entries.iter().map(|e| e["metadata"]["key"].as_str().unwrap()).collect();
        assert_eq!(keys, ["k0", "k1", "k2", "k3"]);
        let text = entries[2]["response"]["candidates"][0]["content"]["parts"][0]["text"].as_str().unwrap();
        assert_eq!(serde_json::from_str::<Value>(text).unwrap()["findings"][0]["file"], "s2");
        assert_eq!((generated.succeeded, inner.stats.lines_completed), (4, 4));
    }

    #[test]
    fn files_carry_keys_errors_and_torn_lines() {
        let shared = shared();
        let mut inner = shared.lock();
        let faults =
            Faults { failed_line_every: 3, malformed_line_every: 4, duplicate_line_every: 5, ..Faults::default() };
        let generated = generate("batches/b2", "m", &requests(6), true, &faults, &mut inner);
        let Output::File { name } = &generated.output else { panic!() };
        let bytes = inner.gemini.files[name].bytes.clone();
        let text = String::from_utf8(bytes.to_vec()).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 7, "6 lines + 1 duplicate");
        let parsed: Vec<Value> = lines.iter().filter_map(|l| serde_json::from_str(l).ok()).collect();
        assert_eq!(parsed.len(), 6, "line 4 is torn");
        assert!(
            parsed.iter().any(|l| l["key"] == "k2" && l["error"]["code"] == 8 && l["error"].get("status").is_none())
        );
        assert_eq!((generated.succeeded, generated.failed), (4, 2));
    }
}
