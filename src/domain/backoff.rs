//! How long to wait before trying again when the other side gave no hint: shared by
//! provider calls and outbox deliveries.

use std::time::Duration;

const BACKOFF_BASE: Duration = Duration::from_millis(500);

/// Exponential backoff with full jitter: uniform in [0, min(cap, base·2^attempt)].
pub fn backoff_delay(attempt: u32, cap: Duration) -> Duration {
    let ceiling = BACKOFF_BASE.saturating_mul(1u32.checked_shl(attempt.min(20)).unwrap_or(u32::MAX)).min(cap);
    let millis = u64::try_from(ceiling.as_millis()).unwrap_or(u64::MAX);
    Duration::from_millis(rand::random_range(0..=millis))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_is_jittered_and_capped() {
        let cap = Duration::from_secs(30);
        for attempt in 0..40 {
            let ceiling = BACKOFF_BASE.saturating_mul(1 << attempt.min(20)).min(cap);
            assert!(backoff_delay(attempt, cap) <= ceiling);
        }
        let samples: std::collections::BTreeSet<_> = (0..50).map(|_| backoff_delay(6, cap)).collect();
        assert!(samples.len() > 10, "full jitter spreads the delays");
    }
}
