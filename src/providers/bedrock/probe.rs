//! What `provider check` asks of Bedrock (docs/PROVIDERS.md, "Amazon Bedrock"), in free
//! reads only: the credentials through a one-job listing of the control plane, the input
//! prefix through an S3 listing, and the configured model id through the control plane's
//! record of it. `GetFoundationModel` takes a foundation model's id or ARN but not an
//! inference profile's, which `GetInferenceProfile` looks up instead; a custom, imported or
//! provisioned model is not looked up, and the check says so. The schema is never checked:
//! batch inference has no synchronous call, and `InvokeModel` would be billed on demand.

use serde_json::Value;

use super::{BedrockBatches, aws, error, wire};
use crate::providers::{Checked, Coverage, ErrorClass, ProviderError};

const SCHEMA_NOT_CHECKED: &str = "batch inference has no synchronous call to send it to (InvokeModel would be \
    billed on demand); the first job's records tell";

/// Which control-plane record a configured model id can be looked up by.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum ModelKind {
    /// `provider.model[:version]`, or a `foundation-model/…` ARN.
    Foundation,
    /// An `inference-profile/…` or `application-inference-profile/…` ARN, or an id of three
    /// dotted parts (`us.anthropic.…`: a geography before a foundation model id). The id
    /// pattern in the service model would let a foundation model's name hold a second dot
    /// too, so such an id that is no profile is looked up as a foundation model before it
    /// is called unknown (`or_foundation`).
    Profile { or_foundation: bool },
    /// Nothing to look it up by: why.
    Unlooked(String),
}

pub(super) fn model_kind(id: &str) -> ModelKind {
    if let Some(arn) = id.strip_prefix("arn:") {
        // partition:service:region:account:resource-type/name
        let resource = arn.splitn(5, ':').nth(4).unwrap_or_default();
        return match resource.split('/').next().unwrap_or_default() {
            "foundation-model" => ModelKind::Foundation,
            "inference-profile" | "application-inference-profile" => ModelKind::Profile { or_foundation: false },
            "" => ModelKind::Unlooked("an ARN without a resource type is not looked up".to_string()),
            other => ModelKind::Unlooked(format!(
                "a {other} ARN is not looked up (only foundation models and inference profiles are)"
            )),
        };
    }
    let name = id.split(':').next().unwrap_or(id);
    match name.matches('.').count() {
        0 => ModelKind::Unlooked(format!(
            "{id:?} is neither a foundation model id (provider.model) nor an inference profile id \
             (geography.provider.model), so it is not looked up"
        )),
        1 => ModelKind::Foundation,
        _ => ModelKind::Profile { or_foundation: true },
    }
}

/// A lookup's answer for an id Bedrock has no record of. The API reference lists both a
/// 404 `ResourceNotFoundException` and a 400 `ValidationException` for these reads, and
/// an unknown model id has been quoted as the latter; either counts.
fn is_unknown(e: &ProviderError) -> bool {
    e.status == Some(404) || (e.status == Some(400) && e.class == ErrorClass::InvalidRequest)
}

impl BedrockBatches {
    pub(super) async fn probe_steps(&self) -> Result<Checked, ProviderError> {
        self.call::<wire::JobList>(http::Method::GET, "/model-invocation-jobs?maxResults=1", None).await?;
        self.input.list(&self.config.input.prefix).await?;
        let model = self.check_model().await?;
        Ok(Checked { key: Coverage::Exercised, model, schema: Coverage::NotChecked(SCHEMA_NOT_CHECKED.to_string()) })
    }

    async fn check_model(&self) -> Result<Coverage, ProviderError> {
        let id = &self.config.model;
        let found = match model_kind(id) {
            ModelKind::Unlooked(why) => return Ok(Coverage::NotChecked(why)),
            ModelKind::Foundation => self.look_up("foundation-models", id).await,
            ModelKind::Profile { or_foundation } => match self.look_up("inference-profiles", id).await {
                Err(profile) if or_foundation && is_unknown(&profile) => {
                    self.look_up("foundation-models", id).await.map_err(|model| {
                        if !is_unknown(&model) {
                            return model;
                        }
                        let both = format!(
                            "neither an inference profile ({}) nor a foundation model ({})",
                            profile.message(),
                            model.message()
                        );
                        error(ErrorClass::InvalidRequest, model.status, both)
                    })
                }
                other => other,
            },
        };
        match found {
            Ok(()) => Ok(Coverage::Exercised),
            Err(e) if is_unknown(&e) => {
                Err(error(ErrorClass::InvalidRequest, e.status, format!("unknown model {id}: {}", e.message())))
            }
            // The listing took the same credentials: this is a policy without the read, not a
            // bad key, and jobs may well run. Said, never failed on.
            Err(e) if e.class == ErrorClass::Auth => Ok(Coverage::NotChecked(format!(
                "the credentials may not read it ({}); allow bedrock:GetFoundationModel and \
                 bedrock:GetInferenceProfile to check it",
                e.message()
            ))),
            Err(e) => Err(e),
        }
    }

    /// `GET /{collection}/{id}`: an answer at all is the proof, its body is not needed.
    async fn look_up(&self, collection: &str, id: &str) -> Result<(), ProviderError> {
        let path = format!("/{collection}/{}", aws::encode_segment(id));
        self.call::<Value>(http::Method::GET, &path, None).await.map(drop)
    }
}

#[cfg(test)]
mod tests {
    use super::{ModelKind, model_kind};

    #[test]
    fn model_ids_are_looked_up_by_their_kind() {
        let foundation = [
            "anthropic.claude-3-5-haiku-20241022-v1:0",
            "amazon.nova-pro-v1:0",
            "arn:aws:bedrock:us-east-1::foundation-model/anthropic.claude-3-5-sonnet-20240620-v1:0",
        ];
        for id in foundation {
            assert_eq!(model_kind(id), ModelKind::Foundation, "{id}");
        }
        assert_eq!(
            model_kind("us.anthropic.claude-sonnet-4-20250514-v1:0"),
            ModelKind::Profile { or_foundation: true }
        );
        for arn in [
            "arn:aws:bedrock:us-east-1:123456789012:inference-profile/us.anthropic.claude-3-haiku-20240307-v1:0",
            "arn:aws:bedrock:us-east-1:123456789012:application-inference-profile/a1b2c3d4e5f6",
        ] {
            assert_eq!(model_kind(arn), ModelKind::Profile { or_foundation: false }, "{arn}");
        }
        for id in [
            "arn:aws:bedrock:us-east-1:123456789012:provisioned-model/abcdefghij12",
            "arn:aws:bedrock:us-east-1:123456789012:custom-model/anthropic.claude-3-haiku-20240307-v1:0/abcdefghij12",
            "arn:aws:bedrock",
            "my-provisioned-model",
        ] {
            assert!(matches!(model_kind(id), ModelKind::Unlooked(_)), "{id}");
        }
    }
}
