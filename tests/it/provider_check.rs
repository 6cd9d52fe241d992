//! `commitpoint provider check` against the simulator over real HTTP: accepted key, model
//! and schemas exit 0; a refused key or an unknown model exits 1 quoting the provider. The
//! verdict names only what was put to the provider: whatever a kind cannot send (Bedrock's
//! schema, the generic contract's everything, a key never configured) is "not checked".

use std::path::Path;
use std::process::Output;
use std::time::Duration;

use commitpoint::simulator::{Dialect, Faults, Simulator, SimulatorConfig};

use crate::providers_e2e::{KEY, KEY_ENV};
use crate::providers_e2e_bedrock::{BedrockRig, MODEL as BEDROCK_MODEL, aws_env};
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
        assert!(text.contains(&format!("openai / {schema}: accepted (key, model and schema)\n")), "{text}");
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

/// `provider check --schema code-review@1` on a Bedrock config, with the rig's credentials.
/// `provider check` on `config`, which must exit `code`; what it printed.
fn bedrock_check(rig: &BedrockRig, config: &str, code: i32) -> String {
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_commitpoint"));
    cmd.args(["provider", "check", "--config", config, "--schema", "code-review@1"]).current_dir(rig.dir.path());
    cmd.env("COMMITPOINT_LOG", "warn").envs(aws_env());
    let out = run_to_end(cmd);
    let text = stdout(&out);
    assert_eq!(out.status.code(), Some(code), "{text}\n{}", stderr(&out));
    text
}

/// A copy of the rig's config naming another model id.
fn bedrock_config_for(rig: &BedrockRig, model: &str, file: &str) -> String {
    let text = std::fs::read_to_string(rig.config_path()).expect("read config");
    let path = rig.dir.path().join(file);
    let swapped = text.replace(&format!("model = \"{BEDROCK_MODEL}\""), &format!("model = \"{model}\""));
    assert_ne!(swapped, text, "the rig's config names {BEDROCK_MODEL}");
    std::fs::write(&path, swapped).expect("write config");
    path.display().to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bedrock_looks_the_model_up_and_never_claims_the_schema() {
    let gone = "anthropic.claude-gone-v1:0";
    let gone_profile = "eu.anthropic.claude-3-5-haiku-20241022-v1:0";
    let faults = Faults { missing_models: vec![gone.to_string(), gone_profile.to_string()], ..Faults::default() };
    let rig = BedrockRig::start(Duration::from_millis(300), faults, "").await;
    let text = bedrock_check(&rig, rig.config_path(), 0);
    assert!(
        text.contains("bedrock / code-review@1: accepted (key and model); schema not checked: batch inference has no"),
        "{text}"
    );
    assert_eq!(rig.stats().models_looked_up, 1, "GetFoundationModel was asked");

    // A model id Bedrock does not know fails the check, named, in Bedrock's words.
    let text = bedrock_check(&rig, &bedrock_config_for(&rig, gone, "gone.toml"), 1);
    assert!(
        text.contains(&format!(
            "bedrock / code-review@1: REFUSED: unknown model {gone}: 400 ValidationException: Could not find model \
             with identifier {gone}"
        )),
        "{text}"
    );

    // A cross-region inference profile is looked up as one: GetFoundationModel refuses its id.
    let profile = format!("us.{BEDROCK_MODEL}");
    let text = bedrock_check(&rig, &bedrock_config_for(&rig, &profile, "profile.toml"), 0);
    assert!(text.contains("bedrock / code-review@1: accepted (key and model); schema not checked"), "{text}");
    assert_eq!(rig.stats().models_looked_up, 2, "GetInferenceProfile was asked");
    let text = bedrock_check(&rig, &bedrock_config_for(&rig, gone_profile, "gone-profile.toml"), 1);
    assert!(text.contains(&format!("REFUSED: unknown model {gone_profile}: neither an inference profile")), "{text}");

    // A provisioned model's ARN has no lookup here: said, not claimed.
    let arn = "arn:aws:bedrock:us-east-1:123456789012:provisioned-model/abcdefghij12";
    let text = bedrock_check(&rig, &bedrock_config_for(&rig, arn, "provisioned.toml"), 0);
    assert!(
        text.contains("bedrock / code-review@1: accepted (key); model not checked: a provisioned-model ARN is not"),
        "{text}"
    );
    assert_eq!(rig.stats().batches_created, 0, "a check creates no job");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_generic_contract_is_checked_for_nothing_and_says_so() {
    // A closed port: any call would be refused, so exit 0 also shows none was made.
    let dir = temp_dir();
    let section =
        format!("[providers.generic]\nbase_url = \"http://127.0.0.1:9\"\nmodel = \"m\"\napi_key_env = \"{KEY_ENV}\"\n");
    let out = check(dir.path(), &section, KEY, &["--schema", "code-review@1"]);
    let text = stdout(&out);
    assert_eq!(out.status.code(), Some(0), "{text}\n{}", stderr(&out));
    assert!(
        text.contains("generic / code-review@1: key, model and schema not checked: the generic contract has no call"),
        "{text}"
    );
    assert!(!text.contains("accepted"), "{text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_chat_endpoint_without_a_key_is_not_said_to_accept_one() {
    let config = SimulatorConfig { dialect: Dialect::OpenAi, api_key: None, ..SimulatorConfig::default() };
    let sim = Simulator::start("127.0.0.1:0".parse().expect("loopback address"), config).await.expect("start");
    let dir = temp_dir();
    let section = format!("[providers.chat]\nbase_url = \"{}\"\nmodel = \"gpt-4o-mini\"\n", sim.base_url());
    let out = check(dir.path(), &section, KEY, &["--schema", "code-review@1"]);
    let text = stdout(&out);
    assert_eq!(out.status.code(), Some(0), "{text}\n{}", stderr(&out));
    assert!(
        text.contains(
            "chat / code-review@1: accepted (model and schema); key not checked: no api_key_env is configured"
        ),
        "{text}"
    );
    assert_eq!(sim.stats().chat_completions, 1, "the schema went out in one completion");
}
