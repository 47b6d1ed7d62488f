//! The leases this process holds on its claims, on the monotonic clock: the reaper returns to the
//! queue those that run out; the token in the store stays the fencing authority.

use std::{
    collections::HashMap,
    sync::{Arc, Mutex},
    time::Duration,
};

use super::Clock;

#[derive(Debug, Clone)]
pub(super) struct Lease {
    pub(super) token: String,
    pub(super) deadline: Duration,
}

/// The leases this process holds, on the monotonic clock; the reaper returns to the queue
/// those that run out. Shared with the claims a runner transaction makes for a waiting worker
/// (`runs::handoff`): such a claim is tracked as it is made, so its lease runs out like any
/// other when the claim never reaches its worker (the caller went away before the hand-off,
/// the worker stopped).
#[derive(Clone)]
pub struct Leases {
    held: Arc<Mutex<HashMap<String, Lease>>>,
    clock: Arc<dyn Clock>,
    lease: Duration,
}

impl Leases {
    pub(super) fn new(clock: Arc<dyn Clock>, lease: Duration) -> Self {
        Self {
            held: Arc::default(),
            clock,
            lease,
        }
    }

    /// How long a claim holds its job without an extension.
    pub fn lease(&self) -> Duration {
        self.lease
    }

    /// Tracks `token`'s lease on `job_id`, running out one lease from now. A claim that does
    /// not commit leaves an entry that runs out and changes nothing: the reaper's expiry is
    /// fenced by the token.
    pub fn track(&self, job_id: &str, token: &str) {
        let deadline = self.clock.mono() + self.lease;
        if let Ok(mut held) = self.held.lock() {
            held.insert(
                job_id.to_string(),
                Lease {
                    token: token.to_string(),
                    deadline,
                },
            );
        }
    }

    /// Stops tracking `job_id`'s lease, whoever holds it.
    pub(super) fn forget(&self, job_id: &str) {
        if let Ok(mut held) = self.held.lock() {
            held.remove(job_id);
        }
    }

    /// Stops tracking `job_id`'s lease if `token` still holds it (a newer claim's stays).
    pub(super) fn forget_if(&self, job_id: &str, token: &str) {
        if let Ok(mut held) = self.held.lock()
            && held.get(job_id).is_some_and(|l| l.token == token)
        {
            held.remove(job_id);
        }
    }

    /// Whether this process tracks a lease on `job_id` (a claim of one of its workers).
    pub(super) fn holds(&self, job_id: &[u8]) -> bool {
        let Ok(job_id) = std::str::from_utf8(job_id) else {
            return false;
        };
        self.held.lock().is_ok_and(|held| held.contains_key(job_id))
    }

    /// Whether `token` holds an unexpired lease on `job_id`.
    pub(super) fn valid(&self, job_id: &str, token: &str) -> bool {
        let now = self.clock.mono();
        self.held
            .lock()
            .ok()
            .and_then(|held| held.get(job_id).cloned())
            .is_some_and(|l| l.token == token && l.deadline > now)
    }

    /// The leases that have run out, by job id in order (a fixed order keeps retries
    /// deterministic, e.g. which of two jobs sharing a dedupe key takes it back first).
    pub(super) fn run_out(&self) -> Vec<(String, Lease)> {
        let now = self.clock.mono();
        let mut expired: Vec<(String, Lease)> = match self.held.lock() {
            Ok(held) => held
                .iter()
                .filter(|(_, l)| l.deadline <= now)
                .map(|(id, l)| (id.clone(), l.clone()))
                .collect(),
            Err(_) => Vec::new(),
        };
        expired.sort_by(|a, b| a.0.cmp(&b.0));
        expired
    }
}
