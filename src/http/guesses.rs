//! Wrong tokens and failed console logins, counted per client address. A few mistakes are
//! free; after that each further one shuts the address out for twice as long as the last
//! (1 s, 2 s, … up to a minute), so a guesser that managed ~1,400 tries a second on one
//! connection gets about one a minute. While shut out, a token from that address is not
//! checked at all (429 with `Retry-After`): checking it would answer the guess.
//!
//! Every client behind one address shares its count: on loopback that is every local
//! client, and behind a proxy every client of the proxy. A stale worker hammering with an
//! old token therefore holds the others back for up to a minute at a time; the log names
//! the address, so it can be found.

use std::collections::HashMap;
use std::net::{IpAddr, Ipv6Addr};
use std::sync::Mutex;
use std::time::Duration;

use super::log_limit::LogLimit;
use crate::domain::metric_names as names;

/// Mistakes an address may make before the backoff starts, unless `[access]
/// wrong_token_allowance` says otherwise (a fuzzer that sends wrong tokens on purpose from
/// the address its valid requests come from needs more).
pub(crate) const DEFAULT_ALLOWANCE: u32 = 10;
/// An address whose last mistake is this old starts again from nothing.
const FORGET_AFTER_MS: u64 = 10 * 60 * 1000;
const FIRST_BACKOFF_MS: u64 = 1000;
const MAX_BACKOFF_MS: u64 = 60 * 1000;
/// Addresses tracked at once; past it the forgotten are dropped, and if none are, new
/// addresses share one entry (so a flood of addresses cannot grow memory or escape the count).
const MAX_CLIENTS: usize = 65_536;

/// Refusals are logged at most once per interval, with the count of the rest.
static REFUSALS: LogLimit = LogLimit::new(Duration::from_secs(10));

/// Where a guess was made, for the log and the metric's `reason` label.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Via {
    /// A bearer token on an API call.
    Token,
    /// The console's login form.
    Login,
}

impl Via {
    fn reason(self) -> &'static str {
        match self {
            Via::Token => "bad_token",
            Via::Login => "bad_login",
        }
    }
}

#[derive(Debug, Clone, Copy, Default)]
struct Client {
    failures: u32,
    last_failure_ms: u64,
    blocked_until_ms: u64,
}

#[derive(Debug)]
pub(crate) struct Guesses {
    allowance: u32,
    clients: Mutex<HashMap<IpAddr, Client>>,
}

impl Default for Guesses {
    fn default() -> Self {
        Self::new(DEFAULT_ALLOWANCE)
    }
}

/// The unit an address is counted in: an IPv6 client can pick any address of its /64.
fn key(who: Option<IpAddr>) -> IpAddr {
    match who {
        Some(IpAddr::V6(v6)) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => {
                let prefix = u128::from(v6) & !((1u128 << 64) - 1);
                IpAddr::V6(Ipv6Addr::from(prefix))
            }
        },
        Some(v4) => v4,
        None => IpAddr::V6(Ipv6Addr::UNSPECIFIED),
    }
}

impl Guesses {
    pub(crate) fn new(allowance: u32) -> Self {
        Self { allowance, clients: Mutex::default() }
    }

    /// How long `who` must still wait before a token of theirs is checked, if at all.
    pub(crate) fn shut_out(&self, who: Option<IpAddr>, now_ms: u64) -> Option<Duration> {
        let clients = self.clients.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let wait = clients.get(&key(who)).map(|c| c.blocked_until_ms.saturating_sub(now_ms)).filter(|w| *w > 0)?;
        drop(clients);
        metrics::counter!(names::AUTH_REFUSALS_TOTAL, "reason" => "rate_limited").increment(1);
        REFUSALS.warn(|suppressed| {
            tracing::warn!(client = %key(who), retry_after_ms = wait, suppressed, "authentication refused: too many wrong tokens from this address");
        });
        Some(Duration::from_millis(wait))
    }

    /// Counts a wrong token or login from `who`, logs it (rate-limited) and counts it in
    /// the metric.
    pub(crate) fn failed(&self, who: Option<IpAddr>, via: Via, now_ms: u64) {
        let mut clients = self.clients.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let mut key = key(who);
        if clients.len() >= MAX_CLIENTS && !clients.contains_key(&key) {
            clients.retain(|_, c| now_ms.saturating_sub(c.last_failure_ms) < FORGET_AFTER_MS);
            if clients.len() >= MAX_CLIENTS {
                key = IpAddr::V6(Ipv6Addr::UNSPECIFIED);
            }
        }
        let client = clients.entry(key).or_default();
        if now_ms.saturating_sub(client.last_failure_ms) >= FORGET_AFTER_MS {
            *client = Client::default();
        }
        client.failures = client.failures.saturating_add(1);
        client.last_failure_ms = now_ms;
        if let Some(over) = client.failures.checked_sub(self.allowance.saturating_add(1)) {
            let backoff = FIRST_BACKOFF_MS.saturating_mul(1u64 << over.min(16)).min(MAX_BACKOFF_MS);
            client.blocked_until_ms = now_ms + backoff;
        }
        let failures = client.failures;
        drop(clients);
        metrics::counter!(names::AUTH_REFUSALS_TOTAL, "reason" => via.reason()).increment(1);
        REFUSALS.warn(|suppressed| {
            tracing::warn!(client = %key, reason = via.reason(), failures, suppressed, "authentication refused");
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_backoff_starts_after_the_free_mistakes_and_doubles() {
        let guesses = Guesses::default();
        let who = Some("192.0.2.7".parse().unwrap());
        for _ in 0..DEFAULT_ALLOWANCE {
            guesses.failed(who, Via::Token, 1_000);
        }
        assert_eq!(guesses.shut_out(who, 1_000), None);
        guesses.failed(who, Via::Token, 1_000);
        assert_eq!(guesses.shut_out(who, 1_000), Some(Duration::from_secs(1)));
        assert_eq!(guesses.shut_out(who, 2_000), None, "over after a second");
        guesses.failed(who, Via::Login, 2_000);
        assert_eq!(guesses.shut_out(who, 2_000), Some(Duration::from_secs(2)));
        assert_eq!(guesses.shut_out(Some("192.0.2.8".parse().unwrap()), 2_000), None, "per address");
        guesses.failed(who, Via::Token, 2_000 + FORGET_AFTER_MS);
        assert_eq!(guesses.shut_out(who, 2_000 + FORGET_AFTER_MS), None, "forgotten after a quiet while");
    }

    #[test]
    fn an_ipv6_client_counts_by_its_64_bit_prefix() {
        assert_eq!(key(Some("2001:db8::1".parse().unwrap())), key(Some("2001:db8::ffff:1".parse().unwrap())));
        assert_eq!(key(Some("::ffff:192.0.2.1".parse().unwrap())), "192.0.2.1".parse::<IpAddr>().unwrap());
    }
}
