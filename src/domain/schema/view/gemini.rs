//! The Gemini view: what `generationConfig.responseJsonSchema` takes.
//!
//! The API reference for `GenerationConfig.responseJsonSchema` (ai.google.dev/api, checked
//! 2026-12) lists the keywords it supports: `$id`, `$defs`, `$ref`, `$anchor`, `type`,
//! `format`, `title`, `description`, `enum` (strings and numbers), `items`, `prefixItems`,
//! `minItems`, `maxItems`, `minimum`, `maximum`, `anyOf`, `oneOf` (read as `anyOf`),
//! `properties`, `additionalProperties`, `required`, plus the non-standard
//! `propertyOrdering`. Other keywords may be sent but are not honoured, so the view drops
//! them (the registered document still enforces them locally) and says so. What cannot be
//! dropped without changing what an answer may be is refused: `allOf` (its branches would
//! be lost), an `enum` or `const` of values other than strings and numbers, a `$ref` with
//! sibling keywords other than `$`-prefixed ones ("no other properties ... may be set"),
//! a reference outside the document, and a reference cycle through required properties
//! (cycles "may only be used within non-required properties").

use std::collections::{BTreeMap, BTreeSet};

use serde_json::{Map, Value, json};

use super::{Inexpressible, View, escape, refuse, without_private_keys};

/// Keywords passed on unchanged (`$defs`, `properties`, `items`, combinators and `$ref`
/// are walked or checked separately).
const PASSTHROUGH: [&str; 11] = [
    "type",
    "format",
    "title",
    "description",
    "minItems",
    "maxItems",
    "minimum",
    "maximum",
    "required",
    "$anchor",
    "propertyOrdering",
];

pub(super) fn derive(document: &Value) -> Result<View, Inexpressible> {
    let root = Value::Object(without_private_keys(document)?);
    let mut walk = Walk::default();
    let view = walk.node(&root, "")?;
    check_required_cycles(&root)?;
    Ok(View { document: view, adaptations: walk.adaptations })
}

#[derive(Default)]
struct Walk {
    adaptations: Vec<String>,
}

impl Walk {
    fn node(&mut self, schema: &Value, pointer: &str) -> Result<Value, Inexpressible> {
        let map = match schema {
            Value::Object(map) => map,
            // `true` / `false` subschemas are JSON Schema, but not in Gemini's list.
            Value::Bool(_) => return Err(refuse(pointer, "type", "Gemini needs a schema object here, not a boolean")),
            _ => return Err(refuse(pointer, "type", "must be a schema object")),
        };
        if let Some(reference) = map.get("$ref") {
            return self.reference(map, reference, pointer);
        }
        let mut out = Map::new();
        for (key, value) in map {
            let at = format!("{pointer}/{}", escape(key));
            match key.as_str() {
                k if PASSTHROUGH.contains(&k) => {
                    out.insert(key.clone(), value.clone());
                }
                "properties" | "$defs" | "definitions" => {
                    let Value::Object(children) = value else {
                        return Err(refuse(&at, key, "must be an object of schemas"));
                    };
                    let mut converted = Map::new();
                    for (name, child) in children {
                        converted.insert(name.clone(), self.node(child, &format!("{at}/{}", escape(name)))?);
                    }
                    // Gemini lists `$defs` only; `definitions` is the older spelling of it.
                    let key = if key == "definitions" { "$defs" } else { key.as_str() };
                    if key == "$defs" && map.contains_key("definitions") && map.contains_key("$defs") {
                        return Err(refuse(&at, "definitions", "use `$defs` only, not both it and `definitions`"));
                    }
                    out.insert(key.to_string(), Value::Object(converted));
                }
                "items" | "additionalProperties" if value.is_boolean() => {
                    out.insert(key.clone(), value.clone());
                }
                "items" | "additionalProperties" => {
                    out.insert(key.clone(), self.node(value, &at)?);
                }
                "prefixItems" | "anyOf" | "oneOf" => {
                    let Value::Array(branches) = value else {
                        return Err(refuse(&at, key, "must be an array of schemas"));
                    };
                    let mut converted = Vec::with_capacity(branches.len());
                    for (index, branch) in branches.iter().enumerate() {
                        converted.push(self.node(branch, &format!("{at}/{index}"))?);
                    }
                    out.insert(key.clone(), Value::Array(converted));
                    if key == "oneOf" {
                        self.note(
                            pointer,
                            "`oneOf` is read by Gemini as `anyOf` (exactly-one is still enforced locally)",
                        );
                    }
                }
                "enum" => {
                    scalar_values(value, &at, "enum")?;
                    out.insert(key.clone(), value.clone());
                }
                "const" => {
                    scalar_values(&json!([value]), &at, "const")?;
                    out.insert("enum".to_string(), json!([value]));
                    self.note(pointer, "`const` sent as a one-value `enum`");
                }
                "allOf" => {
                    return Err(refuse(
                        &at,
                        "allOf",
                        "Gemini's responseJsonSchema has no allOf; merge its branches into the schema itself",
                    ));
                }
                other => self.note(pointer, &format!("dropped `{other}` (not in Gemini's subset; enforced locally)")),
            }
        }
        Ok(Value::Object(out))
    }

