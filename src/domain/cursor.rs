//! Opaque page cursors. A listing's position is a global sequence number (or a finding
//! key); handed out as is, consecutive cursors would tell a tenant how much everyone else
//! ingests. A cursor is instead the position encrypted and authenticated under a key kept
//! in the store (a deterministic SIV construction over keyed BLAKE3): it means nothing
//! outside this store, and a cursor that was altered, made up, or taken from another
//! listing (the scope: which query, which tenant) does not open.

use std::fmt;

const TAG_BYTES: usize = 16;
const MAX_POSITION_BYTES: usize = 64;

/// The secret behind every cursor of one store.
#[derive(Clone, PartialEq, Eq)]
pub struct CursorKey([u8; 32]);

impl fmt::Debug for CursorKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("CursorKey(<redacted>)")
    }
}

impl CursorKey {
    pub fn new(bytes: [u8; 32]) -> Self {
        Self(bytes)
    }

    /// The cursor for `position` within the listing named by `scope`.
    pub fn seal(&self, scope: &str, position: &[u8]) -> String {
        let tag = self.tag(scope, position);
        let pad = self.pad(&tag, position.len());
        let mut out = String::with_capacity(2 * (TAG_BYTES + position.len()));
        for b in tag.iter().chain(position.iter().zip(&pad).map(|(p, k)| p ^ k).collect::<Vec<u8>>().iter()) {
            out.push_str(&format!("{b:02x}"));
        }
        out
    }

    /// The position a cursor from [`CursorKey::seal`] with the same scope holds, or
    /// `None` for anything else.
    pub fn open(&self, scope: &str, cursor: &str) -> Option<Vec<u8>> {
        let bytes = from_hex(cursor)?;
        if bytes.len() < TAG_BYTES || bytes.len() > TAG_BYTES + MAX_POSITION_BYTES {
            return None;
        }
        let (tag, sealed) = bytes.split_at(TAG_BYTES);
        let pad = self.pad(tag, sealed.len());
        let position: Vec<u8> = sealed.iter().zip(&pad).map(|(c, k)| c ^ k).collect();
        let expected = self.tag(scope, &position);
        // Constant time, so a forger learns nothing from how long a refusal takes.
        bool::from(subtle::ConstantTimeEq::ct_eq(&expected[..], tag)).then_some(position)
    }

    /// A key for another purpose (such as signing console sessions), derived from this
    /// one: it lives and dies with the store's secret, and nothing sealed under one
    /// purpose opens under another.
    pub fn derive(&self, purpose: &str) -> [u8; 32] {
        let mut hasher = blake3::Hasher::new_keyed(&self.0);
        hasher.update(b"commitpoint derived key\0");
        hasher.update(purpose.as_bytes());
        *hasher.finalize().as_bytes()
    }

    fn tag(&self, scope: &str, position: &[u8]) -> [u8; TAG_BYTES] {
        let mut hasher = blake3::Hasher::new_keyed(&self.0);
        hasher.update(b"commitpoint cursor tag\0");
        hasher.update(&(scope.len() as u64).to_le_bytes());
        hasher.update(scope.as_bytes());
        hasher.update(position);
        let mut tag = [0; TAG_BYTES];
        tag.copy_from_slice(&hasher.finalize().as_bytes()[..TAG_BYTES]);
        tag
    }

    fn pad(&self, tag: &[u8], len: usize) -> Vec<u8> {
        let mut hasher = blake3::Hasher::new_keyed(&self.0);
        hasher.update(b"commitpoint cursor pad\0");
        hasher.update(tag);
        let mut pad = vec![0; len];
        hasher.finalize_xof().fill(&mut pad);
        pad
    }
}

fn from_hex(text: &str) -> Option<Vec<u8>> {
    if !text.len().is_multiple_of(2) {
        return None;
    }
    let digit = |c: u8| match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        _ => None,
    };
    text.as_bytes().chunks(2).map(|pair| Some(digit(pair[0])? << 4 | digit(pair[1])?)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cursors_round_trip_and_refuse_anything_else() {
        let key = CursorKey::new([7; 32]);
        let cursor = key.seal("list", &42u64.to_be_bytes());
        assert_eq!(key.open("list", &cursor), Some(42u64.to_be_bytes().to_vec()));
        assert_eq!(key.open("list tenant=b", &cursor), None, "another listing's cursor");
        assert_eq!(CursorKey::new([8; 32]).open("list", &cursor), None, "another store's cursor");
        let mut bytes = cursor.into_bytes();
        bytes[40] = if bytes[40] == b'0' { b'1' } else { b'0' };
        let altered = String::from_utf8(bytes).unwrap();
        assert_eq!(key.open("list", &altered), None);
        for junk in ["", "xyz", "00", &"0".repeat(48), &"f".repeat(400)] {
            assert_eq!(key.open("list", junk), None, "{junk}");
        }
        assert_ne!(key.seal("list", &1u64.to_be_bytes()), key.seal("list", &2u64.to_be_bytes()));
    }
}
