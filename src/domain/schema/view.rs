//! Provider views of a registered schema.
//!
//! The registered document stays the authority: every answer is validated against it
//! locally. A provider's structured-output feature only ever sees a view derived from it,
//! because real APIs refuse keywords a plain JSON Schema validator takes for granted.
//! OpenAI's strict mode is an allowlist (an unlisted keyword fails the request with 400
//! `invalid_json_schema`), and Anthropic refuses a tool `input_schema` with a combinator at
//! its root. A view either adapts the document (dropping what the local validator still
//! enforces, closing objects, turning optional properties into required nullable ones) or
//! says exactly which keyword at which JSON Pointer cannot be expressed, so that a schema
//! a provider would refuse is refused at start-up instead of on the first paid batch.
//!
//! Facts and their sources are listed in docs/PROVIDERS.md ("Structured output").

use std::collections::BTreeSet;

use serde_json::{Map, Value, json};

mod gemini;

/// How a provider takes a schema.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Dialect {
    /// OpenAI Structured Outputs with `strict: true` (Batch API lines, chat completions,
    /// and the OpenAI-shaped generic contract).
    OpenAiStrict,
    /// Anthropic forced tool use: the tool's `input_schema`, non-strict.
    AnthropicTool,
    /// Gemini `generationConfig.responseJsonSchema` (see `gemini`).
    GeminiJson,
}

impl Dialect {
    pub const ALL: [Dialect; 3] = [Dialect::OpenAiStrict, Dialect::AnthropicTool, Dialect::GeminiJson];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::OpenAiStrict => "openai-strict",
            Self::AnthropicTool => "anthropic-tool",
            Self::GeminiJson => "gemini-json-schema",
        }
    }
}

/// A schema as one provider will be sent it.
#[derive(Debug, Clone, PartialEq)]
pub struct View {
    pub document: Value,
    /// What was changed to make the provider accept it, one line each (empty: used as is).
    pub adaptations: Vec<String>,
}

/// Why a schema cannot be sent to a provider at all.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("at {pointer:?}, `{keyword}`: {reason}")]
pub struct Inexpressible {
    /// JSON Pointer into the registered document.
    pub pointer: String,
    pub keyword: String,
    pub reason: String,
}

/// Limits of OpenAI's strict mode, from the Structured Outputs guide ("Supported
/// schemas"; checked 2026-12: 5,000 object properties, 10 levels of nesting, 1,000 enum
/// values, 120,000 characters of names and enum/const values, 15,000 characters for one
/// string enum of more than 250 values). The guide has raised them before.
const MAX_PROPERTIES: usize = 5_000;
const MAX_NESTING: usize = 10;
const MAX_ENUM_VALUES: usize = 1_000;
const MAX_TOTAL_STRING_CHARS: usize = 120_000;
const LARGE_ENUM: usize = 250;
const MAX_LARGE_ENUM_CHARS: usize = 15_000;

/// String formats strict mode lists as supported; any other `format` is dropped.
const STRICT_FORMATS: [&str; 9] =
    ["date-time", "time", "date", "duration", "email", "hostname", "ipv4", "ipv6", "uuid"];

/// Keywords strict mode accepts, beyond the structural ones handled explicitly below.
const STRICT_PASSTHROUGH: [&str; 10] = [
    "description",
    "title",
    "pattern",
    "multipleOf",
    "maximum",
    "exclusiveMaximum",
    "minimum",
    "exclusiveMinimum",
    "minItems",
    "maxItems",
];

/// Root keywords that are ours or a document's own bookkeeping, never a provider's business.
fn is_private_root_key(key: &str) -> bool {
    key.starts_with("x-commitpoint-") || key == "$schema" || key == "$id"
}

pub(super) fn derive(document: &Value, dialect: Dialect) -> Result<View, Inexpressible> {
    match dialect {
        Dialect::OpenAiStrict => openai_strict(document),
        Dialect::AnthropicTool => anthropic_tool(document),
        Dialect::GeminiJson => gemini::derive(document),
    }
}

