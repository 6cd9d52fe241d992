//! A provider's answer for a `Ready` extraction, staged until it is validated and
//! committed. It names the provider and the job it came from; it is not a worker's result,
//! so it has its own type rather than a `ResultRecord` whose worker and lease fields hold
//! something else.

use serde::{Deserialize, Serialize};

use crate::domain::batch::Usage;
use crate::store::codec::Versioned;
use crate::store::records::ResultRecord;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StagedAnswer {
    /// The provider's table name: the one that paid for the answer.
    pub provider: String,
    /// The provider's job the answer came from (empty for a synchronous provider).
    pub job_id: String,
    pub output_json: String,
    pub usage: Option<Usage>,
    /// From the batch's submission to the answer.
    pub latency_ms: Option<u64>,
    pub received_at_ms: u64,
}

impl Versioned for StagedAnswer {
    const KIND: &'static str = "staged answer";
    /// Formats 1 and 2 of the staged table were result records (see `upgrade`); the
    /// staged answer's own shape starts at 3 so the version byte tells them apart.
    const VERSION: u8 = 3;

    fn upgrade(version: u8, body: &[u8]) -> Option<Result<Self, String>> {
        let mut bytes = Vec::with_capacity(body.len() + 1);
        bytes.push(version);
        bytes.extend_from_slice(body);
        (version == 1 || version == 2).then(|| {
            crate::store::codec::decode::<ResultRecord>(&bytes).map(Self::from_result_shape).map_err(|e| e.to_string())
        })
    }
}

impl StagedAnswer {
    /// Earlier builds stored a staged answer as a result record, with the provider in
    /// `worker` and the job id in `lease_token`.
    fn from_result_shape(old: ResultRecord) -> Self {
        Self {
            provider: old.producer,
            job_id: old.fence.as_str().to_string(),
            output_json: old.output_json,
            usage: old.usage,
            latency_ms: old.latency_ms,
            received_at_ms: old.received_at_ms,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use super::*;
    use crate::store::codec::{decode, encode};

    fn fixture(name: &str) -> PathBuf {
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/codec").join(name)
    }

    fn usage() -> Usage {
        Usage {
            model: "m".into(),
            input_tokens: 10,
            output_tokens: 20,
            cached_input_tokens: 4,
            cache_write_tokens: 1,
            reasoning_tokens: 2,
            provider_cost_micros: Some(77),
            request_id: Some("req_1".into()),
        }
    }

    /// If this fails the encoding moved: bump the version and add a migration instead of
    /// editing the fixture (`COMMITPOINT_WRITE_GOLDEN=1` writes it anew).
    #[test]
    fn golden_staged_answer() {
        let answer = StagedAnswer {
            provider: "openai-eu".into(),
            job_id: "batch_abc".into(),
            output_json: r#"{"findings":[]}"#.into(),
            usage: Some(usage()),
            latency_ms: Some(1500),
            received_at_ms: 6,
        };
        let bytes = encode(&answer).unwrap();
        let path = fixture("v3_staged.bin");
        if std::env::var_os("COMMITPOINT_WRITE_GOLDEN").is_some() {
            std::fs::write(&path, &bytes).unwrap();
        }
        let golden = std::fs::read(&path).unwrap();
        assert_eq!(bytes, golden, "the staged answer's encoding changed");
        assert_eq!(decode::<StagedAnswer>(&golden).unwrap(), answer);
    }

    /// A file staged by an earlier build (format 2, a result record) reads as a staged
    /// answer with the provider and job id where they belong.
    #[test]
    fn staged_result_records_of_earlier_builds_are_upgraded() {
        let golden = std::fs::read(fixture("v2_result.bin")).unwrap();
        assert_eq!(golden[0], 2);
        let answer = decode::<StagedAnswer>(&golden).unwrap();
        assert_eq!(answer.provider, "w");
        assert_eq!(answer.job_id, "t");
        assert_eq!(answer.usage, Some(usage()));
        assert_eq!((answer.latency_ms, answer.received_at_ms), (Some(1500), 6));
        let v1 = std::fs::read(fixture("v1_result.bin")).unwrap();
        assert_eq!(v1[0], 1);
        let old = decode::<StagedAnswer>(&v1).unwrap();
        assert_eq!(old.provider, decode::<ResultRecord>(&v1).unwrap().producer);
    }
}
