//! Rate-limited logging of repeated failures: the first of a kind is logged at once, the same
//! failure again within the interval only counted, and the next one after the interval logged
//! with how many were passed over. A peer that is down for an hour then costs a few lines per
//! interval instead of one per attempt (delivery to the runner, calls to webhooks).

use std::{
    collections::HashMap,
    sync::{Mutex, PoisonError},
    time::{Duration, Instant},
};

/// Kinds of failure remembered at most; beyond it, those whose interval has passed are
/// forgotten (their pending counts with them), so messages that carry ids cannot grow it
/// without bound.
const MAX_KINDS: usize = 256;

/// Failures logged at most once per `every` for each kind (a key the caller picks, typically
/// the status code and message).
#[derive(Debug)]
pub struct RateLimitedLog {
    every: Duration,
    kinds: Mutex<HashMap<String, Kind>>,
}

#[derive(Debug)]
struct Kind {
    logged_at: Instant,
    passed_over: u64,
}

impl RateLimitedLog {
    pub fn new(every: Duration) -> Self {
        Self {
            every,
            kinds: Mutex::new(HashMap::new()),
        }
    }

    /// One more failure of kind `key`: `Some(n)` when it is to be logged now, `n` being how
    /// many of that kind were passed over since the last line; `None` to count it silently.
    pub fn admit(&self, key: &str) -> Option<u64> {
        self.admit_at(key, Instant::now())
    }

    fn admit_at(&self, key: &str, now: Instant) -> Option<u64> {
        let mut kinds = self.kinds.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(kind) = kinds.get_mut(key) {
            if now.duration_since(kind.logged_at) < self.every {
                kind.passed_over += 1;
                return None;
            }
            let passed_over = std::mem::take(&mut kind.passed_over);
            kind.logged_at = now;
            return Some(passed_over);
        }
        if kinds.len() >= MAX_KINDS {
            let every = self.every;
            kinds.retain(|_, k| now.duration_since(k.logged_at) < every);
            if kinds.len() >= MAX_KINDS {
                // Every kind is recent: log this one without remembering it.
                return Some(0);
            }
        }
        kinds.insert(
            key.to_string(),
            Kind {
                logged_at: now,
                passed_over: 0,
            },
        );
        Some(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_is_logged_the_rest_counted_until_the_interval_passes() {
        let log = RateLimitedLog::new(Duration::from_secs(10));
        let t0 = Instant::now();
        assert_eq!(log.admit_at("down", t0), Some(0));
        for s in 1..10 {
            assert_eq!(log.admit_at("down", t0 + Duration::from_secs(s)), None);
        }
        assert_eq!(
            log.admit_at("other", t0 + Duration::from_secs(5)),
            Some(0),
            "another kind has its own interval"
        );
        assert_eq!(
            log.admit_at("down", t0 + Duration::from_secs(10)),
            Some(9),
            "logged with the count passed over"
        );
        assert_eq!(log.admit_at("down", t0 + Duration::from_secs(11)), None);
        assert_eq!(log.admit_at("down", t0 + Duration::from_secs(30)), Some(1));
    }

    #[test]
    fn many_kinds_do_not_grow_it_without_bound() {
        let log = RateLimitedLog::new(Duration::from_secs(10));
        let t0 = Instant::now();
        for i in 0..MAX_KINDS * 3 {
            assert_eq!(log.admit_at(&i.to_string(), t0), Some(0));
        }
        assert!(log.kinds.lock().unwrap().len() <= MAX_KINDS);
        // Once their interval has passed, old kinds make room.
        assert_eq!(log.admit_at("late", t0 + Duration::from_secs(10)), Some(0));
        assert_eq!(log.admit_at("late", t0 + Duration::from_secs(11)), None);
    }
}