fn refuse(pointer: &str, keyword: &str, reason: impl Into<String>) -> Inexpressible {
    Inexpressible { pointer: pointer.to_string(), keyword: keyword.to_string(), reason: reason.into() }
}

fn without_private_keys(document: &Value) -> Result<Map<String, Value>, Inexpressible> {
    let Value::Object(map) = document else {
        return Err(refuse("", "type", "the schema must be a JSON object"));
    };
    Ok(map.iter().filter(|(k, _)| !is_private_root_key(k)).map(|(k, v)| (k.clone(), v.clone())).collect())
}

/// Anthropic: tool inputs are objects, and the API answers 400 "input_schema does not
/// support oneOf, allOf, or anyOf at the top level". Non-strict tool use takes the rest
/// of JSON Schema, so nothing else is changed.
fn anthropic_tool(document: &Value) -> Result<View, Inexpressible> {
    let root = without_private_keys(document)?;
    for combinator in ["oneOf", "allOf", "anyOf"] {
        if root.contains_key(combinator) {
            return Err(refuse(
                "",
                combinator,
                "Anthropic refuses a tool input_schema with oneOf, allOf or anyOf at the top level",
            ));
        }
    }
    if root.get("type") != Some(&json!("object")) {
        return Err(refuse("", "type", "a tool input_schema must be `\"type\": \"object\"` at the root"));
    }
    Ok(View { document: Value::Object(root), adaptations: Vec::new() })
}

#[derive(Default)]
struct StrictWalk {
    adaptations: Vec<String>,
    properties: usize,
    enum_values: usize,
    string_chars: usize,
}

fn openai_strict(document: &Value) -> Result<View, Inexpressible> {
    let root = Value::Object(without_private_keys(document)?);
    for combinator in ["anyOf", "oneOf", "allOf"] {
        if root.get(combinator).is_some() {
            return Err(refuse("", combinator, "strict mode needs an object at the root, not a combinator"));
        }
    }
    let mut walk = StrictWalk::default();
    let view = walk.node(&root, "", 0)?;
    if view.get("type") != Some(&json!("object")) {
        return Err(refuse("", "type", "strict mode needs `\"type\": \"object\"` at the root"));
    }
    if walk.properties > MAX_PROPERTIES {
        return Err(refuse(
            "",
            "properties",
            format!("{} object properties exceed strict mode's limit of {MAX_PROPERTIES}", walk.properties),
        ));
    }
    if walk.enum_values > MAX_ENUM_VALUES {
        return Err(refuse(
            "",
            "enum",
            format!("{} enum values exceed strict mode's limit of {MAX_ENUM_VALUES}", walk.enum_values),
        ));
    }
    if walk.string_chars > MAX_TOTAL_STRING_CHARS {
        return Err(refuse(
            "",
            "properties",
            format!(
                "{} characters of property names and enum values exceed strict mode's limit of {MAX_TOTAL_STRING_CHARS}",
                walk.string_chars
            ),
        ));
    }
    Ok(View { document: view, adaptations: walk.adaptations })
}

