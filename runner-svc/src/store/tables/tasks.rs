//! `tasks` (task_id → task), `task_queue` (`{available_at BE}{order BE}{task_id}` → task type,
//! queued tasks in dispatch order) and `task_leases` (`{lease_until BE}{task_id}` → (), soonest
//! expiry first).

/// Bytes before the task id in a queue key.
pub const QUEUE_HEAD: usize = 16;
/// Bytes before the task id in a lease key.
pub const LEASE_HEAD: usize = 8;

/// `{available_at BE}{order BE}{task_id}`.
pub fn queue_key(available_at_ms: u64, order: u64, task_id: &str) -> Vec<u8> {
    let mut k = Vec::with_capacity(QUEUE_HEAD + task_id.len());
    k.extend_from_slice(&available_at_ms.to_be_bytes());
    k.extend_from_slice(&order.to_be_bytes());
    k.extend_from_slice(task_id.as_bytes());
    k
}

/// `{lease_until BE}{task_id}`.
pub fn lease_key(lease_until_ms: u64, task_id: &str) -> Vec<u8> {
    let mut k = Vec::with_capacity(LEASE_HEAD + task_id.len());
    k.extend_from_slice(&lease_until_ms.to_be_bytes());
    k.extend_from_slice(task_id.as_bytes());
    k
}

/// (available at, task id) of a queue key.
pub fn parse_queue_key(key: &[u8]) -> Option<(u64, &str)> {
    split(key, QUEUE_HEAD)
}

/// (lease until, task id) of a lease key.
pub fn parse_lease_key(key: &[u8]) -> Option<(u64, &str)> {
    split(key, LEASE_HEAD)
}

fn split(key: &[u8], skip: usize) -> Option<(u64, &str)> {
    let at = u64::from_be_bytes(key.get(..8)?.try_into().ok()?);
    let id = std::str::from_utf8(key.get(skip..)?).ok()?;
    Some((at, id))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn task_keys_keep_their_layout_and_round_trip() {
        let q = queue_key(5, 6, "a");
        assert_eq!(q, b"\0\0\0\0\0\0\0\x05\0\0\0\0\0\0\0\x06a");
        assert_eq!(parse_queue_key(&q), Some((5, "a")));
        let l = lease_key(7, "t1");
        assert_eq!(l, b"\0\0\0\0\0\0\0\x07t1");
        assert_eq!(parse_lease_key(&l), Some((7, "t1")));
        assert_eq!(parse_lease_key(b"short"), None);
    }

    #[test]
    fn queue_keys_sort_by_time_then_order() {
        let a = queue_key(5, 9, "b");
        let b = queue_key(6, 1, "a");
        let c = queue_key(6, 2, "a");
        assert!(a < b && b < c);
        assert_eq!(parse_queue_key(&b), Some((6, "a")));
    }
}
