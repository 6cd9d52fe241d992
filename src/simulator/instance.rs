//! A deterministic instance of a JSON Schema: what the simulated model answers for any
//! schema other than `code-review@1` (which keeps the rule-based reviewer, see `answer`).
//!
//! It covers the subset real extraction schemas use: `type` (one or a list, Gemini's
//! upper-case `OBJECT` and `nullable: true` too), `properties` / `required` /
//! `additionalProperties`, `items` / `prefixItems`, `enum`, `const`, `minimum` / `maximum`
//! (and the exclusive ones, `multipleOf`), `minLength` / `maxLength`, `minItems` /
//! `maxItems`, `uniqueItems`, `pattern` (a simple-regex generator, checked by the same
//! regex engine the validator uses; else `examples` / `default`), `format`, `$ref` into
//! the document, `anyOf` / `oneOf` (the first branch that is not `null`), and `allOf`
//! (merged). Optional properties are left out and a property that admits `null` gets
//! `null`: the provider views can drop constraints (`maxLength`, `format`, ...) that the
//! registered schema still enforces, and an absent or null property cannot break them.
//!
//! Strings come from the source where the property's name suggests it, so findings stay
//! plausible and grounded: `file` / `path` / `source…` is the source id, `quote` /
//! `excerpt` / `evidence` / `snippet` / `text` / `code` a (trimmed) source line, `line…`
//! that line's 1-based number, `rule` / `kind` / `category` / `severity` / `summary` what the
//! reviewer's rule on that line says. The outermost array of objects (the findings) has
//! one item per line the reviewer's rules flag (at least one, at most five).
//! `grounded: false` makes those source-derived values point elsewhere: lines past the
//! end, a file the source never names, quotes that are not in it.

use serde_json::{Map, Number, Value, json};

use super::model::RULES;

/// Strings the schema gives no length for are kept this short: a view may have dropped a
/// `maxLength` the registered schema still enforces.
const DEFAULT_MAX_CHARS: usize = 60;
/// At most this many findings, whatever the source.
const MAX_FINDINGS: usize = 5;
/// `$ref` chains and nesting deeper than this get the smallest value the node admits.
const MAX_DEPTH: usize = 24;
/// What an ungrounded answer cites instead of the source.
pub(super) const ELSEWHERE_FILE: &str = "src/elsewhere.rs";
const ELSEWHERE_QUOTE: &str = "a statement the source does not contain";

/// One place in the source an answer can talk about.
#[derive(Clone, Debug)]
struct Spot<'a> {
    /// 1-based.
    line: usize,
    text: &'a str,
    rule: Option<(&'static str, &'static str, &'static str)>,
}

/// Generates an instance of `schema` about `content` (from source `source_id`).
pub(super) fn generate(schema: &Value, source_id: &str, content: &str, grounded: bool) -> Value {
    let mut generator = Generator::new(schema, source_id, content, grounded);
    generator.node(schema, &Ctx { name: "", spot: 0, depth: 0 })
}

/// The same, with every array at its `minItems`: a fallback when the first answer does
/// not validate (an item the view could not describe).
pub(super) fn generate_minimal(schema: &Value, source_id: &str, content: &str) -> Value {
    let mut generator = Generator::new(schema, source_id, content, true);
    generator.minimal_arrays = true;
    generator.node(schema, &Ctx { name: "", spot: 0, depth: 0 })
}

struct Generator<'a> {
    root: &'a Value,
    source_id: &'a str,
    content: &'a str,
    spots: Vec<Spot<'a>>,
    line_count: usize,
    grounded: bool,
    /// The outermost array of objects has been given one item per spot.
    findings_done: bool,
    minimal_arrays: bool,
}

#[derive(Clone, Copy)]
struct Ctx<'n> {
    /// The property name this value is for ("" at the root and for array items of scalars).
    name: &'n str,
    /// Which spot the enclosing finding is about.
    spot: usize,
    depth: usize,
}

