//! `commitpoint provider check` against the simulator over real HTTP: accepted key, model
//! and schemas exit 0; a refused key or an unknown model exits 1 quoting the provider.

use std::path::Path;
use std::process::Output;

use commitpoint::simulator::{Dialect, Faults, Simulator, SimulatorConfig};

use crate::providers_e2e::{KEY, KEY_ENV};
use crate::util::{run_to_end, stderr, stdout, temp_dir};

async fn simulator(dialect: Dialect, faults: Faults) -> Simulator {
    let config = SimulatorConfig { dialect, api_key: Some(KEY.into()), faults, ..SimulatorConfig::default() };
    Simulator::start("127.0.0.1:0".parse().expect("loopback address"), config).await.expect("start the simulator")
}

fn check(dir: &Path, config: &str, key: &str, extra: &[&str]) -> Output {
    let path = dir.join("config.toml");
    std::fs::write(&path, format!("[server]\ndata_dir = \"{}\"\n{config}", dir.join("data").display()))
        .expect("write config");
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_commitpoint"));
    cmd.args(["provider", "check", "--config", &path.display().to_string()]).args(extra).env(KEY_ENV, key);
    cmd.env("COMMITPOINT_LOG", "warn");
    run_to_end(cmd)
}

fn openai_section(sim: &Simulator, model: &str) -> String {
    format!(
        "[provider]\nkind = \"openai\"\nbase_url = \"{}\"\nmodel = \"{model}\"\napi_key_env = \"{KEY_ENV}\"\n",
        sim.base_url()
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn openai_key_model_and_every_schema_are_accepted() {
    let sim = simulator(Dialect::OpenAi, Faults::default()).await;
    let dir = temp_dir();
    let schemas = dir.path().join("schemas");
    std::fs::create_dir_all(&schemas).expect("schema dir");
    std::fs::write(
        schemas.join("ticket@1.json"),
        serde_json::json!({"type": "object", "properties": {"findings": {"type": "array", "items": {
            "type": "object", "required": ["category"],
            "properties": {"category": {"type": "string", "minLength": 1}, "note": {"type": "string", "maxLength": 9}}
        }}}, "x-commitpoint-identity": ["/category"]})
        .to_string(),
    )
    .expect("write schema");
    let out =
        check(dir.path(), &openai_section(&sim, "gpt-4o-mini"), KEY, &["--schema-dir", &schemas.display().to_string()]);
    let text = stdout(&out);
    assert_eq!(out.status.code(), Some(0), "{text}\n{}", stderr(&out));
    for schema in ["code-review@1", "ticket@1"] {
        assert!(text.contains(&format!("openai / {schema}: accepted")), "{text}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_key_or_an_unknown_model_exits_1_quoting_the_provider() {
    let faults = Faults { missing_models: vec!["gpt-nope".to_string()], ..Faults::default() };
    let sim = simulator(Dialect::OpenAi, faults).await;
    let dir = temp_dir();
    let out = check(dir.path(), &openai_section(&sim, "gpt-4o-mini"), "sk-wrong", &[]);
    assert_eq!(out.status.code(), Some(1), "{}", stdout(&out));
    assert!(stdout(&out).contains("openai / code-review@1: REFUSED: 401"), "{}", stdout(&out));

    let out = check(dir.path(), &openai_section(&sim, "gpt-nope"), KEY, &["--schema", "code-review@1"]);
    let text = stdout(&out);
    assert_eq!(out.status.code(), Some(1), "{text}");
    assert!(text.contains("The model `gpt-nope` does not exist or you do not have access to it."), "{text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn anthropic_is_checked_with_a_forced_tool_call() {
    let faults = Faults { missing_models: vec!["claude-gone".to_string()], ..Faults::default() };
    let sim = simulator(Dialect::Anthropic, faults).await;
    let dir = temp_dir();
    let section = |model: &str| {
        format!(
            "[providers.anthropic]\nbase_url = \"{}\"\nmodel = \"{model}\"\napi_key_env = \"{KEY_ENV}\"\n",
            sim.base_url()
        )
    };
    let out = check(dir.path(), &section("claude-e2e"), KEY, &["--provider", "anthropic"]);
    assert_eq!(out.status.code(), Some(0), "{}\n{}", stdout(&out), stderr(&out));
    assert!(stdout(&out).contains("anthropic / code-review@1: accepted"), "{}", stdout(&out));
    let out = check(dir.path(), &section("claude-gone"), KEY, &[]);
    assert_eq!(out.status.code(), Some(1), "{}", stdout(&out));
    assert!(stdout(&out).contains("not_found_error: model: claude-gone"), "{}", stdout(&out));
    let out = check(dir.path(), &section("claude-e2e"), KEY, &["--provider", "openai"]);
    assert_eq!(out.status.code(), Some(78), "no such provider configured: {}", stderr(&out));
}
