//! The rule-based reviewer answering Messages `params`. A forced tool call (`tool_choice`
//! `tool` or `any`) is answered with one `tool_use` block whose input is the review;
//! `output_config.format` json_schema with a bare JSON `text` block; anything else with
//! prose around the JSON, as a chat model would.

use rand::rngs::StdRng;
use serde_json::{Value, json};

use crate::simulator::answer::{self, Ask};
use crate::simulator::faults::{Behaviour, Flaw};
use crate::simulator::model::{REFUSAL, cut, message_text, message_turns, tokens, valid_prefix};
use crate::simulator::output::random_id;

/// What the model produced for one request.
#[derive(Clone, Debug, PartialEq)]
pub(in crate::simulator) struct Answer {
    pub content: Value,
    pub stop_reason: &'static str,
    pub input_tokens: u64,
    pub output_tokens: u64,
}

/// Answers one request as `behaviour` says; `Err` is an `invalid_request_error` message for
/// a request the API accepts at create time but cannot run (e.g. `tool_choice` naming a
/// missing tool). A long answer is cut off at `max_tokens` when it needs more (stop_reason
/// `max_tokens`); a refusal is stop_reason `refusal` with no content, or (the other kind) an
/// `end_turn` text that declines without calling the forced tool (Messages API reference,
/// `stop_reason`; "Handling stop reasons" guide).
pub(in crate::simulator) fn respond(params: &Value, behaviour: Behaviour, rng: &mut StdRng) -> Result<Answer, String> {
    let messages = params.get("messages").and_then(Value::as_array).map(Vec::as_slice).unwrap_or_default();
    let system = system_text(params.get("system"));
    let tools = params.get("tools").and_then(Value::as_array).map(Vec::as_slice).unwrap_or_default();
    check_tools(tools)?;
    let forced = forced_tool(params.get("tool_choice"), tools)?;
    let ask = ask(params, forced.as_deref());
    // Tool definitions are part of the prompt and billed as input.
    let prompt_bytes = system.len()
        + messages.iter().map(|m| message_text(m).len()).sum::<usize>()
        + tools.iter().map(|t| t.to_string().len()).sum::<usize>();
    let input_tokens = tokens(prompt_bytes);
    let output = match behaviour {
        Behaviour::Refuse { first_kind } => return Ok(refusal(first_kind, input_tokens)),
        Behaviour::Long { needs, valid_prefix: prefix } => {
            let full = answer::answer(&ask, Flaw::None);
            let budget = params.get("max_tokens").and_then(Value::as_u64).unwrap_or(1);
            if budget < u64::from(needs) {
                return Ok(truncated(full, prefix, forced.as_deref(), budget, input_tokens, rng));
            }
            let mut answer = answer_with(full, forced, params, input_tokens, rng);
            answer.output_tokens = u64::from(needs);
            return Ok(answer);
        }
        Behaviour::Answer { flaw } => answer::answer(&ask, flaw),
    };
    Ok(answer_with(output, forced, params, input_tokens, rng))
}

/// Messages `params` as the model reads them: `messages` (`assistant` turns are earlier
/// answers) and the schema: the forced tool's `input_schema` (`forced` names it), else
/// `output_config.format.schema`.
pub(in crate::simulator) fn ask(params: &Value, forced: Option<&str>) -> Ask {
    let messages = params.get("messages").and_then(Value::as_array).map(Vec::as_slice).unwrap_or_default();
    let turns = message_turns(messages);
    let tools = params.get("tools").and_then(Value::as_array).map(Vec::as_slice).unwrap_or_default();
    let schema = match forced {
        Some(name) => tools
            .iter()
            .find(|t| t.get("name").and_then(Value::as_str) == Some(name))
            .and_then(|t| t.get("input_schema")),
        None => params
            .pointer("/output_config/format/schema")
            .filter(|_| params.pointer("/output_config/format/type").and_then(Value::as_str) == Some("json_schema")),
    };
    Ask::new(&turns, schema)
}

/// The tool `params` force, if any (a bad `tool_choice` forces none here; `respond` refuses it).
pub(in crate::simulator) fn forced_name(params: &Value) -> Option<String> {
    let tools = params.get("tools").and_then(Value::as_array).map(Vec::as_slice).unwrap_or_default();
    forced_tool(params.get("tool_choice"), tools).ok().flatten()
}

/// A complete answer: the forced tool's call, or text.
fn answer_with(output: Value, forced: Option<String>, params: &Value, input_tokens: u64, rng: &mut StdRng) -> Answer {
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
    Answer { content, stop_reason, input_tokens, output_tokens: tokens(output_bytes) }
}

/// Cut off at `budget` tokens: a tool call holding a valid prefix of the review (which
/// would pass validation), or one whose input never got written; text is torn mid-way.
fn truncated(
    full: Value,
    prefix: bool,
    forced: Option<&str>,
    budget: u64,
    input_tokens: u64,
    rng: &mut StdRng,
) -> Answer {
    let content = match forced {
        Some(name) => {
            let input = if prefix { valid_prefix(full) } else { json!({}) };
            json!([{"type": "tool_use", "id": random_id(rng, "toolu_", 24), "name": name, "input": input}])
        }
        None => json!([{"type": "text", "text": cut(&full.to_string())}]),
    };
    Answer { content, stop_reason: "max_tokens", input_tokens, output_tokens: budget.max(1) }
}

