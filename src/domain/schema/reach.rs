//! Whether a JSON Pointer can ever find a value in a document a schema accepts: a
//! pointer through a property an object may not have (`additionalProperties: false`, not
//! under `properties`), or into a value that cannot be an object or an array, never matches,
//! and a schema that declares it is a mistake refused at start.
//!
//! Only certain answers refuse: wherever the schema leaves room (`patternProperties`, a
//! combinator, a reference that cannot be followed, `unevaluatedProperties`), the pointer
//! may match and is accepted.

use serde_json::Value;

/// How many `$ref`s one step follows before giving up (and accepting).
const MAX_REFS: usize = 32;

/// The subschema values at `pointer` must satisfy, when it is known; `Err` says why no value
/// can ever be there. `Ok(None)`: something may be there, the schema does not say what.
pub(super) fn resolve<'a>(root: &'a Value, at: &'a Value, pointer: &str) -> Result<Option<&'a Value>, String> {
    let mut schema = at;
    let mut walked = String::new();
    for token in pointer.split('/').skip(1) {
        let token = token.replace("~1", "/").replace("~0", "~");
        let Some(current) = follow_refs(root, schema) else { return Ok(None) };
        match step(current, &token) {
            Step::Into(next) => schema = next,
            Step::Unknown => return Ok(None),
            Step::Never(why) => return Err(format!("{walked} {why}").trim_start().to_string()),
        }
        walked.push('/');
        walked.push_str(&token);
    }
    Ok(follow_refs(root, schema))
}

/// The schema of an array's items, when it says (`items`); `Err` when the value cannot be an
/// array at all.
pub(super) fn items<'a>(root: &'a Value, array: &'a Value) -> Result<Option<&'a Value>, String> {
    let Some(array) = follow_refs(root, array) else { return Ok(None) };
    if let Some(why) = excludes(array, "array") {
        return Err(why);
    }
    if has_combinators(array) {
        return Ok(None);
    }
    Ok(array.get("items").and_then(|items| follow_refs(root, items)))
}

enum Step<'a> {
    Into(&'a Value),
    Unknown,
    Never(String),
}

fn step<'a>(schema: &'a Value, token: &str) -> Step<'a> {
    let object = match schema {
        Value::Bool(false) => return Step::Never("is a `false` schema: no value is accepted there".to_string()),
        Value::Object(object) => object,
        _ => return Step::Unknown,
    };
    if let Some(next) = object.get("properties").and_then(|p| p.get(token)) {
        return Step::Into(next);
    }
    let index =
        token.parse::<usize>().is_ok_and(|_| !token.starts_with('+') && (token == "0" || !token.starts_with('0')));
    if index
        && excludes(schema, "array").is_none()
        && let Some(items) = object.get("items")
    {
        return Step::Into(items);
    }
    if has_combinators(schema) || object.contains_key("patternProperties") {
        return Step::Unknown;
    }
    if excludes(schema, "object").is_some() && (!index || excludes(schema, "array").is_some()) {
        return Step::Never(format!("cannot hold {token:?}: its `type` is neither an object nor an array"));
    }
    match object.get("additionalProperties") {
        Some(Value::Bool(false)) if !index || excludes(schema, "array").is_some() => Step::Never(format!(
            "has no property {token:?}: it is not under `properties` and `additionalProperties` is false"
        )),
        Some(extra @ Value::Object(_)) if !index => Step::Into(extra),
        _ => Step::Unknown,
    }
}

/// Why `schema`'s `type` rules out `kind`, if it does.
fn excludes(schema: &Value, kind: &str) -> Option<String> {
    let allowed: Vec<&str> = match schema.get("type")? {
        Value::String(t) => vec![t.as_str()],
        Value::Array(ts) => ts.iter().filter_map(Value::as_str).collect(),
        _ => return None,
    };
    (!allowed.contains(&kind)).then(|| format!("has `type` {allowed:?}, never an {kind}"))
}

fn has_combinators(schema: &Value) -> bool {
    ["allOf", "anyOf", "oneOf", "if", "then", "else", "not", "dependentSchemas", "unevaluatedProperties", "$dynamicRef"]
        .iter()
        .any(|k| schema.get(k).is_some())
}

/// Follows local `$ref`s (`#/$defs/x`); `None` when one cannot be followed or sits beside
/// other constraints (the schema then says more than this walk reads).
fn follow_refs<'a>(root: &'a Value, mut schema: &'a Value) -> Option<&'a Value> {
    for _ in 0..MAX_REFS {
        let Some(reference) = schema.get("$ref").and_then(Value::as_str) else { return Some(schema) };
        let pointer = reference.strip_prefix('#')?;
        let others = schema
            .as_object()
            .is_some_and(|o| o.keys().any(|k| !k.starts_with('$') && k != "description" && k != "title"));
        if others {
            return None;
        }
        schema = root.pointer(pointer)?;
    }
    None
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn closed_objects_have_only_their_properties() {
        let root = json!({
            "type": "object", "additionalProperties": false,
            "properties": {"items": {"type": "array", "items": {"$ref": "#/$defs/item"}}, "n": {"type": "integer"}},
            "$defs": {"item": {"type": "object", "additionalProperties": false, "properties": {"a": {"type": "string"}}}}
        });
        let array = resolve(&root, &root, "/items").unwrap().unwrap();
        let item = items(&root, array).unwrap().unwrap();
        assert!(resolve(&root, item, "/a").unwrap().is_some());
        assert!(resolve(&root, item, "/b").unwrap_err().contains("has no property \"b\""));
        assert!(resolve(&root, &root, "/nope").unwrap_err().contains("has no property \"nope\""));
        assert!(resolve(&root, &root, "/n/x").unwrap_err().starts_with("/n cannot hold \"x\""));
        assert!(resolve(&root, &root, "/items/0/a").unwrap().is_some());
        assert!(items(&root, resolve(&root, &root, "/n").unwrap().unwrap()).unwrap_err().contains("never an array"));
    }

    #[test]
    fn open_schemas_may_hold_anything() {
        let root = json!({"type": "object", "properties": {"x": {"anyOf": [{"type": "object"}]}},
            "patternProperties": {"^p": {}}});
        assert_eq!(resolve(&root, &root, "/anything/deep"), Ok(None));
        assert_eq!(resolve(&root, &root, "/x/y"), Ok(None));
        let closed_but_patterned = json!({"additionalProperties": false, "patternProperties": {"^p": {}}});
        assert_eq!(resolve(&closed_but_patterned, &closed_but_patterned, "/q"), Ok(None));
        let extra = json!({"additionalProperties": {"type": "string"}});
        assert!(resolve(&extra, &extra, "/k/more").is_err(), "a string has no properties");
        assert_eq!(resolve(&json!(true), &json!(true), "/a"), Ok(None));
        assert!(resolve(&json!(false), &json!(false), "/a").is_err());
    }
}
