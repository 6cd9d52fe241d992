use std::time::Duration;

use serde_json::json;

use super::wire::{self, State};
use super::*;
use crate::domain::batch::LineResult;
use crate::domain::lifecycle::FailureClass;

fn uri(text: &str) -> GcsUri {
    GcsUri::parse(text).unwrap()
}

fn config() -> VertexConfig {
    let mut config = VertexConfig::new(
        "my-project-1",
        "us-central1",
        "gemini-2.5-flash",
        uri("gs://cp-in/in/"),
        uri("gs://cp-out/out"),
        Credentials::MetadataServer,
    );
    config.endpoint = Some("http://127.0.0.1:9".into());
    config.request_timeout = Duration::from_secs(1);
    config
}

#[test]
fn every_job_state_has_a_meaning() {
    let running = ["QUEUED", "PENDING", "RUNNING", "CANCELLING", "UPDATING", "UNSPECIFIED"];
    for name in running {
        assert_eq!(wire::state(&format!("JOB_STATE_{name}")), Some(State::Running), "{name}");
    }
    assert_eq!(wire::state("JOB_STATE_PAUSED"), Some(State::Paused), "kept, but not as running");
    assert_eq!(wire::state("JOB_STATE_SUCCEEDED"), Some(State::Succeeded));
    assert_eq!(wire::state("JOB_STATE_PARTIALLY_SUCCEEDED"), Some(State::Succeeded));
    assert_eq!(wire::state("JOB_STATE_FAILED"), Some(State::Failed));
    assert_eq!(wire::state("JOB_STATE_CANCELLED"), Some(State::Cancelled));
    assert_eq!(wire::state("JOB_STATE_EXPIRED"), Some(State::Expired));
    assert_eq!(wire::state("BATCH_STATE_SUCCEEDED"), None, "the Gemini API's names are not Vertex's");
    assert_eq!(wire::state("JOB_STATE_NEW"), None);
}

#[test]
fn an_answer_line_keeps_its_key_text_and_usage() {
    let line = json!({
        "key": "k1",
        "request": {"contents": []},
        "status": "",
        "processed_time": "2026-12-06T10:00:00.000+00:00",
        "response": {
            "candidates": [{"content": {"role": "model", "parts": [{"text": "{\"findings\":[]}"}]}, "finishReason": "STOP"}],
            "usageMetadata": {"promptTokenCount": 40, "candidatesTokenCount": 9, "totalTokenCount": 49},
            "modelVersion": "gemini-2.5-flash-001",
        },
    });
    let (key, result) = wire::parse_line(&line.to_string()).unwrap();
    assert_eq!(key, "k1");
    let LineResult::Answer { output, usage } = result else { panic!("{result:?}") };
    assert_eq!(output, "{\"findings\":[]}");
    let usage = usage.unwrap();
    assert_eq!((usage.input_tokens, usage.output_tokens, usage.model.as_str()), (40, 9, "gemini-2.5-flash-001"));
}

#[test]
fn a_status_line_is_classified_by_its_google_error() {
    let body = r#"Bad Request: {"error": {"code": 400, "message": "Request contains an invalid argument.", "status": "INVALID_ARGUMENT"}}"#;
    let line = json!({"key": "k2", "request": {}, "status": body});
    let (key, result) = wire::parse_line(&line.to_string()).unwrap();
    assert_eq!(key, "k2");
    let LineResult::Refused { class, reason } = result else { panic!("{result:?}") };
    assert_eq!(class, FailureClass::InvalidRequest);
    assert!(reason.contains("INVALID_ARGUMENT") && reason.contains("invalid argument"), "{reason}");

    let quota = json!({"key": "k3", "request": {}, "status": "429 RESOURCE_EXHAUSTED: Quota exceeded"});
    let (_, result) = wire::parse_line(&quota.to_string()).unwrap();
    assert!(matches!(result, LineResult::Retry { .. }), "{result:?}");
    let vague = json!({"key": "k4", "request": {}, "status": "Internal error encountered."});
    assert!(matches!(wire::parse_line(&vague.to_string()).unwrap().1, LineResult::Retry { .. }));
}

