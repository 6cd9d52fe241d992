//! What the simulated model answers, over real HTTP: an instance of whatever schema the
//! request carries (not only `code-review@1`), and with `invalid_first` /
//! `ungrounded_first` a wrong first answer per source, then a valid one when re-asked.

use std::path::Path;
use std::time::{Duration, Instant};

use reqwest::{Client, StatusCode};
use serde_json::{Value, json};

use super::{code_review_view, download, poll_until_terminal, start, upload};
use crate::domain::schema::{BUILTIN_CODE_REVIEW, Dialect, Registry, Schema};
use crate::simulator::{Dialect as SimDialect, Faults, SimulatorConfig, review};

const SOURCE: &str = "src/pay.rs";
const CONTENT: &str = "fn pay() {\n    let total = sum().unwrap();\n}\n";

fn ticket() -> Schema {
    let document = json!({
        "type": "object",
        "required": ["findings"],
        "properties": {"findings": {"type": "array", "items": {
            "type": "object",
            "required": ["category", "text"],
            "properties": {"category": {"enum": ["billing", "outage", "other"]}, "text": {"type": "string"},
                "line": {"type": "integer", "minimum": 1}}
        }}},
        "x-commitpoint-identity": ["/category"]
    });
    Schema::compile("ticket@1", &document, Path::new("ticket@1.json")).unwrap()
}

/// A chat completion body as the adapters build one; `earlier` is a previous answer to
/// re-ask about (assistant turn, then a user turn with the issues).
fn chat_body(schema: &Value, earlier: Option<&str>) -> Value {
    let mut messages = vec![
        json!({"role": "system", "content": "Extract findings."}),
        json!({"role": "user", "content": format!("source_id: {SOURCE}\n\n{CONTENT}")}),
    ];
    if let Some(earlier) = earlier {
        messages.push(json!({"role": "assistant", "content": earlier}));
        messages.push(json!({"role": "user", "content": "Your answer does not satisfy the schema: /findings/0/line"}));
    }
    json!({"model": "sim", "messages": messages,
        "response_format": {"type": "json_schema", "json_schema": {"name": "x", "strict": true, "schema": schema}}})
}

/// Reads an answer as commitpoint does: strict nulls removed, then validated.
fn check(schema: &Schema, mut output: Value) -> Result<Value, Value> {
    schema.normalize_provider_answer(&mut output);
    match schema.validate(&output) {
        Ok(_) => Ok(output),
        Err(_) => Err(output),
    }
}

async fn chat(client: &Client, base: &str, body: &Value) -> String {
    let response = client.post(format!("{base}/chat/completions")).json(body).send().await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    let completion: Value = response.json().await.unwrap();
    completion["choices"][0]["message"]["content"].as_str().unwrap().to_string()
}

#[tokio::test]
async fn a_custom_schema_is_answered_in_its_own_shape_and_code_review_as_before() {
    let (_sim, client, base) = start(SimulatorConfig::default()).await;
    let ticket = ticket();
    let text = chat(&client, &base, &chat_body(ticket.provider_schema(Dialect::OpenAiStrict), None)).await;
    let output = check(&ticket, serde_json::from_str(&text).unwrap()).unwrap();
    assert_eq!(output["findings"][0]["text"], "let total = sum().unwrap();");
    assert!(output["findings"][0].get("line").is_none(), "optional: sent as null, read as absent");
    let text = chat(&client, &base, &chat_body(&code_review_view(Dialect::OpenAiStrict), None)).await;
    assert_eq!(serde_json::from_str::<Value>(&text).unwrap(), review(SOURCE, CONTENT));
}

