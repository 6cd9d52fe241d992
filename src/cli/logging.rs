//! How log lines look on stderr: chosen from the environment before anything logs.
//!
//! Under systemd, journald stamps and stores every line itself, so our own timestamp is
//! noise there and ANSI colour is garbage in `journalctl`. `JOURNAL_STREAM` alone is not
//! proof: a child started from a journald-attached shell inherits the variable but may have
//! its stderr redirected, so systemd.exec(5) says to compare it with stderr's device and
//! inode.

use std::io::IsTerminal;
use std::os::fd::AsFd;
use std::os::unix::fs::MetadataExt;

/// Selects the format: `text` (the default) or `json` (one object per line, for Loki/ELK).
pub(crate) const FORMAT_VAR: &str = "COMMITPOINT_LOG_FORMAT";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Format {
    Text { timestamps: bool, ansi: bool },
    Json,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub(crate) enum Error {
    #[error("{FORMAT_VAR}={0:?} is not a log format: use \"text\" or \"json\"")]
    UnknownFormat(String),
}

/// What the choice depends on, read once from the process.
#[derive(Debug, Clone, Default)]
pub(crate) struct Environment {
    pub format: Option<String>,
    pub journal_stream: Option<String>,
    /// stderr's (device, inode), when it can be stat'ed.
    pub stderr_id: Option<(u64, u64)>,
    pub stderr_is_terminal: bool,
}

impl Environment {
    pub(crate) fn of_process() -> Self {
        Self {
            format: std::env::var(FORMAT_VAR).ok(),
            journal_stream: std::env::var("JOURNAL_STREAM").ok(),
            stderr_id: stderr_id(),
            stderr_is_terminal: std::io::stderr().is_terminal(),
        }
    }
}

fn stderr_id() -> Option<(u64, u64)> {
    let fd = std::io::stderr().as_fd().try_clone_to_owned().ok()?;
    let meta = std::fs::File::from(fd).metadata().ok()?;
    Some((meta.dev(), meta.ino()))
}

/// An explicit `json` wins everywhere; otherwise text, bare when journald holds stderr.
pub(crate) fn choose(env: &Environment) -> Result<Format, Error> {
    match env.format.as_deref().map(str::trim) {
        None | Some("") | Some("text") => {}
        Some("json") => return Ok(Format::Json),
        Some(other) => return Err(Error::UnknownFormat(other.to_owned())),
    }
    if stderr_is_journal(env.journal_stream.as_deref(), env.stderr_id) {
        return Ok(Format::Text { timestamps: false, ansi: false });
    }
    Ok(Format::Text { timestamps: true, ansi: env.stderr_is_terminal })
}

/// `JOURNAL_STREAM` is `DEVICE:INODE` in decimal (systemd.exec(5)).
fn stderr_is_journal(journal_stream: Option<&str>, stderr_id: Option<(u64, u64)>) -> bool {
    let (Some(value), Some(actual)) = (journal_stream, stderr_id) else {
        return false;
    };
    let Some((dev, ino)) = value.split_once(':') else {
        return false;
    };
    match (dev.parse::<u64>(), ino.parse::<u64>()) {
        (Ok(dev), Ok(ino)) => (dev, ino) == actual,
        _ => false,
    }
}

/// Logs and traces filter apart: `COMMITPOINT_LOG` (`filter`) never hides a trace span, and
/// trace spans, at `trace` level, stay out of log lines at the usual levels. Without
/// `traces` their callsites are disabled, so they cost nothing.
pub(crate) fn subscriber(
    format: Format,
    filter: tracing_subscriber::EnvFilter,
    traces: Option<crate::app::telemetry::TraceLayer>,
) -> impl tracing::Subscriber + Send + Sync {
    use tracing_subscriber::Layer;
    use tracing_subscriber::layer::SubscriberExt;
    type Traced =
        tracing_subscriber::layer::Layered<Option<crate::app::telemetry::TraceLayer>, tracing_subscriber::Registry>;
    type Fmt = Box<dyn Layer<Traced> + Send + Sync>;
    let base = tracing_subscriber::fmt::layer().with_writer(std::io::stderr);
    let logs: Fmt = match format {
        Format::Json => Box::new(base.json()),
        Format::Text { timestamps: true, ansi } => Box::new(base.with_ansi(ansi)),
        Format::Text { timestamps: false, ansi } => Box::new(base.with_ansi(ansi).without_time()),
    };
    tracing_subscriber::registry().with(traces).with(logs.with_filter(filter))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn without_export_trace_spans_are_disabled_and_logs_still_flow() {
        let filter = tracing_subscriber::EnvFilter::new("info");
        tracing::subscriber::with_default(subscriber(Format::Json, filter, None), || {
            let span = tracing::trace_span!(target: crate::domain::trace::TARGET, "intake");
            assert!(span.is_disabled());
            assert!(tracing::enabled!(tracing::Level::INFO));
            assert!(!tracing::enabled!(tracing::Level::DEBUG));
        });
    }

    fn env(format: Option<&str>, journal: Option<&str>, id: Option<(u64, u64)>, tty: bool) -> Environment {
        Environment {
            format: format.map(str::to_owned),
            journal_stream: journal.map(str::to_owned),
            stderr_id: id,
            stderr_is_terminal: tty,
        }
    }

    const PLAIN: Format = Format::Text { timestamps: true, ansi: false };
    const BARE: Format = Format::Text { timestamps: false, ansi: false };

    #[test]
    fn a_terminal_gets_colour_and_a_pipe_does_not() {
        assert_eq!(choose(&env(None, None, Some((1, 2)), true)), Ok(Format::Text { timestamps: true, ansi: true }));
        assert_eq!(choose(&env(None, None, Some((1, 2)), false)), Ok(PLAIN));
    }

    #[test]
    fn journald_on_stderr_drops_the_timestamp_and_colour() {
        assert_eq!(choose(&env(None, Some("8:1234"), Some((8, 1234)), true)), Ok(BARE));
        assert_eq!(choose(&env(Some("text"), Some("8:1234"), Some((8, 1234)), false)), Ok(BARE));
    }

    #[test]
    fn an_inherited_journal_stream_on_another_stderr_is_ignored() {
        assert_eq!(choose(&env(None, Some("8:1234"), Some((8, 9999)), false)), Ok(PLAIN));
        assert_eq!(choose(&env(None, Some("8:1234"), None, false)), Ok(PLAIN));
        assert_eq!(choose(&env(None, Some("garbage"), Some((8, 1234)), false)), Ok(PLAIN));
        assert_eq!(choose(&env(None, Some("8:x"), Some((8, 1234)), false)), Ok(PLAIN));
    }

    #[test]
    fn json_is_chosen_explicitly_even_under_journald() {
        assert_eq!(choose(&env(Some("json"), None, None, true)), Ok(Format::Json));
        assert_eq!(choose(&env(Some(" json "), Some("8:1"), Some((8, 1)), false)), Ok(Format::Json));
    }

    #[test]
    fn an_empty_value_is_the_default_and_an_unknown_one_is_refused() {
        assert_eq!(choose(&env(Some(""), None, None, false)), Ok(PLAIN));
        let err = choose(&env(Some("JSON-lines"), None, None, false));
        assert_eq!(err, Err(Error::UnknownFormat("JSON-lines".into())));
        let message = err.map(|_| ()).unwrap_err().to_string();
        assert!(message.contains("COMMITPOINT_LOG_FORMAT") && message.contains("json"), "{message}");
    }

    #[test]
    fn this_process_can_stat_its_stderr() {
        assert!(stderr_id().is_some());
    }
}
