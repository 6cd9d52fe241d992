//! `commitpoint ctl`: talk to a running server's admin API.

use crate::domain::lifecycle::StateName;
use std::process::ExitCode;

use anyhow::Context;
use serde_json::Value;

use super::EXIT_PROBLEMS;

/// How to reach the admin API.
#[derive(Debug, clap::Args)]
pub(super) struct Target {
    #[command(flatten)]
    admin: super::AdminUrl,
    /// Print the raw JSON instead of text.
    #[arg(long)]
    json: bool,
}

#[derive(Debug, clap::Subcommand)]
pub(super) enum Command {
    /// Counts by state, work waiting longest, providers and their pauses, last backup.
    Status(Target),
    /// Stop new submissions to a provider; its known jobs are still polled to completion.
    PauseProvider {
        name: String,
        #[command(flatten)]
        target: Target,
    },
    /// Let a paused provider take new submissions again.
    ResumeProvider {
        name: String,
        #[command(flatten)]
        target: Target,
    },
    /// Check the configuration as `config check` does, then tell the server (SIGHUP) to
    /// apply its routing, budgets and prices. A bad configuration exits 78 and the server
    /// keeps running with its settings. This is the unit's ExecReload.
    Reload {
        /// The server's process id (`$MAINPID` under systemd).
        #[arg(long)]
        pid: i32,
        #[command(flatten)]
        args: super::serve::Args,
    },
    /// Move failed extractions back to pending in bulk (filters combine).
    Retry(super::retry::Args),
}

fn reload(pid: i32, args: super::serve::Args) -> anyhow::Result<ExitCode> {
    let checked = super::serve::check(args);
    if checked != ExitCode::SUCCESS {
        return Ok(checked);
    }
    let target = nix::unistd::Pid::from_raw(pid);
    nix::sys::signal::kill(target, nix::sys::signal::Signal::SIGHUP)
        .with_context(|| format!("cannot signal process {pid}"))?;
    eprintln!("commitpoint: asked process {pid} to reload");
    Ok(ExitCode::SUCCESS)
}

/// `ctl reload` for a configuration file named by path (`eval promote --apply`).
pub(super) fn reload_config(pid: i32, config: &std::path::Path) -> anyhow::Result<ExitCode> {
    #[derive(clap::Parser)]
    struct Serve {
        #[command(flatten)]
        args: super::serve::Args,
    }
    let parsed = <Serve as clap::Parser>::try_parse_from([
        std::ffi::OsStr::new("serve"),
        "--config".as_ref(),
        config.as_os_str(),
    ])
    .context("cannot name the configuration file to check")?;
    reload(pid, parsed.args)
}

pub(super) async fn run(command: Command) -> anyhow::Result<ExitCode> {
    let (target, method, path) = match command {
        Command::Reload { pid, args } => return reload(pid, args),
        Command::Retry(args) => return super::retry::run(args).await,
        Command::Status(target) => (target, reqwest::Method::GET, "/v1/stats".to_string()),
        Command::PauseProvider { name, target } => {
            (target, reqwest::Method::POST, format!("/v1/admin/providers/{name}/pause"))
        }
        Command::ResumeProvider { name, target } => {
            (target, reqwest::Method::POST, format!("/v1/admin/providers/{name}/resume"))
        }
    };
    let base = target.admin.resolve();
    let request = target.admin.client()?.request(method, format!("{base}{path}"));
    let response = request.send().await.with_context(|| format!("cannot reach the server at {base}"))?;
    let status = response.status();
    let body: Value = response.json().await.context("the server sent a non-JSON answer")?;
    if !status.is_success() {
        eprintln!(
            "commitpoint: the server refused: {status}: {}",
            body["error"]["message"].as_str().unwrap_or("no message")
        );
        return Ok(ExitCode::from(EXIT_PROBLEMS));
    }
    if target.json {
        println!("{}", serde_json::to_string_pretty(&body)?);
    } else if path == "/v1/stats" {
        print!("{}", describe(&body));
    } else {
        let state = if body["operator_paused"] == true { "paused (known jobs still polled)" } else { "active" };
        println!(
            "provider {}: {state}; {} batches in flight",
            body["name"].as_str().unwrap_or("?"),
            body["open_batches"]
        );
    }
    Ok(ExitCode::SUCCESS)
}

