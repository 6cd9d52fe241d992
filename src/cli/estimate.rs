//! `commitpoint estimate`: what files would cost at each configured provider before they
//! are submitted, and whether the tenant's budget covers it (`POST /v1/estimates`).
//! `commitpoint submit --max-cost` asks the same question first.

use std::fmt::Write as _;
use std::process::ExitCode;

use anyhow::{Context, bail};
use serde_json::{Value, json};

use super::costs::dollars;
use super::files::{Source, collect};

#[derive(Debug, clap::Args)]
pub(super) struct Args {
    /// Files, or directories whose files are all estimated (recursively), as `submit` takes them.
    #[arg(required = true)]
    paths: Vec<std::path::PathBuf>,
    #[arg(long)]
    tenant: String,
    #[arg(long, default_value = crate::domain::schema::BUILTIN_CODE_REVIEW)]
    schema: String,
    /// One configured provider; default: every one.
    #[arg(long)]
    provider: Option<String>,
    #[command(flatten)]
    admin: super::AdminUrl,
}

pub(super) async fn run(args: Args) -> anyhow::Result<ExitCode> {
    let sources = collect(&args.paths)?;
    let client = args.admin.client()?;
    let base = args.admin.resolve();
    let answer = ask(&client, &base, &args.tenant, &args.schema, args.provider.as_deref(), &sources).await?;
    print!("{}", table(&answer));
    Ok(ExitCode::SUCCESS)
}

/// The server's estimate for `sources` (their sizes on disk; nothing is read).
pub(super) async fn ask(
    client: &reqwest::Client,
    base: &str,
    tenant: &str,
    schema: &str,
    provider: Option<&str>,
    sources: &[Source],
) -> anyhow::Result<Value> {
    let mut items = Vec::with_capacity(sources.len());
    for source in sources {
        let meta = std::fs::metadata(&source.path).with_context(|| format!("cannot read {}", source.path.display()))?;
        items.push(json!({"source_id": source.source_id, "bytes": meta.len()}));
    }
    let mut body = json!({"tenant": tenant, "schema": schema, "items": items});
    if let Some(provider) = provider {
        body["provider"] = json!(provider);
    }
    let url = format!("{base}/v1/estimates");
    let response = client.post(&url).json(&body).send().await.with_context(|| format!("cannot reach {base}"))?;
    let status = response.status();
    let answer: Value = response.json().await.context("the server sent a non-JSON answer")?;
    if !status.is_success() {
        bail!("the server refused the estimate: {status}: {}", answer["error"]["message"].as_str().unwrap_or("?"));
    }
    Ok(answer)
}

/// The side-by-side table `estimate` prints.
fn table(answer: &Value) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "tenant {}  schema {}  sources {}{}",
        answer["tenant"].as_str().unwrap_or("?"),
        answer["schema"].as_str().unwrap_or("?"),
        answer["requests"],
        answer["routed_to"].as_str().map_or(String::new(), |p| format!("  (routed to {p})"))
    );
    match answer["budget"].as_object() {
        Some(b) => {
            let micros = |k: &str| b.get(k).and_then(Value::as_u64).unwrap_or(0);
            let _ = writeln!(
                out,
                "budget: {} left of {} this period",
                dollars(micros("remaining_micros")),
                dollars(micros("limit_micros"))
            );
        }
        None => {
            let _ = writeln!(out, "budget: none set");
        }
    }
    let estimates = answer["estimates"].as_array().cloned().unwrap_or_default();
    if estimates.is_empty() {
        let _ = writeln!(out, "no provider is configured: external workers' calls are not estimated");
        return out;
    }
    let _ = writeln!(
        out,
        "{:<16} {:<24} {:>12} {:>12} {:<8} {:>14} {:<7}",
        "provider", "model", "input", "output", "(basis)", "cost", "budget"
    );
    for e in estimates {
        let cost = e["cost_micros"].as_u64().map_or_else(|| "unpriced".to_string(), dollars);
        let covered = match e["covered_by_budget"].as_bool() {
            Some(true) => "covers",
            Some(false) => "OVER",
            None => "-",
        };
        let _ = writeln!(
            out,
            "{:<16} {:<24} {:>12} {:>12} {:<8} {:>14} {:<7}",
            e["provider"].as_str().unwrap_or("?"),
            e["model"].as_str().unwrap_or("(deployment)"),
            e["input_tokens"],
            e["output_tokens"],
            e["output_basis"].as_str().unwrap_or("?"),
            cost,
            covered
        );
    }
    let _ = writeln!(
        out,
        "input: 4 bytes a token over instructions, source id and content; output: your mean answer (history) or \
         the output budget (budget). Batch providers at their batch discount."
    );
    out
}

