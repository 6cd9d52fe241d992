//! Identities that make exactly-once possible (DESIGN §1).
//!
//! Every identity is a blake3 derive-key hash over a *length-prefixed* canonical
//! encoding, so that field boundaries can never be forged by concatenation:
//! `("a:b", "c")` and `("a", "b:c")` hash differently.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use super::names::BatchKey;

const EXTRACTION_CONTEXT: &str = "commitpoint extraction v1";
const SOURCE_CONTEXT: &str = "commitpoint source v1";
const FINDING_CONTEXT: &str = "commitpoint finding v1";
const BATCH_CONTEXT: &str = "commitpoint batch v1";
const TRIAL_CONTEXT: &str = "commitpoint trial v1";
const TRIAL_BATCH_CONTEXT: &str = "commitpoint trial batch v1";

/// A 32-byte blake3 digest shown as lowercase hex.
macro_rules! hash_newtype {
    ($(#[$doc:meta])* $name:ident) => {
        $(#[$doc])*
        #[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
        pub struct $name(pub [u8; 32]);

        impl $name {
            pub fn as_bytes(&self) -> &[u8; 32] {
                &self.0
            }
            pub fn to_hex(&self) -> String {
                hex_encode(&self.0)
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.to_hex())
            }
        }

        impl fmt::Debug for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, "{}({})", stringify!($name), self.to_hex())
            }
        }

        impl FromStr for $name {
            type Err = ParseIdError;
            fn from_str(s: &str) -> Result<Self, Self::Err> {
                hex_decode(s).map($name)
            }
        }
    };
}

hash_newtype!(
    /// The identity of one extraction: (tenant, source_id, source_hash, schema).
    ExtractionId
);
hash_newtype!(
    /// blake3 of the reviewed content plus the schema version that gives it meaning.
    SourceHash
);
hash_newtype!(
    /// The identity of one finding within an extraction, from its identifying fields only.
    FindingKey
);

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("an id must be 64 lowercase hex characters (a blake3 digest)")]
pub struct ParseIdError;

/// The start of an extraction id as people copy it (the console shows 12 characters):
/// the range of ids it stands for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IdPrefix {
    text: String,
}

impl IdPrefix {
    /// Fewer characters match too many ids to be worth a lookup.
    pub const MIN_LEN: usize = 4;

    pub fn as_str(&self) -> &str {
        &self.text
    }

    /// The lowest and the highest id starting with this prefix, both inclusive.
    pub fn bounds(&self) -> ([u8; 32], [u8; 32]) {
        let (mut low, mut high) = ([0u8; 32], [0xffu8; 32]);
        for (i, nibble) in self.text.bytes().map(nibble).enumerate() {
            let (byte, shift) = (i / 2, if i % 2 == 0 { 4 } else { 0 });
            let mask = 0x0f_u8 << shift;
            low[byte] = (low[byte] & !mask) | (nibble << shift);
            high[byte] = (high[byte] & !mask) | (nibble << shift);
        }
        (low, high)
    }
}

impl FromStr for IdPrefix {
    type Err = ParsePrefixError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let valid =
            (Self::MIN_LEN..=64).contains(&s.len()) && s.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'));
        valid.then(|| IdPrefix { text: s.to_string() }).ok_or(ParsePrefixError)
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("an id prefix must be 4 to 64 lowercase hex characters")]
pub struct ParsePrefixError;

fn nibble(hex: u8) -> u8 {
    match hex {
        b'0'..=b'9' => hex - b'0',
        _ => hex - b'a' + 10,
    }
}

/// Feeds length-prefixed fields into a hasher so field boundaries are unambiguous.
struct CanonicalHasher(blake3::Hasher);

impl CanonicalHasher {
    fn new(context: &str) -> Self {
        Self(blake3::Hasher::new_derive_key(context))
    }

    fn field(&mut self, bytes: &[u8]) -> &mut Self {
        self.0.update(&(bytes.len() as u64).to_le_bytes());
        self.0.update(bytes);
        self
    }

