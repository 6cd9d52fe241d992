//! What a committed output says besides its findings: the fields a schema requires next to
//! the findings array (a `language`, a `summary`, a verdict). They are validated with the
//! rest and shown with the extraction and in its `extraction.committed` event.

use serde_json::{Map, Value};

/// `output` without the findings array at `findings_pointer` (an RFC 6901 pointer). The
/// objects on the way to a nested array stay, holding their other members. `None` when
/// the output is not an object.
pub(super) fn beside_findings(output: &Value, findings_pointer: &str) -> Option<Map<String, Value>> {
    let Value::Object(fields) = output else { return None };
    let mut fields = fields.clone();
    let mut tokens: Vec<String> = findings_pointer.split('/').skip(1).map(unescape).collect();
    let Some(last) = tokens.pop() else { return Some(fields) };
    let mut parent = &mut fields;
    for token in &tokens {
        match parent.get_mut(token) {
            Some(Value::Object(inner)) => parent = inner,
            _ => return Some(fields),
        }
    }
    parent.remove(&last);
    Some(fields)
}

/// A pointer token as RFC 6901 spells `~` and `/` inside it.
fn unescape(token: &str) -> String {
    token.replace("~1", "/").replace("~0", "~")
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn the_findings_array_is_taken_out_and_everything_else_stays() {
        let output = json!({"language": "rust", "summary": "two issues", "findings": [{"rule": "R1"}]});
        let fields = beside_findings(&output, "/findings").expect("an object");
        assert_eq!(Value::Object(fields), json!({"language": "rust", "summary": "two issues"}));

        let nested = json!({"meta": {"lang": "en", "items": [1]}, "score": 3});
        let fields = beside_findings(&nested, "/meta/items").expect("an object");
        assert_eq!(Value::Object(fields), json!({"meta": {"lang": "en"}, "score": 3}));

        let escaped = json!({"a/b": [1], "c": true});
        assert_eq!(Value::Object(beside_findings(&escaped, "/a~1b").expect("object")), json!({"c": true}));

        assert_eq!(Value::Object(beside_findings(&json!({"findings": []}), "/findings").expect("object")), json!({}));
        assert_eq!(beside_findings(&json!([1, 2]), "/findings"), None);
        // A pointer through a non-object leaves the output as it is.
        let odd = json!({"meta": 3, "x": 1});
        assert_eq!(Value::Object(beside_findings(&odd, "/meta/items").expect("object")), odd);
    }
}