#[test]
fn a_line_without_its_key_or_result_is_malformed() {
    assert!(wire::parse_line(r#"{"request": {}, "status": "", "response": {}}"#).is_err());
    assert!(wire::parse_line(r#"{"key": "k", "request": {}, "status": ""}"#).is_err());
    assert!(wire::parse_line(r#"{"key": "k", "#).is_err());
}

#[test]
fn the_create_body_names_gcs_and_carries_the_batch_label() {
    let body = wire::CreateJob {
        display_name: "commitpoint-cpb-1",
        model: "publishers/google/models/gemini-2.5-flash",
        input_uri: "gs://cp-in/in/x/requests.jsonl",
        output_prefix: "gs://cp-out/out/x",
        batch_key: "cpb-1",
    }
    .body();
    assert_eq!(body["inputConfig"]["instancesFormat"], "jsonl");
    assert_eq!(body["inputConfig"]["gcsSource"]["uris"][0], "gs://cp-in/in/x/requests.jsonl");
    assert_eq!(body["outputConfig"]["gcsDestination"]["outputUriPrefix"], "gs://cp-out/out/x");
    assert_eq!(body["labels"]["commitpoint_batch"], "cpb-1");
}

#[test]
fn job_names_under_our_project_id_or_its_number_are_ids_kept_whole() {
    let vertex = VertexBatches::new(config()).unwrap();
    // Google's Gemini batch sample: the job is named under the project number.
    for name in [
        "projects/650231661283/locations/us-central1/batchPredictionJobs/2544655663456321536",
        "projects/my-project-1/locations/us-central1/batchPredictionJobs/2544655663456321536",
    ] {
        assert_eq!(vertex.job_id(name).unwrap(), "2544655663456321536", "{name}");
        let url = vertex.job_url(name, Some("cancel")).unwrap();
        assert_eq!(
            url.path(),
            "/v1/projects/my-project-1/locations/us-central1/batchPredictionJobs/2544655663456321536:cancel"
        );
    }
    for bad in [
        "projects/other-project/locations/us-central1/batchPredictionJobs/123",
        "projects/650231661283/locations/europe-west4/batchPredictionJobs/123",
        "projects/650231661283/locations/us-central1/customJobs/123",
        "projects/my-project-1/locations/us-central1/batchPredictionJobs/",
        "projects/my-project-1/locations/us-central1/batchPredictionJobs/1/2",
        "projects//locations/us-central1/batchPredictionJobs/1",
    ] {
        let refused = vertex.job_id(bad).unwrap_err();
        assert_eq!(refused.class, ErrorClass::Protocol, "{bad}");
        // A job name is no secret: the reason shows the very name refused.
        assert!(refused.message().contains(bad), "{bad}: {}", refused.message());
    }
}

#[test]
fn a_line_is_matched_by_its_key_or_by_the_request_labels() {
    let key = "3f".repeat(32);
    let input = wire::input_line(&key, json!({"contents": [], "labels": {"team": "x"}}));
    let labels = &input["request"]["labels"];
    assert_eq!(labels["team"], "x", "labels of the request are kept");
    let halves: Vec<&str> = wire::KEY_LABELS.iter().map(|name| labels[*name].as_str().unwrap()).collect();
    assert!(halves.iter().all(|h| h.len() <= 63), "label values are at most 63 characters");
    assert_eq!(halves.concat(), key);

    let response = json!({"candidates": [{"content": {"parts": [{"text": "{}"}]}, "finishReason": "STOP"}]});
    let mut without_key = input.clone();
    without_key.as_object_mut().unwrap().remove("key");
    without_key["status"] = json!("");
    without_key["response"] = response;
    assert_eq!(wire::parse_line(&without_key.to_string()).unwrap().0, key, "the labels name the member");

    let mut both = without_key.clone();
    both["key"] = json!(key);
    assert_eq!(wire::parse_line(&both.to_string()).unwrap().0, key);
    let mut only_key = both.clone();
    only_key["request"].as_object_mut().unwrap().remove("labels");
    assert_eq!(wire::parse_line(&only_key.to_string()).unwrap().0, key, "the key alone names it too");

    let mut disagreeing = both.clone();
    disagreeing["key"] = json!("ab".repeat(32));
    let reason = wire::parse_line(&disagreeing.to_string()).unwrap_err();
    assert!(reason.contains("differs"), "{reason}");
    let mut half = without_key.clone();
    half["request"]["labels"].as_object_mut().unwrap().remove(wire::KEY_LABELS[1]);
    assert!(wire::parse_line(&half.to_string()).is_err(), "half a key names nothing");
}

#[test]
fn settings_vertex_refuses_are_refused_at_start() {
    let refused = |change: fn(&mut VertexConfig)| {
        let mut config = config();
        change(&mut config);
        VertexBatches::new(config).unwrap_err().to_string()
    };
    assert!(refused(|c| c.project = "My_Project".into()).contains("project"));
    assert!(refused(|c| c.project = "abc".into()).contains("6-30"));
    // The project's number is taken where the id is.
    let mut by_number = config();
    by_number.project = "650231661283".into();
    assert!(VertexBatches::new(by_number).is_ok());
    assert!(refused(|c| c.location = "us central".into()).contains("location"));
    assert!(refused(|c| c.model = "publishers/google/models/x".into()).contains("no path"));
    assert!(refused(|c| c.endpoint = Some("ftp://x".into())).contains("endpoint"));
    let missing = refused(|c| c.credentials = Credentials::KeyFile("/nonexistent/key.json".into()));
    assert!(missing.contains("/nonexistent/key.json"), "{missing}");
}

#[test]
fn a_key_file_that_is_not_a_service_account_is_refused_without_quoting_it() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("user.json");
    std::fs::write(&path, r#"{"type": "authorized_user", "refresh_token": "secret-refresh-token"}"#).unwrap();
    let mut config = config();
    config.credentials = Credentials::KeyFile(path);
    let text = VertexBatches::new(config).unwrap_err().to_string();
    assert!(text.contains("service_account"), "{text}");
    assert!(!text.contains("secret-refresh-token"), "{text}");
}
