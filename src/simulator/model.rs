//! The simulated model: a deterministic rule-based code reviewer that answers a chat
//! completion body with `code-review@1` JSON, or for any other schema the request carries
//! an instance of it (see `answer`). It is not a language model; it exists so the whole
//! batch lifecycle can run without an API key.
//!
//! Prompt convention (the commitpoint adapter sends exactly this as the last `user`
//! message): `source_id: <SOURCE_ID>\n\n<CONTENT>`. Line numbers are 1-based within
//! CONTENT.

use serde_json::{Value, json};

use super::answer::{self, Ask, Turn};
use super::faults::{Behaviour, Flaw};

/// The simulated model's own output limit when a request names no budget (gpt-4o-mini's).
pub(super) const MODEL_MAX_OUTPUT_TOKENS: u64 = 16_384;
/// What the simulated model says when it declines (OpenAI's usual wording).
pub(super) const REFUSAL: &str = "I'm sorry, I cannot help with that.";

/// (patterns, rule, severity, summary). A rule fires at most once per line, because
/// (rule, file, line) is a finding's identity and duplicates would be noise.
pub(super) const RULES: &[(&[&str], &str, &str, &str)] = &[
    (&["unwrap()"], "no-unwrap", "medium", "unwrap() panics on bad input; return the error instead"),
    (&["TODO"], "todo-left", "low", "unfinished work left in the change"),
    (&["unsafe"], "unsafe-code", "high", "unsafe code without a safety justification"),
    (&["password", "PASSWORD", "secret ="], "hardcoded-secret", "critical", "credential committed in source"),
    (&["panic!"], "explicit-panic", "medium", "explicit panic in library code"),
];

const UNKNOWN_SOURCE: &str = "unknown";

/// What the model produced for one request line.
#[derive(Clone, Debug, PartialEq)]
pub(super) struct Reply {
    /// `None` when the model declined (`refusal` is set instead).
    pub content: Option<String>,
    pub refusal: Option<String>,
    /// `stop`, or `length` when the answer was cut off at its output budget.
    pub finish_reason: &'static str,
    pub prompt_tokens: u64,
    pub completion_tokens: u64,
}

/// Splits the prompt convention; a prompt without the header is reviewed whole.
pub(super) fn split_prompt(text: &str) -> (&str, &str) {
    let Some(rest) = text.strip_prefix("source_id:") else {
        return (UNKNOWN_SOURCE, text);
    };
    let (id, content) = match rest.split_once('\n') {
        Some((id, content)) => (id, content.strip_prefix('\n').unwrap_or(content)),
        None => (rest, ""),
    };
    let id = id.trim();
    (if id.is_empty() { UNKNOWN_SOURCE } else { id }, content)
}

pub fn review(source_id: &str, content: &str) -> Value {
    let mut findings = Vec::new();
    for (index, line) in content.lines().enumerate() {
        for (patterns, rule, severity, summary) in RULES {
            if patterns.iter().any(|p| line.contains(p)) {
                findings.push(json!({
                    "rule": rule,
                    "severity": severity,
                    "file": source_id,
                    "line": index + 1,
                    "summary": summary,
                }));
            }
        }
    }
    json!({ "findings": findings })
}

/// A schema-violating answer (line 0, severity outside the enum), as a confused model
/// would send: the client must reject it at validation, not commit it.
pub fn broken_review(source_id: &str, content: &str) -> Value {
    let mut output = review(source_id, content);
    if let Some(Value::Array(findings)) = output.get_mut("findings") {
        if findings.is_empty() {
            findings.push(json!({"rule": "no-unwrap", "file": source_id, "summary": "?"}));
        }
        for finding in findings.iter_mut() {
            finding["line"] = json!(0);
            finding["severity"] = json!("urgent");
        }
    }
    output
}