    fn finish(&self) -> [u8; 32] {
        *self.0.finalize().as_bytes()
    }
}

impl SourceHash {
    /// Hashes the content together with the schema it is extracted under: the same text
    /// reviewed under a new schema version is new material for extraction.
    pub fn compute(content: &[u8], schema: &str) -> Self {
        SourceHash(CanonicalHasher::new(SOURCE_CONTEXT).field(content).field(schema.as_bytes()).finish())
    }
}

impl ExtractionId {
    pub fn compute(tenant: &str, source_id: &str, source_hash: &SourceHash, schema: &str) -> Self {
        ExtractionId(
            CanonicalHasher::new(EXTRACTION_CONTEXT)
                .field(tenant.as_bytes())
                .field(source_id.as_bytes())
                .field(source_hash.as_bytes())
                .field(schema.as_bytes())
                .finish(),
        )
    }
}

impl FindingKey {
    /// `canonical_identity` is the canonical JSON of the finding's identifying fields
    /// (see `schema::Schema::finding_identity`); prose fields never take part.
    pub fn compute(extraction: &ExtractionId, canonical_identity: &str) -> Self {
        FindingKey(
            CanonicalHasher::new(FINDING_CONTEXT)
                .field(extraction.as_bytes())
                .field(canonical_identity.as_bytes())
                .finish(),
        )
    }
}

/// The key of a provider batch, fixed when its intent is committed (and stored with it),
/// so a job created before a crash can be found again by it. No two intents share one.
pub fn batch_key(provider: &str, schema: &str, intent_seq: u64, members: &[(ExtractionId, u32)]) -> BatchKey {
    let mut hasher = CanonicalHasher::new(BATCH_CONTEXT);
    // The intent's sequence keeps keys apart when the same members go back as the same
    // attempt (a batch the provider failed for want of room): a lookup of the new intent
    // must never find the failed job.
    hasher.field(provider.as_bytes()).field(schema.as_bytes()).field(&intent_seq.to_le_bytes());
    hasher.field(&(members.len() as u64).to_le_bytes());
    for (id, attempt) in members {
        hasher.field(id.as_bytes()).field(&attempt.to_le_bytes());
    }
    // 128 bits is plenty to find our own job among a provider's recent batches.
    BatchKey::new(format!("cpb-{}", &hex_encode(&hasher.finish())[..32]))
}

/// The custom id a trial is sent under: never an extraction's own, so no lookup of a
/// production batch can take a trial job for its own, nor the other way round.
pub fn trial_id(evaluation: &str, candidate: &str, extraction: &ExtractionId) -> ExtractionId {
    let mut hasher = CanonicalHasher::new(TRIAL_CONTEXT);
    hasher.field(evaluation.as_bytes()).field(candidate.as_bytes()).field(extraction.as_bytes());
    ExtractionId(hasher.finish())
}

/// The key of a trial batch, fixed with its intent as [`batch_key`] is for a production one.
/// The evaluation's creation time keeps apart two evaluations of one name (an erasure frees
/// a name), so a lookup never finds the other's job.
pub fn trial_batch_key(evaluation: &str, created_at_ms: u64, candidate: &str, intent_seq: u64) -> BatchKey {
    let mut hasher = CanonicalHasher::new(TRIAL_BATCH_CONTEXT);
    hasher.field(evaluation.as_bytes()).field(&created_at_ms.to_le_bytes()).field(candidate.as_bytes());
    hasher.field(&intent_seq.to_le_bytes());
    BatchKey::new(format!("cpe-{}", &hex_encode(&hasher.finish())[..32]))
}

fn hex_encode(bytes: &[u8; 32]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut out = String::with_capacity(64);
    for b in bytes {
        out.push(char::from(DIGITS[usize::from(b >> 4)]));
        out.push(char::from(DIGITS[usize::from(b & 0x0f)]));
    }
    out
}

