//! The `x-ratelimit-reset-requests` / `x-ratelimit-reset-tokens` headers, read when a 429
//! carries no `retry-after`: OpenAI and Groq send them as a duration such as `2m59.56s`,
//! `7.66s` or `120ms` (docs/PROVIDERS.md, "OpenAI-compatible batch platforms").

use std::time::Duration;

use reqwest::header::HeaderMap;

/// The longest reset among the exhausted limits (`x-ratelimit-remaining-*: 0`), else the
/// longest given; `None` when no reset header can be read.
pub(super) fn reset_delay(headers: &HeaderMap) -> Option<Duration> {
    let text = |name: &str| headers.get(name).and_then(|v| v.to_str().ok()).map(str::trim);
    let limits = ["requests", "tokens"].map(|kind| {
        let reset = text(&format!("x-ratelimit-reset-{kind}")).and_then(parse_duration);
        let exhausted = text(&format!("x-ratelimit-remaining-{kind}")).is_some_and(|v| v == "0");
        (reset, exhausted)
    });
    let exhausted = limits.iter().filter(|(_, e)| *e).filter_map(|(r, _)| *r).max();
    exhausted.or_else(|| limits.iter().filter_map(|(r, _)| *r).max())
}

/// `1h2m3.5s`, `250ms`, `0s`, or a bare number of seconds. Anything else is `None`.
pub(super) fn parse_duration(text: &str) -> Option<Duration> {
    if let Ok(secs) = text.parse::<f64>() {
        return Duration::try_from_secs_f64(secs).ok();
    }
    if text.is_empty() {
        return None;
    }
    let mut total = 0.0f64;
    let mut rest = text;
    while !rest.is_empty() {
        let number_len = rest.find(|c: char| !(c.is_ascii_digit() || c == '.'))?;
        if number_len == 0 {
            return None;
        }
        let value: f64 = rest[..number_len].parse().ok()?;
        rest = &rest[number_len..];
        let unit_len = rest.find(|c: char| c.is_ascii_digit() || c == '.').unwrap_or(rest.len());
        let scale = match &rest[..unit_len] {
            "h" => 3600.0,
            "m" => 60.0,
            "s" => 1.0,
            "ms" => 1e-3,
            "us" | "µs" => 1e-6,
            "ns" => 1e-9,
            _ => return None,
        };
        total += value * scale;
        rest = &rest[unit_len..];
    }
    Duration::try_from_secs_f64(total).ok()
}

#[cfg(test)]
mod tests {
    use reqwest::header::{HeaderName, HeaderValue};

    use super::*;

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (k, v) in pairs {
            map.insert(HeaderName::from_bytes(k.as_bytes()).unwrap(), HeaderValue::from_str(v).unwrap());
        }
        map
    }

    #[test]
    fn durations_in_the_forms_providers_send() {
        assert_eq!(parse_duration("2m59.56s"), Some(Duration::from_millis(179_560)));
        assert_eq!(parse_duration("7.66s"), Some(Duration::from_millis(7660)));
        assert_eq!(parse_duration("120ms"), Some(Duration::from_millis(120)));
        assert_eq!(parse_duration("1h"), Some(Duration::from_secs(3600)));
        assert_eq!(parse_duration("3"), Some(Duration::from_secs(3)));
        for bad in ["", "s", "soon", "5 s", "1x", "-2s", "1.2.3s"] {
            assert_eq!(parse_duration(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn the_exhausted_limit_decides() {
        let both = headers(&[
            ("x-ratelimit-remaining-requests", "12"),
            ("x-ratelimit-reset-requests", "2m59.56s"),
            ("x-ratelimit-remaining-tokens", "0"),
            ("x-ratelimit-reset-tokens", "7.66s"),
        ]);
        assert_eq!(reset_delay(&both), Some(Duration::from_millis(7660)));
        let unknown = headers(&[("x-ratelimit-reset-requests", "2s"), ("x-ratelimit-reset-tokens", "5s")]);
        assert_eq!(reset_delay(&unknown), Some(Duration::from_secs(5)));
        assert_eq!(reset_delay(&headers(&[("x-ratelimit-reset-tokens", "later")])), None);
        assert_eq!(reset_delay(&HeaderMap::new()), None);
    }
}