/// The first half of a review's findings (any other answer: of its first array): cut off
/// mid-answer, yet valid `code-review@1` JSON — which is why a truncated answer must never
/// be committed on validation alone.
pub(super) fn valid_prefix(mut output: Value) -> Value {
    let Value::Object(fields) = &mut output else { return output };
    let name = if fields.get("findings").is_some_and(Value::is_array) {
        Some("findings".to_string())
    } else {
        fields.iter().find(|(_, v)| v.is_array()).map(|(k, _)| k.clone())
    };
    if let Some(Value::Array(findings)) = name.and_then(|n| fields.get_mut(&n)) {
        findings.truncate(findings.len() / 2);
    }
    output
}

/// A chat completion body as the model reads it: `messages` (`assistant` turns are earlier
/// answers) and `response_format.json_schema.schema`.
pub(super) fn ask(body: &Value) -> Ask {
    let messages = body.get("messages").and_then(Value::as_array).map(Vec::as_slice).unwrap_or_default();
    let turns = message_turns(messages);
    let structured = body.pointer("/response_format/type").and_then(Value::as_str) == Some("json_schema");
    Ask::new(&turns, body.pointer("/response_format/json_schema/schema").filter(|_| structured))
}

/// The output budget a chat completion body asks for: `max_completion_tokens`, else the
/// deprecated `max_tokens`; `None` leaves the model's own limit.
pub(super) fn output_budget(body: &Value) -> Option<u64> {
    body.get("max_completion_tokens").or_else(|| body.get("max_tokens")).and_then(Value::as_u64)
}

/// Answers one `/v1/chat/completions` request body as `behaviour` says.
pub(super) fn respond(body: &Value, behaviour: Behaviour) -> Reply {
    let messages = body.get("messages").and_then(Value::as_array).map(Vec::as_slice).unwrap_or_default();
    let prompt_bytes: usize = messages.iter().map(|m| message_text(m).len()).sum();
    let prompt_tokens = tokens(prompt_bytes);
    let ask = ask(body);
    let structured = body.pointer("/response_format/type").and_then(Value::as_str) == Some("json_schema");
    let strict_schema = body
        .pointer("/response_format/json_schema/schema")
        .filter(|_| body.pointer("/response_format/json_schema/strict") == Some(&Value::Bool(true)));
    // Without Structured Outputs a chat model wraps JSON in prose; clients that forget
    // `response_format` should see that, not a lucky clean answer.
    let render = |mut output: Value| {
        if let Some(schema) = strict_schema {
            conform(&mut output, schema);
        }
        if structured { output.to_string() } else { format!("Here is my review.\n```json\n{output}\n```") }
    };
    let answer = |content: String, finish_reason, completion_tokens| Reply {
        content: Some(content),
        refusal: None,
        finish_reason,
        prompt_tokens,
        completion_tokens,
    };
    match behaviour {
        Behaviour::Refuse { .. } => Reply {
            content: None,
            refusal: Some(REFUSAL.to_string()),
            finish_reason: "stop",
            prompt_tokens,
            completion_tokens: tokens(REFUSAL.len()),
        },
        Behaviour::Long { needs, valid_prefix: prefix } => {
            let budget = output_budget(body).unwrap_or(MODEL_MAX_OUTPUT_TOKENS);
            let full = answer::answer(&ask, Flaw::None);
            if budget >= u64::from(needs) {
                return answer(render(full), "stop", u64::from(needs));
            }
            let text = if prefix { render(valid_prefix(full)) } else { cut(&render(full)).to_string() };
            answer(text, "length", budget.max(1))
        }
        Behaviour::Answer { flaw } => {
            let text = render(answer::answer(&ask, flaw));
            let text = if flaw == Flaw::NotJson { answer::in_prose(&text) } else { text };
            let completion_tokens = tokens(text.len());
            answer(text, "stop", completion_tokens)
        }
    }
}

/// Half a text, on a character boundary: JSON torn mid-value.
pub(super) fn cut(text: &str) -> &str {
    &text[..text.floor_char_boundary(text.len() / 2)]
}

