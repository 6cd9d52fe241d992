//! What Bedrock needs from AWS besides its own API, all from maintained crates: S3 through
//! `object_store` (which also walks the standard credential chain: environment, web
//! identity, ECS container credentials, EC2 instance metadata), and SigV4 signing of the
//! control-plane calls through `aws-sigv4`, with the credentials that chain found.

use std::sync::Arc;
use std::time::Duration;

use aws_credential_types::Credentials;
use aws_sigv4::http_request::{SignableBody, SignableRequest, SigningSettings, sign};
use aws_sigv4::sign::v4;
use bytes::Bytes;
use futures_util::{StreamExt, TryStreamExt};
use object_store::aws::{AmazonS3, AmazonS3Builder};
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt, PutPayload, RetryConfig};

use super::error;
use crate::providers::{ErrorClass, ProviderError};

/// `s3://bucket/prefix/`, split; the prefix never starts or ends with `/`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct S3Uri {
    pub bucket: String,
    pub prefix: String,
}

impl S3Uri {
    pub fn parse(text: &str) -> Option<Self> {
        let rest = text.strip_prefix("s3://")?;
        let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
        let bucket_ok = (3..=63).contains(&bucket.len())
            && bucket.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.');
        bucket_ok.then(|| S3Uri { bucket: bucket.to_string(), prefix: prefix.trim_matches('/').to_string() })
    }

    /// The object key under the prefix.
    pub fn key(&self, rest: &str) -> String {
        if self.prefix.is_empty() { rest.to_string() } else { format!("{}/{rest}", self.prefix) }
    }

    pub fn uri(&self, rest: &str) -> String {
        format!("s3://{}/{}", self.bucket, self.key(rest))
    }
}

/// One bucket, reached through `object_store`.
#[derive(Debug, Clone)]
pub(super) struct Bucket {
    store: Arc<AmazonS3>,
}

impl Bucket {
    pub(super) fn new(bucket: &str, region: &str, endpoint: Option<&str>) -> Result<Self, object_store::Error> {
        let mut builder = AmazonS3Builder::from_env()
            .with_bucket_name(bucket)
            .with_region(region)
            // Our scheduler owns retries and their pacing; one quick retry covers a reset.
            .with_retry(RetryConfig { max_retries: 1, retry_timeout: Duration::from_secs(30), ..Default::default() });
        if let Some(endpoint) = endpoint {
            builder = builder.with_endpoint(endpoint).with_allow_http(endpoint.starts_with("http://"));
        }
        Ok(Self { store: Arc::new(builder.build()?) })
    }

    pub(super) async fn credentials(&self) -> Result<Arc<object_store::aws::AwsCredential>, ProviderError> {
        self.store
            .credentials()
            .get_credential()
            .await
            .map_err(|e| error(ErrorClass::Auth, None, format!("no AWS credentials from the standard chain: {e}")))
    }

    pub(super) async fn put(&self, key: &str, body: Vec<u8>) -> Result<(), ProviderError> {
        let path = Path::from(key);
        self.store.put(&path, PutPayload::from(body)).await.map(drop).map_err(|e| s3_error("put", key, &e))
    }

    /// Every key under `prefix`.
    pub(super) async fn list(&self, prefix: &str) -> Result<Vec<String>, ProviderError> {
        let path = Path::from(prefix);
        let found: Vec<_> =
            self.store.list(Some(&path)).try_collect().await.map_err(|e| s3_error("list", prefix, &e))?;
        Ok(found.into_iter().map(|meta| meta.location.to_string()).collect())
    }

    /// An object's bytes as a stream, errors already described.
    pub(super) async fn stream(
        &self,
        key: &str,
    ) -> Result<futures_util::stream::BoxStream<'static, Result<Bytes, String>>, ProviderError> {
        let result = self.store.get(&Path::from(key)).await.map_err(|e| s3_error("get", key, &e))?;
        Ok(result.into_stream().map(|chunk| chunk.map_err(|e| e.to_string())).boxed())
    }

    pub(super) async fn delete(&self, key: &str) -> Result<bool, ProviderError> {
        match self.store.delete(&Path::from(key)).await {
            Ok(()) => Ok(true),
            Err(object_store::Error::NotFound { .. }) => Ok(false),
            Err(e) => Err(s3_error("delete", key, &e)),
        }
    }
}

fn s3_error(what: &str, key: &str, e: &object_store::Error) -> ProviderError {
    let class = match e {
        object_store::Error::NotFound { .. } => ErrorClass::Gone,
        object_store::Error::PermissionDenied { .. } | object_store::Error::Unauthenticated { .. } => ErrorClass::Auth,
        _ => ErrorClass::Transient,
    };
    error(class, None, format!("S3 {what} {key}: {e}"))
}

/// Signs one control-plane request (service `bedrock`) with SigV4; the body is signed too.
pub(super) fn signed(
    credential: &object_store::aws::AwsCredential,
    region: &str,
    mut request: http::Request<Vec<u8>>,
) -> Result<reqwest::Request, ProviderError> {
    let identity = Credentials::new(
        credential.key_id.clone(),
        credential.secret_key.clone(),
        credential.token.clone(),
        None,
        "commitpoint",
    )
    .into();
    let fail = |what: &str, e: &dyn std::fmt::Display| error(ErrorClass::Protocol, None, format!("{what}: {e}"));
    let params = v4::SigningParams::builder()
        .identity(&identity)
        .region(region)
        .name("bedrock")
        .time(crate::domain::clock::now())
        .settings(SigningSettings::default())
        .build()
        .map_err(|e| fail("SigV4 parameters", &e))?
        .into();
    let uri = request.uri().to_string();
    let headers: Vec<(String, String)> = request
        .headers()
        .iter()
        .filter_map(|(k, v)| Some((k.as_str().to_string(), v.to_str().ok()?.to_string())))
        .collect();
    let signable = SignableRequest::new(
        request.method().as_str(),
        uri,
        headers.iter().map(|(k, v)| (k.as_str(), v.as_str())),
        SignableBody::Bytes(request.body()),
    )
    .map_err(|e| fail("SigV4 request", &e))?;
    let (instructions, _signature) = sign(signable, &params).map_err(|e| fail("SigV4 signing", &e))?.into_parts();
    instructions.apply_to_request_http1x(&mut request);
    reqwest::Request::try_from(request).map_err(|e| fail("request", &e))
}

/// Percent-encodes one path segment (everything but RFC 3986 unreserved characters), as
/// the job ARN must be in `/model-invocation-job/{jobIdentifier}`.
pub(super) fn encode_segment(text: &str) -> String {
    let mut out = String::with_capacity(text.len() * 3);
    for b in text.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~') {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn s3_uris() {
        let uri = S3Uri::parse("s3://my-bucket/in/put/").unwrap();
        assert_eq!((uri.bucket.as_str(), uri.prefix.as_str()), ("my-bucket", "in/put"));
        assert_eq!(uri.uri("job/input.jsonl"), "s3://my-bucket/in/put/job/input.jsonl");
        assert_eq!(S3Uri::parse("s3://bkt").unwrap().key("x"), "x");
        assert!(S3Uri::parse("https://bkt/x").is_none());
        assert!(S3Uri::parse("s3://Upper/x").is_none());
    }

    #[test]
    fn arns_are_one_encoded_segment() {
        assert_eq!(
            encode_segment("arn:aws:bedrock:us-east-1:123:model-invocation-job/abc"),
            "arn%3Aaws%3Abedrock%3Aus-east-1%3A123%3Amodel-invocation-job%2Fabc"
        );
    }
}
