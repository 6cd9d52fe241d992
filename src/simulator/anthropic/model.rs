//! The rule-based reviewer answering Messages `params`. A forced tool call (`tool_choice`
//! `tool` or `any`) is answered with one `tool_use` block whose input is the review;
//! `output_config.format` json_schema with a bare JSON `text` block; anything else with
//! prose around the JSON, as a chat model would.

use rand::rngs::StdRng;
use serde_json::{Value, json};

use crate::simulator::model::{broken_review, message_text, review, split_prompt, tokens};
use crate::simulator::output::random_id;

/// What the model produced for one request.
#[derive(Clone, Debug, PartialEq)]
pub struct Answer {
    pub content: Value,
    pub stop_reason: &'static str,
    pub input_tokens: u64,
    pub output_tokens: u64,
}

/// Answers one request; `Err` is an `invalid_request_error` message for a request the API
/// accepts at create time but cannot run (e.g. `tool_choice` naming a missing tool).
pub fn respond(params: &Value, broken: bool, rng: &mut StdRng) -> Result<Answer, String> {
    let messages = params.get("messages").and_then(Value::as_array).map(Vec::as_slice).unwrap_or_default();
    let system = system_text(params.get("system"));
    let tools = params.get("tools").and_then(Value::as_array).map(Vec::as_slice).unwrap_or_default();
    check_tools(tools)?;
    let forced = forced_tool(params.get("tool_choice"), tools)?;
    let last_user = messages
        .iter()
        .rev()
        .find(|m| m.get("role").and_then(Value::as_str) == Some("user"))
        .map(message_text)
        .unwrap_or_default();
    let (source_id, content) = split_prompt(&last_user);
    let output = if broken { broken_review(source_id, content) } else { review(source_id, content) };
    // Tool definitions are part of the prompt and billed as input.
    let prompt_bytes = system.len()
        + messages.iter().map(|m| message_text(m).len()).sum::<usize>()
        + tools.iter().map(|t| t.to_string().len()).sum::<usize>();
    let input_tokens = tokens(prompt_bytes);
    let structured = params.pointer("/output_config/format/type").and_then(Value::as_str) == Some("json_schema");
    let (content, stop_reason, output_bytes) = match forced {
        Some(name) => {
            let bytes = output.to_string().len();
            let block = json!({"type": "tool_use", "id": random_id(rng, "toolu_", 24), "name": name, "input": output});
            (json!([block]), "tool_use", bytes)
        }
        None => {
            let text =
                if structured { output.to_string() } else { format!("Here is my review.\n```json\n{output}\n```") };
            let bytes = text.len();
            (json!([{"type": "text", "text": text}]), "end_turn", bytes)
        }
    };
    Ok(Answer { content, stop_reason, input_tokens, output_tokens: tokens(output_bytes) })
}

/// Anthropic refuses a tool whose `input_schema` is not an object schema or has a
/// combinator at its root ("input_schema does not support oneOf, allOf, or anyOf at the
/// top level", as quoted in many public tool repositories); in a batch that surfaces as an
/// `errored` result for the request.
fn check_tools(tools: &[Value]) -> Result<(), String> {
    for (index, tool) in tools.iter().enumerate() {
        let schema = tool.get("input_schema").unwrap_or(&Value::Null);
        if ["oneOf", "allOf", "anyOf"].iter().any(|k| schema.get(*k).is_some()) {
            return Err(format!(
                "tools.{index}.custom.input_schema: input_schema does not support oneOf, allOf, or anyOf at the top level"
            ));
        }
        if schema.get("type").and_then(Value::as_str) != Some("object") {
            return Err(format!("tools.{index}.custom.input_schema.type: Input should be 'object'"));
        }
    }
    Ok(())
}

/// The tool the model must call, if `tool_choice` forces one.
fn forced_tool(choice: Option<&Value>, tools: &[Value]) -> Result<Option<String>, String> {
    let name_of = |tool: &Value| tool.get("name").and_then(Value::as_str).map(str::to_string);
    match choice.and_then(|c| c.get("type")).and_then(Value::as_str) {
        Some("tool") => {
            let wanted = choice.and_then(|c| c.get("name")).and_then(Value::as_str).unwrap_or_default();
            if tools.iter().any(|t| name_of(t).as_deref() == Some(wanted)) {
                Ok(Some(wanted.to_string()))
            } else {
                Err(format!("tool_choice.name: tool '{wanted}' is not one of the provided tools"))
            }
        }
        Some("any") => {
            tools.first().and_then(name_of).map(Some).ok_or_else(|| "tool_choice: 'any' requires tools".to_string())
        }
        _ => Ok(None),
    }
}