/// Constrained decoding: a strict-mode model always sends every required key, so a
/// property it has nothing for arrives as `null` where the schema admits one.
pub(super) fn conform(answer: &mut Value, schema: &Value) {
    match answer {
        Value::Object(fields) => {
            let Some(Value::Object(properties)) = schema.get("properties") else { return };
            for key in schema.get("required").and_then(Value::as_array).into_iter().flatten().filter_map(Value::as_str)
            {
                let admits_null = properties
                    .get(key)
                    .and_then(|p| p.get("type"))
                    .is_some_and(|t| t == "null" || t.as_array().is_some_and(|l| l.iter().any(|k| k == "null")));
                if admits_null && !fields.contains_key(key) {
                    fields.insert(key.to_string(), Value::Null);
                }
            }
            for (key, field) in fields.iter_mut() {
                if let Some(sub) = properties.get(key) {
                    conform(field, sub);
                }
            }
        }
        Value::Array(items) => {
            if let Some(item_schema) = schema.get("items") {
                items.iter_mut().for_each(|item| conform(item, item_schema));
            }
        }
        _ => {}
    }
}

/// Tokens billed for `bytes` of text: the rule the cost estimator documents and prices by.
pub(super) fn tokens(bytes: usize) -> u64 {
    crate::domain::batch::approx_tokens(u64::try_from(bytes).unwrap_or(u64::MAX))
}

/// A message's text: a plain string or the concatenated `text` parts.
/// A `messages` array's turns, as both chat completions and Claude's Messages spell them.
pub(super) fn message_turns(messages: &[Value]) -> Vec<(Turn, String)> {
    messages
        .iter()
        .map(|m| {
            let turn = match m.get("role").and_then(Value::as_str) {
                Some("user") => Turn::User,
                Some("assistant") => Turn::Model,
                _ => Turn::Other,
            };
            (turn, message_text(m))
        })
        .collect()
}