    /// A `$ref` may only have `$`-prefixed siblings; a description or title next to it is
    /// dropped (it only annotates), anything else would be ignored by Gemini and is refused.
    fn reference(
        &mut self,
        map: &Map<String, Value>,
        reference: &Value,
        pointer: &str,
    ) -> Result<Value, Inexpressible> {
        if !reference.as_str().is_some_and(|r| r == "#" || r.starts_with("#/")) {
            return Err(refuse(
                &format!("{pointer}/$ref"),
                "$ref",
                "only references within the document (`#/...`) are allowed",
            ));
        }
        let mut out = Map::new();
        for (key, value) in map {
            if key.starts_with('$') {
                out.insert(key.clone(), value.clone());
            } else if key == "description" || key == "title" {
                self.note(pointer, &format!("dropped `{key}` next to `$ref`"));
            } else {
                return Err(refuse(
                    pointer,
                    key,
                    "Gemini takes no keywords next to `$ref` other than `$`-prefixed ones",
                ));
            }
        }
        Ok(Value::Object(out))
    }

    fn note(&mut self, pointer: &str, what: &str) {
        let at = if pointer.is_empty() { "(root)" } else { pointer };
        self.adaptations.push(format!("{at}: {what}"));
    }
}

/// Gemini takes `enum` values that are strings or numbers only.
fn scalar_values(values: &Value, pointer: &str, keyword: &str) -> Result<(), Inexpressible> {
    let Value::Array(values) = values else {
        return Err(refuse(pointer, keyword, "must be an array"));
    };
    if let Some(bad) = values.iter().find(|v| !(v.is_string() || v.is_number())) {
        return Err(refuse(
            pointer,
            keyword,
            format!("Gemini takes enum values that are strings or numbers, not {bad}"),
        ));
    }
    Ok(())
}

/// Refuses a reference cycle every step of which is a required property: Gemini unrolls
/// cycles "to a limited degree", so a required one cannot be answered. A cycle through an
/// optional property, an array's items or a combinator can end, and is allowed.
fn check_required_cycles(root: &Value) -> Result<(), Inexpressible> {
    let mut edges: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    let mut nodes = vec![("#".to_string(), root)];
    for key in ["$defs", "definitions"] {
        if let Some(Value::Object(defs)) = root.get(key) {
            nodes.extend(defs.iter().map(|(name, def)| (format!("#/{key}/{}", escape(name)), def)));
        }
    }
    for (name, schema) in &nodes {
        let mut targets = BTreeSet::new();
        required_refs(schema, &mut targets);
        edges.insert(name.clone(), targets);
    }
    for start in edges.keys() {
        let mut stack: Vec<&str> = edges[start].iter().map(String::as_str).collect();
        let mut seen = BTreeSet::new();
        while let Some(next) = stack.pop() {
            if next == start {
                return Err(refuse(
                    start.trim_start_matches('#'),
                    "$ref",
                    "a reference cycle through required properties; Gemini only unrolls cycles in optional ones",
                ));
            }
            if seen.insert(next)
                && let Some(more) = edges.get(next)
            {
                stack.extend(more.iter().map(String::as_str));
            }
        }
    }
    Ok(())
}

