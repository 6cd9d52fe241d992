//! What `CreateModelInvocationJob` refuses, checked when the config is read, so a setting
//! Bedrock would refuse on every create stops `config check` and start-up (exit 78) with the
//! rule instead of failing every extraction later. The constraints are the service model's
//! (botocore `bedrock` service-2.json; the same shapes in the SDKs):
//! `ModelInvocationJobTimeoutDurationInHours` 24–168, `RoleArn`
//! `arn:aws(-[^:]+)?:iam::([0-9]{12})?:role/.+`, `S3Uri` (below, 1–1024 characters).

use std::sync::LazyLock;

use regex::Regex;

pub const MIN_TIMEOUT_HOURS: u32 = 24;
pub const MAX_TIMEOUT_HOURS: u32 = 168;
const MAX_S3_URI: usize = 1024;

/// The service model's `S3Uri` pattern, matched against the whole URI.
const S3_URI_PATTERN: &str = r"^s3://[a-z0-9][-.a-z0-9]{1,61}(?:/[-!_*'().a-z0-9A-Z]+(?:/[-!_*'().a-z0-9A-Z]+)*)?/?$";
/// `RoleArn` with the account required: the model lets it be empty, but IAM has no role
/// without an account, so such an ARN can only fail when Bedrock assumes it.
const ROLE_ARN_PATTERN: &str = r"^arn:aws(-[^:]+)?:iam::[0-9]{12}:role/.+$";

// Constants the tests compile; were one ever broken, everything would be refused, not passed.
static S3_URI: LazyLock<Option<Regex>> = LazyLock::new(|| Regex::new(S3_URI_PATTERN).ok());
static ROLE_ARN: LazyLock<Option<Regex>> = LazyLock::new(|| Regex::new(ROLE_ARN_PATTERN).ok());

pub fn timeout_hours(hours: u32) -> Result<(), String> {
    if (MIN_TIMEOUT_HOURS..=MAX_TIMEOUT_HOURS).contains(&hours) {
        return Ok(());
    }
    Err(format!(
        "{hours} is outside the {MIN_TIMEOUT_HOURS}–{MAX_TIMEOUT_HOURS} hours Bedrock takes as timeoutDurationInHours"
    ))
}

pub fn role_arn(arn: &str) -> Result<(), String> {
    if ROLE_ARN.as_ref().is_some_and(|r| r.is_match(arn)) {
        return Ok(());
    }
    Err(format!("{arn:?} is not an IAM role ARN with a 12-digit account (arn:aws:iam::<account>:role/<name>)"))
}

/// A configured prefix; the keys the adapter adds under it (`commitpoint-<batch key>/`,
/// `records.jsonl`) stay inside the pattern, so the URIs it sends do too.
pub fn s3_uri(uri: &str) -> Result<(), String> {
    if uri.len() <= MAX_S3_URI && S3_URI.as_ref().is_some_and(|r| r.is_match(uri)) {
        return Ok(());
    }
    Err(format!(
        "{uri:?} is outside Bedrock's S3 URI pattern: s3://bucket/prefix/ with a lower-case bucket name and \
         path segments of letters, digits and -!_*'(). only, at most {MAX_S3_URI} characters"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timeouts_within_a_day_and_a_week() {
        assert!(timeout_hours(24).is_ok() && timeout_hours(168).is_ok() && timeout_hours(72).is_ok());
        for refused in [0, 1, 23, 169, 720] {
            let reason = timeout_hours(refused).unwrap_err();
            assert!(reason.contains("24–168"), "{reason}");
        }
    }

    #[test]
    fn role_arns_need_an_account_and_a_role() {
        assert!(role_arn("arn:aws:iam::123456789012:role/batch").is_ok());
        assert!(role_arn("arn:aws-cn:iam::123456789012:role/path/batch").is_ok());
        for refused in [
            "arn:aws:iam:::role/batch",
            "arn:aws:iam::12345:role/batch",
            "arn:aws:iam::123456789012:user/batch",
            "arn:aws:iam::123456789012:role/",
            "batch",
        ] {
            assert!(role_arn(refused).is_err(), "{refused}");
        }
    }

    #[test]
    fn s3_uris_follow_the_service_pattern() {
        for ok in ["s3://cp-batch-in/commitpoint/in/", "s3://bucket", "s3://my.bucket/a/b", "s3://b1/x_(1)!*'.-/"] {
            assert!(s3_uri(ok).is_ok(), "{ok}");
        }
        for refused in [
            "s3://Bucket/x/",
            "s3://b/x/",
            "s3://bucket/a b/",
            "s3://bucket/a//b/",
            "s3://bucket/a=b/",
            "s3://-bucket/x/",
            "https://bucket/x/",
        ] {
            assert!(s3_uri(refused).is_err(), "{refused}");
        }
        assert!(s3_uri(&format!("s3://bucket/{}", "a".repeat(1020))).is_err(), "over 1024 characters");
        assert!(s3_uri("s3://bucket/p/commitpoint-cpb-0123abcd/records.jsonl").is_ok(), "what the adapter sends");
    }
}