impl<'a> Generator<'a> {
    fn new(root: &'a Value, source_id: &'a str, content: &'a str, grounded: bool) -> Self {
        let mut spots = Vec::new();
        for (index, line) in content.lines().enumerate() {
            for rule in RULES {
                if rule.0.iter().any(|p| line.contains(p)) {
                    spots.push(Spot { line: index + 1, text: line.trim(), rule: Some((rule.1, rule.2, rule.3)) });
                }
            }
        }
        if spots.is_empty() {
            let first = content.lines().enumerate().find(|(_, l)| !l.trim().is_empty());
            let (line, text) = first.map_or((1, ""), |(i, l)| (i + 1, l.trim()));
            spots.push(Spot { line, text, rule: None });
        }
        Self {
            root,
            source_id,
            content,
            spots,
            line_count: content.lines().count(),
            grounded,
            findings_done: false,
            minimal_arrays: false,
        }
    }

    fn spot(&self, ctx: &Ctx<'_>) -> &Spot<'a> {
        &self.spots[ctx.spot % self.spots.len()]
    }

    fn node(&mut self, schema: &Value, ctx: &Ctx<'_>) -> Value {
        let map = match schema {
            Value::Object(map) => map,
            Value::Bool(true) => return Value::String(self.text_for(ctx)),
            _ => return Value::Null,
        };
        if ctx.depth > MAX_DEPTH {
            return smallest(map);
        }
        let deeper = Ctx { depth: ctx.depth + 1, ..*ctx };
        if let Some(target) = map.get("$ref").and_then(Value::as_str).and_then(|r| resolve(self.root, r)) {
            let merged = merge(&without(map, &["$ref"]), target);
            return self.node(&Value::Object(merged), &deeper);
        }
        if let Some(Value::Array(branches)) = map.get("allOf") {
            let mut merged = without(map, &["allOf"]);
            for branch in branches {
                let branch = self.dereference(branch);
                merged = merge(&merged, &branch);
            }
            return self.node(&Value::Object(merged), &deeper);
        }
        if let Some(value) = map.get("const") {
            return value.clone();
        }
        if let Some(Value::Array(values)) = map.get("enum") {
            return self.pick(values, ctx);
        }
        for key in ["anyOf", "oneOf"] {
            if let Some(Value::Array(branches)) = map.get(key) {
                let chosen = branches
                    .iter()
                    .find(|b| !only_null(&self.dereference(b)))
                    .or_else(|| branches.first())
                    .map(|b| self.dereference(b));
                if let Some(branch) = chosen {
                    let merged = merge(&without(map, &["anyOf", "oneOf"]), &branch);
                    return self.node(&Value::Object(merged), &deeper);
                }
            }
        }
        match chosen_type(map).as_str() {
            "null" => Value::Null,
            "object" => self.object(map, &deeper),
            "array" => self.array(map, &deeper),
            "integer" => self.number(map, ctx, true),
            "number" => self.number(map, ctx, false),
            "boolean" => Value::Bool(false),
            _ => Value::String(self.string(map, ctx)),
        }
    }

    /// A `$ref` subschema's target (other subschemas as they are).
    fn dereference(&self, schema: &Value) -> Value {
        match schema.get("$ref").and_then(Value::as_str).and_then(|r| resolve(self.root, r)) {
            Some(target) => target.clone(),
            None => schema.clone(),
        }
    }

    fn object(&mut self, map: &Map<String, Value>, ctx: &Ctx<'_>) -> Value {
        let empty = Map::new();
        let properties = map.get("properties").and_then(Value::as_object).unwrap_or(&empty);
        let required: Vec<&str> =
            map.get("required").and_then(Value::as_array).into_iter().flatten().filter_map(Value::as_str).collect();
        let mut out = Map::new();
        for name in &required {
            let schema = properties.get(*name).or_else(|| map.get("additionalProperties").filter(|a| a.is_object()));
            let child = Ctx { name, ..*ctx };
            let value = match schema {
                Some(schema) => self.node(schema, &child),
                // Nothing says what it is: a plural name (`findings`) is most likely a list.
                None if name.ends_with('s') => json!([]),
                None => Value::String(self.text_for(&child)),
            };
            out.insert((*name).to_string(), value);
        }
        let min = map.get("minProperties").and_then(Value::as_u64).unwrap_or(0);
        for (name, schema) in properties {
            if out.len() as u64 >= min {
                break;
            }
            if !out.contains_key(name) {
                let value = self.node(schema, &Ctx { name, ..*ctx });
                out.insert(name.clone(), value);
            }
        }
        Value::Object(out)
    }

    fn array(&mut self, map: &Map<String, Value>, ctx: &Ctx<'_>) -> Value {
        let min = map.get("minItems").and_then(Value::as_u64).map_or(0, |n| usize::try_from(n).unwrap_or(usize::MAX));
        let max = map.get("maxItems").and_then(Value::as_u64).map_or(usize::MAX, |n| usize::try_from(n).unwrap_or(0));
        let prefix = map.get("prefixItems").and_then(Value::as_array).map(Vec::as_slice).unwrap_or_default();
        let items = map.get("items").filter(|i| i.is_object() || **i == Value::Bool(true));
        let findings = !self.findings_done && items.is_some_and(|i| chosen_type_of(&self.dereference(i)) == "object");
        let wanted = if self.minimal_arrays || ctx.depth > MAX_DEPTH / 2 {
            min.max(prefix.len())
        } else if findings {
            self.findings_done = true;
            self.spots.len().min(MAX_FINDINGS)
        } else {
            1
        };
        let count = wanted.max(min).min(max);
        let count = if items.is_none() { count.min(prefix.len()).max(min.min(prefix.len())) } else { count };
        let unique = map.get("uniqueItems") == Some(&Value::Bool(true)) || findings;
        let mut out: Vec<Value> = Vec::with_capacity(count);
        let mut attempts = 0;
        while out.len() < count && attempts < count + MAX_FINDINGS {
            let index = attempts;
            attempts += 1;
            let schema = prefix.get(index).or(items);
            let Some(schema) = schema else { break };
            let spot = if findings { index } else { ctx.spot };
            let value = self.node(schema, &Ctx { spot, ..*ctx });
            if unique && out.contains(&value) && out.len() >= min {
                continue;
            }
            out.push(value);
        }
        Value::Array(out)
    }

    fn number(&self, map: &Map<String, Value>, ctx: &Ctx<'_>, integer: bool) -> Value {
        let spot = self.spot(ctx);
        let hint = name_key(ctx.name);
        let wanted = if is_line_name(&hint) {
            if self.grounded { spot.line as f64 } else { (self.line_count + 10) as f64 }
        } else {
            1.0
        };
        let bound = |key: &str| map.get(key).and_then(Value::as_f64);
        let step = if integer { 1.0 } else { 0.5 };
        let mut low = bound("minimum");
        if let Some(exclusive) = bound("exclusiveMinimum") {
            low = Some(low.map_or(exclusive + step, |l| l.max(exclusive + step)));
        }
        let mut high = bound("maximum");
        if let Some(exclusive) = bound("exclusiveMaximum") {
            high = Some(high.map_or(exclusive - step, |h| h.min(exclusive - step)));
        }
        let mut value = wanted;
        if let Some(high) = high {
            value = value.min(high);
        }
        if let Some(low) = low {
            value = value.max(low);
        }
        if let (Some(l), Some(h)) = (low, high)
            && l > h
        {
            // Exclusive bounds closer than a step: halfway between them.
            let raw = |a: &str, b: &str| bound(a).or_else(|| bound(b)).unwrap_or(value);
            value = (raw("exclusiveMinimum", "minimum") + raw("exclusiveMaximum", "maximum")) / 2.0;
        }
        if integer {
            let up = value.ceil();
            value = if high.is_some_and(|h| up > h) { value.floor() } else { up };
        }
        if let Some(multiple) = bound("multipleOf").filter(|m| *m > 0.0) {
            value = (value / multiple).ceil() * multiple;
        }
        number_value(value, integer)
    }

    fn string(&self, map: &Map<String, Value>, ctx: &Ctx<'_>) -> String {
        let min = map.get("minLength").and_then(Value::as_u64).map_or(0, |n| usize::try_from(n).unwrap_or(0));
        let max = map
            .get("maxLength")
            .and_then(Value::as_u64)
            .map_or(DEFAULT_MAX_CHARS.max(min), |n| usize::try_from(n).unwrap_or(usize::MAX));
        let examples: Vec<String> = map
            .get("examples")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .chain(map.get("default"))
            .filter_map(Value::as_str)
            .map(str::to_string)
            .collect();
        if let Some(pattern) = map.get("pattern").and_then(Value::as_str) {
            let mut candidates = examples.clone();
            candidates.push(self.text_for(ctx));
            candidates.extend(super::pattern::generate(pattern));
            candidates.push(self.source_id.to_string());
            if let Some(found) = candidates.into_iter().find(|c| super::pattern::matches(pattern, c)) {
                return found;
            }
        }
        if let Some(format) = map.get("format").and_then(Value::as_str)
            && let Some(value) = self.format(format)
        {
            return value;
        }
        let text = if name_key(ctx.name).is_empty() {
            examples.into_iter().next().unwrap_or_else(|| self.text_for(ctx))
        } else {
            self.text_for(ctx)
        };
        fit(&text, min, max, self.content)
    }

    fn format(&self, format: &str) -> Option<String> {
        let hash = blake3::hash(format!("{}\n{}", self.source_id, self.content).as_bytes()).to_hex().to_string();
        let value = match format {
            "date-time" => "2026-01-01T00:00:00Z".to_string(),
            "date" => "2026-01-01".to_string(),
            "time" => "00:00:00Z".to_string(),
            "duration" => "P1D".to_string(),
            "email" | "idn-email" => "reviewer@example.com".to_string(),
            "hostname" | "idn-hostname" => "example.com".to_string(),
            "ipv4" => "192.0.2.1".to_string(),
            "ipv6" => "2001:db8::1".to_string(),
            "uri" | "iri" | "uri-reference" | "iri-reference" | "url" => "https://example.com/".to_string(),
            "uuid" => {
                format!("{}-{}-4{}-8{}-{}", &hash[..8], &hash[8..12], &hash[13..16], &hash[17..20], &hash[20..32])
            }
            _ => return None,
        };
        Some(value)
    }

    /// The text a property of this name is given.
    fn text_for(&self, ctx: &Ctx<'_>) -> String {
        let spot = self.spot(ctx);
        let hint = name_key(ctx.name);
        let quote = || {
            if !self.grounded {
                ELSEWHERE_QUOTE.to_string()
            } else if spot.text.is_empty() {
                self.source_id.to_string()
            } else {
                spot.text.to_string()
            }
        };
        if ["quote", "excerpt", "evidence", "snippet", "span", "text", "code", "passage", "citation", "context"]
            .iter()
            .any(|k| hint.contains(k))
        {
            return quote();
        }
        if is_file_name(&hint) {
            return if self.grounded { self.source_id.to_string() } else { ELSEWHERE_FILE.to_string() };
        }
        if ["severity", "priority", "level", "impact"].iter().any(|k| hint.contains(k)) {
            return spot.rule.map_or("medium", |r| r.1).to_string();
        }
        if ["summary", "message", "description", "reason", "explanation", "note", "comment", "detail", "title"]
            .iter()
            .any(|k| hint.contains(k))
        {
            let line = if self.grounded { spot.line } else { self.line_count + 10 };
            return match spot.rule {
                Some((_, _, summary)) => summary.to_string(),
                None => format!("line {line} of {}", if self.grounded { self.source_id } else { ELSEWHERE_FILE }),
            };
        }
        if ["rule", "kind", "category", "type", "check", "label", "tag", "id", "name", "issue"]
            .iter()
            .any(|k| hint.contains(k))
        {
            return spot.rule.map_or("observation", |r| r.0).to_string();
        }
        quote()
    }

    /// An enum value: the reviewer's rule or severity where the enum has it, else one
    /// that varies with the finding (so findings differ), never `null` unless only that.
    fn pick(&self, values: &[Value], ctx: &Ctx<'_>) -> Value {
        let spot = self.spot(ctx);
        if let Some((rule, severity, _)) = spot.rule {
            for wanted in [rule, severity] {
                if let Some(found) = values.iter().find(|v| v.as_str() == Some(wanted)) {
                    return found.clone();
                }
            }
        }
        let non_null: Vec<&Value> = values.iter().filter(|v| !v.is_null()).collect();
        if non_null.is_empty() {
            return values.first().cloned().unwrap_or(Value::Null);
        }
        non_null[ctx.spot % non_null.len()].clone()
    }
}

/// `minLength` / `maxLength` on characters; too short a text is extended with more of the
/// source (so it stays a quote where it was one), then with dots.
fn fit(text: &str, min: usize, max: usize, content: &str) -> String {
    let mut out: String = text.chars().take(max).collect();
    if out.chars().count() < min {
        let longer = content.trim();
        if longer.chars().count() >= min && longer.contains(text) {
            out = longer.chars().take(max.max(min)).collect();
        }
        while out.chars().count() < min {
            out.push('.');
        }
    }
    out
}

fn number_value(value: f64, integer: bool) -> Value {
    if (integer || value.fract() == 0.0) && value.abs() < 9.0e15 {
        // Integral and exact below 2^53.
        #[allow(clippy::cast_possible_truncation)]
        return json!(value as i64);
    }
    Number::from_f64(value).map_or(Value::Null, Value::Number)
}

/// A property name folded for matching: lower case, no separators.
fn name_key(name: &str) -> String {
    name.chars().filter(char::is_ascii_alphanumeric).map(|c| c.to_ascii_lowercase()).collect()
}

fn is_line_name(hint: &str) -> bool {
    hint == "line" || hint.starts_with("line") || hint.ends_with("line") || hint == "lineno" || hint == "row"
}

fn is_file_name(hint: &str) -> bool {
    ["file", "path", "source", "document", "location"].iter().any(|k| hint.contains(k))
}

/// The type this node produces: the first of its types that is not `null` (a nullable
/// one produces `null`, which strict views read as absent), else what its keywords imply.
fn chosen_type(map: &Map<String, Value>) -> String {
    let mut types: Vec<String> = match map.get("type") {
        Some(Value::String(kind)) => vec![kind.to_ascii_lowercase()],
        Some(Value::Array(kinds)) => kinds.iter().filter_map(Value::as_str).map(str::to_ascii_lowercase).collect(),
        _ => Vec::new(),
    };
    if map.get("nullable") == Some(&Value::Bool(true)) {
        types.push("null".to_string());
    }
    if types.iter().any(|t| t == "null") {
        return "null".to_string();
    }
    if let Some(first) = types.into_iter().next() {
        return first;
    }
    if map.contains_key("properties") || map.contains_key("required") || map.contains_key("additionalProperties") {
        "object".to_string()
    } else if map.contains_key("items") || map.contains_key("prefixItems") || map.contains_key("minItems") {
        "array".to_string()
    } else if ["minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf"]
        .iter()
        .any(|k| map.contains_key(*k))
    {
        "number".to_string()
    } else {
        "string".to_string()
    }
}

fn chosen_type_of(schema: &Value) -> String {
    schema.as_object().map_or_else(|| "string".to_string(), chosen_type)
}

fn only_null(schema: &Value) -> bool {
    chosen_type_of(schema) == "null"
        && !schema.get("type").is_some_and(|t| t.as_array().is_some_and(|l| l.iter().any(|k| k != "null")))
}

/// The smallest value a node admits, for nesting that never ends.
fn smallest(map: &Map<String, Value>) -> Value {
    match chosen_type(map).as_str() {
        "object" => json!({}),
        "array" => json!([]),
        "integer" | "number" => json!(map.get("minimum").and_then(Value::as_f64).map_or(0, |m| m.ceil() as i64)),
        "boolean" => json!(false),
        "null" => Value::Null,
        _ => json!(""),
    }
}

fn without(map: &Map<String, Value>, keys: &[&str]) -> Map<String, Value> {
    map.iter().filter(|(k, _)| !keys.contains(&k.as_str())).map(|(k, v)| (k.clone(), v.clone())).collect()
}

/// `extra` laid over `base`: properties and required lists are united, other keywords
/// are taken from `base` when both have them.
fn merge(base: &Map<String, Value>, extra: &Value) -> Map<String, Value> {
    let mut out = base.clone();
    let Value::Object(extra) = extra else { return out };
    for (key, value) in extra {
        match (key.as_str(), out.get_mut(key)) {
            ("properties", Some(Value::Object(mine))) => {
                if let Value::Object(theirs) = value {
                    for (name, schema) in theirs {
                        mine.entry(name.clone()).or_insert_with(|| schema.clone());
                    }
                }
            }
            ("required", Some(Value::Array(mine))) => {
                for name in value.as_array().into_iter().flatten() {
                    if !mine.contains(name) {
                        mine.push(name.clone());
                    }
                }
            }
            (_, Some(_)) => {}
            (_, None) => {
                out.insert(key.clone(), value.clone());
            }
        }
    }
    out
}

/// `#` or `#/json/pointer` within the document.
fn resolve<'v>(root: &'v Value, reference: &str) -> Option<&'v Value> {
    let pointer = reference.strip_prefix('#')?;
    root.pointer(pointer)
}

#[cfg(test)]
mod tests;
