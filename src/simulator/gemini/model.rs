//! The rule-based reviewer answering a `GenerateContentRequest` with a
//! `GenerateContentResponse`. With `responseMimeType: application/json` the candidate's
//! text is the bare review JSON (constrained decoding); without it, prose around the JSON.
//! A long answer over `maxOutputTokens` stops with `finishReason: MAX_TOKENS`; a refusal is,
//! alternately, a `SAFETY` stop with no text and a prompt blocked before any candidate
//! (`promptFeedback.blockReason`), as the API reference's `FinishReason` and `BlockReason`
//! enums describe.

use rand::rngs::StdRng;
use serde_json::{Value, json};

use crate::simulator::answer::{self, Ask, Turn};
use crate::simulator::faults::{Behaviour, Flaw};
use crate::simulator::model::{cut, tokens, valid_prefix};
use crate::simulator::output::random_id;

/// The simulated model's own output limit when a request sets no `maxOutputTokens`
/// (Gemini 2.5 models document 65,536).
pub(super) const MODEL_MAX_OUTPUT_TOKENS: u64 = 65_536;

/// Checks a request as the API does before running anything; the error names the field
/// (`contents`, `generationConfig.…`). The `responseJsonSchema` rules are the API
/// reference's for `GenerationConfig`: it needs `responseMimeType`, and excludes `responseSchema`.
pub(in crate::simulator) fn check(request: &Value) -> Result<(), String> {
    if !request.is_object() {
        return Err("request: must be a GenerateContentRequest object".to_string());
    }
    if request.get("contents").and_then(Value::as_array).is_none_or(Vec::is_empty) {
        return Err("GenerateContentRequest.contents: contents is not specified".to_string());
    }
    let Some(config) = request.get("generationConfig").or_else(|| request.get("generation_config")) else {
        return Ok(());
    };
    let json_schema = config.get("responseJsonSchema").or_else(|| config.get("response_json_schema"));
    let schema = config.get("responseSchema").or_else(|| config.get("response_schema"));
    let mime = config.get("responseMimeType").or_else(|| config.get("response_mime_type")).and_then(Value::as_str);
    if json_schema.is_some() && schema.is_some() {
        return Err("GenerationConfig: response_schema must be omitted when response_json_schema is set".to_string());
    }
    if (json_schema.is_some() || schema.is_some()) && mime != Some("application/json") {
        return Err(
            "GenerationConfig.response_mime_type: must be application/json when a response schema is set".to_string()
        );
    }
    if config.get("maxOutputTokens").is_some_and(|m| m.as_u64().is_none_or(|m| m == 0)) {
        return Err("GenerationConfig.max_output_tokens: must be a positive integer".to_string());
    }
    Ok(())
}

/// Answers one checked request as `behaviour` says.
pub(in crate::simulator) fn respond(request: &Value, behaviour: Behaviour, model: &str, rng: &mut StdRng) -> Value {
    let ask = ask(request);
    let prompt_tokens = tokens(request.to_string().len());
    let structured =
        request.pointer("/generationConfig/responseMimeType").and_then(Value::as_str) == Some("application/json");
    let budget = request.pointer("/generationConfig/maxOutputTokens").and_then(Value::as_u64);
    let (text, finish, output_tokens) = match behaviour {
        Behaviour::Refuse { first_kind: false } => {
            return json!({
                "promptFeedback": {"blockReason": "PROHIBITED_CONTENT"},
                "usageMetadata": {"promptTokenCount": prompt_tokens, "totalTokenCount": prompt_tokens},
                "modelVersion": model,
                "responseId": random_id(rng, "", 22),
            });
        }
        Behaviour::Refuse { first_kind: true } => (String::new(), "SAFETY", 0),
        Behaviour::Long { needs, valid_prefix: prefix } => {
            let full = answer::answer(&ask, Flaw::None);
            let limit = budget.unwrap_or(MODEL_MAX_OUTPUT_TOKENS);
            if limit < u64::from(needs) {
                let text = if prefix { valid_prefix(full).to_string() } else { cut(&full.to_string()).to_string() };
                (text, "MAX_TOKENS", limit.max(1))
            } else {
                (render(&full, structured), "STOP", u64::from(needs))
            }
        }
        Behaviour::Answer { flaw } => {
            let text = render(&answer::answer(&ask, flaw), structured);
            let text = if flaw == Flaw::NotJson { answer::in_prose(&text) } else { text };
            let used = tokens(text.len());
            (text, "STOP", used)
        }
    };
    let parts = if text.is_empty() { json!([]) } else { json!([{"text": text}]) };
    json!({
        "candidates": [{"content": {"role": "model", "parts": parts}, "finishReason": finish, "index": 0}],
        "usageMetadata": {
            "promptTokenCount": prompt_tokens,
            "candidatesTokenCount": output_tokens,
            "totalTokenCount": prompt_tokens + output_tokens,
        },
        "modelVersion": model,
        "responseId": random_id(rng, "", 22),
    })
}