impl StrictWalk {
    /// One subschema at `pointer`; `depth` counts enclosing objects.
    fn node(&mut self, schema: &Value, pointer: &str, depth: usize) -> Result<Value, Inexpressible> {
        let Value::Object(map) = schema else {
            return Err(refuse(pointer, "type", "strict mode needs a schema object here, not a boolean schema"));
        };
        let mut out = Map::new();
        for (key, value) in map {
            let at = format!("{pointer}/{}", escape(key));
            match key.as_str() {
                "type" | "properties" | "required" | "additionalProperties" | "patternProperties" => {}
                "items" => {
                    if !value.is_object() {
                        return Err(refuse(&at, "items", "strict mode needs one schema object for array items"));
                    }
                    out.insert(key.clone(), self.node(value, &at, depth)?);
                }
                "anyOf" | "oneOf" => {
                    if key == "oneOf" && map.contains_key("anyOf") {
                        return Err(refuse(&at, "oneOf", "oneOf next to anyOf cannot be expressed in strict mode"));
                    }
                    let Value::Array(branches) = value else {
                        return Err(refuse(&at, key, "must be an array of schemas"));
                    };
                    let mut converted = Vec::with_capacity(branches.len());
                    for (index, branch) in branches.iter().enumerate() {
                        converted.push(self.node(branch, &format!("{at}/{index}"), depth)?);
                    }
                    if key == "oneOf" {
                        self.note(pointer, "`oneOf` sent as `anyOf` (exactly-one is still enforced locally)");
                    }
                    out.insert("anyOf".to_string(), Value::Array(converted));
                }
                "$defs" | "definitions" => {
                    let Value::Object(defs) = value else {
                        return Err(refuse(&at, key, "must be an object of schemas"));
                    };
                    let mut converted = Map::new();
                    for (name, def) in defs {
                        self.string_chars += name.chars().count();
                        converted.insert(name.clone(), self.node(def, &format!("{at}/{}", escape(name)), depth)?);
                    }
                    out.insert(key.clone(), Value::Object(converted));
                }
                "$ref" => {
                    if !value.as_str().is_some_and(|r| r == "#" || r.starts_with("#/")) {
                        return Err(refuse(&at, "$ref", "only references within the document (`#/...`) are allowed"));
                    }
                    out.insert(key.clone(), value.clone());
                }
                "enum" => {
                    self.count_enum(value, &at)?;
                    out.insert(key.clone(), value.clone());
                }
                "const" => {
                    if let Some(text) = value.as_str() {
                        self.string_chars += text.chars().count();
                    }
                    out.insert(key.clone(), value.clone());
                }
                "format" => {
                    if value.as_str().is_some_and(|f| STRICT_FORMATS.contains(&f)) {
                        out.insert(key.clone(), value.clone());
                    } else {
                        self.note(pointer, &format!("dropped `format: {value}` (strict mode does not list it)"));
                    }
                }
                "allOf" => {
                    return Err(refuse(
                        &at,
                        "allOf",
                        "strict mode has no allOf; merge its branches into the schema itself",
                    ));
                }
                "prefixItems" => {
                    return Err(refuse(&at, "prefixItems", "strict mode cannot express tuples (prefixItems)"));
                }
                k if STRICT_PASSTHROUGH.contains(&k) => {
                    out.insert(key.clone(), value.clone());
                }
                other => {
                    self.note(pointer, &format!("dropped `{other}` (not in strict mode's subset; enforced locally)"))
                }
            }
        }
        if out.contains_key("$ref") {
            let siblings: Vec<String> = out.keys().filter(|k| *k != "$ref").cloned().collect();
            for sibling in siblings {
                if sibling == "description" || sibling == "title" {
                    out.remove(&sibling);
                    self.note(pointer, &format!("dropped `{sibling}` next to `$ref`"));
                } else {
                    return Err(refuse(pointer, &sibling, "strict mode takes no keywords next to `$ref`"));
                }
            }
            return Ok(Value::Object(out));
        }
        let kind = map.get("type").cloned().or_else(|| inferred_type(map)).or_else(|| {
            map.contains_key("properties").then(|| {
                self.note(pointer, "added `type: object` (it has `properties`)");
                json!("object")
            })
        });
        match kind {
            Some(kind) => {
                out.insert("type".to_string(), kind);
            }
            None if out.contains_key("anyOf") => {}
            None => {
                return Err(refuse(
                    pointer,
                    "type",
                    "strict mode needs a `type` on every schema (or an `enum`/`const` it can be read from)",
                ));
            }
        }
        if type_includes(out.get("type"), "object") {
            self.object(map, &mut out, pointer, depth + 1)?;
        }
        Ok(Value::Object(out))
    }

