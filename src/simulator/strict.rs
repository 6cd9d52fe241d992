//! OpenAI's checks on a `response_format` of type `json_schema`, answered in OpenAI's words.
//!
//! Written from the published rules, not from commitpoint's own schema views, so that a
//! view that strays from what the real API accepts fails here as it would there. Sources
//! (docs/PROVIDERS.md, "Structured output"): the Structured Outputs guide's "Supported
//! schemas" list and limits; the error texts as quoted in public issue threads and code
//! (`Invalid schema for response_format '<name>': In context=(...), '<kw>' is not
//! permitted.`, `... 'additionalProperties' is required to be supplied and to be false.`,
//! `... 'required' is required to be supplied and to be an array including every key in
//! properties. Missing '<key>'.`, `... schema must have a 'type' key.`, `<n> levels of
//! nesting exceeds limit of <m>.`), all with code `invalid_json_schema`; the name rule
//! `^[a-zA-Z0-9_-]+$`, at most 64 characters.

use serde_json::{Map, Value};

/// Keywords strict mode accepts on a schema object.
const ALLOWED: [&str; 22] = [
    "type",
    "properties",
    "required",
    "additionalProperties",
    "items",
    "anyOf",
    "$ref",
    "$defs",
    "definitions",
    "enum",
    "const",
    "description",
    "title",
    "pattern",
    "format",
    "multipleOf",
    "maximum",
    "exclusiveMaximum",
    "minimum",
    "exclusiveMinimum",
    "minItems",
    "maxItems",
];
const FORMATS: [&str; 9] = ["date-time", "time", "date", "duration", "email", "hostname", "ipv4", "ipv6", "uuid"];
const MAX_NESTING: usize = 10;
const MAX_PROPERTIES: usize = 5_000;
const MAX_NAME_CHARS: usize = 64;

/// Why a request's `response_format` is refused: a 400 `invalid_request_error`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rejection {
    pub message: String,
    pub param: String,
    pub code: &'static str,
}

/// Checks a chat completion body's `response_format`; `Ok` when there is none to check.
pub fn check_body(body: &Value) -> Result<(), Rejection> {
    let Some(format) = body.get("response_format") else { return Ok(()) };
    if format.get("type").and_then(Value::as_str) != Some("json_schema") {
        return Ok(());
    }
    let Some(spec) = format.get("json_schema") else {
        return Err(Rejection {
            message: "Missing required parameter: 'response_format.json_schema'.".to_string(),
            param: "response_format.json_schema".to_string(),
            code: "missing_required_parameter",
        });
    };
    let name = spec.get("name").and_then(Value::as_str).unwrap_or_default();
    check_name(name)?;
    if spec.get("strict") != Some(&Value::Bool(true)) {
        return Ok(());
    }
    let schema = spec.get("schema").cloned().unwrap_or(Value::Null);
    let mut walk = Walk { name: name.to_string(), properties: 0 };
    walk.root(&schema)?;
    if walk.properties > MAX_PROPERTIES {
        return Err(walk
            .reject(None, format!("{} total object properties exceeds limit of {MAX_PROPERTIES}.", walk.properties)));
    }
    Ok(())
}

fn check_name(name: &str) -> Result<(), Rejection> {
    let param = "response_format.json_schema.name".to_string();
    let chars = name.chars().count();
    if chars > MAX_NAME_CHARS {
        return Err(Rejection {
            message: format!(
                "Invalid '{param}': string too long. Expected a string with maximum length {MAX_NAME_CHARS}, \
                 but got a string with length {chars} instead."
            ),
            param,
            code: "string_above_max_length",
        });
    }
    if name.is_empty() || !name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-') {
        return Err(Rejection {
            message: format!(
                "Invalid '{param}': string does not match pattern. Expected a string that matches the pattern \
                 '^[a-zA-Z0-9_-]+$'."
            ),
            param,
            code: "invalid_value",
        });
    }
    Ok(())
}

struct Walk {
    name: String,
    properties: usize,
}

impl Walk {
    fn reject(&self, context: Option<&[String]>, detail: String) -> Rejection {
        let message = match context {
            Some(path) => format!(
                "Invalid schema for response_format '{}': In context={}, {detail}",
                self.name,
                python_tuple(path)
            ),
            None => format!("Invalid schema for response_format '{}': {detail}", self.name),
        };
        Rejection { message, param: "response_format".to_string(), code: "invalid_json_schema" }
    }

    fn root(&mut self, schema: &Value) -> Result<(), Rejection> {
        let kind = schema.get("type").and_then(Value::as_str);
        if kind != Some("object") {
            let got = schema.get("type").map_or_else(|| "None".to_string(), Value::to_string);
            return Err(
                self.reject(None, format!("schema must be a JSON Schema of 'type: \"object\"', got 'type: {got}'."))
            );
        }
        self.node(schema, &mut Vec::new(), 0)
    }

