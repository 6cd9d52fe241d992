//! `[retention]`: how long a committed extraction's content and raw result are kept.
//! Nothing set keeps everything for ever, as before retention existed.

use std::time::Duration;

use serde::Deserialize;

use super::Error;
use super::file::parse_duration;

/// How often the sweep looks for what has expired, unless configured.
pub(super) const DEFAULT_SWEEP_INTERVAL: Duration = Duration::from_secs(600);

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawRetention {
    /// How long after commit the stored content is kept ("30d"; "forever" keeps it).
    pub content_after_commit: Option<String>,
    /// How long after commit the raw result is kept.
    pub raw_results_after_commit: Option<String>,
    pub sweep_interval: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct RetentionOptions {
    pub content_after_commit: Option<Duration>,
    pub raw_results_after_commit: Option<Duration>,
    pub sweep_interval: Duration,
}

impl Default for RetentionOptions {
    fn default() -> Self {
        Self { content_after_commit: None, raw_results_after_commit: None, sweep_interval: DEFAULT_SWEEP_INTERVAL }
    }
}

impl RetentionOptions {
    pub(super) fn resolve(raw: &RawRetention) -> Result<Self, Error> {
        let keep = |key: &'static str, text: &Option<String>| -> Result<Option<Duration>, Error> {
            match text.as_deref() {
                None | Some("forever") => Ok(None),
                Some(text) => parse_duration(key, text).map(Some),
            }
        };
        let sweep_interval = match &raw.sweep_interval {
            None => DEFAULT_SWEEP_INTERVAL,
            Some(text) => parse_duration("retention.sweep_interval", text)?,
        };
        if sweep_interval.is_zero() {
            return Err(Error::Invalid { key: "retention.sweep_interval", reason: "must be more than 0s".into() });
        }
        Ok(Self {
            content_after_commit: keep("retention.content_after_commit", &raw.content_after_commit)?,
            raw_results_after_commit: keep("retention.raw_results_after_commit", &raw.raw_results_after_commit)?,
            sweep_interval,
        })
    }

    pub(crate) fn policy(&self) -> crate::store::RetentionPolicy {
        let ms = |d: Option<Duration>| d.map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
        crate::store::RetentionPolicy {
            content_after_ms: ms(self.content_after_commit),
            raw_results_after_ms: ms(self.raw_results_after_commit),
        }
    }

    pub(crate) fn describe(&self) -> String {
        let kept = |d: Option<Duration>| d.map_or_else(|| "forever".to_string(), whole);
        format!(
            "[retention]\ncontent_after_commit = \"{}\"\nraw_results_after_commit = \"{}\"\nsweep_interval = \"{}\"",
            kept(self.content_after_commit),
            kept(self.raw_results_after_commit),
            whole(self.sweep_interval)
        )
    }
}

/// "90d" rather than humantime's calendar months ("2months 29days 2h 52m 48s").
fn whole(d: Duration) -> String {
    let secs = d.as_secs();
    match secs {
        _ if d.subsec_nanos() != 0 || secs == 0 => humantime::format_duration(d).to_string(),
        _ if secs.is_multiple_of(86_400) => format!("{}d", secs / 86_400),
        _ if secs.is_multiple_of(3600) => format!("{}h", secs / 3600),
        _ if secs.is_multiple_of(60) => format!("{}m", secs / 60),
        _ => format!("{secs}s"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn resolve(text: &str) -> Result<RetentionOptions, Error> {
        RetentionOptions::resolve(&toml::from_str::<RawRetention>(text).unwrap())
    }

    #[test]
    fn durations_forever_and_bad_values() {
        assert_eq!(resolve("").unwrap(), RetentionOptions::default());
        let set = resolve("content_after_commit = \"30d\"\nraw_results_after_commit = \"forever\"").unwrap();
        assert_eq!(set.content_after_commit, Some(Duration::from_secs(30 * 86_400)));
        assert_eq!(set.raw_results_after_commit, None);
        assert!(resolve("content_after_commit = \"soon\"").is_err());
        assert!(resolve("sweep_interval = \"0s\"").is_err());
        assert!(toml::from_str::<RawRetention>("contents_after_commit = \"1d\"").is_err(), "a typo is an error");
        let shown = resolve("content_after_commit = \"90d\"\nsweep_interval = \"90s\"").unwrap().describe();
        assert!(shown.contains("content_after_commit = \"90d\"") && shown.contains("\"90s\""), "{shown}");
        assert!(shown.contains("raw_results_after_commit = \"forever\""), "{shown}");
    }
}