/// At most this many (tenant, schema) rows in `ctl status`: the ones with the most
/// unfinished work; `GET /v1/stats` lists them all.
const TENANT_ROWS: usize = 20;

/// Each tenant's work by schema, the busiest first, as a table.
fn tenant_table(stats: &Value) -> String {
    const STATES: [&str; 7] = ["pending", "claimed", "submitted", "ready", "committed", "failed", "cancelled"];
    let mut rows = stats["tenants"].as_array().cloned().unwrap_or_default();
    if rows.is_empty() {
        return String::new();
    }
    let count = |row: &Value, state: &str| row["extractions"][state].as_u64().unwrap_or(0);
    let unfinished =
        |row: &Value| StateName::ALL.iter().filter(|s| !s.is_terminal()).map(|s| count(row, s.as_str())).sum::<u64>();
    // Stable: equal rows keep the server's (tenant, schema) order.
    rows.sort_by_key(|row| std::cmp::Reverse(unfinished(row)));
    let mut out = format!("{:<20} {:<20}", "tenant", "schema");
    for state in STATES {
        out += &format!(" {state:>9}");
    }
    out += "  oldest pending\n";
    for row in rows.iter().take(TENANT_ROWS) {
        out += &format!("{:<20} {:<20}", row["tenant"].as_str().unwrap_or("?"), row["schema"].as_str().unwrap_or("?"));
        for state in STATES {
            out += &format!(" {:>9}", count(row, state));
        }
        let age = row["oldest_pending_age_seconds"].as_f64().map_or("-".to_string(), human_age);
        out += &format!("  {age}\n");
    }
    if rows.len() > TENANT_ROWS {
        out +=
            &format!("… and {} more (tenant, schema) pairs: GET /v1/stats lists them all\n", rows.len() - TENANT_ROWS);
    }
    out
}

fn describe(stats: &Value) -> String {
    let store = &stats["store"];
    let mut out = format!(
        "store: {} (this instance: {})\n",
        store["backend"].as_str().unwrap_or("?"),
        store["instance"].as_str().unwrap_or("?")
    );
    out += &format!("extractions: {}\n", stats["total"]);
    if let Some(states) = stats["extractions"].as_object() {
        for (state, n) in states {
            let age = stats["oldest_age_seconds"][state].as_f64().filter(|a| *a > 0.0);
            let waiting = age.map_or(String::new(), |a| format!("  (oldest waiting {})", human_age(a)));
            out += &format!("  {state:<10} {n}{waiting}\n");
        }
    }
    out += &tenant_table(stats);
    let providers = stats["providers"].as_array().cloned().unwrap_or_default();
    if providers.is_empty() {
        out += "providers: none (external workers claim the work)\n";
    }
    for p in providers {
        let paused = if p["operator_paused"] == true {
            "PAUSED by an operator (known jobs still polled)".to_string()
        } else if p["paused_until_ms"].is_u64() {
            format!("PAUSED ({})", p["pause_reason"].as_str().unwrap_or("?"))
        } else {
            "active".to_string()
        };
        let name = p["name"].as_str().unwrap_or("?");
        out += &format!(
            "provider {name}: {paused}; {}; batches {} submitted, {} recovered, {} closed; last error: {}\n",
            driven_by(stats, name),
            p["batches_submitted"],
            p["batches_recovered"],
            p["batches_closed"],
            p["last_error"].as_str().unwrap_or("none"),
        );
        if let Some(waiting) = p["waiting_for_minimum"].as_str() {
            out += &format!("provider {name}: waiting: {waiting}\n");
        }
    }
    let outbox = &stats["outbox"];
    out += &format!(
        "outbox: {} pending{}, {} dead\n",
        outbox["pending"],
        outbox["oldest_pending_at"].as_str().map_or(String::new(), |at| format!(" (oldest from {at})")),
        outbox["dead"]
    );
    for b in stats["budgets"].as_array().cloned().unwrap_or_default() {
        let micros = |v: &Value| v.as_u64().unwrap_or(0) as f64 / 1e6;
        let reserved = match b["reserved_members"].as_u64().unwrap_or(0) {
            0 => String::new(),
            n => format!(" (+${:.4} reserved for {n} in flight)", micros(&b["reserved_micros"])),
        };
        let waiting = match &b["waiting"] {
            Value::Object(w) => format!(
                " — waiting: the next source needs ~${:.4}, ${:.4} left",
                micros(&w["needed_micros"]),
                micros(&w["left_micros"])
            ),
            _ => String::new(),
        };
        out += &format!(
            "budget {}: ${:.2} of ${:.2}{reserved}{}{waiting}\n",
            b["tenant"].as_str().unwrap_or("?"),
            micros(&b["spent_micros"]),
            micros(&b["budget_micros"]),
            if b["held"] == true { " — REACHED: new work is held" } else { "" }
        );
    }
    out += &format!("last backup: {}\n", stats["last_backup_at"].as_str().unwrap_or("none recorded"));
    out
}

