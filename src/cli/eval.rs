//! `commitpoint eval`: provider bake-offs on a running server (docs/EVALUATIONS.md).

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context;
use serde_json::{Value, json};

use super::costs::dollars;
use super::{EXIT_PROBLEMS, EXIT_USAGE};

/// How to reach the server.
#[derive(Debug, clap::Args)]
pub(super) struct Target {
    #[command(flatten)]
    admin: super::AdminUrl,
}

#[derive(Debug, clap::Subcommand)]
pub(super) enum Command {
    /// Freeze a set of extractions and send it to each candidate provider as trials.
    Start(StartArgs),
    /// Progress per candidate (every evaluation without a name).
    Status {
        name: Option<String>,
        /// Wait until the evaluation has an outcome for every trial (or is cancelled).
        #[arg(long, requires = "name")]
        wait: bool,
        /// Print the raw JSON.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        target: Target,
    },
    /// The side-by-side comparison of the candidates.
    Report {
        name: String,
        /// Compare with this candidate's answers instead of production's committed findings.
        #[arg(long)]
        against: Option<String>,
        /// One row per candidate, as CSV.
        #[arg(long, conflicts_with = "json")]
        csv: bool,
        /// The full report as JSON, with each candidate's disagreements.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        target: Target,
    },
    /// Commit the candidate's valid answers for members not committed yet (once, however
    /// often it runs), and print the routing rule that sends new work to it.
    Promote {
        name: String,
        candidate: String,
        /// Also add the routing rule to the configuration file and tell the server to
        /// reload it (`ctl reload`); the old provider's known jobs are still polled.
        #[arg(long)]
        apply: bool,
        /// The configuration file `--apply` edits.
        #[arg(long, env = "COMMITPOINT_CONFIG", default_value = crate::app::config::DEFAULT_CONFIG_PATH)]
        config: PathBuf,
        /// The server's process id, signalled to reload after `--apply` ($MAINPID).
        #[arg(long, requires = "apply")]
        pid: Option<i32>,
        #[command(flatten)]
        target: Target,
    },
    /// Stop sending trials; jobs already at a provider are still read.
    Cancel {
        name: String,
        #[command(flatten)]
        target: Target,
    },
}

#[derive(Debug, clap::Args)]
pub(super) struct StartArgs {
    name: String,
    /// The schema whose extractions are drawn.
    #[arg(long)]
    schema: String,
    /// A `[providers.<name>]` table to try; repeat for each candidate.
    #[arg(long = "candidate", required = true)]
    candidates: Vec<String>,
    /// Draw only this tenant's extractions.
    #[arg(long)]
    tenant: Option<String>,
    /// Draw this many extractions at random (by --seed).
    #[arg(long, conflicts_with = "ids_file")]
    sample: Option<u32>,
    /// Which extractions a sample is drawn from.
    #[arg(long, value_parser = ["committed", "pending", "any"], default_value = "committed")]
    state: String,
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// A file of extraction ids, one per line, instead of a sample.
    #[arg(long)]
    ids_file: Option<PathBuf>,
    /// Stop sending trials once they have cost this many micro-dollars.
    #[arg(long)]
    budget_micros: Option<u64>,
    #[command(flatten)]
    target: Target,
}

struct Client {
    base: String,
    http: reqwest::Client,
}

impl Client {
    fn new(target: &Target) -> anyhow::Result<Self> {
        Ok(Self { base: target.admin.resolve(), http: target.admin.client()? })
    }

    /// Sends one request; a refusal is printed and becomes `Err(exit code)`.
    async fn call(&self, method: reqwest::Method, path: &str, body: Option<Value>) -> anyhow::Result<Reply> {
        let mut request = self.http.request(method, format!("{}{path}", self.base));
        if let Some(body) = body {
            request = request.json(&body);
        }
        let response = request.send().await.with_context(|| format!("cannot reach the server at {}", self.base))?;
        let status = response.status();
        let text = response.text().await.context("the server's answer was cut short")?;
        if status.is_success() {
            return Ok(Reply::Ok(text));
        }
        let body: Value = serde_json::from_str(&text).unwrap_or(Value::Null);
        eprintln!("commitpoint: the server refused: {status}: {}", body["error"]["message"].as_str().unwrap_or(&text));
        Ok(Reply::Refused)
    }
}

enum Reply {
    Ok(String),
    Refused,
}

