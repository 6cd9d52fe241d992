//! The OAuth token endpoint a service account key file's `token_uri` points at: the
//! JWT-bearer grant (RFC 7523) Google documents for service accounts. Refusals are OAuth's
//! shape, `{"error": "invalid_grant", "error_description": …}` with 400.

use std::sync::Arc;

use axum::Json;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use serde_json::{Value, json};

use crate::simulator::state::Shared;

pub(super) const PATH: &str = "/token";
const GRANT: &str = "urn:ietf:params:oauth:grant-type:jwt-bearer";
const SCOPE: &str = "https://www.googleapis.com/auth/cloud-platform";
/// Tokens live an hour at Google; `expires_in` says a little less.
const EXPIRES_IN: u64 = 3599;

fn refuse(error: &str, description: impl Into<String>) -> Response {
    (StatusCode::BAD_REQUEST, Json(json!({"error": error, "error_description": description.into()}))).into_response()
}

pub(super) async fn issue(State(shared): State<Arc<Shared>>, body: Bytes) -> Response {
    let form: Vec<(String, String)> = serde_urlencoded::from_bytes(&body).unwrap_or_default();
    let field = |name: &str| form.iter().find(|(k, _)| k == name).map(|(_, v)| v.as_str());
    if field("grant_type") != Some(GRANT) {
        return refuse("unsupported_grant_type", "Invalid grant_type.");
    }
    let Some(assertion) = field("assertion") else {
        return refuse("invalid_request", "Missing required parameter: assertion");
    };
    let audience = format!("{}{PATH}", shared.origin);
    if let Err(description) = check_assertion(assertion, &audience, crate::domain::clock::now_ms() / 1000) {
        return refuse("invalid_grant", description);
    }
    let token = {
        let mut inner = shared.lock();
        let token = format!("ya29.sim-{}", inner.new_id("", 40));
        inner.vertex.tokens.push(token.clone());
        token
    };
    Json(json!({"access_token": token, "expires_in": EXPIRES_IN, "token_type": "Bearer"})).into_response()
}

/// A signed JWT's header and claims as Google checks them (its signature aside).
fn check_assertion(jwt: &str, audience: &str, now_secs: u64) -> Result<(), String> {
    let parts: Vec<&str> = jwt.split('.').collect();
    let [header, claims, signature] = parts[..] else {
        return Err("Invalid JWT: Token must be a short-lived token (60 minutes) and in a reasonable timeframe. Check your iat and exp values in the JWT claim.".into());
    };
    // base64url, with or without padding: Google takes both (gcp_auth pads).
    let bytes = |part: &str| URL_SAFE_NO_PAD.decode(part.trim_end_matches('=')).ok();
    let decode = |part: &str| -> Option<Value> { serde_json::from_slice(&bytes(part)?).ok() };
    let header = decode(header).ok_or("Invalid JWT header.")?;
    if header["alg"] != "RS256" {
        return Err("Invalid JWT Signature.".into());
    }
    if bytes(signature).is_none_or(|s| s.is_empty()) {
        return Err("Invalid JWT Signature.".into());
    }
    let claims = decode(claims).ok_or("Invalid JWT payload.")?;
    if claims["iss"].as_str().is_none_or(str::is_empty) {
        return Err("Invalid JWT: missing iss.".into());
    }
    if claims["aud"].as_str() != Some(audience) {
        return Err(format!("Invalid JWT: audience must be {audience}"));
    }
    if !claims["scope"].as_str().is_some_and(|s| s.split(' ').any(|s| s == SCOPE)) {
        return Err("Invalid OAuth scope or ID token audience provided.".into());
    }
    let (iat, exp) = (claims["iat"].as_u64().unwrap_or(0), claims["exp"].as_u64().unwrap_or(0));
    if exp <= iat || exp - iat > 3600 || exp < now_secs || iat > now_secs + 300 {
        return Err("Invalid JWT: Token must be a short-lived token (60 minutes) and in a reasonable timeframe. Check your iat and exp values in the JWT claim.".into());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn jwt(header: Value, claims: Value) -> String {
        let part = |v: &Value| URL_SAFE_NO_PAD.encode(v.to_string());
        format!("{}.{}.{}", part(&header), part(&claims), URL_SAFE_NO_PAD.encode(b"sig"))
    }

    #[test]
    fn assertions_are_checked_as_google_does() {
        let aud = "http://127.0.0.1:1/token";
        let claims =
            json!({"iss": "sa@p.iam.gserviceaccount.com", "aud": aud, "scope": SCOPE, "iat": 1000, "exp": 4600});
        let header = json!({"alg": "RS256", "typ": "JWT"});
        assert_eq!(check_assertion(&jwt(header.clone(), claims.clone()), aud, 2000), Ok(()));
        assert!(check_assertion(&jwt(json!({"alg": "none"}), claims.clone()), aud, 2000).is_err());
        let mut other = claims.clone();
        other["aud"] = json!("https://oauth2.googleapis.com/token");
        assert!(check_assertion(&jwt(header.clone(), other), aud, 2000).unwrap_err().contains("audience"));
        let mut long = claims.clone();
        long["exp"] = json!(9000);
        assert!(check_assertion(&jwt(header.clone(), long), aud, 2000).is_err());
        assert!(check_assertion(&jwt(header.clone(), claims.clone()), aud, 9000).is_err(), "expired");
        let mut scope = claims;
        scope["scope"] = json!("https://www.googleapis.com/auth/devstorage.read_only");
        assert!(check_assertion(&jwt(header, scope), aud, 2000).is_err());
        assert!(check_assertion("a.b", aud, 2000).is_err());
    }
}