/// `system` is a string or a list of text blocks.
fn system_text(system: Option<&Value>) -> String {
    match system {
        Some(Value::String(text)) => text.clone(),
        Some(Value::Array(blocks)) => {
            blocks.iter().filter_map(|b| b.get("text").and_then(Value::as_str)).collect::<Vec<_>>().join("\n")
        }
        _ => String::new(),
    }
}

#[cfg(test)]
mod tests {
    use rand::SeedableRng;

    use super::*;

    fn params(extra: Value) -> Value {
        let mut params = json!({"model": "m", "max_tokens": 100, "system": "Review.",
            "messages": [{"role": "user", "content": "source_id: s1\n\nok\nx.unwrap()"}]});
        for (k, v) in extra.as_object().unwrap() {
            params[k] = v.clone();
        }
        params
    }

    fn tool() -> Value {
        json!({"name": "code-review_1", "input_schema": {"type": "object"}})
    }

    #[test]
    fn a_tool_schema_with_a_root_combinator_is_refused_in_anthropic_words() {
        let mut rng = StdRng::seed_from_u64(1);
        let tools = json!([{"name": "t", "input_schema": {"anyOf": [{"type": "object"}]}}]);
        let refused = respond(&params(json!({"tools": tools})), false, &mut rng).unwrap_err();
        assert_eq!(
            refused,
            "tools.0.custom.input_schema: input_schema does not support oneOf, allOf, or anyOf at the top level"
        );
        let tools = json!([{"name": "t", "input_schema": {"type": "array"}}]);
        assert!(
            respond(&params(json!({"tools": tools})), false, &mut rng)
                .unwrap_err()
                .contains("Input should be 'object'")
        );
    }

    #[test]
    fn a_forced_tool_is_called_with_the_review_as_input() {
        let mut rng = StdRng::seed_from_u64(1);
        for choice in [json!({"type": "tool", "name": "code-review_1"}), json!({"type": "any"})] {
            let answer = respond(&params(json!({"tools": [tool()], "tool_choice": choice})), false, &mut rng).unwrap();
            assert_eq!(answer.stop_reason, "tool_use");
            let block = &answer.content[0];
            assert_eq!(block["type"], "tool_use");
            assert_eq!(block["name"], "code-review_1");
            assert!(block["id"].as_str().unwrap().starts_with("toolu_"));
            assert_eq!(block["input"], review("s1", "ok\nx.unwrap()"));
            assert!(answer.input_tokens > 1 && answer.output_tokens > 1);
        }
    }

    #[test]
    fn text_answers_without_a_forced_tool() {
        let mut rng = StdRng::seed_from_u64(1);
        let plain = respond(&params(json!({"tools": [tool()], "tool_choice": {"type": "auto"}})), false, &mut rng);
        let plain = plain.unwrap();
        assert_eq!(plain.stop_reason, "end_turn");
        assert!(plain.content[0]["text"].as_str().unwrap().starts_with("Here is my review."));
        let format = json!({"output_config": {"format": {"type": "json_schema", "schema": {}}}});
        let structured = respond(&params(format), true, &mut rng).unwrap();
        let output: Value = serde_json::from_str(structured.content[0]["text"].as_str().unwrap()).unwrap();
        assert_eq!(output["findings"][0]["severity"], "urgent", "broken answers violate the schema");
    }

    #[test]
    fn a_missing_forced_tool_is_an_invalid_request() {
        let mut rng = StdRng::seed_from_u64(1);
        let choice = json!({"tools": [tool()], "tool_choice": {"type": "tool", "name": "other"}});
        assert!(respond(&params(choice), false, &mut rng).unwrap_err().contains("'other'"));
        let any = json!({"tool_choice": {"type": "any"}});
        assert!(respond(&params(any), false, &mut rng).is_err());
    }
}
