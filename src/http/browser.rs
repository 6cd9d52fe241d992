//! What a web page may make this server do. A server without tokens on loopback trusts
//! every local process, but the operator's browser runs pages from anywhere on the same
//! machine (and, through `ssh -L`, on the operator's laptop): such a page may send simple
//! cross-site requests without asking, and a DNS name it controls can be rebound to
//! 127.0.0.1 so that its scripts read the answers too. So, on every request:
//!
//! * the `Host` must be a name of this server: a rebound name is refused, reads included;
//! * a state-changing request must not come from another site (`Origin`,
//!   `Sec-Fetch-Site`): that covers the bodyless admin posts as well as form posts;
//! * JSON bodies must say `application/json` (in `extract.rs`), which a page cannot send
//!   cross-site without a CORS preflight this server never grants;
//! * and, on a server without tokens, the calls that cost the most (backup, tenant
//!   erasure, pausing a provider) refuse anything that looks like a browser at all.
//!
//! Every answer also carries `Cache-Control: no-store` unless its handler set a policy
//! (`front.rs`, which runs these checks): nothing this server says should outlive the
//! moment in a shared cache or a disk cache.

use std::net::{IpAddr, SocketAddr};

use axum::extract::FromRequestParts;
use axum::http::request::Parts;
use axum::http::{HeaderMap, Method, Request, header};

use super::ApiError;
use super::conn::Peer;
use super::refusal::Refusal;
use crate::http::access::Caller;

/// The names the `Host` header may carry: loopback and the listen address by default,
/// plus `[server] allowed_hosts`.
#[derive(Debug, Clone)]
pub(crate) struct HostNames {
    listen: IpAddr,
    /// Lower-case, as configured: a name alone matches any port, `name:port` that port only.
    allowed: Vec<String>,
}

impl HostNames {
    pub(crate) fn new(listen: SocketAddr, allowed: &[String]) -> Self {
        Self { listen: listen.ip(), allowed: allowed.iter().map(|n| n.trim().to_ascii_lowercase()).collect() }
    }

    /// Whether `authority` (a `Host` value) names this server. An IP literal is never a
    /// rebinding (that needs a DNS name), so the addresses the client can reach us on are
    /// accepted whatever the port.
    fn allows(&self, authority: &str, reached: Option<IpAddr>) -> bool {
        // Compared without a lower-cased copy: this runs on every request.
        let authority = authority.trim();
        let Some(host) = host_part(authority) else { return false };
        let host = host.strip_suffix('.').unwrap_or(host);
        if host.eq_ignore_ascii_case("localhost") {
            return true;
        }
        if let Ok(ip) = host.trim_start_matches('[').trim_end_matches(']').parse::<IpAddr>() {
            return ip.is_loopback() || ip == self.listen || Some(ip) == reached;
        }
        self.allowed.iter().any(|name| name.eq_ignore_ascii_case(authority) || name.eq_ignore_ascii_case(host))
    }
}

/// The host of an authority (`name`, `name:port`, `[v6]:port`); `None` if it is malformed.
fn host_part(authority: &str) -> Option<&str> {
    if authority.starts_with('[') {
        let end = authority.find(']')?;
        let rest = &authority[end + 1..];
        return (rest.is_empty() || port_ok(rest.strip_prefix(':')?)).then(|| &authority[..=end]);
    }
    match authority.rsplit_once(':') {
        Some((host, port)) if port_ok(port) && !host.contains(':') => Some(host),
        Some(_) => None,
        None => Some(authority),
    }
    .filter(|h| !h.is_empty())
}

fn port_ok(port: &str) -> bool {
    !port.is_empty() && port.len() <= 5 && port.bytes().all(|b| b.is_ascii_digit())
}

/// Methods that change nothing (RFC 9110 §9.2.1); every other one is checked for its site.
fn is_safe(method: &Method) -> bool {
    matches!(*method, Method::GET | Method::HEAD | Method::OPTIONS | Method::TRACE)
}

/// The authority of an `Origin` value, with the scheme's default port dropped so that it
/// compares with a `Host` header.
fn origin_authority(origin: &str) -> Option<String> {
    let (scheme, rest) = origin.trim().split_once("://")?;
    let rest = rest.to_ascii_lowercase();
    let default = match scheme.to_ascii_lowercase().as_str() {
        "http" => ":80",
        "https" => ":443",
        _ => return None,
    };
    Some(rest.strip_suffix(default).map_or(rest.clone(), str::to_string))
}

