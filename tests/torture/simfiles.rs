//! The provider's side of the books, read back over the simulator's own API at the end,
//! as an auditor would read the provider's files: every batch, every billed line of every
//! output file (by its `request_id`), the lines too torn to read, and the members of the
//! batches that failed validation.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::time::Duration;

use serde_json::Value;

use crate::process::SIM_KEY;

/// One success line of an output file: a call the provider billed.
#[derive(Debug, Clone)]
pub struct Billed {
    pub batch_id: String,
    pub custom_id: String,
    pub model: String,
    pub input_tokens: u64,
    pub output_tokens: u64,
    /// The model's answer (`choices[0].message.content`).
    pub content: String,
}

#[derive(Debug, Default)]
pub struct ProviderFiles {
    pub batches: usize,
    /// By the line's `response.request_id`; a duplicated line is the same call.
    pub billed: HashMap<String, Billed>,
    /// Distinct output lines that are not JSON: billed, but nobody can read them.
    pub torn: BTreeSet<String>,
    /// Batches the provider failed → the members on the input lines its errors name.
    pub failed_batches: BTreeMap<String, Vec<String>>,
    /// Batches not terminal when read.
    pub live: Vec<String>,
}

struct Sim {
    base: String,
    http: reqwest::Client,
}

impl Sim {
    async fn get(&self, path: &str) -> String {
        let response = self
            .http
            .get(format!("{}{path}", self.base))
            .bearer_auth(SIM_KEY)
            .send()
            .await
            .unwrap_or_else(|e| panic!("GET {path} at the simulator: {e}"));
        assert!(response.status().is_success(), "GET {path} at the simulator: {}", response.status());
        response.text().await.unwrap_or_else(|e| panic!("GET {path} at the simulator: {e}"))
    }

    async fn json(&self, path: &str) -> Value {
        let text = self.get(path).await;
        serde_json::from_str(&text).unwrap_or_else(|e| panic!("GET {path} at the simulator is not JSON: {e}"))
    }
}

/// Reads every batch the simulator (OpenAI dialect, `base` ending in `/v1`) knows.
pub async fn read(base: &str) -> ProviderFiles {
    let http = reqwest::Client::builder().no_proxy().timeout(Duration::from_secs(30)).build().expect("client");
    let sim = Sim { base: base.trim_end_matches('/').to_string(), http };
    let mut files = ProviderFiles::default();
    let mut after = String::new();
    loop {
        let page = sim.json(&format!("/batches?limit=100{after}")).await;
        let batches = page["data"].as_array().expect("batch list data");
        for batch in batches {
            read_batch(&sim, batch, &mut files).await;
        }
        match (page["has_more"].as_bool(), page["last_id"].as_str()) {
            (Some(true), Some(last)) => after = format!("&after={last}"),
            _ => return files,
        }
    }
}

async fn read_batch(sim: &Sim, batch: &Value, files: &mut ProviderFiles) {
    files.batches += 1;
    let id = batch["id"].as_str().expect("batch id").to_string();
    let status = batch["status"].as_str().expect("batch status");
    if !matches!(status, "failed" | "completed" | "expired" | "cancelled") {
        files.live.push(id.clone());
    }
    if status == "failed" {
        let input = batch["input_file_id"].as_str().expect("input_file_id");
        let text = sim.get(&format!("/files/{input}/content")).await;
        let members: Vec<String> = text
            .lines()
            .filter_map(|l| serde_json::from_str::<Value>(l).ok())
            .filter_map(|l| l["custom_id"].as_str().map(str::to_string))
            .collect();
        // Only the members on the lines the provider's errors name are refused; the others
        // go back to the queue as the same attempt.
        let blamed = batch["errors"]["data"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|e| e["line"].as_u64())
            .filter_map(|line| members.get(usize::try_from(line.checked_sub(1)?).ok()?).cloned())
            .collect();
        files.failed_batches.insert(id.clone(), blamed);
    }
    let Some(output) = batch["output_file_id"].as_str() else { return };
    let text = sim.get(&format!("/files/{output}/content")).await;
    for line in text.lines().filter(|l| !l.trim().is_empty()) {
        let Ok(parsed) = serde_json::from_str::<Value>(line) else {
            files.torn.insert(line.to_string());
            continue;
        };
        let response = &parsed["response"];
        assert_eq!(response["status_code"], 200, "an output-file line that is not a success: {line}");
        let body = &response["body"];
        let billed = Billed {
            batch_id: id.clone(),
            custom_id: parsed["custom_id"].as_str().expect("custom_id").to_string(),
            model: body["model"].as_str().expect("model").to_string(),
            input_tokens: body["usage"]["prompt_tokens"].as_u64().expect("prompt_tokens"),
            output_tokens: body["usage"]["completion_tokens"].as_u64().expect("completion_tokens"),
            content: body["choices"][0]["message"]["content"].as_str().expect("content").to_string(),
        };
        let request_id = response["request_id"].as_str().expect("request_id").to_string();
        if let Some(known) = files.billed.get(&request_id) {
            // A duplicated line: the very same call, written twice.
            assert_eq!((&known.batch_id, &known.custom_id), (&billed.batch_id, &billed.custom_id), "{request_id}");
            continue;
        }
        files.billed.insert(request_id, billed);
    }
}