fn parse(text: &str) -> anyhow::Result<Value> {
    serde_json::from_str(text).context("the server sent a non-JSON answer")
}

pub(super) async fn run(command: Command) -> anyhow::Result<ExitCode> {
    match command {
        Command::Start(args) => start(args).await,
        Command::Status { name, wait, json, target } => status(name, wait, json, &target).await,
        Command::Report { name, against, csv, json, target } => {
            let format = if csv {
                "csv"
            } else if json {
                "json"
            } else {
                "text"
            };
            let mut path = format!("/v1/evaluations/{name}/report?format={format}");
            if let Some(against) = against {
                let _ = write!(path, "&against={against}");
            }
            match Client::new(&target)?.call(reqwest::Method::GET, &path, None).await? {
                Reply::Ok(text) => {
                    print!("{text}");
                    Ok(ExitCode::SUCCESS)
                }
                Reply::Refused => Ok(ExitCode::from(EXIT_PROBLEMS)),
            }
        }
        Command::Promote { name, candidate, apply, config, pid, target } => {
            let body = json!({ "candidate": candidate });
            let path = format!("/v1/evaluations/{name}/promote");
            let Reply::Ok(text) = Client::new(&target)?.call(reqwest::Method::POST, &path, Some(body)).await? else {
                return Ok(ExitCode::from(EXIT_PROBLEMS));
            };
            let reply = parse(&text)?;
            let rule = reply["routing_rule"].as_str().unwrap_or_default().to_string();
            println!(
                "promoted {candidate}: {} committed now, {} committed before, {} in flight (left to their own answer), {} without a valid answer, {} cancelled or erased",
                reply["committed"],
                reply["already_committed"],
                reply["in_flight"],
                reply["no_valid_answer"],
                reply["skipped"]
            );
            if !apply {
                println!("to send new work to {candidate}, add to [routing] rules in the configuration:\n  {rule}");
                println!("then reload (systemctl reload commitpoint); the old provider's known jobs are still polled.");
                return Ok(ExitCode::SUCCESS);
            }
            add_routing_rule(&config, &rule)?;
            println!("added to [routing] rules in {}: {rule}", config.display());
            match pid {
                Some(pid) => super::ctl::reload_config(pid, &config),
                None => {
                    println!("reload the server to apply it (systemctl reload commitpoint, or --pid)");
                    Ok(ExitCode::SUCCESS)
                }
            }
        }
        Command::Cancel { name, target } => {
            let path = format!("/v1/evaluations/{name}/cancel");
            match Client::new(&target)?.call(reqwest::Method::POST, &path, None).await? {
                Reply::Ok(text) => {
                    print!("{}", describe(&parse(&text)?));
                    Ok(ExitCode::SUCCESS)
                }
                Reply::Refused => Ok(ExitCode::from(EXIT_PROBLEMS)),
            }
        }
    }
}

async fn start(args: StartArgs) -> anyhow::Result<ExitCode> {
    let select = match (args.sample, &args.ids_file) {
        (Some(sample), None) => json!({ "sample": sample, "state": args.state, "seed": args.seed }),
        (None, Some(path)) => {
            let text = std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))?;
            let ids: Vec<&str> = text.lines().map(str::trim).filter(|l| !l.is_empty() && !l.starts_with('#')).collect();
            json!({ "ids": ids })
        }
        _ => {
            eprintln!("commitpoint: say which extractions: --sample N or --ids-file FILE");
            return Ok(ExitCode::from(EXIT_USAGE));
        }
    };
    let mut body = json!({ "name": args.name, "schema": args.schema, "select": select, "candidates": args.candidates });
    if let Some(tenant) = args.tenant {
        body["tenant"] = json!(tenant);
    }
    if let Some(budget) = args.budget_micros {
        body["budget_micros"] = json!(budget);
    }
    match Client::new(&args.target)?.call(reqwest::Method::POST, "/v1/evaluations", Some(body)).await? {
        Reply::Ok(text) => {
            print!("{}", describe(&parse(&text)?));
            Ok(ExitCode::SUCCESS)
        }
        Reply::Refused => Ok(ExitCode::from(EXIT_PROBLEMS)),
    }
}

/// How often `status --wait` looks again.
const WAIT_POLL: Duration = Duration::from_millis(500);

