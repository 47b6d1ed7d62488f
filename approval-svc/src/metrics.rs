//! Counters an operator needs to see that the loop with the runner is healthy. They are logged
//! with every notable change and readable in process (tests, a future metrics endpoint).

use std::sync::atomic::{AtomicU64, Ordering};

#[derive(Debug, Default)]
pub struct Metrics {
    pub events_processed: AtomicU64,
    /// The runner compacted the event log past our cursor: events may have been lost.
    pub cursor_lost: AtomicU64,
    pub malformed_events: AtomicU64,
    pub stream_reconnects: AtomicU64,
    pub acks_sent: AtomicU64,
    pub deliveries_accepted: AtomicU64,
    pub delivery_failures: AtomicU64,
    pub deliveries_refused: AtomicU64,
}

impl Metrics {
    pub fn inc(counter: &AtomicU64) -> u64 {
        counter.fetch_add(1, Ordering::Relaxed) + 1
    }

    pub fn add(counter: &AtomicU64, n: u64) -> u64 {
        counter.fetch_add(n, Ordering::Relaxed) + n
    }

    pub fn get(counter: &AtomicU64) -> u64 {
        counter.load(Ordering::Relaxed)
    }
}
