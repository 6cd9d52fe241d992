use std::path::Path;

use serde_json::{Value, json};

use super::*;
use crate::domain::schema::{BUILTIN_CODE_REVIEW, Dialect, Registry, Schema};

const CONTENT: &str = "fn f() {\n    let x = y.unwrap();\n    // TODO\n}\n";

fn ask(schema: Option<&Value>) -> Ask {
    Ask::new(&[(Turn::Other, "sys".into()), (Turn::User, format!("source_id: src/f.rs\n\n{CONTENT}"))], schema)
}

fn ticket() -> Schema {
    let document = json!({
        "type": "object",
        "required": ["findings"],
        "properties": {"findings": {"type": "array", "items": {
            "type": "object",
            "required": ["category", "text"],
            "properties": {"category": {"enum": ["billing", "outage", "other"]}, "text": {"type": "string"}}
        }}},
        "x-commitpoint-identity": ["/category"]
    });
    Schema::compile("ticket@1", &document, Path::new("ticket@1.json")).unwrap()
}

/// The answer for `schema` as `dialect` is sent it, read back and validated as commitpoint does.
fn validated(schema: &Schema, dialect: Dialect, flaw: Flaw) -> (Value, bool) {
    let view = schema.provider_schema(dialect);
    let mut output = answer(&ask(Some(view)), flaw);
    conform(&mut output, view);
    schema.normalize_provider_answer(&mut output);
    let valid = schema.validate(&output).is_ok();
    (output, valid)
}

#[test]
fn code_review_is_answered_by_the_reviewer_exactly_in_every_view() {
    let schema = Registry::builtin().get(BUILTIN_CODE_REVIEW).unwrap();
    let expected = review("src/f.rs", CONTENT);
    for dialect in Dialect::ALL {
        assert_eq!(answer(&ask(Some(schema.provider_schema(dialect))), Flaw::None), expected, "{}", dialect.as_str());
    }
    for loose in [None, Some(json!({})), Some(json!({"type": "object"}))] {
        assert_eq!(answer(&ask(loose.as_ref()), Flaw::None), expected, "{loose:?}");
    }
    assert_eq!(answer(&ask(None), Flaw::Invalid), broken_review("src/f.rs", CONTENT));
}

#[test]
fn another_schema_gets_an_instance_of_itself_in_every_view() {
    let schema = ticket();
    for dialect in Dialect::ALL {
        let (output, valid) = validated(&schema, dialect, Flaw::None);
        assert!(valid, "{}: {output:#}", dialect.as_str());
        assert_eq!(output["findings"][0]["text"], "let x = y.unwrap();", "a quote of the flagged line");
    }
}

#[test]
fn invalid_answers_fail_the_registered_schema_and_ungrounded_ones_pass_it() {
    let builtin = Registry::builtin().get(BUILTIN_CODE_REVIEW).unwrap();
    for schema in [Arc::new(ticket()), builtin] {
        for dialect in Dialect::ALL {
            let (output, valid) = validated(&schema, dialect, Flaw::Invalid);
            assert!(!valid, "{} {}: {output:#}", schema.name(), dialect.as_str());
            let (output, valid) = validated(&schema, dialect, Flaw::Ungrounded);
            assert!(valid, "{} {}: {output:#}", schema.name(), dialect.as_str());
            let (grounded, _) = validated(&schema, dialect, Flaw::None);
            assert_ne!(output, grounded);
        }
    }
}

#[test]
fn an_ungrounded_review_cites_a_line_past_the_end_and_a_file_not_in_the_source() {
    let output = answer(&ask(None), Flaw::Ungrounded);
    let findings = output["findings"].as_array().unwrap();
    let real = review("src/f.rs", CONTENT)["findings"].as_array().unwrap().clone();
    assert_eq!(findings[..real.len()], real[..], "the real findings are kept");
    let made_up = &findings[real.len()..];
    assert_eq!(made_up.len(), 2);
    assert!(made_up[0]["line"].as_u64().unwrap() as usize > CONTENT.lines().count());
    assert_eq!(made_up[0]["file"], "src/f.rs");
    assert_eq!(made_up[1]["file"], ELSEWHERE_FILE);
}

#[test]
fn a_re_ask_is_read_from_its_conversation() {
    let turns = [
        (Turn::Other, "system".to_string()),
        (Turn::User, format!("source_id: src/f.rs\n\n{CONTENT}")),
        (Turn::Model, "{\"findings\": []}".to_string()),
        (Turn::User, "Your answer had these issues: /findings/0/line ...".to_string()),
    ];
    let re_ask = Ask::new(&turns, None);
    assert_eq!((re_ask.source_id.as_str(), re_ask.content.as_str()), ("src/f.rs", CONTENT));
    assert_eq!(re_ask.prior_answers, 1);
    assert_eq!(re_ask.key(), ask(None).key(), "the same source, whatever the turns");
    let unheaded = Ask::new(&[(Turn::User, "first".into()), (Turn::User, "second".into())], None);
    assert_eq!(unheaded.content, "first", "without the convention, the first user turn is the source");
}

#[test]
fn attempts_misbehave_first_then_answer_validly() {
    let faults = Faults { invalid_first: 1, ungrounded_first: 1, ..Faults::default() };
    let mut attempts = Attempts::default();
    let first = ask(None);
    let flaw = |b: Behaviour| match b {
        Behaviour::Answer { flaw } => flaw,
        other => panic!("{other:?}"),
    };
    assert_eq!(flaw(attempts.behaviour(&faults, 1, &first)), Flaw::Invalid);
    assert_eq!(flaw(attempts.behaviour(&faults, 1, &first)), Flaw::Ungrounded);
    assert_eq!(flaw(attempts.behaviour(&faults, 1, &first)), Flaw::None);
    assert_eq!(flaw(attempts.behaviour(&faults, 1, &first)), Flaw::None);
    // Another source starts over; a conversation carrying two answers is a third attempt
    // even to a simulator that never saw the first two.
    let mut other = ask(None);
    other.source_id = "src/g.rs".to_string();
    assert_eq!(flaw(attempts.behaviour(&faults, 1, &other)), Flaw::Invalid);
    let mut fresh = Attempts::default();
    let re_asked = Ask { prior_answers: 2, ..ask(None) };
    assert_eq!(flaw(fresh.behaviour(&faults, 1, &re_asked)), Flaw::None);
    let once = Ask { prior_answers: 1, ..ask(None) };
    assert_eq!(flaw(Attempts::default().behaviour(&faults, 1, &once)), Flaw::Ungrounded);
    // Off, nothing is counted; other behaviours are left alone.
    let mut idle = Attempts::default();
    assert_eq!(flaw(idle.behaviour(&Faults::default(), 1, &first)), Flaw::None);
    assert!(idle.answered.is_empty());
    let refusing = Faults { refuse_every: 1, ..faults };
    assert!(matches!(idle.behaviour(&refusing, 1, &first), Behaviour::Refuse { .. }));
    assert!(idle.answered.is_empty());
}