async fn status(name: Option<String>, wait: bool, json: bool, target: &Target) -> anyhow::Result<ExitCode> {
    let client = Client::new(target)?;
    let path = name.as_ref().map_or_else(|| "/v1/evaluations".to_string(), |n| format!("/v1/evaluations/{n}"));
    loop {
        let Reply::Ok(text) = client.call(reqwest::Method::GET, &path, None).await? else {
            return Ok(ExitCode::from(EXIT_PROBLEMS));
        };
        let body = parse(&text)?;
        if wait && body["state"] == "running" {
            tokio::time::sleep(WAIT_POLL).await;
            continue;
        }
        if json {
            println!("{body:#}");
        } else if let Some(all) = body["evaluations"].as_array() {
            if all.is_empty() {
                println!("no evaluations");
            }
            all.iter().for_each(|e| print!("{}", describe(e)));
        } else {
            print!("{}", describe(&body));
        }
        return Ok(ExitCode::SUCCESS);
    }
}

/// One evaluation in a few lines: what it is, then one line per candidate.
fn describe(e: &Value) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{}  {}  schema {}{}  {} members ({})  spent {}{}",
        e["name"].as_str().unwrap_or("?"),
        e["state"].as_str().unwrap_or("?"),
        e["schema"].as_str().unwrap_or("?"),
        e["tenant"].as_str().map(|t| format!("  tenant {t}")).unwrap_or_default(),
        e["members"],
        e["selection"].as_str().unwrap_or("?"),
        dollars(e["spent_micros"].as_u64().unwrap_or(0)),
        e["budget_micros"].as_u64().map(|b| format!(" of {}", dollars(b))).unwrap_or_default(),
    );
    for c in e["candidates"].as_array().into_iter().flatten() {
        let _ = writeln!(
            out,
            "  {:<24} finished {:>6}  waiting {:>6}  not sent {:>6}  spent {}",
            c["name"].as_str().unwrap_or("?"),
            c["finished"],
            c["waiting"],
            c["not_sent"],
            dollars(c["spent_micros"].as_u64().unwrap_or(0))
        );
    }
    out
}