fn render(output: &Value, structured: bool) -> String {
    if structured { output.to_string() } else { format!("Here is my review.\n```json\n{output}\n```") }
}

/// A `GenerateContentRequest` as the model reads it: `contents` (a turn without a role is
/// the user's; `model` turns are earlier answers) and the schema,
/// `generationConfig.responseJsonSchema`, else `responseSchema`.
pub(in crate::simulator) fn ask(request: &Value) -> Ask {
    let contents = request.get("contents").and_then(Value::as_array).map(Vec::as_slice).unwrap_or_default();
    let turns: Vec<(Turn, String)> = contents
        .iter()
        .map(|c| {
            let turn = match c.get("role").and_then(Value::as_str).unwrap_or("user") {
                "user" => Turn::User,
                "model" => Turn::Model,
                _ => Turn::Other,
            };
            let parts = c.get("parts").and_then(Value::as_array).map(Vec::as_slice).unwrap_or_default();
            let text =
                parts.iter().filter_map(|p| p.get("text").and_then(Value::as_str)).collect::<Vec<_>>().join("\n");
            (turn, text)
        })
        .collect();
    let config = request.get("generationConfig").or_else(|| request.get("generation_config"));
    let schema = config.and_then(|c| {
        ["responseJsonSchema", "response_json_schema", "responseSchema", "response_schema"]
            .iter()
            .find_map(|k| c.get(*k))
    });
    Ask::new(&turns, schema)
}

#[cfg(test)]
mod tests {
    use rand::SeedableRng;

    use super::*;
    use crate::simulator::model::review;

    fn request(max: Option<u64>) -> Value {
        let mut config = json!({"responseMimeType": "application/json", "responseJsonSchema": {"type": "object"}});
        if let Some(max) = max {
            config["maxOutputTokens"] = json!(max);
        }
        json!({"contents": [{"role": "user", "parts": [{"text": "source_id: s1\n\nx.unwrap()"}]}],
            "generationConfig": config})
    }

    #[test]
    fn the_review_is_the_candidate_text_with_usage() {
        let mut rng = StdRng::seed_from_u64(1);
        let answer = respond(&request(None), Behaviour::Answer { flaw: Flaw::None }, "gemini-sim", &mut rng);
        let text = answer["candidates"][0]["content"]["parts"][0]["text"].as_str().unwrap();
        assert_eq!(serde_json::from_str::<Value>(text).unwrap(), review("s1", "x.unwrap()"));
        assert_eq!(answer["candidates"][0]["finishReason"], "STOP");
        assert!(answer["usageMetadata"]["promptTokenCount"].as_u64().unwrap() > 1);
        assert_eq!(answer["modelVersion"], "gemini-sim");
    }

    #[test]
    fn budgets_cut_long_answers_and_refusals_take_two_shapes() {
        let mut rng = StdRng::seed_from_u64(1);
        let long = Behaviour::Long { needs: 500, valid_prefix: true };
        let cut = respond(&request(Some(100)), long, "m", &mut rng);
        assert_eq!(cut["candidates"][0]["finishReason"], "MAX_TOKENS");
        assert_eq!(cut["usageMetadata"]["candidatesTokenCount"], 100);
        let full = respond(&request(Some(500)), long, "m", &mut rng);
        assert_eq!(full["candidates"][0]["finishReason"], "STOP");
        let safety = respond(&request(None), Behaviour::Refuse { first_kind: true }, "m", &mut rng);
        assert_eq!(safety["candidates"][0]["finishReason"], "SAFETY");
        let blocked = respond(&request(None), Behaviour::Refuse { first_kind: false }, "m", &mut rng);
        assert!(blocked.get("candidates").is_none());
        assert_eq!(blocked["promptFeedback"]["blockReason"], "PROHIBITED_CONTENT");
    }

    #[test]
    fn requests_are_checked_by_the_documented_rules() {
        assert!(check(&request(Some(10))).is_ok());
        assert!(check(&json!({"contents": []})).unwrap_err().contains("contents is not specified"));
        let mut no_mime = request(None);
        no_mime["generationConfig"].as_object_mut().unwrap().remove("responseMimeType");
        assert!(check(&no_mime).unwrap_err().contains("response_mime_type"));
        let mut both = request(None);
        both["generationConfig"]["responseSchema"] = json!({"type": "OBJECT"});
        assert!(check(&both).unwrap_err().contains("response_schema must be omitted"));
        assert!(check(&request(Some(0))).is_err());
    }
}
