//! Reading a batch input file (`BatchRequestInput` JSONL). Size and line-count limits are
//! upload errors (400); per-line problems are kept with the file and surface the way the
//! real API reports them: the batch goes `failed` with `errors.data[{code,message,param,line}]`.

use std::collections::HashSet;

use serde_json::Value;

use super::wire::BatchError;

pub(super) const MAX_LINES: usize = 50_000;
pub(super) const MAX_FILE_BYTES: usize = 200 * 1024 * 1024;
/// A file with thousands of broken lines needs a handful of examples, not all of them.
const MAX_REPORTED_ERRORS: usize = 100;

/// One valid request line.
#[derive(Clone, Debug, PartialEq)]
pub(super) struct InputRequest {
    pub custom_id: String,
    pub model: String,
    pub body: Value,
}

/// A parsed batch input file: its requests, or why a batch over it must fail.
#[derive(Clone, Debug, PartialEq)]
pub(super) struct Input {
    pub requests: Vec<InputRequest>,
    /// Every `custom_id` seen, valid line or not, for the submission statistics.
    pub custom_ids: Vec<String>,
    pub errors: Vec<BatchError>,
    pub model: Option<String>,
    /// The `url` of the first line naming a known one; every other line must name the same.
    pub url: Option<String>,
}

/// Counts request lines (blank lines are not requests) without parsing them.
pub(super) fn count_lines(bytes: &[u8]) -> usize {
    bytes.split(|b| *b == b'\n').filter(|line| !line.iter().all(u8::is_ascii_whitespace)).count()
}

#[cfg(test)]
pub(crate) fn parse(bytes: &[u8]) -> Input {
    parse_for(bytes, &[super::wire::ENDPOINT_CHAT])
}

/// `parse`, for a platform whose lines may name any of `urls` (Azure: also `/chat/completions`).
pub(super) fn parse_for(bytes: &[u8], urls: &[&str]) -> Input {
    let mut input = Input { requests: Vec::new(), custom_ids: Vec::new(), errors: Vec::new(), model: None, url: None };
    let mut seen = HashSet::new();
    for (index, raw) in bytes.split(|b| *b == b'\n').enumerate() {
        if raw.iter().all(u8::is_ascii_whitespace) {
            continue;
        }
        let line = u64::try_from(index + 1).unwrap_or(u64::MAX);
        match parse_line(raw, &mut seen, &mut input, urls) {
            Ok(request) => input.requests.push(request),
            Err(error) => {
                if input.errors.len() < MAX_REPORTED_ERRORS {
                    input.errors.push(error.at(line));
                }
            }
        }
    }
    if input.requests.is_empty() && input.errors.is_empty() {
        input.errors.push(LineError::new("empty_file", "The input file contains no requests.", None).at(0));
    }
    input
}

struct LineError(BatchError);

impl LineError {
    fn new(code: &str, message: &str, param: Option<&str>) -> Self {
        Self(BatchError {
            code: code.to_string(),
            message: message.to_string(),
            param: param.map(str::to_string),
            line: None,
        })
    }

    fn at(mut self, line: u64) -> BatchError {
        self.0.line = (line > 0).then_some(line);
        self.0
    }
}

fn parse_line(
    raw: &[u8],
    seen: &mut HashSet<String>,
    input: &mut Input,
    urls: &[&str],
) -> Result<InputRequest, LineError> {
    let Ok(Value::Object(mut object)) = serde_json::from_slice::<Value>(raw) else {
        return Err(LineError::new("invalid_json_line", "This line is not parseable as valid JSON.", None));
    };
    let Some(Value::String(custom_id)) = object.remove("custom_id") else {
        return Err(missing("custom_id"));
    };
    input.custom_ids.push(custom_id.clone());
    if !seen.insert(custom_id.clone()) {
        return Err(LineError::new(
            "duplicate_custom_id",
            "The custom_id for this request is a duplicate of another request. The custom_id \
             parameter must be unique for each individual request in a batch.",
            Some("custom_id"),
        ));
    }
    if object.get("method").and_then(Value::as_str) != Some("POST") {
        return Err(LineError::new("invalid_method", "The method for this request must be POST.", Some("method")));
    }
    let url = object.get("url").and_then(Value::as_str).filter(|u| urls.contains(u)).map(str::to_string);
    let Some(url) = url else {
        return Err(LineError::new(
            "invalid_url",
            "The URL provided for this request does not match the batch endpoint.",
            Some("url"),
        ));
    };
    if input.url.as_ref().is_some_and(|first| *first != url) {
        return Err(LineError::new(
            "url_mismatch",
            "The URL of this request does not match the URL of the other requests in the file.",
            Some("url"),
        ));
    }
    let Some(body) = object.remove("body").filter(Value::is_object) else {
        return Err(missing("body"));
    };
    let Some(model) = body.get("model").and_then(Value::as_str).map(str::to_string) else {
        return Err(missing("body.model"));
    };
    if body.get("messages").and_then(Value::as_array).is_none_or(Vec::is_empty) {
        return Err(missing("body.messages"));
    }
    input.url.get_or_insert(url);
    match &input.model {
        None => input.model = Some(model.clone()),
        Some(first) if *first != model => {
            return Err(LineError::new(
                "mismatched_model",
                "All requests in a batch must use the same model.",
                Some("body.model"),
            ));
        }
        Some(_) => {}
    }
    Ok(InputRequest { custom_id, model, body })
}

fn missing(param: &str) -> LineError {
    LineError::new("missing_required_parameter", &format!("Missing required parameter: '{param}'."), Some(param))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn line(custom_id: &str, model: &str) -> String {
        format!(
            r#"{{"custom_id":"{custom_id}","method":"POST","url":"/v1/chat/completions","body":{{"model":"{model}","messages":[{{"role":"user","content":"x"}}]}}}}"#
        )
    }

    #[test]
    fn valid_file_parses_and_skips_blank_lines() {
        let text = format!("{}\n\n{}\n", line("a", "m"), line("b", "m"));
        assert_eq!(count_lines(text.as_bytes()), 2);
        let input = parse(text.as_bytes());
        assert!(input.errors.is_empty(), "{:?}", input.errors);
        assert_eq!(input.custom_ids, ["a", "b"]);
        assert_eq!(input.model.as_deref(), Some("m"));
    }

    #[test]
    fn each_problem_is_reported_with_its_line() {
        let text = [
            line("a", "m"),
            line("a", "m"),
            "not json".to_string(),
            line("b", "m").replace("POST", "GET"),
            line("c", "m").replace("/v1/chat/completions", "/v1/embeddings"),
            r#"{"custom_id":"d","method":"POST","url":"/v1/chat/completions","body":{"model":"m"}}"#.to_string(),
            line("e", "other"),
        ]
        .join("\n");
        let input = parse(text.as_bytes());
        let got: Vec<_> = input.errors.iter().map(|e| (e.code.as_str(), e.line)).collect();
        assert_eq!(
            got,
            [
                ("duplicate_custom_id", Some(2)),
                ("invalid_json_line", Some(3)),
                ("invalid_method", Some(4)),
                ("invalid_url", Some(5)),
                ("missing_required_parameter", Some(6)),
                ("mismatched_model", Some(7)),
            ]
        );
        assert_eq!(input.errors[4].param.as_deref(), Some("body.messages"));
    }

    #[test]
    fn an_empty_file_cannot_make_a_batch() {
        let input = parse(b"\n\n");
        assert_eq!(input.errors[0].code, "empty_file");
    }
}