fn without_default_port(host: &str) -> String {
    let host = host.trim().to_ascii_lowercase();
    host.strip_suffix(":80").map_or(host.clone(), str::to_string)
}

fn header<'a>(headers: &'a HeaderMap, name: &header::HeaderName) -> Option<&'a str> {
    headers.get(name).map(|v| v.to_str().unwrap_or("<not text>"))
}

/// Whether a request may run at all (the module's first two rules).
pub(super) fn check<B>(hosts: &HostNames, request: &Request<B>) -> Result<(), Refusal> {
    let headers = request.headers();
    let host = header(headers, &header::HOST);
    // A request without `Host` (HTTP/1.0) comes from no browser: there is nothing to rebind.
    if let Some(host) = host {
        let reached = request.extensions().get::<Peer>().map(|p| p.local.ip());
        if !hosts.allows(host, reached) {
            return Err(Refusal::UnknownHost(host.to_string()));
        }
    }
    if is_safe(request.method()) {
        return Ok(());
    }
    if let Some(site) = headers.get("sec-fetch-site") {
        let site = site.to_str().unwrap_or("");
        if !(site.eq_ignore_ascii_case("same-origin") || site.eq_ignore_ascii_case("none")) {
            return Err(Refusal::CrossSite(format!("Sec-Fetch-Site: {site}")));
        }
    }
    if let Some(origin) = header(headers, &header::ORIGIN) {
        let same = match (origin_authority(origin), host) {
            (Some(authority), Some(host)) => authority == without_default_port(host),
            _ => false,
        };
        if !same {
            return Err(Refusal::CrossSite(format!("Origin: {origin}")));
        }
    }
    Ok(())
}

/// Whether a request carries what only browsers send: `Origin` or a `Sec-Fetch-*` header.
fn from_browser(headers: &HeaderMap) -> bool {
    headers.contains_key(header::ORIGIN) || headers.keys().any(|name| name.as_str().starts_with("sec-fetch-"))
}

/// An extractor for the calls no web page should make on a server without tokens (backup,
/// tenant erasure, pausing a provider): the cross-site checks above stop other sites, and
/// this stops the rest (a same-origin page, a browser that sends no `Origin`) from acting
/// with nobody's authority. Clients outside a browser send none of these headers.
#[derive(Debug)]
pub(super) struct NotFromBrowser;

impl<S: Send + Sync> FromRequestParts<S> for NotFromBrowser {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, Self::Rejection> {
        let open = matches!(parts.extensions.get::<Caller>(), Some(Caller::Open));
        if open && from_browser(&parts.headers) { Err(Refusal::TokenRequired.into()) } else { Ok(NotFromBrowser) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names() -> HostNames {
        HostNames::new("127.0.0.1:8787".parse().unwrap(), &["Commitpoint.internal".to_string()])
    }

    #[test]
    fn loopback_the_listen_address_and_configured_names_are_this_server() {
        let hosts = names();
        for ok in [
            "localhost",
            "LOCALHOST:9000",
            "127.0.0.1:8787",
            "127.0.0.1",
            "[::1]:8787",
            "[::1]",
            "commitpoint.internal:443",
            "localhost.",
        ] {
            assert!(hosts.allows(ok, None), "{ok}");
        }
        for refused in ["rebind.attacker.example", "rebind.attacker.example:8787", "10.0.0.5:8787", "", ":80", "a:b:c"]
        {
            assert!(!hosts.allows(refused, None), "{refused}");
        }
        assert!(hosts.allows("10.0.0.5:8787", Some("10.0.0.5".parse().unwrap())), "the address the client reached");
    }

    #[test]
    fn origins_compare_with_the_host_without_default_ports() {
        assert_eq!(origin_authority("http://127.0.0.1:8787").as_deref(), Some("127.0.0.1:8787"));
        assert_eq!(origin_authority("https://Example.com:443").as_deref(), Some("example.com"));
        assert_eq!(origin_authority("null"), None);
        assert_eq!(without_default_port("example.com:80"), "example.com");
    }
}
