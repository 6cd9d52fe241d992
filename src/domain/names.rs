//! Names that are strings on the wire and in the file but must not be mixed up in code:
//! a batch key is not a lease token, and neither is a provider's name. Each serializes
//! as the bare string (`serde(transparent)`), so the stored format is unchanged.

use std::fmt;

use serde::{Deserialize, Serialize};

macro_rules! name {
    ($(#[$meta:meta])* $name:ident) => {
        $(#[$meta])*
        #[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Default, Serialize, Deserialize)]
        #[serde(transparent)]
        pub struct $name(String);

        impl $name {
            pub fn new(text: impl Into<String>) -> Self {
                Self(text.into())
            }

            pub fn as_str(&self) -> &str {
                &self.0
            }

            pub fn into_string(self) -> String {
                self.0
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        }

        impl From<String> for $name {
            fn from(text: String) -> Self {
                Self(text)
            }
        }

        impl From<&str> for $name {
            fn from(text: &str) -> Self {
                Self(text.to_string())
            }
        }

        impl PartialEq<str> for $name {
            fn eq(&self, other: &str) -> bool {
                self.0 == other
            }
        }

        impl PartialEq<&str> for $name {
            fn eq(&self, other: &&str) -> bool {
                self.0 == *other
            }
        }
    };
}

name!(
    /// Derived from a submit intent (`identity::batch_key`): how a provider's job is found
    /// again after a crash, and the authority a staged answer is committed under.
    BatchKey
);
name!(
    /// A fencing token handed out with a claim; only its holder may post the result.
    LeaseToken
);
name!(
    /// A provider's `[providers.<name>]` table name: what schedulers, batches, health,
    /// routing and the ledger know it by.
    ProviderName
);

#[cfg(test)]
mod tests {
    use super::*;

    /// The stored format depends on this: a name encodes exactly as its string does.
    #[test]
    fn a_name_serializes_as_its_bare_string() {
        let key = BatchKey::new("b-1");
        assert_eq!(serde_json::to_string(&key).unwrap(), "\"b-1\"");
        let config = bincode::config::standard();
        let as_name = bincode::serde::encode_to_vec(LeaseToken::new("lt-9"), config).unwrap();
        let as_string = bincode::serde::encode_to_vec("lt-9".to_string(), config).unwrap();
        assert_eq!(as_name, as_string);
        assert_eq!(ProviderName::from("openai-eu"), "openai-eu");
    }
}
