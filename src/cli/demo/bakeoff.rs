//! The demo's third act: a bake-off (docs/EVALUATIONS.md). Act two's database is served
//! again with two more providers, each a SIMULATED OpenAI Batch API started here: one
//! answers well, one cuts answers off, sends prose and reads sources differently. The
//! committed extractions are frozen as a set, tried on both, and the report's table is
//! printed. Production routing stays on the demo's own simulator; trials commit nothing.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use serde_json::{Value, json};

use super::api::Api;
use super::corpus::SOURCES;
use super::provider::DEMO_MAX_COMPLETION_TOKENS;
use super::scenario::Summary;
use crate::app::config::{Overrides, SIMULATOR_MODEL, ServeOptions};
use crate::app::server::Server;
use crate::simulator::{Faults, Simulator, SimulatorConfig, Stats};

/// Act two's provider, which production work stays routed to.
const PRODUCTION: &str = "simulator";
/// The candidates' `[providers.<name>]` names, and the model each is priced by.
pub(super) const STEADY: &str = "steady";
pub(super) const FLAKY: &str = "flaky";
const STEADY_MODEL: &str = "simulated-steady";
const FLAKY_MODEL: &str = "simulated-flaky";
const EVALUATION: &str = "bake-off";
/// Short, so the act adds well under a second.
const COMPLETE_AFTER: Duration = Duration::from_millis(100);
const WAIT: Duration = Duration::from_secs(30);
/// The flaky candidate's knobs count positions within a trial batch, which the demo's
/// scheduler keeps to 4 members: every 4th answer is cut off, every 3rd wrapped in prose,
/// every 2nd (of the rest) a different reading of its source.
const TRUNCATE_EVERY: u32 = 4;
const NOT_JSON_EVERY: u32 = 3;
const DISAGREE_EVERY: u32 = 2;

/// The two candidates' simulators; they must outlive the server that calls them.
pub(super) struct Candidates {
    steady: Simulator,
    flaky: Simulator,
}

impl Candidates {
    pub(super) async fn start() -> anyhow::Result<Self> {
        let start = |faults| async move {
            let config = SimulatorConfig { complete_after: COMPLETE_AFTER, faults, ..SimulatorConfig::default() };
            Simulator::start(([127, 0, 0, 1], 0).into(), config).await.context("cannot start a candidate's simulator")
        };
        let flaky = Faults {
            truncate_every: TRUNCATE_EVERY,
            not_json_every: NOT_JSON_EVERY,
            disagree_every: DISAGREE_EVERY,
            ..Faults::default()
        };
        Ok(Self { steady: start(Faults::default()).await?, flaky: start(flaky).await? })
    }

    /// Writes the act's config (act two's provider, the candidates as `kind = "openai"`
    /// tables on their simulators' `base_url`, `[routing] default` on act two's provider,
    /// prices) and its key file into `dir`, and takes its providers, routing and prices
    /// into `options`. Returns the config's path.
    pub(super) fn configure(&self, dir: &Path, options: &mut ServeOptions) -> anyhow::Result<PathBuf> {
        let key = dir.join("bake-off.key");
        write_private(&key, "sk-simulated-candidates-check-no-key\n")?;
        // A TOML string, quoted and escaped whatever `--data-dir` is.
        let key = toml::Value::String(key.display().to_string());
        let config = format!(
            "# The demo's act three. The simulators check no key; a key file is what a real account names.\n\
             [providers.{PRODUCTION}]\nkind = \"simulator\"\nmax_completion_tokens = {DEMO_MAX_COMPLETION_TOKENS}\n\n\
             [providers.{STEADY}]\nkind = \"openai\"\nbase_url = \"{}\"\nmodel = \"{STEADY_MODEL}\"\napi_key_file = {key}\n\n\
             # A small output budget: its long answers are cut off.\n\
             [providers.{FLAKY}]\nkind = \"openai\"\nbase_url = \"{}\"\nmodel = \"{FLAKY_MODEL}\"\napi_key_file = {key}\n\
             max_completion_tokens = {DEMO_MAX_COMPLETION_TOKENS}\n\n\
             # Production work stays where it was; candidates get only trials.\n\
             [routing]\ndefault = \"{PRODUCTION}\"\n\n\
             # List prices per million tokens (gpt-4o-mini's, and gpt-4.1-nano's for the flaky one), batch discount.\n\
             {}{}{}",
            self.steady.base_url(),
            self.flaky.base_url(),
            price(PRODUCTION, SIMULATOR_MODEL, 0.15, 0.60),
            price(STEADY, STEADY_MODEL, 0.15, 0.60),
            price(FLAKY, FLAKY_MODEL, 0.10, 0.40),
        );
        let path = dir.join("bake-off.toml");
        write_private(&path, &config)?;
        let loaded = ServeOptions::load(&path, true, Overrides::default())
            .with_context(|| format!("{}: the demo's config does not load", path.display()))?;
        options.providers = loaded.providers;
        options.routes = loaded.routes;
        options.prices = loaded.prices;
        Ok(path)
    }
}

fn price(provider: &str, model: &str, input: f64, output: f64) -> String {
    format!(
        "[[prices]]\nprovider = \"{provider}\"\nmodel = \"{model}\"\ninput_per_mtok = {input}\noutput_per_mtok = {output}\n\n"
    )
}

/// Writes a file only its owner can read (a key file must be; the config names it).
fn write_private(path: &Path, text: &str) -> anyhow::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
    let cannot = || format!("cannot write {}", path.display());
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)
        .with_context(cannot)?;
    file.write_all(text.as_bytes()).with_context(cannot)?;
    // A file left from an earlier run with `--data-dir` keeps its mode: make it private.
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)).with_context(cannot)?;
    Ok(())
}

