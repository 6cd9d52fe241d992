//! The views are checked against the simulator's independent reading of OpenAI's rules
//! (`simulator::strict`), so a view that strays from what the real API accepts fails here.

use serde_json::{Value, json};

use super::*;
use crate::domain::schema::{BUILTIN_CODE_REVIEW, Registry};
use crate::simulator::strict;

fn accepted_by_openai(view: &Value) -> Result<(), String> {
    let body = json!({"response_format": {"type": "json_schema", "json_schema": {"name": "t", "schema": view, "strict": true}}});
    strict::check_body(&body).map_err(|r| r.message)
}

/// Every key anywhere in a document, to prove keywords are gone.
fn keys(value: &Value, out: &mut Vec<String>) {
    match value {
        Value::Object(map) => {
            for (k, v) in map {
                out.push(k.clone());
                keys(v, out);
            }
        }
        Value::Array(items) => items.iter().for_each(|v| keys(v, out)),
        _ => {}
    }
}

fn custom_schema() -> Value {
    json!({
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "type": "object",
        "required": ["findings"],
        "properties": {
            "findings": {
                "type": "array",
                "uniqueItems": true,
                "maxItems": 50,
                "items": {
                    "type": "object",
                    "required": ["code", "contact"],
                    "properties": {
                        "code": {"type": "string", "minLength": 2, "maxLength": 8, "pattern": "^[A-Z]+$"},
                        "contact": {"type": "string", "format": "email"},
                        "homepage": {"type": "string", "format": "uri"},
                        "note": {"type": "string", "maxLength": 40},
                        "level": {"enum": [1, 2, 3]},
                        "tags": {"type": "array", "items": {"type": "string"}, "uniqueItems": true}
                    }
                }
            }
        },
        "x-commitpoint-identity": ["/code"]
    })
}

#[test]
fn builtin_code_review_view_passes_openai_strict_rules() {
    let registry = Registry::builtin();
    let schema = registry.get(BUILTIN_CODE_REVIEW).unwrap();
    let view = schema.view(Dialect::OpenAiStrict).unwrap();
    accepted_by_openai(&view.document).unwrap();
    let mut all = Vec::new();
    keys(&view.document, &mut all);
    assert!(!all.iter().any(|k| k == "minLength" || k == "$schema" || k.starts_with("x-commitpoint")), "{all:?}");
    assert_eq!(view.document["properties"]["findings"]["items"]["properties"]["severity"]["type"], "string");
    assert!(view.adaptations.iter().any(|a| a.contains("minLength")), "{:?}", view.adaptations);
    // The registered document itself is what strict mode refuses: the check is not vacuous.
    let raw = json!({"type": "object", "additionalProperties": false, "required": ["findings"],
        "properties": {"findings": schema.provider_schema(Dialect::AnthropicTool)["properties"]["findings"].clone()}});
    assert!(accepted_by_openai(&raw).unwrap_err().contains("'minLength' is not permitted"));
}

#[test]
fn custom_schema_with_optional_fields_and_unsupported_keywords_is_adapted() {
    let view = derive(&custom_schema(), Dialect::OpenAiStrict).unwrap();
    accepted_by_openai(&view.document).unwrap();
    let item = &view.document["properties"]["findings"]["items"];
    assert_eq!(item["required"], json!(["code", "contact", "homepage", "level", "note", "tags"]));
    assert_eq!(item["additionalProperties"], false);
    assert_eq!(item["properties"]["note"]["type"], json!(["string", "null"]));
    assert_eq!(item["properties"]["level"]["enum"], json!([1, 2, 3, null]));
    assert_eq!(item["properties"]["level"]["type"], json!(["integer", "null"]));
    assert_eq!(item["properties"]["contact"]["format"], "email", "supported formats stay");
    assert!(item["properties"]["homepage"].get("format").is_none(), "unsupported formats go");
    assert_eq!(item["properties"]["code"]["pattern"], "^[A-Z]+$");
    assert_eq!(view.document["properties"]["findings"]["maxItems"], 50);
    let mut all = Vec::new();
    keys(&view.document, &mut all);
    for gone in ["minLength", "maxLength", "uniqueItems"] {
        assert!(!all.iter().any(|k| k == gone), "{gone} still sent");
    }
}

#[test]
fn refusals_name_the_pointer_and_keyword() {
    let cases = [
        (json!({"anyOf": [{"type": "object", "properties": {}}]}), "", "anyOf"),
        (
            json!({"type": "object", "properties": {"tags": {"type": "object", "patternProperties": {"^x": {"type": "string"}}}}}),
            "/properties/tags",
            "patternProperties",
        ),
        (json!({"type": "object", "properties": {"free": {}}}), "/properties/free", "type"),
        (
            json!({"type": "object", "properties": {"a": {"allOf": [{"type": "string"}]}}}),
            "/properties/a/allOf",
            "allOf",
        ),
        (
            json!({"type": "object", "properties": {"a": {"$ref": "http://example.com/s"}}}),
            "/properties/a/$ref",
            "$ref",
        ),
        (json!({"type": "array", "items": {"type": "string"}}), "", "type"),
    ];
    for (schema, pointer, keyword) in cases {
        let refused = derive(&schema, Dialect::OpenAiStrict).unwrap_err();
        assert_eq!((refused.pointer.as_str(), refused.keyword.as_str()), (pointer, keyword), "{schema}");
    }
}