    fn object(
        &mut self,
        original: &Map<String, Value>,
        out: &mut Map<String, Value>,
        pointer: &str,
        depth: usize,
    ) -> Result<(), Inexpressible> {
        if depth > MAX_NESTING {
            return Err(refuse(
                pointer,
                "properties",
                format!("{depth} levels of nesting exceed strict mode's limit of {MAX_NESTING}"),
            ));
        }
        let open_ended = original.get("patternProperties").is_some()
            || original.get("additionalProperties").is_some_and(|a| a.is_object() || *a == json!(true));
        let Some(properties) = original.get("properties") else {
            let keyword = if original.contains_key("patternProperties") { "patternProperties" } else { "properties" };
            return Err(refuse(
                pointer,
                keyword,
                "an object without named `properties` cannot be expressed in strict mode (the model could only answer {})",
            ));
        };
        let Value::Object(properties) = properties else {
            return Err(refuse(pointer, "properties", "must be an object of schemas"));
        };
        if open_ended {
            self.note(pointer, "closed with `additionalProperties: false` (other keys are still accepted locally)");
        } else if original.get("additionalProperties") != Some(&json!(false)) {
            self.note(pointer, "added `additionalProperties: false`");
        }
        let required: BTreeSet<&str> = original
            .get("required")
            .and_then(Value::as_array)
            .map(|r| r.iter().filter_map(Value::as_str).collect())
            .unwrap_or_default();
        let mut converted = Map::new();
        for (name, schema) in properties {
            self.properties += 1;
            self.string_chars += name.chars().count();
            let at = format!("{pointer}/properties/{}", escape(name));
            let mut view = self.node(schema, &at, depth)?;
            if !required.contains(name.as_str()) {
                view = nullable(view);
                self.note(&at, "optional: sent as required and nullable (a null answer is read as absent)");
            }
            converted.insert(name.clone(), view);
        }
        let names: Vec<Value> = converted.keys().map(|k| Value::String(k.clone())).collect();
        out.insert("properties".to_string(), Value::Object(converted));
        out.insert("required".to_string(), Value::Array(names));
        out.insert("additionalProperties".to_string(), Value::Bool(false));
        Ok(())
    }

    fn count_enum(&mut self, values: &Value, pointer: &str) -> Result<(), Inexpressible> {
        let Value::Array(values) = values else {
            return Err(refuse(pointer, "enum", "must be an array"));
        };
        self.enum_values += values.len();
        let chars: usize = values.iter().filter_map(Value::as_str).map(|s| s.chars().count()).sum();
        self.string_chars += chars;
        if values.len() > LARGE_ENUM && chars > MAX_LARGE_ENUM_CHARS {
            return Err(refuse(
                pointer,
                "enum",
                format!(
                    "an enum of more than {LARGE_ENUM} values may hold at most {MAX_LARGE_ENUM_CHARS} characters, not {chars}"
                ),
            ));
        }
        Ok(())
    }

    fn note(&mut self, pointer: &str, what: &str) {
        let at = if pointer.is_empty() { "(root)" } else { pointer };
        self.adaptations.push(format!("{at}: {what}"));
    }
}

/// The type an `enum`/`const` implies, so that a schema like `{"enum": ["low", "high"]}`
/// still carries the `type` strict mode insists on.
fn inferred_type(map: &Map<String, Value>) -> Option<Value> {
    let values: Vec<&Value> = match (map.get("enum"), map.get("const")) {
        (Some(Value::Array(values)), _) => values.iter().collect(),
        (None, Some(value)) => vec![value],
        _ => return None,
    };
    let mut kinds: Vec<&str> = Vec::new();
    for value in values {
        let kind = match value {
            Value::String(_) => "string",
            Value::Bool(_) => "boolean",
            Value::Null => "null",
            Value::Number(n) if n.is_i64() || n.is_u64() => "integer",
            Value::Number(_) => "number",
            Value::Array(_) | Value::Object(_) => return None,
        };
        if !kinds.contains(&kind) {
            kinds.push(kind);
        }
    }
    if kinds.contains(&"number") {
        kinds.retain(|k| *k != "integer");
    }
    match kinds.as_slice() {
        [] => None,
        [one] => Some(json!(one)),
        many => Some(json!(many)),
    }
}

fn type_includes(kind: Option<&Value>, name: &str) -> bool {
    match kind {
        Some(Value::String(s)) => s == name,
        Some(Value::Array(list)) => list.iter().any(|t| t == name),
        _ => false,
    }
}

