//! `trees`: `{tree_id}\0{version BE u32}` → tree record.

use crate::store::codec;

/// The key of one version of a tree.
pub fn key(id: &str, version: u32) -> Vec<u8> {
    let mut k = codec::prefix(id);
    k.extend_from_slice(&version.to_be_bytes());
    k
}

/// The prefix of every version of a tree (the last one under it is the newest).
pub fn versions(id: &str) -> Vec<u8> {
    codec::prefix(id)
}

/// The version inside a tree key.
pub fn version_of(key: &[u8]) -> Option<u32> {
    let (_, version) = key.split_last_chunk::<4>()?;
    Some(u32::from_be_bytes(*version))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tree_key_keeps_its_layout_and_round_trips() {
        let k = key("tree", 258);
        assert_eq!(k, b"tree\0\x00\x00\x01\x02");
        assert!(k.starts_with(&versions("tree")));
        assert_eq!(version_of(&k), Some(258));
        // Versions sort in number order.
        assert!(key("tree", 9) < key("tree", 10));
    }
}
