//! What the simulated model answers, whatever the dialect: the JSON it puts in a
//! completion's content, a tool call's input or a candidate's text.
//!
//! Every real request carries the schema the answer must satisfy (OpenAI
//! `response_format.json_schema.schema`, Anthropic the forced tool's `input_schema` or
//! `output_config.format.schema`, Gemini `generationConfig.responseJsonSchema` or
//! `responseSchema`, Bedrock the Anthropic body). A schema that takes the rule-based
//! reviewer's `code-review@1` findings (no schema at all, `code-review@1` itself or its
//! provider views, a superset of it) gets exactly that review; any other schema an
//! instance made by `instance` from the source. The answer is checked against the
//! request's schema, so the simulator never sends an invalid answer by accident.
//!
//! It can also be told to answer wrong first (`Faults::invalid_first`,
//! `Faults::ungrounded_first`), the way a model does before it is re-asked: see
//! [`Attempts`].

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock, PoisonError};

use serde_json::{Map, Value, json};

use super::faults::{Behaviour, Faults, Flaw};
use super::instance::{self, ELSEWHERE_FILE};
use super::model::{broken_review, conform, review, split_prompt};

/// Who said one turn of a conversation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Turn {
    /// `user` (every dialect).
    User,
    /// A previous answer: `assistant` (OpenAI, Anthropic, Bedrock), `model` (Gemini).
    Model,
    /// `system`, `developer`, `tool`, ...
    Other,
}

/// One request as the model reads it: the source, the schema it must answer in, and how
/// many answers it has already given in this conversation.
#[derive(Clone, Debug, PartialEq)]
pub(super) struct Ask {
    pub source_id: String,
    pub content: String,
    pub schema: Option<Value>,
    /// Assistant (Gemini: `model`) turns before this request: a re-ask carries the earlier
    /// answer and then a user turn with the issues found in it.
    pub prior_answers: usize,
}

impl Ask {
    /// The source is the last user turn that follows the prompt convention
    /// (`source_id: …`), else the first user turn: a re-ask's last user turn holds the
    /// issues, not the source.
    pub(super) fn new(turns: &[(Turn, String)], schema: Option<&Value>) -> Self {
        let users = || turns.iter().filter(|(t, _)| *t == Turn::User).map(|(_, text)| text.as_str());
        let prompt = users().rev().find(|t| t.starts_with("source_id:")).or_else(|| users().next()).unwrap_or_default();
        let (source_id, content) = split_prompt(prompt);
        Ask {
            source_id: source_id.to_string(),
            content: content.to_string(),
            schema: schema.filter(|s| !s.is_null()).cloned(),
            prior_answers: turns.iter().filter(|(t, _)| *t == Turn::Model).count(),
        }
    }

    /// The source and schema asked about, as the attempt counter keys them.
    fn key(&self) -> [u8; 32] {
        let mut hasher = blake3::Hasher::new();
        for part in [self.source_id.as_str(), self.content.as_str()] {
            hasher.update(&(part.len() as u64).to_le_bytes());
            hasher.update(part.as_bytes());
        }
        hasher.update(self.schema.as_ref().map(Value::to_string).unwrap_or_default().as_bytes());
        *hasher.finalize().as_bytes()
    }
}

/// An answer as a chatty model sends it: the text after a sentence, so it is not JSON.
pub(super) fn in_prose(text: &str) -> String {
    format!("Sure! Here is what I found in the source: {text} Let me know if you need anything else.")
}

/// The answer for `ask`, with `flaw` (see [`Flaw`]).
pub(super) fn answer(ask: &Ask, flaw: Flaw) -> Value {
    let compiled = compiled(ask.schema.as_ref());
    let (id, content) = (ask.source_id.as_str(), ask.content.as_str());
    let Some(schema) = compiled.schema.as_ref().filter(|_| !compiled.reviewer) else {
        return match flaw {
            Flaw::None | Flaw::NotJson => review(id, content),
            Flaw::Disagree => disagreeing_review(id, content),
            Flaw::Invalid => broken_review(id, content),
            Flaw::Ungrounded => ungrounded_review(id, content),
        };
    };
    let valid = {
        let first = instance::generate(schema, id, content, true);
        if compiled.accepts(&first) {
            first
        } else {
            let minimal = instance::generate_minimal(schema, id, content);
            if compiled.accepts(&minimal) { minimal } else { first }
        }
    };
    match flaw {
        Flaw::None | Flaw::NotJson | Flaw::Disagree => valid,
        Flaw::Ungrounded => ungrounded(&compiled, schema, valid, id, content),
        Flaw::Invalid => invalid(&compiled, schema, valid),
    }
}

