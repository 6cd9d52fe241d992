//! Console sessions: after the token is checked once (`POST /ui/login`), a cookie carries
//! who the caller is and until when, signed with HMAC-SHA256 under a key derived from the
//! store's own secret, the tokens in force and this process's epoch (so a changed token,
//! a reload that rotates one, or a restart ends the sessions made before; `ended.rs` ends
//! single sessions at logout). Every form carries a CSRF token bound to the session.

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use hmac::{Hmac, KeyInit, Mac};
use sha2::Sha256;

use crate::http::access::Caller;

type HmacSha256 = Hmac<Sha256>;

pub(super) const COOKIE: &str = "cp_console";
/// The login form's own cookie: a signed nonce its CSRF token is bound to, so even the
/// one post made before a session exists carries a token a cross-site form cannot know.
pub(super) const LOGIN_COOKIE: &str = "cp_login";
const LOGIN_SECONDS: u64 = 3600;
/// How long a session lasts; the operator logs in again after it.
pub(super) const SESSION_SECONDS: u64 = 8 * 3600;

/// The signing key of one server.
#[derive(Clone)]
pub(super) struct SessionKey([u8; 32]);

impl std::fmt::Debug for SessionKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SessionKey(<redacted>)")
    }
}

/// A verified session.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Session {
    pub(super) caller: Caller,
    /// Random, per login: what the CSRF token is bound to.
    pub(super) id: String,
    pub(super) expires_ms: u64,
}

impl SessionKey {
    /// `store_secret` is the store's derived console key, `tokens` the access policy's
    /// fingerprint, `epoch` this process's (`ended.rs`).
    pub(super) fn new(store_secret: [u8; 32], tokens: [u8; 32], epoch: [u8; 16]) -> Self {
        let mut hasher = blake3::Hasher::new_keyed(&store_secret);
        hasher.update(b"commitpoint console session\0");
        hasher.update(&tokens);
        hasher.update(&epoch);
        Self(*hasher.finalize().as_bytes())
    }

    fn mac(&self, purpose: &[u8], data: &[u8]) -> HmacSha256 {
        // HMAC takes a key of any length: this cannot fail.
        let mut mac = <HmacSha256 as KeyInit>::new_from_slice(&self.0).unwrap_or_else(|_| unreachable!());
        mac.update(purpose);
        mac.update(data);
        mac
    }

    /// A new session for `caller` from `now_ms`: the cookie value and the session.
    pub(super) fn issue(&self, caller: Caller, now_ms: u64) -> (String, Session) {
        let id: [u8; 16] = rand::random();
        let session = Session { caller, id: hex(&id), expires_ms: now_ms + SESSION_SECONDS * 1000 };
        let (role, tenant) = match &session.caller {
            Caller::Open => ("open", ""),
            Caller::Admin => ("admin", ""),
            Caller::Tenant(t) => ("tenant", t.as_str()),
            // The login refuses worker tokens; were one issued, `verify` would not take it.
            Caller::Worker(_) => ("worker", ""),
        };
        let payload = format!("{role}|{tenant}|{}|{}", session.expires_ms, session.id);
        let tag = self.mac(b"session\0", payload.as_bytes()).finalize().into_bytes();
        (format!("{}.{}", URL_SAFE_NO_PAD.encode(payload), URL_SAFE_NO_PAD.encode(tag)), session)
    }

    /// The session a cookie value holds, if its signature holds and it has not expired.
    pub(super) fn verify(&self, value: &str, now_ms: u64) -> Option<Session> {
        let (payload, tag) = value.split_once('.')?;
        let payload = URL_SAFE_NO_PAD.decode(payload).ok()?;
        let tag = URL_SAFE_NO_PAD.decode(tag).ok()?;
        // Constant-time comparison inside.
        self.mac(b"session\0", &payload).verify_slice(&tag).ok()?;
        let text = String::from_utf8(payload).ok()?;
        let mut parts = text.split('|');
        let (role, tenant, expires, id) = (parts.next()?, parts.next()?, parts.next()?, parts.next()?);
        let expires_ms: u64 = expires.parse().ok()?;
        if parts.next().is_some() || expires_ms <= now_ms {
            return None;
        }
        let caller = match role {
            "open" => Caller::Open,
            "admin" => Caller::Admin,
            "tenant" => Caller::Tenant(tenant.to_string()),
            _ => return None,
        };
        Some(Session { caller, id: id.to_string(), expires_ms })
    }

    /// A login form's nonce cookie value (valid for an hour) and the form's CSRF token.
    pub(super) fn issue_login(&self, now_ms: u64) -> (String, String) {
        let nonce: [u8; 16] = rand::random();
        let payload = format!("{}|{}", now_ms + LOGIN_SECONDS * 1000, hex(&nonce));
        let tag = self.mac(b"login\0", payload.as_bytes()).finalize().into_bytes();
        let value = format!("{}.{}", URL_SAFE_NO_PAD.encode(&payload), URL_SAFE_NO_PAD.encode(tag));
        (value, self.login_csrf(&hex(&nonce)))
    }

    /// Whether a login post's CSRF token belongs to the nonce cookie it came with.
    pub(super) fn login_csrf_matches(&self, cookie: &str, presented: &str, now_ms: u64) -> bool {
        let Some(nonce) = self.open_login(cookie, now_ms) else { return false };
        let Some(bytes) = unhex(presented) else { return false };
        self.mac(b"login-csrf\0", nonce.as_bytes()).verify_slice(&bytes).is_ok()
    }

