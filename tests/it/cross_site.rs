//! What a web page can make a server without tokens do (issue 30, item 1): a cross-site
//! `text/plain` post, a bodyless admin post with the page's `Origin`, a rebound DNS name in
//! `Host`, and the costly calls from any browser at all. `tests/attacks/cross_site.py`
//! replays the same attack from headless Chromium.

use serde_json::Value;

use crate::raw::{addr, exchange, status};
use crate::util::{Server, temp_dir};

/// A raw request with `connection: close`; `extra` are whole header lines.
fn request(method: &str, path: &str, host: &str, extra: &[&str], body: &str) -> Vec<u8> {
    let mut head = format!("{method} {path} HTTP/1.1\r\nhost: {host}\r\nconnection: close\r\n");
    for line in extra {
        head.push_str(line);
        head.push_str("\r\n");
    }
    format!("{head}content-length: {}\r\n\r\n{body}", body.len()).into_bytes()
}

fn body_of(answer: &str) -> Value {
    let body = answer.split_once("\r\n\r\n").map_or("", |(_, b)| b);
    serde_json::from_str(body).unwrap_or(Value::Null)
}

fn assert_refused(answer: &str, want: u16, code: &str) {
    assert_eq!(status(answer), want, "{answer}");
    assert_eq!(body_of(answer)["error"]["code"], code, "{answer}");
    assert!(answer.to_ascii_lowercase().contains("cache-control: no-store"), "{answer}");
}

const INTAKE: &str = r#"{"tenant":"acme","source_id":"planted","schema":"code-review@1","content":"x"}"#;

#[test]
fn a_page_on_another_site_cannot_write_and_a_rebound_name_cannot_read() {
    let dir = temp_dir();
    let server = Server::start(&dir.path().join("data"));
    let addr = addr(&server);
    let here = addr.as_str();
    let page = "origin: http://localhost:9";

    // The CORS "simple" request a page may send without a preflight: refused as text/plain,
    // and for its Origin, and for Sec-Fetch-Site, each on its own.
    let plain = request("POST", "/v1/extractions", here, &["content-type: text/plain"], INTAKE);
    assert_refused(&exchange(&addr, &plain), 415, "unsupported_media_type");
    let none = request("POST", "/v1/extractions", here, &[], INTAKE);
    assert_refused(&exchange(&addr, &none), 415, "unsupported_media_type");
    let json = "content-type: application/json";
    let foreign = request("POST", "/v1/extractions", here, &[json, page], INTAKE);
    assert_refused(&exchange(&addr, &foreign), 403, "cross_site");
    for site in ["cross-site", "same-site"] {
        let fetch = format!("sec-fetch-site: {site}");
        let marked = request("POST", "/v1/extractions", here, &[json, &fetch], INTAKE);
        assert_refused(&exchange(&addr, &marked), 403, "cross_site");
    }
    // Bodyless admin posts: no Content-Type to check, so the site is what refuses them.
    for path in ["/v1/admin/backup", "/v1/admin/providers/simulator/pause", "/v1/admin/retry"] {
        let answer = exchange(&addr, &request("POST", path, here, &[page], ""));
        assert_refused(&answer, 403, "cross_site");
    }
    let erase = request("DELETE", "/v1/tenants/acme", here, &["origin: null"], "");
    assert_refused(&exchange(&addr, &erase), 403, "cross_site");

    // A rebound name reaches this address with its own Host: refused, reads included.
    for path in ["/v1/extractions", "/v1/stats", "/ui/login", "/healthz"] {
        let answer = exchange(&addr, &request("GET", path, "rebind.attacker.example:80", &[], ""));
        assert_refused(&answer, 421, "unknown_host");
    }
    let port = addr.rsplit_once(':').map(|(_, p)| p).expect("a port");
    for host in [format!("localhost:{port}"), format!("[::1]:{port}"), addr.clone()] {
        let answer = exchange(&addr, &request("GET", "/v1/extractions", &host, &[], ""));
        assert_eq!(status(&answer), 200, "{host}: {answer}");
    }

    // Without tokens, backup, erasure and pause refuse anything that looks like a browser,
    // even from this very origin; a client outside the browser still gets them.
    let same = format!("origin: http://{addr}");
    for (method, path) in
        [("POST", "/v1/admin/backup"), ("DELETE", "/v1/tenants/acme"), ("POST", "/v1/admin/providers/x/pause")]
    {
        for marker in [same.as_str(), "sec-fetch-site: same-origin"] {
            let answer = exchange(&addr, &request(method, path, here, &[marker], ""));
            assert_refused(&answer, 403, "token_required");
        }
    }
    // Without a browser's markers the call goes through (PostgreSQL takes no backups).
    let backup = exchange(&addr, &request("POST", "/v1/admin/backup", here, &[], ""));
    let taken = if crate::support::postgres::enabled() { 501 } else { 201 };
    assert_eq!(status(&backup), taken, "{backup}");
    // The same-origin JSON post of a page served here is no cross-site request.
    let own = request("POST", "/v1/extractions", here, &[json, &same, "sec-fetch-site: same-origin"], INTAKE);
    assert_eq!(status(&exchange(&addr, &own)), 201);

    let listing = exchange(&addr, &request("GET", "/v1/extractions", here, &[], ""));
    let listing = body_of(&listing);
    let sources: Vec<&str> =
        listing["extractions"].as_array().expect("a listing").iter().filter_map(|e| e["source_id"].as_str()).collect();
    assert_eq!(sources, ["planted"], "only the same-origin post was taken in");
}

#[test]
fn a_configured_host_name_is_accepted() {
    let dir = temp_dir();
    let config = dir.path().join("config.toml");
    std::fs::write(&config, "[server]\nallowed_hosts = [\"commitpoint.internal\"]\n").expect("write config");
    let server = Server::start_with(&dir.path().join("data"), &["--config", config.to_str().expect("utf-8")]);
    let addr = addr(&server);
    let ok = exchange(&addr, &request("GET", "/v1/stats", "commitpoint.internal:8443", &[], ""));
    assert_eq!(status(&ok), 200, "{ok}");
    let other = exchange(&addr, &request("GET", "/v1/stats", "other.internal", &[], ""));
    assert_refused(&other, 421, "unknown_host");
}
