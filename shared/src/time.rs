//! Wall-clock helpers. Durable deadlines (timers, backoff, approval deadlines) are wall-clock
//! milliseconds because they must survive restarts; leases use the monotonic clock instead.

use std::time::{SystemTime, UNIX_EPOCH};

use prost_types::Timestamp;

/// Milliseconds since the Unix epoch.
pub fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// A protobuf timestamp for epoch milliseconds.
pub fn timestamp(ms: u64) -> Timestamp {
    Timestamp {
        seconds: (ms / 1000) as i64,
        nanos: ((ms % 1000) * 1_000_000) as i32,
    }
}

/// `None` for 0 (unset), a timestamp otherwise.
pub fn opt_timestamp(ms: u64) -> Option<Timestamp> {
    (ms != 0).then(|| timestamp(ms))
}

/// Epoch milliseconds of a protobuf timestamp (negative times clamp to 0).
pub fn from_timestamp(ts: &Timestamp) -> u64 {
    let ms = ts.seconds.saturating_mul(1000) + i64::from(ts.nanos / 1_000_000);
    ms.max(0) as u64
}