/// Who drives `provider`'s batches, as `/v1/stats` reports it.
fn driven_by(stats: &Value, provider: &str) -> String {
    let this = stats["store"]["instance"].as_str();
    match stats["store"]["drivers"][provider].as_str() {
        Some(instance) if Some(instance) == this => "driven by this instance".to_string(),
        Some(instance) => format!("driven by {instance}"),
        None => "driven by no instance now".to_string(),
    }
}

fn human_age(seconds: f64) -> String {
    humantime::format_duration(std::time::Duration::from_secs(seconds.round() as u64)).to_string()
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn the_tenant_table_puts_the_busiest_first_and_caps_its_rows() {
        let row = |tenant: &str, pending: u64, committed: u64, age: Option<u64>| {
            let mut row = json!({"tenant": tenant, "schema": "code-review@1",
                                 "extractions": {"pending": pending, "committed": committed}});
            if let Some(age) = age {
                row["oldest_pending_age_seconds"] = json!(age);
            }
            row
        };
        let mut tenants = vec![row("quiet", 0, 90, None), row("busy", 5000, 1, Some(3600))];
        let table = tenant_table(&json!({ "tenants": tenants }));
        let lines: Vec<&str> = table.lines().collect();
        assert_eq!(lines.len(), 3, "{table}");
        assert!(lines[1].starts_with("busy") && lines[1].contains("5000") && lines[1].ends_with("1h"), "{table}");
        assert!(lines[2].starts_with("quiet") && lines[2].ends_with('-'), "{table}");
        tenants.extend((0..30).map(|i| row(&format!("t{i}"), 1, 0, Some(1))));
        let table = tenant_table(&json!({ "tenants": tenants }));
        assert_eq!(table.lines().count(), 1 + TENANT_ROWS + 1, "{table}");
        assert!(table.ends_with("… and 12 more (tenant, schema) pairs: GET /v1/stats lists them all\n"), "{table}");
        assert_eq!(tenant_table(&json!({"tenants": []})), "");
    }

    #[test]
    fn a_provider_waiting_for_its_minimum_says_so() {
        let stats = json!({
            "store": {"backend": "redb", "instance": "h:1", "drivers": {"bedrock": "h:1"}},
            "providers": [
                {"name": "bedrock", "batches_submitted": 0, "batches_recovered": 0, "batches_closed": 0,
                 "waiting_for_minimum": "12 extractions of code-review@1 wait for a job of at least 100"},
                {"name": "openai", "batches_submitted": 3, "batches_recovered": 0, "batches_closed": 3}
            ]
        });
        let text = describe(&stats);
        assert!(text.contains("provider bedrock: waiting: 12 extractions"), "{text}");
        assert!(!text.contains("provider openai: waiting"), "{text}");
    }
}