/// The references a value of `schema` must contain: `$ref`s of the schema itself and of
/// its required properties, recursively.
fn required_refs(schema: &Value, out: &mut BTreeSet<String>) {
    if let Some(reference) = schema.get("$ref").and_then(Value::as_str) {
        out.insert(reference.to_string());
        return;
    }
    let required: BTreeSet<&str> = schema
        .get("required")
        .and_then(Value::as_array)
        .map(|r| r.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    if let Some(Value::Object(properties)) = schema.get("properties") {
        for (name, child) in properties {
            if required.contains(name.as_str()) {
                required_refs(child, out);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_builtin_shape_keeps_its_structure_and_drops_string_constraints() {
        let schema = json!({
            "$schema": "https://json-schema.org/draft/2020-12/schema",
            "type": "object", "required": ["findings"], "additionalProperties": false,
            "properties": {"findings": {"type": "array", "items": {
                "type": "object", "required": ["rule"],
                "properties": {
                    "rule": {"type": "string", "minLength": 1},
                    "severity": {"enum": ["low", "high"]},
                    "line": {"type": "integer", "minimum": 1},
                    "kind": {"const": "bug"}
                }}}},
            "x-commitpoint-identity": ["/rule"]
        });
        let view = derive(&schema).unwrap();
        let item = &view.document["properties"]["findings"]["items"];
        assert_eq!(item["properties"]["rule"], json!({"type": "string"}));
        assert_eq!(item["properties"]["line"], json!({"type": "integer", "minimum": 1}));
        assert_eq!(item["properties"]["kind"], json!({"enum": ["bug"]}));
        assert_eq!(item["required"], json!(["rule"]), "optional stays optional: Gemini needs no nulls");
        assert_eq!(view.document["additionalProperties"], json!(false));
        assert!(view.document.get("$schema").is_none() && view.document.get("x-commitpoint-identity").is_none());
        let notes = view.adaptations.join("\n");
        assert!(notes.contains("dropped `minLength`") && notes.contains("`const` sent as"), "{notes}");
    }

    #[test]
    fn what_gemini_cannot_take_is_refused_with_its_pointer() {
        let cases = [
            (json!({"allOf": [{"type": "object"}]}), "/allOf", "allOf"),
            (json!({"properties": {"a": {"enum": ["x", null]}}}), "/properties/a/enum", "enum"),
            (json!({"properties": {"a": {"const": true}}}), "/properties/a/const", "const"),
            (json!({"properties": {"a": {"$ref": "#/$defs/b", "minimum": 1}}}), "/properties/a", "minimum"),
            (json!({"properties": {"a": {"$ref": "https://x/y.json"}}}), "/properties/a/$ref", "$ref"),
            (json!({"properties": {"a": true}}), "/properties/a", "type"),
        ];
        for (schema, pointer, keyword) in cases {
            let refused = derive(&schema).unwrap_err();
            assert_eq!((refused.pointer.as_str(), refused.keyword.as_str()), (pointer, keyword), "{schema}");
        }
    }

    #[test]
    fn references_keep_dollar_siblings_and_cycles_must_be_optional() {
        let fine = json!({
            "type": "object", "required": ["node"],
            "properties": {"node": {"$ref": "#/$defs/node", "description": "the root"}},
            "$defs": {"node": {"type": "object", "properties": {"child": {"$ref": "#/$defs/node"}}}}
        });
        let view = derive(&fine).unwrap();
        assert_eq!(view.document["properties"]["node"], json!({"$ref": "#/$defs/node"}));
        let mut required = fine;
        required["$defs"]["node"]["required"] = json!(["child"]);
        let refused = derive(&required).unwrap_err();
        assert_eq!(refused.keyword, "$ref");
        assert!(refused.reason.contains("cycle"), "{refused}");
    }
}
