//! Page tokens of every List RPC: the last key a page returned, with a checksum over the list's
//! name and the key. A token this service did not hand out (garbled, cut short, or another
//! list's) is refused with INVALID_ARGUMENT instead of being read as a place in the list, which
//! would answer OK with a page that looks like the end.

/// Rows of a page when a List RPC's `page_size` is 0.
pub const DEFAULT_SIZE: usize = 100;
/// The most rows a page holds; a larger `page_size` is clamped to it (the proto's "at most
/// 1000"), the same in every List RPC of both services.
pub const MAX_SIZE: usize = 1000;

/// Rows of a page for a requested `page_size`: 0 means [`DEFAULT_SIZE`], more than
/// [`MAX_SIZE`] is clamped to it.
pub fn size(requested: u32) -> usize {
    match requested as usize {
        0 => DEFAULT_SIZE,
        n => n.min(MAX_SIZE),
    }
}

/// The token that continues `list` after `last_key`.
pub fn token(list: &str, last_key: &[u8]) -> String {
    let mut out = hex::encode(last_key);
    out.push_str(&hex::encode(checksum(list, last_key).to_be_bytes()));
    out
}

/// The key a token continues after; `None` unless `token(list, key)` made it.
pub fn key(list: &str, token: &str) -> Option<Vec<u8>> {
    let mut bytes = hex::decode(token).ok()?;
    let split = bytes.len().checked_sub(4)?;
    let sum = u32::from_be_bytes(bytes[split..].try_into().ok()?);
    bytes.truncate(split);
    (checksum(list, &bytes) == sum).then_some(bytes)
}

/// What a refused token is told.
pub const INVALID: &str = "not a page token this list handed out; start again without one";

fn checksum(list: &str, key: &[u8]) -> u32 {
    let mut h = crc32fast::Hasher::new();
    h.update(list.as_bytes());
    h.update(&[0]);
    h.update(key);
    h.finalize()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_default_and_clamp() {
        assert_eq!(size(0), DEFAULT_SIZE);
        assert_eq!(size(1), 1);
        assert_eq!(size(1000), 1000);
        assert_eq!(size(1001), MAX_SIZE);
        assert_eq!(size(u32::MAX), MAX_SIZE);
    }

    #[test]
    fn tokens_round_trip_and_foreign_ones_are_refused() {
        let t = token("runs", b"run-7");
        assert_eq!(key("runs", &t).as_deref(), Some(&b"run-7"[..]));
        assert_eq!(key("runs", &token("runs", b"")).as_deref(), Some(&b""[..]));
        assert_eq!(key("jobs", &t), None, "another list's token");
        for bad in [
            "",
            "zzz",
            "abcd",
            "00",
            &t[..t.len() - 1],
            &format!("{t}00"),
        ] {
            assert_eq!(key("runs", bad), None, "{bad:?}");
        }
        let mut flipped = t.into_bytes();
        flipped[0] = if flipped[0] == b'7' { b'6' } else { b'7' };
        assert_eq!(key("runs", &String::from_utf8(flipped).unwrap()), None);
    }
}