#[test]
fn limits_follow_the_guide() {
    let mut deep = json!({"type": "object", "properties": {"leaf": {"type": "string"}}, "required": ["leaf"]});
    for _ in 0..10 {
        deep = json!({"type": "object", "properties": {"n": deep}, "required": ["n"]});
    }
    let refused = derive(&deep, Dialect::OpenAiStrict).unwrap_err();
    assert!(refused.reason.contains("11 levels of nesting"), "{refused}");
    let many: serde_json::Map<String, Value> = (0..1001).map(|i| (format!("p{i}"), json!({"enum": [i]}))).collect();
    let wide = json!({"type": "object", "properties": many});
    assert_eq!(derive(&wide, Dialect::OpenAiStrict).unwrap_err().keyword, "enum");
}

#[test]
fn recursive_definitions_stay_references() {
    let schema = json!({
        "type": "object",
        "required": ["root"],
        "properties": {"root": {"$ref": "#/$defs/node"}},
        "$defs": {"node": {"type": "object", "required": ["name"], "properties": {
            "name": {"type": "string"},
            "children": {"type": "array", "items": {"$ref": "#/$defs/node"}}
        }}}
    });
    let view = derive(&schema, Dialect::OpenAiStrict).unwrap();
    accepted_by_openai(&view.document).unwrap();
    assert_eq!(view.document["$defs"]["node"]["required"], json!(["children", "name"]));
    assert_eq!(view.document["$defs"]["node"]["properties"]["children"]["type"], json!(["array", "null"]));
}

#[test]
fn nulls_for_optional_properties_are_removed_before_validation() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("contacts@1.json"), custom_schema().to_string()).unwrap();
    let registry = Registry::load(Some(dir.path())).unwrap();
    let schema = registry.get("contacts@1").unwrap();
    let mut answer = json!({"findings": [
        {"code": "AB", "contact": "a@b.example", "homepage": null, "note": null, "level": null, "tags": null}
    ]});
    assert!(schema.validate(&answer).is_err(), "the registered schema refuses the nulls as sent");
    schema.normalize_provider_answer(&mut answer);
    assert_eq!(answer, json!({"findings": [{"code": "AB", "contact": "a@b.example"}]}));
    assert_eq!(schema.validate(&answer).unwrap().len(), 1);
    // What the registered schema forbids is still refused locally: the keywords the view
    // dropped are enforced here.
    for bad in [
        json!({"findings": [{"code": "A", "contact": "a@b.example"}]}),
        json!({"findings": [{"code": "ABCDEFGHI", "contact": "a@b.example"}]}),
        json!({"findings": [{"code": "AB", "contact": "a@b.example", "note": "x".repeat(41)}]}),
        json!({"findings": [{"code": "AB", "contact": "c", "tags": ["x", "x"]}]}),
        json!({"findings": [{"code": "AB", "contact": "c"}, {"code": "AB", "contact": "c"}]}),
    ] {
        assert!(schema.validate(&bad).is_err(), "{bad}");
    }
}

#[test]
fn a_null_the_registered_schema_allows_is_kept() {
    let schema = json!({"type": "object", "properties": {"a": {"type": ["string", "null"]}, "b": {"type": "string"}}});
    let mut answer = json!({"a": null, "b": null});
    strip_optional_nulls(&schema, &mut answer);
    assert_eq!(answer, json!({"a": null}));
    let required = json!({"type": "object", "required": ["b"], "properties": {"b": {"type": "string"}}});
    let mut answer = json!({"b": null});
    strip_optional_nulls(&required, &mut answer);
    assert_eq!(answer, json!({"b": null}), "a required property is never dropped");
}

#[test]
fn anthropic_refuses_root_combinators_and_takes_the_rest() {
    let refused = derive(&json!({"anyOf": [{"type": "object"}]}), Dialect::AnthropicTool).unwrap_err();
    assert_eq!((refused.pointer.as_str(), refused.keyword.as_str()), ("", "anyOf"));
    let view = derive(&custom_schema(), Dialect::AnthropicTool).unwrap();
    assert!(view.adaptations.is_empty());
    assert!(view.document.get("$schema").is_none() && view.document.get("x-commitpoint-identity").is_none());
    assert_eq!(view.document["properties"], custom_schema()["properties"]);
}