/// The cost `submit --max-cost` holds the files to: the routed provider's, else the dearest
/// of those configured. `Err` says why it cannot be told.
pub(super) fn cost_to_check(answer: &Value) -> Result<(String, u64), String> {
    let estimates = answer["estimates"].as_array().cloned().unwrap_or_default();
    let routed = answer["routed_to"].as_str();
    let chosen: Vec<&Value> = match routed {
        Some(name) => estimates.iter().filter(|e| e["provider"].as_str() == Some(name)).collect(),
        None => estimates.iter().collect(),
    };
    let mut costs = Vec::with_capacity(chosen.len());
    for e in chosen {
        let name = e["provider"].as_str().unwrap_or("?").to_string();
        let Some(cost) = e["cost_micros"].as_u64() else {
            return Err(format!("provider {name}'s model has no [[prices]] row, so its cost cannot be told"));
        };
        costs.push((name, cost));
    }
    costs.into_iter().max_by_key(|(_, cost)| *cost).ok_or_else(|| "no configured provider to estimate against".into())
}

/// `submit --max-cost`: `Ok` when the files fit, else the refusal to print (exit 1).
pub(super) async fn check_max_cost(
    client: &reqwest::Client,
    base: &str,
    tenant: &str,
    schema: &str,
    sources: &[Source],
    max_micros: u64,
) -> anyhow::Result<Result<(), String>> {
    let answer = ask(client, base, tenant, schema, None, sources).await?;
    Ok(match cost_to_check(&answer) {
        Ok((_, cost)) if cost <= max_micros => Ok(()),
        Ok((provider, cost)) => Err(format!(
            "refusing to submit: the estimate at {provider} is {} for {} sources, above --max-cost {}",
            dollars(cost),
            sources.len(),
            dollars(max_micros)
        )),
        Err(why) => Err(format!("refusing to submit: --max-cost is set but {why}")),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answer(routed: Option<&str>) -> Value {
        json!({"tenant": "acme", "schema": "code-review@1", "requests": 2, "routed_to": routed,
               "budget": {"limit_micros": 1_000_000, "spent_micros": 250_000, "remaining_micros": 750_000},
               "estimates": [
                   {"provider": "cheap", "model": "m1", "input_tokens": 10, "output_tokens": 5,
                    "output_basis": "history", "cost_micros": 100, "covered_by_budget": true},
                   {"provider": "dear", "model": "m2", "input_tokens": 10, "output_tokens": 5,
                    "output_basis": "budget", "cost_micros": 900, "covered_by_budget": true},
                   {"provider": "free", "model": "m3", "input_tokens": 10, "output_tokens": 5,
                    "output_basis": "budget", "cost_micros": null, "covered_by_budget": null}]})
    }

    #[test]
    fn the_routed_provider_is_checked_else_the_dearest_and_an_unpriced_one_refuses() {
        assert_eq!(cost_to_check(&answer(Some("cheap"))), Ok(("cheap".to_string(), 100)));
        assert_eq!(cost_to_check(&answer(Some("dear"))), Ok(("dear".to_string(), 900)));
        assert!(cost_to_check(&answer(Some("free"))).is_err_and(|e| e.contains("no [[prices]] row")));
        assert!(cost_to_check(&answer(None)).is_err(), "unrouted: every provider counts, and one is unpriced");
        assert!(cost_to_check(&answer(Some("gone"))).is_err());
    }

    #[test]
    fn the_table_has_a_row_per_provider_and_the_budget() {
        let text = table(&answer(Some("cheap")));
        assert!(text.contains("(routed to cheap)") && text.contains("budget: $0.750000 left of $1.000000"), "{text}");
        let free = text.lines().find(|l| l.starts_with("free")).unwrap();
        assert!(free.contains("unpriced") && free.trim_end().ends_with('-'), "{free}");
        assert!(text.lines().find(|l| l.starts_with("dear")).unwrap().contains("$0.000900"));
    }
}