pub(super) fn message_text(message: &Value) -> String {
    match message.get("content") {
        Some(Value::String(text)) => text.clone(),
        Some(Value::Array(parts)) => {
            parts.iter().filter_map(|p| p.get("text").and_then(Value::as_str)).collect::<Vec<_>>().join("\n")
        }
        _ => String::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rules_at(output: &Value) -> Vec<(String, String, u64)> {
        output["findings"]
            .as_array()
            .unwrap()
            .iter()
            .map(|f| {
                (
                    f["rule"].as_str().unwrap().to_string(),
                    f["severity"].as_str().unwrap().to_string(),
                    f["line"].as_u64().unwrap(),
                )
            })
            .collect()
    }

    #[test]
    fn each_rule_fires_on_its_line() {
        let content = "let x = y.unwrap();\n// TODO later\nunsafe { poke() }\nlet password = 1;\nconst PASSWORD: u8 = 0;\nlet secret = 2;\npanic!(\"no\");\nfine();\n";
        let got = rules_at(&review("src/a.rs", content));
        let want = [
            ("no-unwrap", "medium", 1),
            ("todo-left", "low", 2),
            ("unsafe-code", "high", 3),
            ("hardcoded-secret", "critical", 4),
            ("hardcoded-secret", "critical", 5),
            ("hardcoded-secret", "critical", 6),
            ("explicit-panic", "medium", 7),
        ];
        let want: Vec<_> = want.iter().map(|(r, s, l)| (r.to_string(), s.to_string(), *l)).collect();
        assert_eq!(got, want);
    }

    #[test]
    fn one_finding_per_rule_per_line_but_many_rules_per_line() {
        let got = rules_at(&review("f", "password secret = x.unwrap() // TODO"));
        let rules: Vec<_> = got.iter().map(|(r, _, _)| r.as_str()).collect();
        assert_eq!(rules, ["no-unwrap", "todo-left", "hardcoded-secret"]);
        assert!(got.iter().all(|(_, _, line)| *line == 1));
    }

    #[test]
    fn prompt_convention_is_split_and_lines_are_relative_to_content() {
        assert_eq!(split_prompt("source_id: pay#1\n\na\nb"), ("pay#1", "a\nb"));
        assert_eq!(split_prompt("no header"), ("unknown", "no header"));
        assert_eq!(split_prompt("source_id:   \n\nx"), ("unknown", "x"));
        let body = json!({"model": "m", "messages": [
            {"role": "system", "content": "review"},
            {"role": "user", "content": "source_id: s1\n\nok\nx.unwrap()"}
        ], "response_format": {"type": "json_schema", "json_schema": {"name": "r", "schema": {}}}});
        let reply = respond(&body, Behaviour::Answer { flaw: Flaw::None });
        let output: Value = serde_json::from_str(reply.content.as_deref().unwrap()).unwrap();
        assert_eq!(output["findings"][0]["file"], "s1");
        assert_eq!(output["findings"][0]["line"], 2);
        let prompt_bytes = "review".len() + "source_id: s1\n\nok\nx.unwrap()".len();
        assert_eq!(reply.prompt_tokens, (prompt_bytes / 4) as u64);
        assert_eq!(reply.completion_tokens, (reply.content.unwrap().len() / 4) as u64);
    }

    #[test]
    fn without_structured_outputs_the_json_is_wrapped_in_prose() {
        let body = json!({"model": "m", "messages": [{"role": "user", "content": "x"}]});
        let reply = respond(&body, Behaviour::Answer { flaw: Flaw::None });
        let content = reply.content.unwrap();
        assert!(content.starts_with("Here is my review."));
        assert!(serde_json::from_str::<Value>(&content).is_err());
        assert_eq!(reply.prompt_tokens, 1);
    }

    fn structured(budget: Option<u64>) -> Value {
        let mut body = json!({"model": "m", "messages": [{"role": "user", "content": "source_id: s\n\na.unwrap()\nTODO"}],
            "response_format": {"type": "json_schema"}});
        if let Some(budget) = budget {
            body["max_completion_tokens"] = json!(budget);
        }
        body
    }

    #[test]
    fn a_long_answer_is_cut_off_under_a_small_budget_and_complete_under_a_large_one() {
        let long = |valid_prefix| Behaviour::Long { needs: 3000, valid_prefix };
        let cut_valid = respond(&structured(Some(1000)), long(true));
        assert_eq!((cut_valid.finish_reason, cut_valid.completion_tokens), ("length", 1000));
        let prefix: Value = serde_json::from_str(cut_valid.content.as_deref().unwrap()).unwrap();
        assert_eq!(prefix["findings"].as_array().unwrap().len(), 1, "the first half of two findings: valid JSON");
        let torn = respond(&structured(Some(1000)), long(false));
        assert_eq!(torn.finish_reason, "length");
        assert!(serde_json::from_str::<Value>(torn.content.as_deref().unwrap()).is_err());
        let full = respond(&structured(Some(3000)), long(true));
        assert_eq!((full.finish_reason, full.completion_tokens), ("stop", 3000));
        let full: Value = serde_json::from_str(full.content.as_deref().unwrap()).unwrap();
        assert_eq!(full["findings"].as_array().unwrap().len(), 2);
        let unbounded = respond(&structured(None), long(true));
        assert_eq!(unbounded.finish_reason, "stop", "the model's own limit is 16384");
        let legacy = json!({"max_tokens": 10, "messages": []});
        assert_eq!(output_budget(&legacy), Some(10));
    }

    #[test]
    fn a_refusal_has_no_content() {
        let reply = respond(&structured(None), Behaviour::Refuse { first_kind: true });
        assert_eq!(reply.content, None);
        assert_eq!(reply.refusal.as_deref(), Some(REFUSAL));
        assert_eq!(reply.finish_reason, "stop");
    }

    #[test]
    fn broken_review_violates_the_schema_even_without_findings() {
        for content in ["fine()", "x.unwrap()"] {
            let output = broken_review("f", content);
            let first = &output["findings"][0];
            assert_eq!(first["line"], 0);
            assert_eq!(first["severity"], "urgent");
        }
    }
}
