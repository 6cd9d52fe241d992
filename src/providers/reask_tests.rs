//! Every dialect asks again in its own wire shape: the source as the first user turn, the
//! refused answer as the model's turn, the issues as the next user turn.

use serde_json::{Value, json};

use crate::domain::batch::{BatchMember, PreviousAttempt};
use crate::domain::identity::ExtractionId;
use crate::domain::schema::{BUILTIN_CODE_REVIEW, Dialect, Registry, ValidationIssue};
use crate::providers::{anthropic, bedrock, chat, gemini};

fn reasked() -> BatchMember {
    let issues = vec![ValidationIssue {
        path: "/findings/0/line".into(),
        message: "line 90 is outside every hunk of src/a.rs".into(),
    }];
    BatchMember {
        id: ExtractionId([1; 32]),
        source_id: "PR-1".into(),
        content: "diff --git a/src/a.rs b/src/a.rs".into(),
        output_budget: None,
        previous_attempt: Some(PreviousAttempt::new(r#"{"findings":[{"line":90}]}"#, issues)),
    }
}

fn roles(turns: &Value, key: &str) -> Vec<String> {
    turns.as_array().unwrap().iter().map(|t| t[key].as_str().unwrap_or_default().to_string()).collect()
}

fn says_what_to_fix(text: &str) {
    assert!(text.contains("/findings/0/line: line 90 is outside every hunk of src/a.rs"), "{text}");
    assert!(text.contains("Answer again"), "{text}");
}

#[test]
fn chat_completions_continue_the_conversation() {
    let schema = Registry::builtin().get(BUILTIN_CODE_REVIEW).unwrap();
    let body = chat::wire::request_body(&reasked(), &schema, "m", None, chat::wire::BudgetField::MaxTokens);
    assert_eq!(roles(&body["messages"], "role"), ["system", "user", "assistant", "user"]);
    assert_eq!(body["messages"][2]["content"], r#"{"findings":[{"line":90}]}"#);
    says_what_to_fix(body["messages"][3]["content"].as_str().unwrap());
    let first = BatchMember { previous_attempt: None, ..reasked() };
    let body = chat::wire::request_body(&first, &schema, "m", None, chat::wire::BudgetField::MaxTokens);
    assert_eq!(roles(&body["messages"], "role"), ["system", "user"], "a first ask is one user turn");
}

#[test]
fn anthropic_and_bedrock_alternate_user_and_assistant_turns() {
    let schema = Registry::builtin().get(BUILTIN_CODE_REVIEW).unwrap();
    let input_schema = schema.provider_schema(Dialect::AnthropicTool).clone();
    let request = anthropic::wire::request(&reasked(), &schema, &input_schema, "claude", 1000);
    let messages = &request["params"]["messages"];
    assert_eq!(roles(messages, "role"), ["user", "assistant", "user"]);
    assert_eq!(messages[1]["content"], r#"{"findings":[{"line":90}]}"#);
    says_what_to_fix(messages[2]["content"].as_str().unwrap());
    assert_eq!(request["params"]["tool_choice"]["type"], "tool", "the answer is still forced into the tool");
    let record = bedrock::wire::record(&reasked(), &schema, &input_schema, 1000);
    assert_eq!(roles(&record["modelInput"]["messages"], "role"), ["user", "assistant", "user"], "{record:#}");
}

#[test]
fn gemini_answers_as_the_model_turn() {
    let schema = Registry::builtin().get(BUILTIN_CODE_REVIEW).unwrap();
    let request = gemini::wire::request(&reasked(), &schema, &json!({"type": "object"}), None);
    assert_eq!(roles(&request["contents"], "role"), ["user", "model", "user"]);
    assert_eq!(request["contents"][1]["parts"][0]["text"], r#"{"findings":[{"line":90}]}"#);
    says_what_to_fix(request["contents"][2]["parts"][0]["text"].as_str().unwrap());
}

#[test]
fn a_long_refused_answer_is_cut_and_says_so() {
    let long = "é".repeat(crate::domain::batch::MAX_PREVIOUS_OUTPUT_CHARS + 10);
    let previous = PreviousAttempt::new(&long, Vec::new());
    assert!(previous.output.ends_with("… [cut: 20 more bytes]"), "{}", &previous.output[previous.output.len() - 40..]);
    assert_eq!(previous.output.chars().filter(|&c| c == 'é').count(), crate::domain::batch::MAX_PREVIOUS_OUTPUT_CHARS);
    assert_eq!(PreviousAttempt::new("{}", Vec::new()).output, "{}", "a short answer is kept whole");
}

/// Mistral serves a conversation only when it ends on a user turn (400 "Expected last role
/// User or Tool (or Assistant with prefix True) for serving but got assistant",
/// NEKOparapa/AiNiee#641): a re-ask's last turn is the issues, and the line keeps to
/// Mistral's own fields.
#[test]
fn mistral_lines_end_on_the_users_turn() {
    let schema = Registry::builtin().get(BUILTIN_CODE_REVIEW).unwrap();
    let line = crate::providers::mistral::wire::input_line(&reasked(), &schema, Some(500));
    let messages = &line["body"]["messages"];
    assert_eq!(roles(messages, "role"), ["system", "user", "assistant", "user"]);
    says_what_to_fix(messages[3]["content"].as_str().unwrap());
    assert!(line["body"].get("max_completion_tokens").is_none(), "{line:#}");
}
