//! docs/TUTORIAL.md, run as written against the simulated OpenAI Batch API, so the
//! tutorial cannot rot. Its fenced blocks are the script:
//! - ```` ```sh ````: run by bash in order, as one shell session (the working directory and
//!   exported variables carry from block to block); each must exit 0;
//! - ```` ```sh serve ````: `commitpoint serve`, started in the background and stopped at the
//!   end with SIGTERM (it must stop cleanly);
//! - ```` ```sh install ````: not run (the binary under test is the one cargo built, first on
//!   `PATH`; the package is checked by `.ci/check-packaging.sh`);
//! - ```` ```json PATH ````, ```` ```toml PATH ````: files the reader saves, written at PATH.
//!
//! The only changes for the test, each asserted to apply: `config.toml` listens on port 0
//! (the CLI finds the server through `<data_dir>/address`), points `[providers.openai]` at
//! the simulator with `base_url`, and polls it every 200 ms (`[scheduler]`);
//! `OPENAI_API_KEY` is the simulator's key.

use std::path::{Path, PathBuf};
use std::process::Command;

use commitpoint::simulator::{Dialect, Faults, Simulator, SimulatorConfig};
use serde_json::Value;

use crate::util::{BIN, Server, run_to_end, stderr, stdout, temp_dir};

const KEY: &str = "sk-tutorial-simulated-0001";

/// One fenced block of the tutorial.
struct Block {
    lang: String,
    tag: String,
    text: String,
}

fn blocks(markdown: &str) -> Vec<Block> {
    let mut out = Vec::new();
    let mut lines = markdown.lines();
    while let Some(line) = lines.next() {
        let Some(info) = line.strip_prefix("```").filter(|i| !i.is_empty()) else { continue };
        let (lang, tag) = info.split_once(' ').unwrap_or((info, ""));
        let body: Vec<&str> = lines.by_ref().take_while(|l| *l != "```").collect();
        out.push(Block { lang: lang.to_string(), tag: tag.trim().to_string(), text: body.join("\n") + "\n" });
    }
    out
}

/// The session's state between blocks: where it is and what it exported.
struct Session {
    state: PathBuf,
    path: String,
}

impl Session {
    fn new(root: &Path) -> Self {
        let state = root.join(".tutorial-state");
        std::fs::create_dir_all(&state).expect("state dir");
        std::fs::write(state.join("cwd"), root.display().to_string()).expect("cwd");
        std::fs::write(state.join("env"), "").expect("env");
        let bin_dir = Path::new(BIN).parent().expect("the binary's directory");
        let path = format!("{}:{}", bin_dir.display(), std::env::var("PATH").unwrap_or_default());
        Self { state, path }
    }

    fn cwd(&self) -> PathBuf {
        PathBuf::from(std::fs::read_to_string(self.state.join("cwd")).expect("cwd").trim())
    }

    /// A bash running `script` where the last block left off, saving where it ends.
    fn command(&self, script: &str, save: bool) -> Command {
        let state = self.state.display();
        let tail = if save { format!("\nexport -p > '{state}/env'\npwd > '{state}/cwd'\n") } else { String::new() };
        let full = format!("source '{state}/env'\ncd \"$(cat '{state}/cwd')\"\nset -euo pipefail\n{script}{tail}");
        let mut cmd = Command::new("bash");
        cmd.arg("-c").arg(full);
        cmd.env_clear()
            .env("PATH", &self.path)
            .env("HOME", self.cwd())
            .env("OPENAI_API_KEY", KEY)
            .env("COMMITPOINT_LOG", "warn")
            .env("TERM", "dumb");
        cmd
    }
}