pub(super) async fn run(server: &Server, candidates: &Candidates, summary: &mut Summary) -> anyhow::Result<()> {
    let api = Api { base: format!("http://{}", server.addr()), http: reqwest::Client::new() };
    println!("== 9. a bake-off: two more SIMULATED models tried on the committed extractions, side by side ==");
    println!(
        "  candidates: `{STEADY}` answers well; `{FLAKY}` cuts every {} answer of a batch off at \
         max_completion_tokens = {DEMO_MAX_COMPLETION_TOKENS}, wraps every {} in prose (not JSON) and reads every {} \
         source differently; production stays routed to `{PRODUCTION}`",
        ordinal(TRUNCATE_EVERY),
        ordinal(NOT_JSON_EVERY),
        ordinal(DISAGREE_EVERY)
    );
    let before = production(&api).await?;
    let started = Instant::now();
    let body = json!({"name": EVALUATION, "schema": "code-review@1",
        "select": {"sample": 100, "state": "committed", "seed": 7}, "candidates": [STEADY, FLAKY]});
    let (status, created) = api.post("/v1/evaluations", body).await?;
    if status != 201 {
        bail!("POST /v1/evaluations: {status} {created}");
    }
    let members = created["members"].as_u64().unwrap_or(0);
    println!("  POST /v1/evaluations → {status}: every committed extraction ({members}) frozen as the set");
    let done = loop {
        let evaluation = api.get(&format!("/v1/evaluations/{EVALUATION}")).await?;
        if evaluation["state"] == "done" {
            break evaluation;
        }
        if started.elapsed() > WAIT {
            bail!("the bake-off did not finish within {WAIT:?}: {evaluation}");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let table = api.get_text(&format!("/v1/evaluations/{EVALUATION}/report?format=text")).await?;
    println!(
        "  done in {:.1}s; GET /v1/evaluations/{EVALUATION}/report?format=text:\n",
        started.elapsed().as_secs_f64()
    );
    for line in table.lines() {
        println!("    {line}");
    }
    let report = api.get(&format!("/v1/evaluations/{EVALUATION}/report")).await?;
    let candidate =
        |name: &str| report["candidates"].as_array().and_then(|c| c.iter().find(|c| c["candidate"] == name)).cloned();
    let (steady, flaky) = (candidate(STEADY).unwrap_or_default(), candidate(FLAKY).unwrap_or_default());
    let per_valid = |c: &Value| c["cost_per_valid_micros"].as_u64().unwrap_or(u64::MAX);
    println!(
        "\n  Each column is one candidate's answers to the same {members} sources, scored against the findings \
         production committed: `{STEADY}` found exactly those; `{FLAKY}`'s cut-off and prose answers are paid for but \
         unusable, and some of its valid ones disagree{}. The trials were charged to the tenants' ledgers \
         (`evaluation` entries) and compared, never committed: no extraction changed state or findings, and nothing \
         went to the outbox.",
        if per_valid(&flaky) > per_valid(&steady) {
            "; for all its lower list price, each valid answer cost it more"
        } else {
            ""
        }
    );

    let everyone_once = |stats: &Stats| {
        stats.submissions_per_custom_id.len() as u64 == members
            && stats.submissions_per_custom_id.values().all(|n| *n == 1)
    };
    let finished = done["candidates"].as_array().is_some_and(|c| {
        c.len() == 2 && c.iter().all(|c| c["finished"].as_u64() == Some(members) && c["waiting"] == 0)
    });
    let committed = before.0.values().filter(|(state, _)| state == "committed").count() as u64;
    summary.check(
        "every committed extraction was tried once on each candidate",
        members > 0
            && members == committed
            && finished
            && everyone_once(&candidates.steady.stats())
            && everyone_once(&candidates.flaky.stats()),
    );
    summary.check(
        "the report tells them apart: steady all valid and agreeing, flaky's faults counted",
        steady["valid"].as_u64() == Some(members)
            && steady["agreement"]["exact_sets"].as_u64() == Some(members)
            && flaky["truncated"].as_u64() >= Some(1)
            && flaky["invalid"].as_u64() >= Some(1)
            && flaky["disagreements_total"].as_u64() >= Some(1)
            && table.starts_with(&format!("evaluation {EVALUATION} "))
            && table.contains(STEADY)
            && table.contains(FLAKY),
    );
    let after = production(&api).await?;
    summary.check(
        "trials committed nothing and added nothing to the outbox",
        committed > 0 && before.1.is_array() && after == before,
    );
    Ok(())
}

fn ordinal(n: u32) -> String {
    let suffix = match (n % 10, n % 100) {
        (_, 11..=13) => "th",
        (1, _) => "st",
        (2, _) => "nd",
        (3, _) => "rd",
        _ => "th",
    };
    format!("{n}{suffix}")
}

/// What trials must not touch: each extraction's state and findings, and the outbox.
async fn production(api: &Api) -> anyhow::Result<(BTreeMap<String, (Value, Value)>, Value)> {
    let mut extractions = BTreeMap::new();
    let tenants: BTreeSet<&str> = SOURCES.iter().map(|s| s.tenant).collect();
    for tenant in tenants {
        let page = api.get(&format!("/v1/extractions?tenant={tenant}&limit=100")).await?;
        for record in page["extractions"].as_array().cloned().unwrap_or_default() {
            let id = record["extraction_id"].as_str().unwrap_or_default().to_string();
            let findings = api.get(&format!("/v1/extractions/{id}/findings?limit=1000")).await?;
            extractions.insert(id, (record["state"].clone(), findings["findings"].clone()));
        }
    }
    let outbox = api.get("/v1/outbox?limit=1000").await?["events"].clone();
    Ok((extractions, outbox))
}
