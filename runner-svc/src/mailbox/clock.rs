//! Clocks for the mailbox: wall clock for durable times, monotonic for leases. Tests use
//! `ManualClock` to expire leases without sleeping.

use std::{
    sync::atomic::{AtomicU64, Ordering},
    time::{Duration, Instant},
};

pub trait Clock: Send + Sync {
    /// Wall-clock epoch milliseconds.
    fn wall_ms(&self) -> u64;
    /// Monotonic time since an arbitrary start; never goes backwards.
    fn mono(&self) -> Duration;
}

#[derive(Debug)]
pub struct SystemClock {
    start: Instant,
}

impl Default for SystemClock {
    fn default() -> Self {
        Self {
            start: Instant::now(),
        }
    }
}

impl Clock for SystemClock {
    fn wall_ms(&self) -> u64 {
        arbor_shared::time::now_ms()
    }

    fn mono(&self) -> Duration {
        self.start.elapsed()
    }
}

/// The store's clock for durable times (the database server's, for a store shared by
/// replicas), this process's monotonic clock for its own lease bookkeeping.
pub struct StoreClock {
    store: crate::store::Store,
    start: Instant,
}

impl StoreClock {
    pub fn new(store: crate::store::Store) -> Self {
        Self {
            store,
            start: Instant::now(),
        }
    }
}

impl Clock for StoreClock {
    fn wall_ms(&self) -> u64 {
        self.store.now_ms()
    }

    fn mono(&self) -> Duration {
        self.start.elapsed()
    }
}

/// A clock that only moves when told to.
#[derive(Debug)]
pub struct ManualClock {
    wall_ms: AtomicU64,
    mono_ms: AtomicU64,
}

impl ManualClock {
    pub fn new(wall_ms: u64) -> Self {
        Self {
            wall_ms: AtomicU64::new(wall_ms),
            mono_ms: AtomicU64::new(0),
        }
    }

    pub fn advance(&self, by: Duration) {
        let ms = by.as_millis() as u64;
        self.wall_ms.fetch_add(ms, Ordering::SeqCst);
        self.mono_ms.fetch_add(ms, Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    fn wall_ms(&self) -> u64 {
        self.wall_ms.load(Ordering::SeqCst)
    }

    fn mono(&self) -> Duration {
        Duration::from_millis(self.mono_ms.load(Ordering::SeqCst))
    }
}