fn refusal(first_kind: bool, input_tokens: u64) -> Answer {
    if first_kind {
        Answer { content: json!([]), stop_reason: "refusal", input_tokens, output_tokens: 1 }
    } else {
        let content = json!([{"type": "text", "text": REFUSAL}]);
        Answer { content, stop_reason: "end_turn", input_tokens, output_tokens: tokens(REFUSAL.len()) }
    }
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
    use crate::simulator::model::review;

    const ANSWER: Behaviour = Behaviour::Answer { flaw: Flaw::None };

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
        let refused =
            respond(&params(json!({"tools": tools})), Behaviour::Answer { flaw: Flaw::None }, &mut rng).unwrap_err();
        assert_eq!(
            refused,
            "tools.0.custom.input_schema: input_schema does not support oneOf, allOf, or anyOf at the top level"
        );
        let tools = json!([{"name": "t", "input_schema": {"type": "array"}}]);
        assert!(
            respond(&params(json!({"tools": tools})), Behaviour::Answer { flaw: Flaw::None }, &mut rng)
                .unwrap_err()
                .contains("Input should be 'object'")
        );
    }

    #[test]
    fn a_forced_tool_is_called_with_the_review_as_input() {
        let mut rng = StdRng::seed_from_u64(1);
        for choice in [json!({"type": "tool", "name": "code-review_1"}), json!({"type": "any"})] {
            let answer = respond(&params(json!({"tools": [tool()], "tool_choice": choice})), ANSWER, &mut rng).unwrap();
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
        let plain = respond(&params(json!({"tools": [tool()], "tool_choice": {"type": "auto"}})), ANSWER, &mut rng);
        let plain = plain.unwrap();
        assert_eq!(plain.stop_reason, "end_turn");
        assert!(plain.content[0]["text"].as_str().unwrap().starts_with("Here is my review."));
        let format = json!({"output_config": {"format": {"type": "json_schema", "schema": {}}}});
        let structured = respond(&params(format), Behaviour::Answer { flaw: Flaw::Invalid }, &mut rng).unwrap();
        let output: Value = serde_json::from_str(structured.content[0]["text"].as_str().unwrap()).unwrap();
        assert_eq!(output["findings"][0]["severity"], "urgent", "broken answers violate the schema");
    }

    #[test]
    fn a_missing_forced_tool_is_an_invalid_request() {
        let mut rng = StdRng::seed_from_u64(1);
        let choice = json!({"tools": [tool()], "tool_choice": {"type": "tool", "name": "other"}});
        assert!(respond(&params(choice), ANSWER, &mut rng).unwrap_err().contains("'other'"));
        let any = json!({"tool_choice": {"type": "any"}});
        assert!(respond(&params(any), ANSWER, &mut rng).is_err());
    }

    #[test]
    fn max_tokens_cuts_a_long_answer_and_a_larger_budget_completes_it() {
        let mut rng = StdRng::seed_from_u64(1);
        let forced = json!({"tools": [tool()], "tool_choice": {"type": "tool", "name": "code-review_1"}});
        let long = |valid_prefix| Behaviour::Long { needs: 500, valid_prefix };
        // `params` asks for 100 tokens.
        let cut = respond(&params(forced.clone()), long(true), &mut rng).unwrap();
        assert_eq!((cut.stop_reason, cut.output_tokens), ("max_tokens", 100));
        assert_eq!(cut.content[0]["input"]["findings"], json!([]), "half of one finding: a valid prefix");
        let empty = respond(&params(forced.clone()), long(false), &mut rng).unwrap();
        assert_eq!(empty.content[0]["input"], json!({}));
        let mut roomy = params(forced);
        roomy["max_tokens"] = json!(500);
        let full = respond(&roomy, long(true), &mut rng).unwrap();
        assert_eq!((full.stop_reason, full.output_tokens), ("tool_use", 500));
        assert_eq!(full.content[0]["input"], review("s1", "ok\nx.unwrap()"));
    }

    #[test]
    fn refusals_come_in_two_shapes() {
        let mut rng = StdRng::seed_from_u64(1);
        let forced = json!({"tools": [tool()], "tool_choice": {"type": "tool", "name": "code-review_1"}});
        let first = respond(&params(forced.clone()), Behaviour::Refuse { first_kind: true }, &mut rng).unwrap();
        assert_eq!((first.stop_reason, first.content.clone()), ("refusal", json!([])));
        let second = respond(&params(forced), Behaviour::Refuse { first_kind: false }, &mut rng).unwrap();
        assert_eq!(second.stop_reason, "end_turn");
        assert_eq!(second.content[0]["text"], REFUSAL, "declines in text, no tool call");
    }
}
