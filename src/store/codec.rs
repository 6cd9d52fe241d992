//! The one place that turns stored values into bytes and back.
//!
//! Every value starts with a one-byte format version, followed by bincode 2 (standard
//! config, serde). bincode has no schema, so a changed struct must get a new version
//! and a migration here; the golden-bytes tests fail if an encoding moves silently.

use serde::Serialize;
use serde::de::DeserializeOwned;

use super::Error;

/// A value stored in redb, with the format version its bytes are written in.
pub trait Versioned: Serialize + DeserializeOwned {
    const KIND: &'static str;
    const VERSION: u8;
}

fn config() -> bincode::config::Configuration {
    bincode::config::standard()
}

pub fn encode<T: Versioned>(value: &T) -> Result<Vec<u8>, Error> {
    let mut out = vec![T::VERSION];
    bincode::serde::encode_into_std_write(value, &mut out, config())
        .map_err(|e| Error::Encode { kind: T::KIND, reason: e.to_string() })?;
    Ok(out)
}

pub fn decode<T: Versioned>(bytes: &[u8]) -> Result<T, Error> {
    let corrupt = |reason: String| Error::Corrupt { kind: T::KIND, reason };
    let (&version, body) = bytes.split_first().ok_or_else(|| corrupt("empty value".to_string()))?;
    if version != T::VERSION {
        return Err(corrupt(format!(
            "format version {version} is not supported by this build (expected {}); was the file written by a newer commitpoint?",
            T::VERSION
        )));
    }
    let (value, used) = bincode::serde::decode_from_slice(body, config()).map_err(|e| corrupt(e.to_string()))?;
    if used != body.len() {
        return Err(corrupt(format!("{} trailing bytes", body.len() - used)));
    }
    Ok(value)
}