#[tokio::test]
async fn invalid_first_then_valid_when_re_asked_on_the_chat_endpoint() {
    let faults = Faults { invalid_first: 1, ungrounded_first: 1, ..Faults::default() };
    let (_sim, client, base) = start(SimulatorConfig { faults, ..SimulatorConfig::default() }).await;
    let builtin = Registry::builtin().get(BUILTIN_CODE_REVIEW).unwrap();
    let view = code_review_view(Dialect::OpenAiStrict);
    let first = chat(&client, &base, &chat_body(&view, None)).await;
    let first = check(&builtin, serde_json::from_str(&first).unwrap()).unwrap_err();
    assert_eq!(first["findings"][0]["line"], 0);
    let second = chat(&client, &base, &chat_body(&view, Some(&first.to_string()))).await;
    let second = check(&builtin, serde_json::from_str(&second).unwrap()).unwrap();
    let past_end = CONTENT.lines().count() + 10;
    assert!(second["findings"].as_array().unwrap().iter().any(|f| f["line"] == past_end), "ungrounded: {second:#}");
    let third = chat(&client, &base, &chat_body(&view, Some(&second.to_string()))).await;
    assert_eq!(serde_json::from_str::<Value>(&third).unwrap(), review(SOURCE, CONTENT), "the corrected answer");

    // A custom schema's first answer leaves out a required property.
    let ticket = ticket();
    let body = chat_body(ticket.provider_schema(Dialect::OpenAiStrict), None);
    let wrong = check(&ticket, serde_json::from_str(&chat(&client, &base, &body).await).unwrap()).unwrap_err();
    assert!(wrong["findings"][0].get("text").is_none() || wrong["findings"][0].get("category").is_none(), "{wrong}");
}

#[tokio::test]
async fn a_batch_answers_each_line_in_its_schema_and_misbehaves_once_per_source() {
    let faults = Faults { invalid_first: 1, ..Faults::default() };
    let (_sim, client, base) = start(SimulatorConfig { faults, ..SimulatorConfig::default() }).await;
    let ticket = ticket();
    let builtin = Registry::builtin().get(BUILTIN_CODE_REVIEW).unwrap();
    let lines = |earlier: Option<&str>| {
        [("t", ticket.provider_schema(Dialect::OpenAiStrict).clone()), ("r", code_review_view(Dialect::OpenAiStrict))]
            .iter()
            .map(|(id, schema)| {
                json!({"custom_id": id, "method": "POST", "url": "/v1/chat/completions",
                    "body": chat_body(schema, earlier)})
                .to_string()
            })
            .collect::<Vec<_>>()
            .join("\n")
    };
    let mut answers = Vec::new();
    for earlier in [None, Some("{\"findings\": []}")] {
        let file = upload(&client, &base, lines(earlier)).await;
        let body = json!({"input_file_id": file["id"], "endpoint": "/v1/chat/completions", "completion_window": "24h"});
        let batch: Value =
            client.post(format!("{base}/batches")).json(&body).send().await.unwrap().json().await.unwrap();
        let done = poll_until_terminal(&client, &base, batch["id"].as_str().unwrap()).await;
        let out = download(&client, &base, &done["output_file_id"]).await;
        let content = |id: &str| -> Value {
            serde_json::from_str(out[id]["response"]["body"]["choices"][0]["message"]["content"].as_str().unwrap())
                .unwrap()
        };
        answers.push((check(&ticket, content("t")), check(&builtin, content("r"))));
    }
    assert!(answers[0].0.is_err() && answers[0].1.is_err(), "first answers are invalid: {answers:#?}");
    assert!(answers[1].0.is_ok(), "{answers:#?}");
    assert_eq!(answers[1].1, Ok(review(SOURCE, CONTENT)));
}