/// Another reading of the same source: the reviewer's findings without the last one, and
/// one more on line 1 (which every source has), so precision and recall both move.
fn disagreeing_review(source_id: &str, content: &str) -> Value {
    let mut output = review(source_id, content);
    if let Some(Value::Array(findings)) = output.get_mut("findings") {
        findings.pop();
        findings.push(json!({"rule": "readability", "severity": "low", "file": source_id, "line": 1,
            "summary": "the first line could say more plainly what the change does"}));
    }
    output
}

/// The reviewer's findings plus two it made up: one on a line past the end of the source,
/// one in a file the source never names.
fn ungrounded_review(source_id: &str, content: &str) -> Value {
    let mut output = review(source_id, content);
    let past_end = content.lines().count() + 10;
    if let Some(Value::Array(findings)) = output.get_mut("findings") {
        findings.push(json!({"rule": "no-unwrap", "severity": "medium", "file": source_id, "line": past_end,
            "summary": "unwrap() panics on bad input; return the error instead"}));
        findings.push(json!({"rule": "todo-left", "severity": "low", "file": ELSEWHERE_FILE, "line": 1,
            "summary": "unfinished work left in the change"}));
    }
    output
}

/// A valid answer with, in its findings (the first array of objects under the root), one
/// more item about nothing in the source; or, where that cannot be, an answer all of
/// whose source-derived values point elsewhere.
fn ungrounded(compiled: &Compiled, schema: &Value, mut valid: Value, id: &str, content: &str) -> Value {
    let elsewhere = instance::generate(schema, id, content, false);
    let findings = valid.as_object().and_then(|fields| {
        let holds_objects = |v: &Value| v.as_array().and_then(|a| a.first()).is_some_and(Value::is_object);
        fields.iter().find(|(_, v)| holds_objects(v)).map(|(name, _)| name.clone())
    });
    let made_up = findings.as_ref().and_then(|name| elsewhere.get(name)?.as_array()?.first().cloned());
    if let (Some(name), Some(item)) = (findings, made_up)
        && let Some(Value::Array(items)) = valid.get_mut(&name)
        && !items.contains(&item)
    {
        items.push(item);
        if compiled.accepts(&valid) {
            return valid;
        }
        if let Some(Value::Array(items)) = valid.get_mut(&name) {
            items.pop();
        }
    }
    if compiled.accepts(&elsewhere) { elsewhere } else { valid }
}

/// A valid answer with one required property taken out (the deepest one that holds a
/// value), as a model that forgot a field sends; a bare string where that stays valid.
fn invalid(compiled: &Compiled, schema: &Value, mut valid: Value) -> Value {
    if drop_required(schema, schema, &mut valid, 0) && !compiled.accepts(&valid) {
        return valid;
    }
    let refused = json!("SIMULATED: an answer that is not the JSON asked for");
    if compiled.accepts(&refused) { valid } else { refused }
}

fn drop_required(root: &Value, schema: &Value, value: &mut Value, depth: usize) -> bool {
    if depth > 32 {
        return false;
    }
    let schema = match schema.get("$ref").and_then(Value::as_str).and_then(|r| root.pointer(r.strip_prefix('#')?)) {
        Some(target) => target,
        None => schema,
    };
    match value {
        Value::Object(fields) => {
            let properties = schema.get("properties").and_then(Value::as_object);
            for (name, field) in fields.iter_mut() {
                if let Some(sub) = properties.and_then(|p| p.get(name))
                    && drop_required(root, sub, field, depth + 1)
                {
                    return true;
                }
            }
            let required = schema.get("required").and_then(Value::as_array).into_iter().flatten();
            let drop = required.filter_map(Value::as_str).find(|n| fields.get(*n).is_some_and(|v| !v.is_null()));
            match drop.map(str::to_string) {
                Some(name) => fields.remove(&name).is_some(),
                None => false,
            }
        }
        Value::Array(items) => match (items.first_mut(), schema.get("items")) {
            (Some(first), Some(item_schema)) => drop_required(root, item_schema, first, depth + 1),
            _ => false,
        },
        _ => false,
    }
}

/// A request schema, read once: whether the reviewer's findings satisfy it, and its validator.
struct Compiled {
    /// `None`: no schema was sent.
    schema: Option<Value>,
    reviewer: bool,
    validator: Option<jsonschema::Validator>,
}

impl Compiled {
    /// Whether the request's schema takes `answer`, after the nulls strict mode adds;
    /// a schema the validator cannot read takes everything.
    fn accepts(&self, answer: &Value) -> bool {
        let (Some(validator), Some(schema)) = (&self.validator, &self.schema) else { return true };
        let mut answer = answer.clone();
        conform(&mut answer, schema);
        validator.is_valid(&answer)
    }
}

