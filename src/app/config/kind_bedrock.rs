//! `[providers.<name>] kind = "bedrock"`: Amazon Bedrock batch inference (docs/PROVIDERS.md,
//! "Amazon Bedrock"). No key is read from the config: credentials come from the standard
//! AWS chain (environment, web identity, container credentials, instance metadata).

use serde::Deserialize;

use super::Error;
use super::kinds::at_least_one;
use crate::providers::bedrock::{self, S3Uri};

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawBedrock {
    pub region: String,
    /// A Bedrock model id such as `anthropic.claude-3-5-haiku-20241022-v1:0`.
    pub model: String,
    /// The service role Bedrock assumes to read the input and write the output.
    pub role_arn: String,
    /// `s3://bucket/prefix/` the JSONL records are written under.
    pub input_s3_uri: String,
    /// `s3://bucket/prefix/` Bedrock writes `{job id}/*.jsonl.out` under.
    pub output_s3_uri: String,
    /// The control plane (default `https://bedrock.{region}.amazonaws.com`).
    pub endpoint: Option<String>,
    /// S3 (default AWS's; set for a VPC endpoint or an S3-compatible test server).
    pub s3_endpoint: Option<String>,
    pub max_tokens: Option<u32>,
    pub max_tokens_cap: Option<u32>,
    /// The account's "minimum number of records per batch inference job" (default 100).
    pub min_records: Option<usize>,
    /// The account's "records per batch inference job" (default 50,000).
    pub max_records: Option<usize>,
    /// `timeoutDurationInHours` (Bedrock's default when unset).
    pub timeout_hours: Option<u32>,
}

#[derive(Debug, Clone, PartialEq)]
pub(crate) struct BedrockOptions {
    pub region: String,
    pub model: String,
    pub role_arn: String,
    pub input: S3Uri,
    pub output: S3Uri,
    pub endpoint: Option<String>,
    pub s3_endpoint: Option<String>,
    pub max_tokens: u32,
    pub max_tokens_cap: u32,
    pub min_records: usize,
    pub max_records: usize,
    pub timeout_hours: Option<u32>,
}

impl RawBedrock {
    pub(super) fn resolve(self) -> Result<BedrockOptions, Error> {
        let invalid = |key: &'static str, reason: String| Error::Invalid { key, reason };
        // Bedrock's own rules (`bedrock::rules`) first: a URI it refuses says which rule.
        let s3 = |key: &'static str, text: &str| {
            bedrock::rules::s3_uri(text).map_err(|rule| invalid(key, rule))?;
            S3Uri::parse(text).ok_or_else(|| invalid(key, format!("{text:?} must be an s3://bucket/prefix/ URI")))
        };
        if self.model.trim().is_empty() {
            return Err(invalid("model", "must be a Bedrock model id".into()));
        }
        bedrock::rules::role_arn(&self.role_arn).map_err(|rule| invalid("role_arn", rule))?;
        if let Some(hours) = self.timeout_hours {
            bedrock::rules::timeout_hours(hours).map_err(|rule| invalid("timeout_hours", rule))?;
        }
        let min_records = self.min_records.unwrap_or(bedrock::DEFAULT_MIN_RECORDS);
        let max_records = self.max_records.unwrap_or(bedrock::DEFAULT_MAX_RECORDS);
        if min_records == 0 || min_records > max_records {
            return Err(invalid("min_records", format!("must be between 1 and max_records ({max_records})")));
        }
        Ok(BedrockOptions {
            region: self.region,
            model: self.model,
            role_arn: self.role_arn,
            input: s3("input_s3_uri", &self.input_s3_uri)?,
            output: s3("output_s3_uri", &self.output_s3_uri)?,
            endpoint: self.endpoint,
            s3_endpoint: self.s3_endpoint,
            max_tokens: at_least_one("max_tokens", self.max_tokens)?.unwrap_or(bedrock::DEFAULT_MAX_TOKENS),
            max_tokens_cap: at_least_one("max_tokens_cap", self.max_tokens_cap)?
                .unwrap_or(bedrock::DEFAULT_MAX_TOKENS_CAP),
            min_records,
            max_records,
            timeout_hours: at_least_one("timeout_hours", self.timeout_hours)?,
        })
    }
}

/// `config check` / `describe` lines for the table.
pub(super) fn describe(b: &BedrockOptions, lines: &mut Vec<String>) {
    let mut line = |key: &str, value: &str| lines.push(format!("{key} = {value:?}"));
    line("region", &b.region);
    line("model", &b.model);
    line("role_arn", &b.role_arn);
    line("input_s3_uri", &b.input.uri(""));
    line("output_s3_uri", &b.output.uri(""));
    if let Some(endpoint) = &b.endpoint {
        line("endpoint", endpoint);
    }
    if let Some(endpoint) = &b.s3_endpoint {
        line("s3_endpoint", endpoint);
    }
    lines.push(format!("max_tokens = {}", b.max_tokens));
    lines.push(format!("max_tokens_cap = {}", b.max_tokens_cap));
    lines.push(format!("min_records = {}", b.min_records));
    lines.push(format!("max_records = {}", b.max_records));
    lines.push("# credentials: the standard AWS chain (never the config file)".to_string());
}

#[cfg(test)]
mod tests {
    use super::*;

    const BASE: &str = "region = \"us-east-1\"\nmodel = \"anthropic.claude-3-5-haiku-20241022-v1:0\"\n\
        role_arn = \"arn:aws:iam::123456789012:role/batch\"\n\
        input_s3_uri = \"s3://in-bucket/commitpoint/\"\noutput_s3_uri = \"s3://out-bucket/results\"\n";

    fn resolve(text: &str) -> Result<BedrockOptions, Error> {
        toml::from_str::<RawBedrock>(text).map_err(|e| Error::Invalid { key: "t", reason: e.to_string() })?.resolve()
    }

    #[test]
    fn defaults_and_refusals() {
        let o = resolve(BASE).unwrap();
        assert_eq!((o.min_records, o.max_records), (100, 50_000));
        assert_eq!(o.input.prefix, "commitpoint");
        assert!(resolve(&format!("{BASE}min_records = 0")).is_err());
        assert!(resolve(&format!("{BASE}min_records = 60000")).is_err());
        assert!(resolve(&BASE.replace("s3://in-bucket/commitpoint/", "https://x")).is_err());
        assert!(resolve(&BASE.replace(":role/batch", ":user/x")).is_err());
        assert!(resolve(&format!("{BASE}timeout_hours = 12")).is_err());
        assert!(resolve(&format!("{BASE}timeout_hours = 48")).is_ok());
        assert!(resolve(&format!("{BASE}api_key_env = \"X\"")).is_err(), "no key in the config");
    }
}