#[tokio::test]
async fn anthropic_and_gemini_batches_answer_a_custom_schema_and_a_re_ask() {
    let ticket = ticket();
    let faults = Faults { invalid_first: 1, ..Faults::default() };
    // Anthropic: the forced tool's input_schema; the re-ask replays the conversation.
    let config = SimulatorConfig { dialect: SimDialect::Anthropic, faults: faults.clone(), ..Default::default() };
    let (sim, client, _) = start(config).await;
    let base = format!("{}/v1/messages/batches", sim.base_url());
    let tool = json!({"name": "ticket_1", "input_schema": ticket.provider_schema(Dialect::AnthropicTool)});
    let mut inputs = Vec::new();
    for earlier in [None::<Value>, Some(json!({"findings": []}))] {
        let mut messages = vec![json!({"role": "user", "content": format!("source_id: {SOURCE}\n\n{CONTENT}")})];
        if let Some(earlier) = earlier {
            messages.push(json!({"role": "assistant", "content": [
                {"type": "tool_use", "id": "toolu_1", "name": "ticket_1", "input": earlier}]}));
            messages.push(json!({"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "toolu_1", "content": "issues: /findings/0/text", "is_error": true}]}));
        }
        let body = json!({"requests": [{"custom_id": "a", "params": {"model": "sim", "max_tokens": 1000,
            "messages": messages, "tools": [tool], "tool_choice": {"type": "tool", "name": "ticket_1"}}}]});
        let request = client.post(&base).header("x-api-key", "k").header("anthropic-version", "2023-06-01");
        let batch: Value = request.json(&body).send().await.unwrap().json().await.unwrap();
        let id = batch["id"].as_str().unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        let ended = loop {
            let get =
                client.get(format!("{base}/{id}")).header("x-api-key", "k").header("anthropic-version", "2023-06-01");
            let batch: Value = get.send().await.unwrap().json().await.unwrap();
            if batch["processing_status"] == "ended" {
                break batch;
            }
            assert!(Instant::now() < deadline);
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        let get = client.get(ended["results_url"].as_str().unwrap()).header("x-api-key", "k");
        let text = get.header("anthropic-version", "2023-06-01").send().await.unwrap().text().await.unwrap();
        let line: Value = serde_json::from_str(text.lines().next().unwrap()).unwrap();
        inputs.push(line["result"]["message"]["content"][0]["input"].clone());
    }
    assert!(check(&ticket, inputs[0].clone()).is_err(), "{inputs:#?}");
    assert!(check(&ticket, inputs[1].clone()).is_ok(), "{inputs:#?}");

    // Gemini: responseJsonSchema; inline requests.
    let config = SimulatorConfig { dialect: SimDialect::Gemini, faults, ..Default::default() };
    let (sim, client, base) = start(config).await;
    let request = json!({"contents": [{"role": "user", "parts": [{"text": format!("source_id: {SOURCE}\n\n{CONTENT}")}]}],
        "generationConfig": {"responseMimeType": "application/json",
            "responseJsonSchema": ticket.provider_schema(Dialect::GeminiJson)}});
    let mut re_ask = request.clone();
    re_ask["contents"].as_array_mut().unwrap().extend([
        json!({"role": "model", "parts": [{"text": "{\"findings\": []}"}]}),
        json!({"role": "user", "parts": [{"text": "issues: /findings/0/text"}]}),
    ]);
    let body = json!({"batch": {"displayName": "d", "inputConfig": {"requests": {"requests": [
        {"request": request, "metadata": {"key": "first"}}, {"request": re_ask, "metadata": {"key": "again"}}]}}}});
    let url = format!("{base}/v1beta/models/m:batchGenerateContent");
    let op: Value =
        client.post(&url).header("x-goog-api-key", "k").json(&body).send().await.unwrap().json().await.unwrap();
    let name = op["name"].as_str().unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    let done = loop {
        let get = client.get(format!("{base}/v1beta/{name}")).header("x-goog-api-key", "k");
        let op: Value = get.send().await.unwrap().json().await.unwrap();
        if op["done"] == true {
            break op;
        }
        assert!(Instant::now() < deadline, "{op:#}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let entries = done["response"]["inlinedResponses"]["inlinedResponses"].as_array().unwrap();
    let text = |i: usize| -> Value {
        let text = entries[i]["response"]["candidates"][0]["content"]["parts"][0]["text"].as_str().unwrap();
        serde_json::from_str(text).unwrap()
    };
    assert!(check(&ticket, text(0)).is_err(), "the first answer: {:#}", text(0));
    assert!(check(&ticket, text(1)).is_ok(), "the re-ask: {:#}", text(1));
    drop(sim);
}