/// The test's three changes to the reader's config.toml, each required to apply.
fn for_the_simulator(config: &str, sim: &Simulator) -> String {
    let replaced = [
        ("listen = \"127.0.0.1:7878\"", "listen = \"127.0.0.1:0\"".to_string()),
        ("[providers.openai]\n", format!("[providers.openai]\nbase_url = \"{}\"\n", sim.base_url())),
    ];
    let mut text = config.to_string();
    for (from, to) in replaced {
        assert!(text.contains(from), "the tutorial's config.toml no longer has {from:?}: update this test");
        text = text.replacen(from, &to, 1);
    }
    assert!(!text.contains("[scheduler]"), "the tutorial sets [scheduler] itself now: update this test");
    text + "\n[scheduler]\npoll_interval = \"200ms\"\n"
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_tutorial_runs_as_written() {
    let markdown = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/TUTORIAL.md")).expect("tutorial");
    let config = SimulatorConfig {
        dialect: Dialect::OpenAi,
        api_key: Some(KEY.into()),
        faults: Faults::default(),
        ..SimulatorConfig::default()
    };
    let sim = Simulator::start("127.0.0.1:0".parse().expect("loopback"), config).await.expect("simulator");
    let root = temp_dir();
    let session = Session::new(root.path());
    let mut server: Option<Server> = None;
    let mut outputs: Vec<(String, String)> = Vec::new();
    let mut kinds = (0, 0, 0);
    for block in blocks(&markdown) {
        match (block.lang.as_str(), block.tag.as_str()) {
            ("sh", "install") => {}
            ("sh", "serve") => {
                assert_eq!(
                    block.text.trim(),
                    "commitpoint serve",
                    "the serve block starts the server and nothing else"
                );
                let cmd = session.command("exec commitpoint serve", false);
                let cwd = session.cwd();
                server = Some(tokio::task::block_in_place(|| Server::spawn_as_is(cmd, &cwd.join("data"))));
                kinds.1 += 1;
            }
            ("sh", "") => {
                let text = block.text.clone();
                let cmd = session.command(&text, true);
                let out = tokio::task::block_in_place(|| run_to_end(cmd));
                assert_eq!(
                    out.status.code(),
                    Some(0),
                    "tutorial block failed:\n{text}\nstdout:\n{}\nstderr:\n{}",
                    stdout(&out),
                    stderr(&out)
                );
                outputs.push((text, stdout(&out)));
                kinds.0 += 1;
            }
            ("json" | "toml", path) if !path.is_empty() => {
                let text =
                    if path == "config.toml" { for_the_simulator(&block.text, &sim) } else { block.text.clone() };
                let target = session.cwd().join(path);
                std::fs::create_dir_all(target.parent().expect("a parent")).expect("mkdir");
                std::fs::write(&target, text).expect("write the reader's file");
                kinds.2 += 1;
            }
            (lang, tag) => panic!("a block the test does not know how to run: ```{lang} {tag}"),
        }
    }
    assert!(kinds.0 >= 8 && kinds.1 == 1 && kinds.2 == 2, "blocks run, servers, files: {kinds:?}");

    // What the reader was promised, checked from what the commands printed.
    let printed = |needle: &str| -> &str {
        &outputs.iter().find(|(text, _)| text.contains(needle)).unwrap_or_else(|| panic!("no block runs {needle}")).1
    };
    let submitted = printed("commitpoint submit");
    assert!(submitted.contains("submitted: 20 created, 0 already known, 0 failed"), "{submitted}");
    assert!(submitted.contains("settled: 20 committed, 0 failed, 0 cancelled"), "{submitted}");
    let checked = printed("commitpoint provider check");
    assert!(checked.contains("ticket-triage@1"), "provider check names the schema: {checked}");
    let estimate = printed("commitpoint estimate");
    assert!(estimate.contains("openai"), "{estimate}");
    let mut got = serde_json::Deserializer::from_str(printed("--schema ticket-triage@1\ncommitpoint get")).into_iter();
    let record: Value = got.next().expect("get prints the record").expect("as JSON");
    let findings: Value = got.next().expect("then its findings").expect("as JSON");
    assert!(
        findings.as_array().is_some_and(|f| !f.is_empty() && f.iter().all(|f| f["summary"].is_string())),
        "{findings}"
    );
    assert_eq!((record["source_id"].as_str(), record["state"].as_str()), (Some("ticket-07.txt"), Some("committed")));
    let costs = printed("commitpoint costs --tenant support\n");
    assert!(costs.contains("fresh") && costs.contains("unusable"), "{costs}");

    let dir = session.cwd();
    let exported = std::fs::read_to_string(dir.join("triage.jsonl")).expect("the export");
    let lines: Vec<Value> = exported.lines().map(|l| serde_json::from_str(l).expect("a JSON line")).collect();
    assert_eq!(lines.len(), 20, "every ticket once");
    for line in &lines {
        assert!(line["output_fields"]["language"].is_string(), "the field beside the findings is exported: {line}");
        assert!(line["findings"].as_array().is_some_and(|f| f.iter().all(|f| f["category"].is_string())), "{line}");
    }
    let csv = std::fs::read_to_string(dir.join("triage.csv")).expect("the CSV export");
    assert!(csv.lines().next().is_some_and(|h| h.contains("category") && h.contains("output.language")), "{csv}");

    let server = server.expect("the tutorial starts the server");
    let (status, log) = tokio::task::block_in_place(|| server.terminate());
    assert_eq!(status.code(), Some(0), "Ctrl-C (SIGTERM) stops it cleanly: {log}");
    assert_eq!(sim.stats().batches_created, 1, "twenty tickets went as one batch");
}
