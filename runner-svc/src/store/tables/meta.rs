//! `events` (`{seq BE u64}` → event) and `meta`: the event log's counters, durable subscribers'
//! cursors (`sub:{subscriber}`), runs' trace contexts (`trace:{run_id}`) and the state counts
//! (`count/{kind}/{label}`).

pub use crate::store::{FIRST_SEQ, NEXT_SEQ};

/// The key of the event with `seq`.
pub fn event_key(seq: u64) -> [u8; 8] {
    seq.to_be_bytes()
}

/// The seq of an event key.
pub fn seq_of(key: &[u8]) -> Option<u64> {
    Some(u64::from_be_bytes(key.get(..8)?.try_into().ok()?))
}

/// A big-endian seq or generation, as `meta` and `mailboxes` store it.
pub fn u64_value(n: u64) -> [u8; 8] {
    n.to_be_bytes()
}

/// The prefix of every durable subscriber's cursor key.
pub const CURSORS: &[u8] = b"sub:";

/// The key of a durable subscriber's cursor.
pub fn cursor_key(subscriber: &str) -> Vec<u8> {
    [CURSORS, subscriber.as_bytes()].concat()
}

/// The subscriber a cursor key belongs to (lossy: a damaged name still names its cursor).
pub fn subscriber_of(key: &[u8]) -> String {
    String::from_utf8_lossy(key.strip_prefix(CURSORS).unwrap_or(key)).into_owned()
}

/// The key of a run's trace context.
pub fn trace_key(run_id: &str) -> Vec<u8> {
    [b"trace:".as_slice(), run_id.as_bytes()].concat()
}

/// The key of a state count: `kind` is `run`, `job` or `suspensions`, `label` the status or
/// category as the metric labels it.
pub fn count_key(kind: &str, label: &str) -> Vec<u8> {
    format!("count/{kind}/{label}").into_bytes()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn meta_and_event_keys_keep_their_layout_and_round_trip() {
        assert_eq!(event_key(258), [0, 0, 0, 0, 0, 0, 1, 2]);
        assert_eq!(seq_of(&event_key(258)), Some(258));
        assert_eq!(cursor_key("approval-svc"), b"sub:approval-svc");
        assert!(cursor_key("approval-svc").starts_with(CURSORS));
        assert_eq!(subscriber_of(&cursor_key("approval-svc")), "approval-svc");
        assert_eq!(trace_key("run-1"), b"trace:run-1");
        assert_eq!(count_key("job", "queued"), b"count/job/queued");
        assert_eq!(u64_value(7), 7u64.to_be_bytes());
    }
}
