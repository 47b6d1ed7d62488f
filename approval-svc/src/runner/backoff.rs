//! Exponential backoff with jitter, so a fleet of retries does not hit a recovering runner in
//! lockstep.

use std::time::Duration;

#[derive(Debug, Clone)]
pub struct Backoff {
    min: Duration,
    max: Duration,
    next: Duration,
}

impl Backoff {
    pub fn new(min: Duration, max: Duration) -> Self {
        Self {
            min,
            max: max.max(min),
            next: min,
        }
    }

    /// The wait before the next attempt: a random point in the upper half of the current step,
    /// which then doubles up to `max`.
    pub fn next_delay(&mut self) -> Duration {
        let step = self.next;
        self.next = (self.next * 2).min(self.max);
        let half = step / 2;
        half + half.mul_f64(fastrand::f64())
    }

    pub fn reset(&mut self) {
        self.next = self.min;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grows_to_the_cap_with_jitter_and_resets() {
        let mut b = Backoff::new(Duration::from_millis(100), Duration::from_millis(400));
        let first = b.next_delay();
        assert!(first >= Duration::from_millis(50) && first <= Duration::from_millis(100));
        for _ in 0..10 {
            assert!(b.next_delay() <= Duration::from_millis(400));
        }
        let capped = b.next_delay();
        assert!(capped >= Duration::from_millis(200));
        b.reset();
        assert!(b.next_delay() <= Duration::from_millis(100));
    }
}
