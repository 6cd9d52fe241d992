//! `commitpoint costs`: a tenant's spend from a running server, as text or CSV.

use std::fmt::Write as _;
use std::process::ExitCode;

use anyhow::Context;
use serde_json::Value;

use super::EXIT_PROBLEMS;

#[derive(Debug, clap::Args)]
pub(super) struct Args {
    #[arg(long)]
    tenant: String,
    /// Start (a date like 2026-11-01, or RFC 3339); default: the start of this UTC month.
    #[arg(long)]
    from: Option<String>,
    /// End, exclusive; default: now.
    #[arg(long)]
    to: Option<String>,
    /// Split the totals by day, model or provider.
    #[arg(long, value_parser = ["day", "model", "provider"])]
    group_by: Option<String>,
    /// CSV (one row per group and kind) instead of text.
    #[arg(long)]
    csv: bool,
    #[command(flatten)]
    admin: super::AdminUrl,
}

/// Every bucket the API reports, in its order: a finance export that left one out (as
/// `unusable` once was) would miss what truncated and refused answers cost.
const KINDS: [&str; 5] = ["fresh", "replay", "failed_validation", "unusable", "evaluation"];

pub(super) async fn run(args: Args) -> anyhow::Result<ExitCode> {
    let base = args.admin.resolve();
    let mut query: Vec<(&str, &str)> = Vec::new();
    for (key, value) in [("from", &args.from), ("to", &args.to), ("group_by", &args.group_by)] {
        if let Some(v) = value {
            query.push((key, v));
        }
    }
    let url = format!("{base}/v1/tenants/{}/costs", args.tenant);
    let response = args
        .admin
        .client()?
        .get(&url)
        .query(&query)
        .send()
        .await
        .with_context(|| format!("cannot reach the server at {base}"))?;
    let status = response.status();
    let body: Value = response.json().await.context("the server sent a non-JSON answer")?;
    if !status.is_success() {
        eprintln!("commitpoint: the server refused: {status}: {}", body["error"]["message"].as_str().unwrap_or("?"));
        return Ok(ExitCode::from(EXIT_PROBLEMS));
    }
    print!("{}", if args.csv { csv(&body) } else { text(&body) });
    Ok(ExitCode::SUCCESS)
}

fn rows(body: &Value) -> Vec<(String, &Value)> {
    let mut rows = vec![("total".to_string(), body)];
    if let Some(groups) = body["groups"].as_object() {
        rows.extend(groups.iter().map(|(k, v)| (k.clone(), v)));
    }
    rows
}

pub(super) use crate::engine::ledger::dollars;

fn text(body: &Value) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "tenant {}  from {}  to {}",
        body["tenant"].as_str().unwrap_or("?"),
        body["from"].as_str().unwrap_or("?"),
        body["to"].as_str().unwrap_or("?")
    );
    let _ = writeln!(out, "charged: {}", dollars(body["charged_micros"].as_u64().unwrap_or(0)));
    let unpriced = body["unpriced_attempts"].as_u64().unwrap_or(0);
    let why = if unpriced == 0 {
        ""
    } else {
        " (booked at $0: the charge is short of the bill; add [[prices]] rows for their models, \
         `commitpoint config check` lists them)"
    };
    let _ = writeln!(out, "unpriced attempts: {unpriced}{why}");
    let _ = writeln!(
        out,
        "{:<24} {:<18} {:>9} {:>13} {:>13} {:>14} {:>9}",
        "group", "kind", "attempts", "input", "output", "cost", "unpriced"
    );
    for (group, split) in rows(body) {
        for kind in KINDS {
            let b = &split[kind];
            let _ = writeln!(
                out,
                "{:<24} {:<18} {:>9} {:>13} {:>13} {:>14} {:>9}",
                group,
                kind,
                b["attempts"].as_u64().unwrap_or(0),
                b["input_tokens"].as_u64().unwrap_or(0),
                b["output_tokens"].as_u64().unwrap_or(0),
                dollars(b["cost_micros"].as_u64().unwrap_or(0)),
                b["unpriced_attempts"].as_u64().unwrap_or(0)
            );
        }
    }
    out
}

fn csv(body: &Value) -> String {
    let mut out = String::from("group,kind,attempts,input_tokens,output_tokens,cost_micros,unpriced_attempts\n");
    for (group, split) in rows(body) {
        for kind in KINDS {
            let b = &split[kind];
            // Group keys are days, model or provider names: quote them in case of commas.
            let _ = writeln!(
                out,
                "\"{}\",{kind},{},{},{},{},{}",
                group.replace('"', "\"\""),
                b["attempts"].as_u64().unwrap_or(0),
                b["input_tokens"].as_u64().unwrap_or(0),
                b["output_tokens"].as_u64().unwrap_or(0),
                b["cost_micros"].as_u64().unwrap_or(0),
                b["unpriced_attempts"].as_u64().unwrap_or(0)
            );
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn bucket(attempts: u64, cost: u64, unpriced: u64) -> Value {
        json!({"attempts": attempts, "input_tokens": 10, "output_tokens": 5, "cost_micros": cost,
               "unpriced_attempts": unpriced})
    }

    fn body() -> Value {
        let split = json!({"fresh": bucket(2, 300, 0), "replay": bucket(1, 0, 0),
                           "failed_validation": bucket(0, 0, 0), "unusable": bucket(3, 90, 1),
                           "evaluation": bucket(4, 25, 0)});
        let mut body = split.clone();
        body["charged_micros"] = json!(415);
        body["unpriced_attempts"] = json!(1);
        body["groups"] = json!({ "gpt-4o-mini": split });
        body
    }

    #[test]
    fn csv_has_a_row_per_group_and_kind_unusable_included() {
        let text = csv(&body());
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 11, "{text}");
        assert_eq!(lines[0], "group,kind,attempts,input_tokens,output_tokens,cost_micros,unpriced_attempts");
        assert_eq!(lines[1], "\"total\",fresh,2,10,5,300,0");
        assert_eq!(lines[4], "\"total\",unusable,3,10,5,90,1");
        assert_eq!(lines[5], "\"total\",evaluation,4,10,5,25,0");
        assert_eq!(lines[6], "\"gpt-4o-mini\",fresh,2,10,5,300,0");
        let csv_cost: u64 = lines[1..6].iter().map(|l| l.split(',').nth(5).unwrap().parse::<u64>().unwrap()).sum();
        assert_eq!(csv_cost, body()["charged_micros"].as_u64().unwrap(), "the rows add up to the charge");
        assert_eq!(dollars(1_234_567), "$1.234567");
    }

    #[test]
    fn text_names_the_unusable_bucket_and_the_unpriced_attempts() {
        let text = text(&body());
        assert!(text.contains("unpriced attempts: 1 (booked at $0"), "{text}");
        let unusable = text.lines().find(|l| l.starts_with("total") && l.contains("unusable")).unwrap();
        assert!(unusable.contains("$0.000090"), "{unusable}");
    }
}