fn hex_decode(s: &str) -> Result<[u8; 32], ParseIdError> {
    let raw = s.as_bytes();
    if raw.len() != 64 {
        return Err(ParseIdError);
    }
    let nibble = |c: u8| match c {
        b'0'..=b'9' => Ok(c - b'0'),
        b'a'..=b'f' => Ok(c - b'a' + 10),
        _ => Err(ParseIdError),
    };
    let mut out = [0u8; 32];
    for (i, pair) in raw.chunks_exact(2).enumerate() {
        out[i] = (nibble(pair[0])? << 4) | nibble(pair[1])?;
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(tenant: &str, source: &str, content: &str, schema: &str) -> ExtractionId {
        let hash = SourceHash::compute(content.as_bytes(), schema);
        ExtractionId::compute(tenant, source, &hash, schema)
    }

    #[test]
    fn field_boundaries_cannot_be_forged() {
        assert_ne!(id("a:b", "c", "x", "s@1"), id("a", "b:c", "x", "s@1"));
        assert_ne!(id("ab", "", "x", "s@1"), id("a", "b", "x", "s@1"));
    }

    #[test]
    fn each_component_changes_the_identity() {
        let base = id("t", "s", "content", "code-review@1");
        assert_eq!(base, id("t", "s", "content", "code-review@1"));
        assert_ne!(base, id("t2", "s", "content", "code-review@1"));
        assert_ne!(base, id("t", "s2", "content", "code-review@1"));
        assert_ne!(base, id("t", "s", "content2", "code-review@1"));
        assert_ne!(base, id("t", "s", "content", "code-review@2"));
    }

    #[test]
    fn source_hash_includes_schema_version() {
        assert_ne!(SourceHash::compute(b"same", "a@1"), SourceHash::compute(b"same", "a@2"));
    }

    #[test]
    fn known_vector_is_stable() {
        // A change here means every stored identity changes: that is a format break.
        let got = id("acme", "PR-1", "fn main() {}", "code-review@1").to_hex();
        assert_eq!(got.len(), 64);
        assert_eq!(got, include_str!("../../tests/fixtures/identity_v1.txt").trim());
    }

    #[test]
    fn hex_round_trips_and_rejects_bad_input() {
        let h = id("t", "s", "c", "x@1");
        assert_eq!(h.to_hex().parse::<ExtractionId>(), Ok(h));
        assert!("ABCD".parse::<ExtractionId>().is_err());
        assert!("g".repeat(64).parse::<ExtractionId>().is_err());
        assert!(h.to_hex().to_uppercase().parse::<ExtractionId>().is_err());
    }

    #[test]
    fn finding_key_depends_on_extraction_and_identity() {
        let a = id("t", "s", "c", "x@1");
        let b = id("t", "s", "c2", "x@1");
        let ident = r#"["R1","src/a.rs",3]"#;
        assert_ne!(FindingKey::compute(&a, ident), FindingKey::compute(&b, ident));
        assert_ne!(FindingKey::compute(&a, ident), FindingKey::compute(&a, r#"["R1","src/a.rs",4]"#));
    }

    #[test]
    fn a_prefix_bounds_exactly_the_ids_that_start_with_it() {
        let id: ExtractionId = "3fa9".repeat(16).parse().unwrap();
        for len in [4, 5, 12, 63, 64] {
            let prefix: IdPrefix = id.to_hex()[..len].parse().unwrap();
            let (low, high) = prefix.bounds();
            assert!(low <= id.0 && id.0 <= high, "{len}");
            assert!(id.to_hex().starts_with(prefix.as_str()));
            let starts = |b: [u8; 32]| ExtractionId(b).to_hex().starts_with(prefix.as_str());
            assert!(starts(low) && starts(high), "{len}: the bounds start with it too");
        }
        let odd: IdPrefix = "3fa9c".parse().unwrap();
        let (low, high) = odd.bounds();
        assert_eq!((low[2], high[2]), (0xc0, 0xcf));
        for bad in ["3fa", "3FA9", "3fa9g", &"a".repeat(65)] {
            assert!(bad.parse::<IdPrefix>().is_err(), "{bad}");
        }
    }
}
