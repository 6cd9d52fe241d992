use std::sync::{Arc, Mutex as StdMutex};

use axum::Router;
use axum::extract::{Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::routing::get;

use super::*;

const SCOPE: &str = "https://www.googleapis.com/auth/cloud-platform";

/// What the test server saw of each request: the flavour header and the scopes asked.
#[derive(Default)]
struct Seen {
    requests: Vec<(Option<String>, Option<String>)>,
}

type Answer = (StatusCode, &'static str, String);

/// A metadata server on loopback whose answers `answer` makes from the request number.
async fn server(answer: fn(usize) -> Answer) -> (String, Arc<StdMutex<Seen>>) {
    let seen = Arc::new(StdMutex::new(Seen::default()));
    let handler = move |State(seen): State<Arc<StdMutex<Seen>>>,
                        headers: HeaderMap,
                        Query(query): Query<std::collections::HashMap<String, String>>| async move {
        let n = {
            let mut seen = seen.lock().unwrap();
            let flavour = headers.get("metadata-flavor").and_then(|v| v.to_str().ok()).map(str::to_string);
            seen.requests.push((flavour, query.get("scopes").cloned()));
            seen.requests.len()
        };
        let (status, content_type, body) = answer(n);
        (status, [("content-type", content_type)], body)
    };
    let app = Router::new().route(TOKEN_PATH, get(handler)).with_state(Arc::clone(&seen));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let host = listener.local_addr().unwrap().to_string();
    tokio::spawn(async move { axum::serve(listener, app).await });
    (host, seen)
}

fn token(n: usize) -> Answer {
    let body = format!(r#"{{"access_token":"ya29.test-{n}","expires_in":3599,"token_type":"Bearer"}}"#);
    (StatusCode::OK, "application/json", body)
}

/// Moves the runtime's clock on; I/O runs on the real clock again afterwards.
async fn travel(by: Duration) {
    tokio::time::pause();
    tokio::time::advance(by).await;
    tokio::time::resume();
}

#[tokio::test]
async fn a_token_is_kept_until_less_than_the_margin_is_left_then_asked_for_again() {
    let (host, seen) = server(token).await;
    let tokens = MetadataTokens::new(&host, SCOPE).unwrap();
    let first = tokens.bearer().await.unwrap();
    assert_eq!(first.to_str().unwrap(), "Bearer ya29.test-1");
    assert!(first.is_sensitive(), "never shown in debug output");
    assert_eq!(tokens.bearer().await.unwrap(), first);

    // 3599 s to live: kept while more than 3 min 45 s (the Python library's margin) are left.
    travel(Duration::from_secs(3599 - 225 - 2)).await;
    assert_eq!(tokens.bearer().await.unwrap(), first, "still more than the margin left");
    assert_eq!(seen.lock().unwrap().requests.len(), 1);

    travel(Duration::from_secs(3)).await;
    let second = tokens.bearer().await.unwrap();
    assert_eq!(second.to_str().unwrap(), "Bearer ya29.test-2", "asked again inside the margin");
    assert_eq!(tokens.bearer().await.unwrap(), second);

    let seen = seen.lock().unwrap();
    assert_eq!(seen.requests.len(), 2);
    for (flavour, scopes) in &seen.requests {
        assert_eq!(flavour.as_deref(), Some("Google"), "the server refuses requests without it");
        assert_eq!(scopes.as_deref(), Some(SCOPE));
    }
    assert!(!format!("{tokens:?}").contains("ya29"), "the token is not in the debug output");
}

#[tokio::test]
async fn a_token_shorter_lived_than_the_margin_is_never_kept() {
    fn short(n: usize) -> Answer {
        let body = format!(r#"{{"access_token":"ya29.short-{n}","expires_in":60,"token_type":"Bearer"}}"#);
        (StatusCode::OK, "application/json", body)
    }
    let (host, seen) = server(short).await;
    let tokens = MetadataTokens::new(&host, SCOPE).unwrap();
    assert_eq!(tokens.bearer().await.unwrap().to_str().unwrap(), "Bearer ya29.short-1");
    assert_eq!(tokens.bearer().await.unwrap().to_str().unwrap(), "Bearer ya29.short-2");
    assert_eq!(seen.lock().unwrap().requests.len(), 2);
}

#[tokio::test]
async fn an_unreachable_server_is_named_with_what_to_do() {
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().to_string();
    let tokens = MetadataTokens::new(&closed, SCOPE).unwrap();
    let e = tokens.bearer().await.unwrap_err();
    assert_eq!(e.class, ErrorClass::Auth, "{e}");
    assert!(e.message().contains(&format!("metadata server at {closed}")), "{e}");
    assert!(e.message().contains("credentials_file") && e.message().contains("run on Google Cloud"), "{e}");
}

#[tokio::test]
async fn refusals_are_said_in_the_servers_words_and_classed() {
    fn forbidden(_: usize) -> Answer {
        let page = "<!DOCTYPE html>\n<html><style>p{margin:0}</style><p>Your client does not have permission to get \
                    URL <code>/computeMetadata/v1/instance/service-accounts/default/token</code> from this server. \
                    Missing Metadata-Flavor:Google header.";
        (StatusCode::FORBIDDEN, "text/html; charset=UTF-8", page.to_string())
    }
    let (host, _) = server(forbidden).await;
    let e = MetadataTokens::new(&host, SCOPE).unwrap().bearer().await.unwrap_err();
    assert_eq!((e.class, e.status), (ErrorClass::Auth, Some(403)), "{e}");
    assert!(e.message().contains("Missing Metadata-Flavor:Google header"), "{e}");
    assert!(!e.message().contains("<code>") && !e.message().contains("margin"), "tags and styles dropped: {e}");

    fn unavailable(_: usize) -> Answer {
        (StatusCode::SERVICE_UNAVAILABLE, "text/plain", "try later".to_string())
    }
    let (host, _) = server(unavailable).await;
    let e = MetadataTokens::new(&host, SCOPE).unwrap().bearer().await.unwrap_err();
    assert_eq!((e.class, e.status), (ErrorClass::Transient, Some(503)), "{e}");

    fn not_json(_: usize) -> Answer {
        (StatusCode::OK, "application/json", r#"{"access_token":"ya29.secret"}"#.to_string())
    }
    let (host, _) = server(not_json).await;
    let e = MetadataTokens::new(&host, SCOPE).unwrap().bearer().await.unwrap_err();
    assert_eq!(e.class, ErrorClass::Protocol, "{e}");
    assert!(!e.message().contains("ya29"), "a body that holds a token is never quoted: {e}");
}

#[test]
fn the_host_comes_from_the_libraries_variables() {
    let env = |pairs: &'static [(&'static str, &'static str)]| {
        move |name: &str| pairs.iter().find(|(k, _)| *k == name).map(|(_, v)| v.to_string())
    };
    assert_eq!(host_from(env(&[])), DEFAULT_HOST);
    assert_eq!(host_from(env(&[(HOST_VAR, "127.0.0.1:8080"), (OLD_HOST_VAR, "other")])), "127.0.0.1:8080");
    assert_eq!(host_from(env(&[(HOST_VAR, " "), (OLD_HOST_VAR, "old:80")])), "old:80", "an empty one is unset");
    assert!(MetadataTokens::new("127.0.0.1:8080", SCOPE).is_ok());
    assert!(MetadataTokens::new("[::1]:8080", SCOPE).is_ok());
    for bad in ["http://x", "x/y", "a b", "", "h:port"] {
        let e = MetadataTokens::new(bad, SCOPE).unwrap_err().to_string();
        assert!(e.contains(HOST_VAR), "{bad:?}: {e}");
    }
}
