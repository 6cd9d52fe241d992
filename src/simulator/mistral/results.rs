//! A finished job's output and error files: JSONL lines `{"id", "custom_id", "response":
//! {"status_code", "body"}, "error"}`, successes in the output file, failures in the error
//! file, in no promised order. A line's body is checked when it runs, as Mistral's API
//! checks a request: a field it does not know is that line's 422 `extra_forbidden`, never
//! the job's failure. The file-level faults (`malformed_line_every`,
//! `duplicate_line_every`) apply by position in the output file.

use bytes::Bytes;
use rand::SeedableRng;
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use serde_json::{Value, json};

use super::body;
use super::error::MistralError;
use super::lifecycle::Request;
use super::store::{StoredFile, uuid};
use crate::domain::batch::approx_tokens;
use crate::simulator::faults::{Behaviour, Faults, every};
use crate::simulator::model::{self, Reply};
use crate::simulator::output::{batch_salt, push_line, random_id, truncate};
use crate::simulator::state::{Inner, unix_now};

#[derive(Debug, Default)]
pub(super) struct Written {
    pub output_file: Option<String>,
    pub error_file: Option<String>,
    pub succeeded: u64,
    pub failed: u64,
}

pub(super) fn generate(
    job_id: &str,
    model_name: &str,
    requests: &[Request],
    faults: &Faults,
    inner: &mut Inner,
) -> Written {
    let mut rng = StdRng::seed_from_u64(inner.seed ^ batch_salt(job_id));
    let (mut successes, mut failures) = (Vec::new(), Vec::new());
    for (index, request) in requests.iter().enumerate() {
        let position = index + 1;
        let line = |rng: &mut StdRng, status: u16, body: Value| {
            json!({"id": random_id(rng, "batch-", 24), "custom_id": request.custom_id,
                "response": {"status_code": status, "body": body}, "error": null})
        };
        let input_tokens = approx_tokens(request.body.to_string().len() as u64);
        if let Err(refused) = body::check(&request.body, true) {
            failures.push(line(&mut rng, refused.status.as_u16(), refused.body));
        } else if faults.max_input_tokens > 0 && input_tokens > faults.max_input_tokens {
            let message = format!(
                "Prompt contains {input_tokens} tokens, too large for model with {} maximum context length \
                 (SIMULATED fault: max_input_tokens)",
                faults.max_input_tokens
            );
            failures.push(line(&mut rng, 400, MistralError::invalid(message).body));
        } else if every(faults.failed_line_every, position) {
            let limited = MistralError::api(
                axum::http::StatusCode::TOO_MANY_REQUESTS,
                "rate_limited",
                "Rate limit exceeded (SIMULATED fault: failed_line_every)",
                Some("1300"),
            );
            failures.push(line(&mut rng, 429, limited.body));
        } else {
            let behaviour = inner.attempts.behaviour(faults, position, &model::ask(&request.body));
            let reply = model::respond(&request.body, behaviour);
            inner.stats.lines_truncated += u64::from(reply.finish_reason == "length");
            inner.stats.lines_refused += u64::from(matches!(behaviour, Behaviour::Refuse { .. }));
            let body = completion(&mut rng, model_name, &reply);
            successes.push(line(&mut rng, 200, body));
        }
    }
    successes.shuffle(&mut rng);
    failures.shuffle(&mut rng);
    let mut written =
        Written { succeeded: successes.len() as u64, failed: failures.len() as u64, ..Written::default() };
    inner.stats.lines_completed += written.succeeded;
    inner.stats.lines_failed += written.failed;
    let mut output = Vec::new();
    for (index, line) in successes.iter().enumerate() {
        let line = line.to_string();
        let position = index + 1;
        let text = if every(faults.malformed_line_every, position) { truncate(&line) } else { &line };
        push_line(&mut output, text);
        if every(faults.duplicate_line_every, position) {
            push_line(&mut output, text);
        }
    }
    let mut errors = Vec::new();
    for line in &failures {
        push_line(&mut errors, &line.to_string());
    }
    if !output.is_empty() {
        written.output_file = Some(store(inner, format!("{job_id}_output.jsonl"), output));
    }
    if !errors.is_empty() {
        written.error_file = Some(store(inner, format!("{job_id}_error.jsonl"), errors));
    }
    written
}

fn store(inner: &mut Inner, filename: String, content: Vec<u8>) -> String {
    let id = uuid(inner);
    let file = StoredFile {
        filename,
        purpose: "batch".to_string(),
        bytes: Bytes::from(content),
        created_at: unix_now(),
        lines: None,
    };
    inner.mistral.files.insert(id.clone(), file);
    id
}

/// A `ChatCompletionResponse`. Mistral has no `refusal` field: a declining model's words
/// are its content. Its `finish_reason` is `stop` or `length` here (client-python
/// `ChatCompletionChoiceFinishReason` also has `model_length`, `error`, `tool_calls`).
pub(super) fn completion(rng: &mut StdRng, model_name: &str, reply: &Reply) -> Value {
    let content = reply.content.clone().or_else(|| reply.refusal.clone());
    json!({
        "id": random_id(rng, "", 32),
        "object": "chat.completion",
        "model": model_name,
        "created": unix_now(),
        "choices": [{
            "index": 0,
            "message": {"role": "assistant", "content": content, "tool_calls": null, "prefix": false},
            "finish_reason": reply.finish_reason,
        }],
        "usage": {
            "prompt_tokens": reply.prompt_tokens,
            "completion_tokens": reply.completion_tokens,
            "total_tokens": reply.prompt_tokens + reply.completion_tokens,
        },
    })
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::simulator::state::Shared;

    fn requests(n: usize) -> Vec<Request> {
        (0..n)
            .map(|i| Request {
                custom_id: Some(format!("k{i}")),
                body: json!({"messages": [{"role": "user", "content": format!("source_id: s{i}\n\nx.unwrap()")}],
                    "max_tokens": 4000}),
            })
            .collect()
    }

    fn lines(inner: &Inner, file: &Option<String>) -> Vec<Value> {
        let Some(id) = file else { return Vec::new() };
        let text = String::from_utf8(inner.mistral.files[id].bytes.to_vec()).unwrap();
        text.lines().filter_map(|l| serde_json::from_str(l).ok()).collect()
    }

    #[test]
    fn successes_and_failures_go_to_their_own_files() {
        let shared = Shared::new(None, Duration::from_millis(10), 3, Faults::default(), "http://x".into());
        let mut inner = shared.lock();
        let mut reqs = requests(5);
        reqs[1].body["max_completion_tokens"] = json!(10);
        let faults = Faults { failed_line_every: 4, ..Faults::default() };
        let written = generate("job1", "mistral-small-latest", &reqs, &faults, &mut inner);
        assert_eq!((written.succeeded, written.failed), (3, 2));
        let output = lines(&inner, &written.output_file);
        assert!(output.iter().all(|l| l["response"]["status_code"] == 200), "{output:?}");
        assert_eq!(output[0]["response"]["body"]["usage"]["prompt_tokens"].as_u64().map(|n| n > 0), Some(true));
        let errors = lines(&inner, &written.error_file);
        let refused = errors.iter().find(|l| l["custom_id"] == "k1").unwrap();
        assert_eq!(refused["response"]["status_code"], 422);
        assert_eq!(refused["response"]["body"]["message"]["detail"][0]["type"], "extra_forbidden");
        let limited = errors.iter().find(|l| l["custom_id"] == "k3").unwrap();
        assert_eq!(limited["response"]["body"]["code"], "1300");
    }
}
