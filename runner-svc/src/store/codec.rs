//! Encoding of stored records (postcard) and of the composite keys the trees are ordered by.

use serde::{Serialize, de::DeserializeOwned};

/// A stored value that no longer decodes: disk corruption or an incompatible build.
#[derive(Debug, Clone, thiserror::Error)]
#[error("corrupt {what} record: {message}")]
pub struct Corrupt {
    pub what: &'static str,
    pub message: String,
}

pub fn encode<T: Serialize>(value: &T) -> Vec<u8> {
    // Serialising plain structs into a Vec cannot fail; an empty record is caught on decode.
    postcard::to_allocvec(value).unwrap_or_default()
}

pub fn decode<T: DeserializeOwned>(what: &'static str, bytes: &[u8]) -> Result<T, Corrupt> {
    postcard::from_bytes(bytes).map_err(|e| Corrupt {
        what,
        message: e.to_string(),
    })
}

/// `a\0b`: ids are validated to contain no NUL, so the separator keeps prefixes unambiguous.
pub fn pair_key(a: &str, b: &str) -> Vec<u8> {
    let mut k = Vec::with_capacity(a.len() + b.len() + 1);
    k.extend_from_slice(a.as_bytes());
    k.push(0);
    k.extend_from_slice(b.as_bytes());
    k
}

/// The two parts of a [`pair_key`] (`None`: not one).
pub fn split_pair(key: &[u8]) -> Option<(&[u8], &[u8])> {
    let at = key.iter().position(|b| *b == 0)?;
    Some((&key[..at], &key[at + 1..]))
}

/// `a\0` — the prefix of every `pair_key(a, _)`.
pub fn prefix(a: &str) -> Vec<u8> {
    let mut k = Vec::with_capacity(a.len() + 1);
    k.extend_from_slice(a.as_bytes());
    k.push(0);
    k
}

pub fn u64_key(n: u64) -> [u8; 8] {
    n.to_be_bytes()
}

pub fn read_u64(bytes: &[u8]) -> u64 {
    bytes
        .get(..8)
        .and_then(|b| <[u8; 8]>::try_from(b).ok())
        .map(u64::from_be_bytes)
        .unwrap_or(0)
}

/// Bytes that sort higher priorities first.
pub fn priority_key(priority: i32) -> [u8; 4] {
    (!((priority as u32) ^ 0x8000_0000)).to_be_bytes()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn priority_keys_sort_high_first() {
        let mut ps = vec![0, -5, 7, i32::MAX, i32::MIN, 1];
        ps.sort_by_key(|p| priority_key(*p));
        assert_eq!(ps, vec![i32::MAX, 7, 1, 0, -5, i32::MIN]);
    }

    #[test]
    fn truncated_records_are_corrupt_not_panics() {
        let bytes = encode(&("hello".to_string(), 42u64));
        for cut in 0..bytes.len() {
            assert!(decode::<(String, u64)>("test", &bytes[..cut]).is_err());
        }
    }
}
