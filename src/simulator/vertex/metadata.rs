//! The metadata server's token endpoint, as a process without a key file on GCE, GKE
//! (workload identity) or Cloud Run asks it: `GET` with `Metadata-Flavor: Google`, answered
//! with `{"access_token", "expires_in", "token_type"}` for the attached service account.
//! The header is what keeps a server-side request forgery (a fetched URL the attacker
//! names, without their headers) from reading tokens, so a request without it is 403 with
//! the GCE server's HTML page naming the path, and counted.

use std::collections::HashMap;
use std::sync::Arc;

use axum::Json;
use axum::extract::{Query, State};
use axum::http::{HeaderMap, HeaderName, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::json;

use crate::simulator::state::Shared;

pub(super) const PATH: &str = "/computeMetadata/v1/instance/service-accounts/default/token";
/// Tokens live an hour; the server says how much of it is left.
const EXPIRES_IN: u64 = 3599;

pub(super) async fn token(
    State(shared): State<Arc<Shared>>,
    headers: HeaderMap,
    Query(query): Query<HashMap<String, String>>,
) -> Response {
    let flavoured = headers.get("metadata-flavor").is_some_and(|v| v.as_bytes() == b"Google");
    let mut response = if flavoured {
        let token = {
            let mut inner = shared.lock();
            let token = format!("ya29.sim-md-{}", inner.new_id("", 40));
            inner.vertex.metadata_tokens.push(token.clone());
            inner.stats.metadata_tokens_issued += 1;
            if let Some(scopes) = query.get("scopes") {
                inner.stats.metadata_token_scopes = Some(scopes.clone());
            }
            token
        };
        Json(json!({"access_token": token, "expires_in": EXPIRES_IN, "token_type": "Bearer"})).into_response()
    } else {
        shared.lock().stats.metadata_refused += 1;
        let page = format!(
            "<!DOCTYPE html>\n<html lang=en>\n  <title>Error 403 (Forbidden)!!1</title>\n  <p><b>403.</b> \
             <ins>That\u{2019}s an error.</ins>\n  <p>Your client does not have permission to get URL \
             <code>{PATH}</code> from this server. Missing Metadata-Flavor:Google header. \
             <ins>That\u{2019}s all we know.</ins>\n"
        );
        (StatusCode::FORBIDDEN, [(header::CONTENT_TYPE, "text/html; charset=UTF-8")], page).into_response()
    };
    // The real server sets both on every answer, refusals included.
    let headers = response.headers_mut();
    headers.insert(HeaderName::from_static("metadata-flavor"), HeaderValue::from_static("Google"));
    headers.insert(header::SERVER, HeaderValue::from_static("Metadata Server for VM"));
    response
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use reqwest::{Client, StatusCode};
    use serde_json::Value;

    use super::PATH;
    use crate::simulator::{Dialect, Simulator, SimulatorConfig};

    const JOBS: &str = "/v1/projects/my-project-1/locations/us-central1/batchPredictionJobs";

    #[tokio::test]
    async fn tokens_only_for_the_flavour_header_and_admitted_by_the_api() {
        let config = SimulatorConfig {
            dialect: Dialect::Vertex,
            complete_after: Duration::from_millis(100),
            ..Default::default()
        };
        let sim = Simulator::start(([127, 0, 0, 1], 0).into(), config).await.unwrap();
        let client = Client::new();
        let url = format!("{}{PATH}", sim.origin());

        let refused = client.get(&url).send().await.unwrap();
        assert_eq!(refused.status(), StatusCode::FORBIDDEN);
        assert_eq!(refused.headers()["metadata-flavor"], "Google", "set on refusals too");
        let page = refused.text().await.unwrap();
        assert!(page.contains(&format!("<code>{PATH}</code>")), "{page}");
        assert!(page.contains("Missing Metadata-Flavor:Google header."), "{page}");
        let wrong = client.get(&url).header("Metadata-Flavor", "google").send().await.unwrap();
        assert_eq!(wrong.status(), StatusCode::FORBIDDEN, "the value is matched exactly");

        let scope = "https://www.googleapis.com/auth/cloud-platform";
        let answer =
            client.get(&url).query(&[("scopes", scope)]).header("Metadata-Flavor", "Google").send().await.unwrap();
        assert_eq!(answer.status(), StatusCode::OK);
        let body: Value = answer.json().await.unwrap();
        assert_eq!((body["token_type"].as_str(), body["expires_in"].as_u64()), (Some("Bearer"), Some(3599)));
        let token = body["access_token"].as_str().unwrap();

        let jobs = format!("{}{JOBS}", sim.origin());
        let listed = client.get(&jobs).bearer_auth(token).send().await.unwrap();
        assert_eq!(listed.status(), StatusCode::OK, "a metadata token is a token: {:?}", listed.text().await);
        let unknown = client.get(&jobs).bearer_auth("ya29.made-up").send().await.unwrap();
        assert_eq!(unknown.status(), StatusCode::UNAUTHORIZED);

        let stats = sim.stats();
        assert_eq!((stats.metadata_refused, stats.metadata_tokens_issued), (2, 1), "{stats:#?}");
        assert_eq!(stats.metadata_token_scopes.as_deref(), Some(scope));
        assert_eq!(stats.calls_with_metadata_tokens, 1, "{stats:#?}");
    }
}
