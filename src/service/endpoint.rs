//! Configured webhook endpoints: how a verified payload becomes an intake request.

use std::time::Duration;

use serde_json::Value;

use crate::domain::secret::{KeySource, SecretError};
use crate::engine::webhook::{Delivery, Scheme, SecretError as BadSecret, SignatureError, WebhookSecret};
use crate::service::IntakeRequest;

/// Where a field of the extraction comes from in a webhook's payload.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Field {
    Fixed(String),
    Pointer(String),
}

#[derive(Debug, Clone)]
pub struct WebhookOptions {
    pub name: String,
    pub scheme: Scheme,
    pub secret: KeySource,
    pub tenant: Field,
    pub source_id: Field,
    pub content: Field,
    pub schema: Field,
    pub tolerance: Duration,
    pub max_body_bytes: usize,
}

#[derive(Debug, Clone)]
pub struct Endpoint {
    pub name: String,
    pub scheme: Scheme,
    secrets: Vec<WebhookSecret>,
    tenant: Field,
    source_id: Field,
    content: Field,
    schema: Field,
    tolerance: Duration,
    /// Bodies past this are refused before they are read.
    pub max_body_bytes: usize,
}

#[derive(Debug, thiserror::Error)]
pub enum EndpointError {
    #[error("webhook {name}: cannot read its secret")]
    Secret {
        name: String,
        #[source]
        source: SecretError,
    },
    #[error("webhook {name}: the secret is unusable: {source}")]
    BadSecret {
        name: String,
        #[source]
        source: BadSecret,
    },
}

/// Why a verified payload cannot become an intake.
#[derive(Debug, thiserror::Error)]
pub enum MapError {
    #[error("the body is not JSON: {0}")]
    NotJson(String),
    #[error("{field}: the payload has nothing at {pointer}")]
    Missing { field: &'static str, pointer: String },
}

impl Endpoint {
    pub fn load(options: &WebhookOptions) -> Result<Self, EndpointError> {
        let name = options.name.clone();
        let text =
            options.secret.load_secret().map_err(|source| EndpointError::Secret { name: name.clone(), source })?;
        // Several secrets, one per line, allow rotation without downtime.
        let secrets = text
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty())
            .map(|l| options.scheme.parse_secret(l))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|source| EndpointError::BadSecret { name: name.clone(), source })?;
        Ok(Self {
            name,
            scheme: options.scheme,
            secrets,
            tenant: options.tenant.clone(),
            source_id: options.source_id.clone(),
            content: options.content.clone(),
            schema: options.schema.clone(),
            tolerance: options.tolerance,
            max_body_bytes: options.max_body_bytes,
        })
    }

    /// Checks the signature over the raw body; `header` looks names up case-insensitively.
    pub fn verify<'h>(
        &self,
        header: &dyn Fn(&str) -> Option<&'h str>,
        body: &[u8],
        now_secs: u64,
    ) -> Result<Delivery, SignatureError> {
        self.scheme.verify(&self.secrets, header, body, now_secs, self.tolerance)
    }

    pub fn map(&self, body: &[u8]) -> Result<IntakeRequest, MapError> {
        let payload: Value = serde_json::from_slice(body).map_err(|e| MapError::NotJson(e.to_string()))?;
        let pick = |field: &'static str, source: &Field| -> Result<String, MapError> {
            match source {
                Field::Fixed(value) => Ok(value.clone()),
                Field::Pointer(pointer) => match payload.pointer(pointer) {
                    None | Some(Value::Null) => Err(MapError::Missing { field, pointer: pointer.clone() }),
                    Some(Value::String(text)) => Ok(text.clone()),
                    // Numbers (ids) and objects (structured content) keep their JSON text.
                    Some(other) => Ok(other.to_string()),
                },
            }
        };
        Ok(IntakeRequest {
            tenant: pick("tenant", &self.tenant)?,
            source_id: pick("source_id", &self.source_id)?,
            schema: pick("schema", &self.schema)?,
            content: pick("content", &self.content)?,
            metadata: Some(serde_json::json!({ "webhook": self.name })),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn payload_fields_come_from_pointers_or_fixed_values() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("secret");
        std::fs::write(&path, "s3cret\nolder-secret\n").unwrap();
        std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
        let options = WebhookOptions {
            name: "gh".into(),
            scheme: Scheme::Github,
            secret: KeySource::File(path),
            tenant: Field::Pointer("/repository/owner/login".into()),
            source_id: Field::Pointer("/pull_request/number".into()),
            content: Field::Pointer("/pull_request/body".into()),
            schema: Field::Fixed("code-review@1".into()),
            tolerance: Duration::from_secs(300),
            max_body_bytes: 1024,
        };
        let endpoint = Endpoint::load(&options).unwrap();
        assert_eq!(endpoint.secrets.len(), 2);
        let body = br#"{"repository":{"owner":{"login":"acme"}},"pull_request":{"number":17,"body":"fn x() {}"}}"#;
        let request = endpoint.map(body).unwrap();
        assert_eq!((request.tenant.as_str(), request.source_id.as_str()), ("acme", "17"));
        assert_eq!((request.schema.as_str(), request.content.as_str()), ("code-review@1", "fn x() {}"));
        let err = endpoint.map(br#"{"repository":{}}"#).unwrap_err();
        assert!(err.to_string().contains("/repository/owner/login"), "{err}");
        assert!(matches!(endpoint.map(b"not json"), Err(MapError::NotJson(_))));
        let signature = crate::engine::webhook::sign_github(&WebhookSecret::github("older-secret").unwrap(), body);
        let header = |name: &str| match name {
            "x-hub-signature-256" => Some(signature.as_str()),
            "x-github-delivery" => Some("d-1"),
            _ => None,
        };
        assert_eq!(endpoint.verify(&header, body, 0).unwrap().id, "d-1");
    }
}
