//! `commitpoint simulator` flags for an OpenAI-compatible platform's departures from
//! OpenAI (a Groq-like one by default with `--platform groq`): see `simulator::Variant`.

use crate::simulator::{MetadataMode, RateLimitHeaders, Variant};

#[derive(Debug, Clone, clap::Args)]
pub(super) struct PlatformArgs {
    /// Start from a known platform's departures (`groq`: /openai/v1, metadata dropped,
    /// Groq's 429 headers, one-page lists); the flags below override it.
    #[arg(long, value_enum)]
    pub platform: Option<PlatformArg>,
    /// Where the Files and Batches API lives (default /v1; Groq: /openai/v1).
    #[arg(long, value_name = "PATH")]
    pub base_path: Option<String>,
    /// What a batch's metadata becomes: kept, ignored (answered as null) or refused (400).
    #[arg(long, value_enum)]
    pub metadata: Option<MetadataArg>,
    /// Short for `--metadata ignored`.
    #[arg(long, conflicts_with = "metadata")]
    pub no_metadata: bool,
    /// The headers of a 429: openai, groq (retry-after in seconds and reset durations) or
    /// reset-only (x-ratelimit-reset-* and no retry-after).
    #[arg(long, value_enum)]
    pub rate_limit_headers: Option<HeadersArg>,
    /// Lists answer everything at once, without has_more / first_id / last_id.
    #[arg(long)]
    pub unpaged_lists: bool,
}

#[derive(Debug, Clone, Copy, clap::ValueEnum)]
pub(super) enum PlatformArg {
    Groq,
}

#[derive(Debug, Clone, Copy, clap::ValueEnum)]
pub(super) enum MetadataArg {
    Kept,
    Ignored,
    Refused,
}

#[derive(Debug, Clone, Copy, clap::ValueEnum)]
pub(super) enum HeadersArg {
    Openai,
    Groq,
    ResetOnly,
}

impl PlatformArgs {
    pub(super) fn variant(&self) -> Result<Variant, String> {
        let mut variant = match self.platform {
            None => Variant::default(),
            Some(PlatformArg::Groq) => Variant::groq_like(),
        };
        if let Some(path) = &self.base_path {
            let path = path.trim_end_matches('/');
            if !path.starts_with('/') || path.len() < 2 || path.starts_with("/_sim") {
                return Err(format!("--base-path {path:?}: give a path such as /v1 or /openai/v1"));
            }
            variant.base_path = path.to_string();
        }
        if self.no_metadata {
            variant.metadata = MetadataMode::Ignored;
        }
        if let Some(mode) = self.metadata {
            variant.metadata = match mode {
                MetadataArg::Kept => MetadataMode::Kept,
                MetadataArg::Ignored => MetadataMode::Ignored,
                MetadataArg::Refused => MetadataMode::Refused,
            };
        }
        if let Some(headers) = self.rate_limit_headers {
            variant.rate_limit_headers = match headers {
                HeadersArg::Openai => RateLimitHeaders::Openai,
                HeadersArg::Groq => RateLimitHeaders::Groq,
                HeadersArg::ResetOnly => RateLimitHeaders::ResetOnly,
            };
        }
        if self.unpaged_lists {
            variant.paged_lists = false;
        }
        Ok(variant)
    }
}
