//! Reading a provider's retry signals and computing our own backoff.
//!
//! `x-should-retry: true` makes an answer retryable whatever its status. `false` only
//! tells an SDK not to repeat that request on its own: it says nothing about whether the
//! request was valid, so the class still comes from the status and the error code (a 503
//! with `false` is an outage, not a bad request). A server delay comes from `retry-after-ms` (milliseconds), then `Retry-After`
//! as seconds, then as an HTTP date. Without one we back off exponentially with full
//! jitter, capped.

use std::time::{Duration, SystemTime};

use reqwest::header::HeaderMap;

use super::ErrorClass;

/// The delay the server asked for, if any. `now` makes HTTP dates testable.
pub fn parse_retry_after(headers: &HeaderMap, now: SystemTime) -> Option<Duration> {
    let text = |name: &str| headers.get(name).and_then(|v| v.to_str().ok()).map(str::trim);
    // try_from: a value past Duration's range (`1e300`) is as unusable as a negative one.
    if let Some(ms) = text("retry-after-ms").and_then(|v| v.parse::<f64>().ok())
        && let Ok(delay) = Duration::try_from_secs_f64(ms / 1000.0)
    {
        return Some(delay);
    }
    let value = text("retry-after")?;
    if let Ok(secs) = value.parse::<f64>() {
        return Duration::try_from_secs_f64(secs).ok();
    }
    let at = httpdate::parse_http_date(value).ok()?;
    Some(at.duration_since(now).unwrap_or(Duration::ZERO))
}

/// Sorts an HTTP failure into a class. `error_code` is the provider's machine code or
/// type from the error body, used to tell quota exhaustion from a rate limit.
pub fn classify_status(status: u16, headers: &HeaderMap, error_code: Option<&str>) -> ErrorClass {
    // Azure answers a full quota of files without expiry with 400 `quotaExceeded`
    // (Azure/azure-sdk-for-java#47401): spent, like OpenAI's quota, not a bad request.
    let budget =
        error_code.is_some_and(|c| matches!(c, "insufficient_quota" | "billing_hard_limit_reached" | "quotaExceeded"));
    let should_retry = headers.get("x-should-retry").and_then(|v| v.to_str().ok());
    match (status, should_retry) {
        (401 | 403, _) => ErrorClass::Auth,
        (400 | 402 | 429, _) if budget => ErrorClass::Budget,
        (429 | 529, _) => ErrorClass::RateLimited,
        (_, Some("true")) => ErrorClass::Transient,
        (404, _) => ErrorClass::Gone,
        (408 | 409, _) => ErrorClass::Transient,
        (500.., _) => ErrorClass::Transient,
        _ => ErrorClass::InvalidRequest,
    }
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
    fn retry_after_precedence_and_formats() {
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000_000);
        let both = headers(&[("retry-after-ms", "1500"), ("retry-after", "30")]);
        assert_eq!(parse_retry_after(&both, now), Some(Duration::from_millis(1500)));
        assert_eq!(parse_retry_after(&headers(&[("retry-after", "7")]), now), Some(Duration::from_secs(7)));
        let date = httpdate::fmt_http_date(now + Duration::from_secs(90));
        assert_eq!(parse_retry_after(&headers(&[("retry-after", &date)]), now), Some(Duration::from_secs(90)));
        let past = httpdate::fmt_http_date(now - Duration::from_secs(90));
        assert_eq!(parse_retry_after(&headers(&[("retry-after", &past)]), now), Some(Duration::ZERO));
        assert_eq!(parse_retry_after(&headers(&[("retry-after", "soon")]), now), None);
        assert_eq!(parse_retry_after(&headers(&[("retry-after", "-3")]), now), None);
        assert_eq!(parse_retry_after(&HeaderMap::new(), now), None);
    }

    #[test]
    fn classification() {
        let none = HeaderMap::new();
        assert_eq!(classify_status(429, &none, Some("rate_limit_exceeded")), ErrorClass::RateLimited);
        assert_eq!(classify_status(429, &none, Some("insufficient_quota")), ErrorClass::Budget);
        assert_eq!(classify_status(400, &none, Some("quotaExceeded")), ErrorClass::Budget);
        assert_eq!(classify_status(400, &none, Some("invalid_value")), ErrorClass::InvalidRequest);
        assert_eq!(classify_status(529, &none, None), ErrorClass::RateLimited);
        assert_eq!(classify_status(503, &none, None), ErrorClass::Transient);
        assert_eq!(classify_status(401, &none, None), ErrorClass::Auth);
        assert_eq!(classify_status(403, &none, None), ErrorClass::Auth);
        assert_eq!(classify_status(404, &none, None), ErrorClass::Gone);
        assert_eq!(classify_status(400, &none, None), ErrorClass::InvalidRequest);
        assert_eq!(classify_status(400, &headers(&[("x-should-retry", "true")]), None), ErrorClass::Transient);
    }

    #[test]
    fn should_retry_false_does_not_make_a_request_invalid() {
        let no = headers(&[("x-should-retry", "false")]);
        assert_eq!(classify_status(503, &no, None), ErrorClass::Transient);
        assert_eq!(classify_status(500, &no, None), ErrorClass::Transient);
        assert_eq!(classify_status(429, &no, Some("rate_limit_exceeded")), ErrorClass::RateLimited);
        assert_eq!(classify_status(429, &no, Some("insufficient_quota")), ErrorClass::Budget);
        assert_eq!(classify_status(404, &no, None), ErrorClass::Gone);
        assert_eq!(classify_status(401, &no, None), ErrorClass::Auth);
        assert_eq!(classify_status(400, &no, Some("invalid_value")), ErrorClass::InvalidRequest);
    }
}