/// Compiled schemas by the hash of their text; a simulator run sees a handful.
type Cache = Mutex<HashMap<[u8; 32], Arc<Compiled>>>;
const MAX_CACHED: usize = 256;

fn compiled(schema: Option<&Value>) -> Arc<Compiled> {
    static CACHE: OnceLock<Cache> = OnceLock::new();
    let key = *blake3::hash(schema.map(Value::to_string).unwrap_or_default().as_bytes()).as_bytes();
    let cache = CACHE.get_or_init(Cache::default);
    if let Some(found) = cache.lock().unwrap_or_else(PoisonError::into_inner).get(&key) {
        return Arc::clone(found);
    }
    let made = Arc::new(compile(schema));
    let mut cache = cache.lock().unwrap_or_else(PoisonError::into_inner);
    if cache.len() >= MAX_CACHED {
        cache.clear();
    }
    cache.insert(key, Arc::clone(&made));
    made
}

fn compile(schema: Option<&Value>) -> Compiled {
    let Some(schema) = schema else { return Compiled { schema: None, reviewer: true, validator: None } };
    let schema = json_schema(schema);
    let validator = jsonschema::draft202012::new(&schema).ok();
    let compiled = Compiled { schema: Some(schema), reviewer: false, validator };
    // One finding the reviewer would give: a schema that takes it is code-review-shaped.
    let probe = review("src/probe.rs", "let x = y.unwrap();");
    let reviewer = compiled.validator.is_none() || compiled.accepts(&probe);
    Compiled { reviewer, ..compiled }
}

/// Gemini's OpenAPI-style `responseSchema` (`"type": "OBJECT"`, `nullable: true`) read
/// as JSON Schema; a JSON Schema document is unchanged.
fn json_schema(schema: &Value) -> Value {
    match schema {
        Value::Object(map) => {
            let mut out = Map::new();
            for (key, value) in map {
                let value = match (key.as_str(), value) {
                    ("type", Value::String(kind)) => Value::String(kind.to_ascii_lowercase()),
                    ("type", Value::Array(kinds)) => Value::Array(
                        kinds
                            .iter()
                            .map(|k| k.as_str().map_or_else(|| k.clone(), |k| Value::String(k.to_ascii_lowercase())))
                            .collect(),
                    ),
                    ("enum" | "const" | "default" | "examples" | "required", v) => v.clone(),
                    ("properties" | "$defs" | "definitions" | "patternProperties", Value::Object(children)) => {
                        Value::Object(children.iter().map(|(k, v)| (k.clone(), json_schema(v))).collect())
                    }
                    (_, v) => json_schema(v),
                };
                out.insert(key.clone(), value);
            }
            if out.remove("nullable") == Some(Value::Bool(true)) {
                match out.get_mut("type") {
                    Some(Value::String(kind)) => {
                        let kind = std::mem::take(kind);
                        out.insert("type".to_string(), json!([kind, "null"]));
                    }
                    Some(Value::Array(kinds)) if !kinds.iter().any(|k| k == "null") => kinds.push(json!("null")),
                    _ => {}
                }
            }
            Value::Object(out)
        }
        Value::Array(items) => Value::Array(items.iter().map(json_schema).collect()),
        other => other.clone(),
    }
}

/// How many answers each source has had while a misbehave knob was on.
#[derive(Debug, Default)]
pub(super) struct Attempts {
    answered: HashMap<[u8; 32], u32>,
}

impl Attempts {
    /// The behaviour for the request at `position`, with the misbehave knobs applied: a
    /// plain answer becomes invalid for a source's first `invalid_first` attempts, then
    /// ungrounded for the next `ungrounded_first`. The attempt is the larger of the
    /// answers already given for this source and schema (counted here, while a knob is
    /// on) and the answers the request's own conversation carries, plus one; so a re-ask
    /// is answered validly in every dialect, whether or not it replays the conversation.
    pub(super) fn behaviour(&mut self, faults: &Faults, position: usize, ask: &Ask) -> Behaviour {
        let behaviour = faults.behaviour(position);
        let wrong_first = faults.invalid_first.saturating_add(faults.ungrounded_first);
        if wrong_first == 0 || behaviour != (Behaviour::Answer { flaw: Flaw::None }) {
            return behaviour;
        }
        let seen = self.answered.entry(ask.key()).or_insert(0);
        *seen = seen.saturating_add(1);
        let attempt = (*seen).max(u32::try_from(ask.prior_answers).unwrap_or(u32::MAX).saturating_add(1));
        let flaw = if attempt <= faults.invalid_first {
            Flaw::Invalid
        } else if attempt <= wrong_first {
            Flaw::Ungrounded
        } else {
            Flaw::None
        };
        Behaviour::Answer { flaw }
    }
}

#[cfg(test)]
mod tests;