/// Adds `rule` to `[routing] rules` in the file, keeping its comments and layout: ahead of
/// every rule that would take the same work, behind those more specific than it (a rule
/// pinned to a tenant stays ahead of a new rule for the whole schema). The new text must
/// still be a configuration this build reads before the file is replaced, atomically (a
/// crash leaves the old file or the new one), with the old file's permissions.
fn add_routing_rule(path: &Path, rule: &str) -> anyhow::Result<()> {
    let text = std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))?;
    let mut doc: toml_edit::DocumentMut =
        text.parse().with_context(|| format!("{} is not valid TOML", path.display()))?;
    let parsed: toml_edit::DocumentMut = format!("rule = {rule}").parse().context("the routing rule is not TOML")?;
    let Some(new_rule) = parsed["rule"].as_inline_table().cloned() else {
        anyhow::bail!("the server's routing rule is not an inline table: {rule}");
    };
    let pins = |keys: &dyn Fn(&str) -> bool| (keys("schema"), keys("tenant"));
    let new_pins = pins(&|k| new_rule.contains_key(k));
    // Rules a new one must stay behind: they pin something it leaves open.
    let narrower = |other: (bool, bool)| (other.0 && !new_pins.0) || (other.1 && !new_pins.1);
    let routing = doc.entry("routing").or_insert_with(toml_edit::table);
    let Some(routing) = routing.as_table_like_mut() else {
        anyhow::bail!("{}: [routing] is not a table", path.display());
    };
    let rules = routing.entry("rules").or_insert(toml_edit::value(toml_edit::Array::new()));
    if let Some(tables) = rules.as_array_of_tables_mut() {
        let same = |t: &toml_edit::Table| {
            new_rule.iter().all(|(k, v)| {
                t.get(k).and_then(|i| i.as_value()).is_some_and(|o| o.to_string().trim() == v.to_string().trim())
            })
        };
        if tables.iter().any(|t| same(t) && t.len() == new_rule.len()) {
            return Ok(());
        }
        let at = tables.iter().position(|t| !narrower(pins(&|k| t.contains_key(k)))).unwrap_or(tables.len());
        let mut table = toml_edit::Table::new();
        for (key, value) in new_rule.iter() {
            table.insert(key, toml_edit::Item::Value(value.clone()));
        }
        let mut all: Vec<toml_edit::Table> = tables.iter().cloned().collect();
        all.insert(at, table);
        *tables = all.into_iter().collect();
    } else if let Some(array) = rules.as_array_mut() {
        let tables: Vec<&toml_edit::InlineTable> = array.iter().filter_map(|r| r.as_inline_table()).collect();
        if tables.iter().any(|t| t.to_string().trim() == new_rule.to_string().trim()) {
            return Ok(());
        }
        let at = tables.iter().position(|t| !narrower(pins(&|k| t.contains_key(k)))).unwrap_or(array.len());
        array.insert(at, new_rule);
    } else {
        anyhow::bail!("{}: [routing] rules is neither an array of inline tables nor [[routing.rules]]", path.display());
    }
    let new_text = doc.to_string();
    toml::from_str::<crate::app::config::RawConfig>(&new_text)
        .with_context(|| format!("{} with the rule added is not a configuration this build reads", path.display()))?;
    // The configuration's directory may be writable by others: a link planted at the
    // partial name must not be followed (nor renamed into the configuration's place).
    let partial = crate::domain::private_file::partial_path(path);
    {
        use std::io::Write;
        let mut file = crate::domain::private_file::replace(&partial)
            .with_context(|| format!("cannot write {}", partial.display()))?;
        if let Ok(meta) = std::fs::metadata(path) {
            file.set_permissions(meta.permissions())
                .with_context(|| format!("cannot set the mode of {}", partial.display()))?;
        }
        file.write_all(new_text.as_bytes())
            .and_then(|()| file.sync_all())
            .with_context(|| format!("cannot write {}", partial.display()))?;
    }
    std::fs::rename(&partial, path).with_context(|| format!("cannot replace {}", path.display()))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_routing_rule_goes_first_in_the_rules_and_keeps_the_files_comments() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("config.toml");
        std::fs::write(
            &path,
            "# my config\n[routing]\ndefault = \"a\" # the old one\nrules = [{ tenant = \"x\", provider = \"a\" }]\n",
        )
        .unwrap();
        add_routing_rule(&path, r#"{ schema = "s@1", provider = "b" }"#).unwrap();
        add_routing_rule(&path, r#"{ schema = "s@1", provider = "b" }"#).unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(text.contains("# my config") && text.contains("# the old one"), "{text}");
        let doc: toml::Table = text.parse().unwrap();
        let rules = doc["routing"]["rules"].as_array().unwrap();
        assert_eq!(rules.len(), 2, "added once: {text}");
        assert_eq!(rules[0]["tenant"].as_str(), Some("x"), "a tenant's own rule stays ahead of one for the schema");
        assert_eq!(rules[1]["provider"].as_str(), Some("b"));

        let bare = dir.path().join("bare.toml");
        std::fs::write(&bare, "[server]\nlisten = \"127.0.0.1:0\"\n").unwrap();
        add_routing_rule(&bare, r#"{ schema = "s@1", tenant = "t", provider = "b" }"#).unwrap();
        let doc: toml::Table = std::fs::read_to_string(&bare).unwrap().parse().unwrap();
        assert_eq!(doc["routing"]["rules"][0]["tenant"].as_str(), Some("t"));

        // [[routing.rules]] tables: a rule of the same schema and tenant is passed by the new one.
        let tables = dir.path().join("tables.toml");
        std::fs::write(
            &tables,
            "[routing]\ndefault = \"a\"\n\n[[routing.rules]]\nschema = \"s@1\"\nprovider = \"a\"\n",
        )
        .unwrap();
        add_routing_rule(&tables, r#"{ schema = "s@1", provider = "b" }"#).unwrap();
        let doc: toml::Table = std::fs::read_to_string(&tables).unwrap().parse().unwrap();
        let rules = doc["routing"]["rules"].as_array().unwrap();
        assert_eq!((rules.len(), rules[0]["provider"].as_str()), (2, Some("b")));

        // A file the rule would turn into one this build refuses is left as it was.
        let broken = dir.path().join("broken.toml");
        std::fs::write(&broken, "[routing]\nrules = []\nbogus_key = 1\n").unwrap();
        assert!(add_routing_rule(&broken, r#"{ schema = "s@1", provider = "b" }"#).is_err());
        assert_eq!(std::fs::read_to_string(&broken).unwrap(), "[routing]\nrules = []\nbogus_key = 1\n");
    }
}