    fn node(&mut self, schema: &Value, path: &mut Vec<String>, depth: usize) -> Result<(), Rejection> {
        let Value::Object(map) = schema else {
            return Err(self.reject(Some(path), "schema must be a JSON object.".to_string()));
        };
        for key in map.keys() {
            if !ALLOWED.contains(&key.as_str()) {
                return Err(self.reject(Some(path), format!("'{key}' is not permitted.")));
            }
        }
        if let Some(format) = map.get("format").and_then(Value::as_str)
            && !FORMATS.contains(&format)
        {
            return Err(self.reject(Some(path), format!("'{format}' is not a permitted format.")));
        }
        if let Some(Value::Array(branches)) = map.get("anyOf") {
            for (index, branch) in branches.iter().enumerate() {
                path.extend(["anyOf".to_string(), index.to_string()]);
                self.node(branch, path, depth)?;
                path.truncate(path.len() - 2);
            }
        }
        for defs in ["$defs", "definitions"] {
            if let Some(Value::Object(entries)) = map.get(defs) {
                for (name, def) in entries {
                    path.extend([defs.to_string(), name.clone()]);
                    self.node(def, path, depth)?;
                    path.truncate(path.len() - 2);
                }
            }
        }
        if map.contains_key("$ref") || map.contains_key("anyOf") {
            return Ok(());
        }
        let Some(kind) = map.get("type") else {
            return Err(self.reject(Some(path), "schema must have a 'type' key.".to_string()));
        };
        let has = |t: &str| kind == t || kind.as_array().is_some_and(|l| l.iter().any(|k| k == t));
        if has("object") {
            self.object(map, path, depth + 1)?;
        }
        if has("array")
            && let Some(items) = map.get("items")
        {
            path.push("items".to_string());
            self.node(items, path, depth)?;
            path.pop();
        }
        Ok(())
    }

    fn object(&mut self, map: &Map<String, Value>, path: &mut Vec<String>, depth: usize) -> Result<(), Rejection> {
        if depth > MAX_NESTING {
            return Err(self.reject(None, format!("{depth} levels of nesting exceeds limit of {MAX_NESTING}.")));
        }
        if map.get("additionalProperties") != Some(&Value::Bool(false)) {
            return Err(self
                .reject(Some(path), "'additionalProperties' is required to be supplied and to be false.".to_string()));
        }
        let empty = Map::new();
        let properties = map.get("properties").and_then(Value::as_object).unwrap_or(&empty);
        let required: Vec<&str> = map
            .get("required")
            .and_then(Value::as_array)
            .map(|r| r.iter().filter_map(Value::as_str).collect())
            .unwrap_or_default();
        if let Some(missing) = properties.keys().find(|k| !required.contains(&k.as_str())) {
            return Err(self.reject(
                Some(path),
                format!(
                    "'required' is required to be supplied and to be an array including every key in properties. \
                     Missing '{missing}'."
                ),
            ));
        }
        for (name, schema) in properties {
            self.properties += 1;
            path.extend(["properties".to_string(), name.clone()]);
            self.node(schema, path, depth)?;
            path.truncate(path.len() - 2);
        }
        Ok(())
    }
}

/// The context as OpenAI prints it: a Python tuple of path segments.
fn python_tuple(path: &[String]) -> String {
    let items: Vec<String> = path.iter().map(|p| format!("'{p}'")).collect();
    match items.as_slice() {
        [] => "()".to_string(),
        [one] => format!("({one},)"),
        many => format!("({})", many.join(", ")),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn body(schema: Value) -> Value {
        json!({"response_format": {"type": "json_schema", "json_schema": {"name": "t", "schema": schema, "strict": true}}})
    }

    #[test]
    fn refuses_min_length_in_openai_words() {
        let schema = json!({
            "type": "object", "additionalProperties": false, "required": ["rule"],
            "properties": {"rule": {"type": "string", "minLength": 1}}
        });
        let refused = check_body(&body(schema)).unwrap_err();
        assert_eq!(
            refused.message,
            "Invalid schema for response_format 't': In context=('properties', 'rule'), 'minLength' is not permitted."
        );
        assert_eq!(refused.code, "invalid_json_schema");
    }

    #[test]
    fn refuses_open_objects_optional_properties_and_untyped_schemas() {
        let open = json!({"type": "object", "properties": {"a": {"type": "string"}}, "required": ["a"]});
        assert!(
            check_body(&body(open))
                .unwrap_err()
                .message
                .ends_with("In context=(), 'additionalProperties' is required to be supplied and to be false.")
        );
        let optional =
            json!({"type": "object", "additionalProperties": false, "properties": {"a": {"type": "string"}}});
        assert!(check_body(&body(optional)).unwrap_err().message.ends_with("Missing 'a'."));
        let untyped =
            json!({"type": "object", "additionalProperties": false, "required": ["a"], "properties": {"a": {}}});
        assert!(
            check_body(&body(untyped))
                .unwrap_err()
                .message
                .contains("('properties', 'a'), schema must have a 'type' key.")
        );
        let root = json!({"anyOf": [{"type": "object"}]});
        assert!(
            check_body(&body(root)).unwrap_err().message.contains("schema must be a JSON Schema of 'type: \"object\"'")
        );
    }

    #[test]
    fn names_follow_the_pattern() {
        let mut request = body(json!({"type": "object", "additionalProperties": false, "properties": {}}));
        assert!(check_body(&request).is_ok());
        request["response_format"]["json_schema"]["name"] = json!("code-review@1");
        assert_eq!(check_body(&request).unwrap_err().code, "invalid_value");
        request["response_format"]["json_schema"]["name"] = json!("x".repeat(65));
        assert_eq!(check_body(&request).unwrap_err().code, "string_above_max_length");
    }

    #[test]
    fn non_strict_formats_are_not_checked() {
        let loose = json!({"response_format": {"type": "json_schema", "json_schema": {"name": "t", "schema": {"minLength": 1}}}});
        assert!(check_body(&loose).is_ok());
        assert!(check_body(&json!({"messages": []})).is_ok());
    }

    #[test]
    fn nesting_is_limited() {
        let mut schema = json!({"type": "object", "additionalProperties": false, "properties": {}, "required": []});
        for _ in 0..10 {
            schema = json!({"type": "object", "additionalProperties": false, "properties": {"n": schema}, "required": ["n"]});
        }
        assert_eq!(
            check_body(&body(schema)).unwrap_err().message,
            "Invalid schema for response_format 't': 11 levels of nesting exceeds limit of 10."
        );
    }
}