    fn open_login(&self, value: &str, now_ms: u64) -> Option<String> {
        let (payload, tag) = value.split_once('.')?;
        let payload = URL_SAFE_NO_PAD.decode(payload).ok()?;
        let tag = URL_SAFE_NO_PAD.decode(tag).ok()?;
        self.mac(b"login\0", &payload).verify_slice(&tag).ok()?;
        let text = String::from_utf8(payload).ok()?;
        let (expires, nonce) = text.split_once('|')?;
        (expires.parse::<u64>().ok()? > now_ms).then(|| nonce.to_string())
    }

    fn login_csrf(&self, nonce: &str) -> String {
        hex(&self.mac(b"login-csrf\0", nonce.as_bytes()).finalize().into_bytes())
    }

    /// The CSRF token of a session.
    pub(super) fn csrf(&self, session: &Session) -> String {
        hex(&self.mac(b"csrf\0", session.id.as_bytes()).finalize().into_bytes())
    }

    /// Whether `presented` is the session's CSRF token (constant time).
    pub(super) fn csrf_matches(&self, session: &Session, presented: &str) -> bool {
        let Some(bytes) = unhex(presented) else { return false };
        self.mac(b"csrf\0", session.id.as_bytes()).verify_slice(&bytes).is_ok()
    }
}

/// The `Set-Cookie` value for a session.
pub(super) fn set_cookie(value: &str) -> String {
    // No `Secure`: the console is served over plain HTTP on loopback, where browsers
    // would drop a Secure cookie; put TLS in front and the proxy can add it.
    format!("{COOKIE}={value}; Path=/ui; HttpOnly; SameSite=Strict; Max-Age={SESSION_SECONDS}")
}

/// The `Set-Cookie` value of a login form's nonce.
pub(super) fn set_login_cookie(value: &str) -> String {
    format!("{LOGIN_COOKIE}={value}; Path=/ui/login; HttpOnly; SameSite=Strict; Max-Age={LOGIN_SECONDS}")
}

/// The `Set-Cookie` value that ends a session.
pub(super) fn clear_cookie() -> String {
    format!("{COOKIE}=; Path=/ui; HttpOnly; SameSite=Strict; Max-Age=0")
}

/// The value of cookie `name` among a request's `Cookie` headers.
pub(super) fn cookie_value<'a>(headers: impl Iterator<Item = &'a str>, name: &str) -> Option<&'a str> {
    headers
        .flat_map(|h| h.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(n, _)| *n == name)
        .map(|(_, value)| value)
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex(text: &str) -> Option<Vec<u8>> {
    if !text.len().is_multiple_of(2) || !text.is_ascii() {
        return None;
    }
    (0..text.len()).step_by(2).map(|i| u8::from_str_radix(&text[i..i + 2], 16).ok()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sessions_verify_only_as_issued() {
        let key = SessionKey::new([7; 32], [1; 32], [0; 16]);
        let (cookie, session) = key.issue(Caller::Tenant("acme".into()), 1_000);
        assert_eq!(key.verify(&cookie, 2_000), Some(session.clone()));
        assert_eq!(key.verify(&cookie, session.expires_ms), None, "expired");
        let other_tokens = SessionKey::new([7; 32], [2; 32], [0; 16]);
        assert_eq!(other_tokens.verify(&cookie, 2_000), None, "a changed token ends the session");
        let restarted = SessionKey::new([7; 32], [1; 32], [1; 16]);
        assert_eq!(restarted.verify(&cookie, 2_000), None, "a new epoch ends the session");
        let mut forged = cookie.clone();
        forged.insert(0, 'x');
        assert_eq!(key.verify(&forged, 2_000), None);
        let (payload, tag) = cookie.split_once('.').unwrap();
        let admin = URL_SAFE_NO_PAD.encode(
            String::from_utf8(URL_SAFE_NO_PAD.decode(payload).unwrap()).unwrap().replacen("tenant|acme", "admin|", 1),
        );
        assert_eq!(key.verify(&format!("{admin}.{tag}"), 2_000), None, "the role cannot be edited");
        let csrf = key.csrf(&session);
        assert!(key.csrf_matches(&session, &csrf));
        assert!(!key.csrf_matches(&session, ""));
        assert!(!key.csrf_matches(&session, &csrf[2..]));
        let (_, other) = key.issue(Caller::Admin, 1_000);
        assert!(!key.csrf_matches(&other, &csrf), "a token is bound to its session");
    }

    #[test]
    fn login_tokens_belong_to_their_nonce() {
        let key = SessionKey::new([7; 32], [1; 32], [0; 16]);
        let (cookie, csrf) = key.issue_login(1_000);
        assert!(key.login_csrf_matches(&cookie, &csrf, 2_000));
        assert!(!key.login_csrf_matches(&cookie, &csrf, 1_000 + LOGIN_SECONDS * 1000), "expired");
        let (other, _) = key.issue_login(1_000);
        assert!(!key.login_csrf_matches(&other, &csrf, 2_000));
        assert!(!key.login_csrf_matches(&cookie, "", 2_000));
        assert_eq!(key.verify(&cookie, 2_000), None, "a login nonce is no session");
    }

    #[test]
    fn the_cookie_is_found_among_others() {
        let headers = ["a=1; cp_console=abc.def", "b=2"];
        assert_eq!(cookie_value(headers.into_iter(), COOKIE), Some("abc.def"));
        assert_eq!(cookie_value(["cp_consolex=1"].into_iter(), COOKIE), None);
    }
}