/// The same schema, also admitting `null`.
fn nullable(view: Value) -> Value {
    let Value::Object(mut map) = view else { return view };
    if map.contains_key("$ref") || map.contains_key("const") {
        return json!({"anyOf": [Value::Object(map), {"type": "null"}]});
    }
    if let Some(Value::Array(branches)) = map.get_mut("anyOf") {
        if !branches.iter().any(|b| b.get("type") == Some(&json!("null"))) {
            branches.push(json!({"type": "null"}));
        }
        return Value::Object(map);
    }
    match map.get_mut("type") {
        Some(Value::String(kind)) if kind != "null" => {
            let kind = std::mem::take(kind);
            map.insert("type".to_string(), json!([kind, "null"]));
        }
        Some(Value::Array(kinds)) if !kinds.iter().any(|k| k == "null") => kinds.push(json!("null")),
        _ => {}
    }
    if let Some(Value::Array(values)) = map.get_mut("enum")
        && !values.contains(&Value::Null)
    {
        values.push(Value::Null);
    }
    Value::Object(map)
}

/// RFC 6901 escaping of one reference token.
fn escape(token: &str) -> String {
    token.replace('~', "~0").replace('/', "~1")
}

/// Removes, in place, every `null` the strict view made possible: a property that was
/// optional in the registered schema and does not admit `null` there. Strict mode makes
/// the model send every property, so "absent" arrives as `null`; local validation must
/// see it absent again, as the registered schema means it.
pub(super) fn strip_optional_nulls(document: &Value, answer: &mut Value) {
    strip(document, document, answer, 0);
}

/// Bounds `$ref` chains that consume no input (`{"$ref": "#"}` at the root).
const MAX_REF_HOPS: usize = 64;

fn strip(root: &Value, schema: &Value, value: &mut Value, hops: usize) {
    if hops > MAX_REF_HOPS {
        return;
    }
    if let Some(target) = schema.get("$ref").and_then(Value::as_str).and_then(|r| resolve(root, r)) {
        strip(root, target, value, hops + 1);
        return;
    }
    match value {
        Value::Object(fields) => {
            let Some(Value::Object(properties)) = schema.get("properties") else { return };
            let required: BTreeSet<&str> = schema
                .get("required")
                .and_then(Value::as_array)
                .map(|r| r.iter().filter_map(Value::as_str).collect())
                .unwrap_or_default();
            fields.retain(|name, field| {
                let optional = !required.contains(name.as_str());
                !(field.is_null() && optional && properties.get(name).is_some_and(|s| !admits_null(root, s, 0)))
            });
            for (name, field) in fields.iter_mut() {
                if let Some(sub) = properties.get(name) {
                    strip(root, sub, field, 0);
                }
            }
        }
        Value::Array(items) => {
            if let Some(item_schema) = schema.get("items").filter(|s| s.is_object()) {
                for item in items {
                    strip(root, item_schema, item, 0);
                }
            }
        }
        _ => {}
    }
}

fn admits_null(root: &Value, schema: &Value, hops: usize) -> bool {
    if hops > MAX_REF_HOPS {
        return true;
    }
    let Value::Object(map) = schema else { return *schema != Value::Bool(false) };
    if let Some(target) = map.get("$ref").and_then(Value::as_str).and_then(|r| resolve(root, r)) {
        return admits_null(root, target, hops + 1);
    }
    let branches = ["anyOf", "oneOf"].iter().filter_map(|k| map.get(*k)).filter_map(Value::as_array).flatten();
    if map.contains_key("anyOf") || map.contains_key("oneOf") {
        return branches.into_iter().any(|b| admits_null(root, b, hops + 1));
    }
    if let Some(values) = map.get("enum").and_then(Value::as_array) {
        return values.contains(&Value::Null);
    }
    if let Some(value) = map.get("const") {
        return value.is_null();
    }
    match map.get("type") {
        None => true,
        Some(kind) => type_includes(Some(kind), "null"),
    }
}

fn resolve<'a>(root: &'a Value, reference: &str) -> Option<&'a Value> {
    let pointer = reference.strip_prefix('#')?;
    root.pointer(pointer)
}

#[cfg(test)]
mod tests;
