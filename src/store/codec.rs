//! The one place that turns stored values into bytes and back.
//!
//! Every value starts with a one-byte format version, followed by bincode 2 (standard
//! config, serde). bincode has no schema, so a changed struct must get a new version
//! and a migration here; the golden-bytes tests fail if an encoding moves silently.

use bincode::config::{Configuration, Limit, LittleEndian, Varint};
use serde::Serialize;
use serde::de::DeserializeOwned;

use super::Error;

/// A value stored in redb, with the format version its bytes are written in.
pub(crate) trait Versioned: Serialize + DeserializeOwned {
    const KIND: &'static str;
    const VERSION: u8;

    /// Reads a value written by an older format version of this type. `None` means this
    /// build never wrote that version. Implementations decode the old shape with
    /// [`decode_body`] and convert it.
    fn upgrade(_version: u8, _body: &[u8]) -> Option<Result<Self, String>> {
        None
    }
}

/// redb's own ceiling on one value (3 GiB). bincode sizes a string's buffer from its
/// length prefix before reading it, so without a limit a corrupt prefix aborts the
/// process on a failed allocation; with one it is `Corrupt`. Never rejects a value redb
/// could hold, and only bounds decoding: the bytes written are unchanged.
const MAX_VALUE_BYTES: usize = 3 << 30;

fn config() -> Configuration<LittleEndian, Varint, Limit<MAX_VALUE_BYTES>> {
    bincode::config::standard().with_limit::<MAX_VALUE_BYTES>()
}

pub(crate) fn encode<T: Versioned>(value: &T) -> Result<Vec<u8>, Error> {
    let mut out = vec![T::VERSION];
    bincode::serde::encode_into_std_write(value, &mut out, config())
        .map_err(|e| Error::Encode { kind: T::KIND, reason: e.to_string() })?;
    Ok(out)
}

pub(crate) fn decode<T: Versioned>(bytes: &[u8]) -> Result<T, Error> {
    let corrupt = |reason: String| Error::Corrupt { kind: T::KIND, reason };
    let (&version, body) = bytes.split_first().ok_or_else(|| corrupt("empty value".to_string()))?;
    if version != T::VERSION {
        if let Some(upgraded) = T::upgrade(version, body) {
            return upgraded.map_err(corrupt);
        }
        return Err(corrupt(format!(
            "format version {version} is not supported by this build (expected {}); was the file written by a newer commitpoint?",
            T::VERSION
        )));
    }
    decode_body(body).map_err(corrupt)
}

/// Decodes one value's body (after the version byte); the whole body must be used.
pub(crate) fn decode_body<U: DeserializeOwned>(body: &[u8]) -> Result<U, String> {
    let (value, used) = bincode::serde::decode_from_slice(body, config()).map_err(|e| e.to_string())?;
    if used != body.len() {
        return Err(format!("{} trailing bytes", body.len() - used));
    }
    Ok(value)
}
