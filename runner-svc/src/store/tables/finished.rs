//! `finished`: `{kind}{finished_at BE u64}{id}` → (), for finished runs (`r`), final jobs (`j`)
//! and ended tasks (`t`), oldest first, so retention walks only what it may delete.

/// Kind byte of a finished run.
pub const RUN: u8 = b'r';
/// Kind byte of a final job.
pub const JOB: u8 = b'j';
/// Kind byte of an ended task.
pub const TASK: u8 = b't';

/// The key of an entry: `id` of `kind` finished at `at_ms`.
pub fn key(kind: u8, at_ms: u64, id: &str) -> Vec<u8> {
    let mut k = Vec::with_capacity(9 + id.len());
    k.push(kind);
    k.extend_from_slice(&at_ms.to_be_bytes());
    k.extend_from_slice(id.as_bytes());
    k
}

/// When an entry's record finished, and its id (lossy: a damaged id still names its entry).
pub fn parse(key: &[u8]) -> Option<(u64, String)> {
    let at = key.get(1..9)?;
    let at = u64::from_be_bytes(at.try_into().ok()?);
    Some((at, String::from_utf8_lossy(&key[9..]).into_owned()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_finished_key_keeps_its_layout_and_round_trips() {
        let k = key(RUN, 0x0102, "run-1");
        assert_eq!(k, b"r\0\0\0\0\0\0\x01\x02run-1");
        assert_eq!(parse(&k), Some((0x0102, "run-1".to_string())));
        assert!(key(JOB, 9, "b") < key(JOB, 10, "a"), "oldest first");
        assert_eq!(parse(b"t\0"), None);
    }
}
