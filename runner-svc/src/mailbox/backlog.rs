//! What this process's looks at the queue found they could not claim yet, so that a worker
//! that finishes a job looks at the queue again only when that look may find something: a job
//! of the same thread that waited for the one just finished, or a delayed job now due.
//!
//! Everything else that makes a job claimable wakes a worker already: the transaction that
//! queues a job hands it to an idle worker or wakes one (another replica is told by a
//! notification), a nack or a lease that ran out wakes one, and a step that queues a timer
//! wakes one to learn when it is due. A look after every job (what workers did before) found
//! nothing most of the time, and cost a scan of the queue, often a claim transaction too.

use std::{
    collections::HashSet,
    sync::{
        Mutex,
        atomic::{AtomicU64, Ordering},
    },
};

/// Due jobs a look passed over because their thread's job is claimed: (the thread, the id of
/// its claimed job).
pub type PassedOver = Vec<(Vec<u8>, Vec<u8>)>;

/// See the module documentation.
#[derive(Debug)]
pub struct Backlog {
    /// Threads with a due job queued behind the job this process's worker holds.
    behind: Mutex<HashSet<Vec<u8>>>,
    /// Jobs this process's workers finished, counted once their commit is done: a look that
    /// counts one during its scan may have seen the thread still busy, and looks again.
    finished: AtomicU64,
    /// When the earliest delayed job the last look saw becomes due (`u64::MAX`: none).
    next_due: AtomicU64,
}

impl Default for Backlog {
    fn default() -> Self {
        Self {
            behind: Mutex::default(),
            finished: AtomicU64::new(0),
            next_due: AtomicU64::new(u64::MAX),
        }
    }
}

/// One look at the queue, from before its scan until what it found is noted.
pub struct Look<'b> {
    backlog: &'b Backlog,
    finished: u64,
}

impl Backlog {
    /// Starts a look: what it finds replaces what the last one said of delayed jobs.
    pub fn look(&self) -> Look<'_> {
        self.next_due.store(u64::MAX, Ordering::SeqCst);
        Look {
            backlog: self,
            finished: self.finished.load(Ordering::SeqCst),
        }
    }

    /// Notes that a worker finished a job of `thread` (its commit done); whether it should
    /// look at the queue before waiting: a job of that thread waited for it, or a delayed job
    /// is due by `now_ms`.
    pub fn finished(&self, thread: &[u8], now_ms: u64) -> bool {
        self.finished.fetch_add(1, Ordering::SeqCst);
        let waited = self
            .behind
            .lock()
            .map_or(true, |mut behind| behind.remove(thread));
        waited || self.next_due().is_some_and(|at| at <= now_ms)
    }

    /// When the earliest delayed job known becomes due.
    pub fn next_due(&self) -> Option<u64> {
        match self.next_due.load(Ordering::SeqCst) {
            u64::MAX => None,
            at => Some(at),
        }
    }
}

impl Look<'_> {
    /// Notes what the look found it could not claim: threads whose due job waits behind a job
    /// of this process's, and the earliest delayed job. Answers whether to look again at once
    /// (a job finished while it looked, maybe one of those threads' before it was noted).
    pub fn found(self, behind: Vec<Vec<u8>>, next_due: Option<u64>) -> bool {
        if let Some(at) = next_due {
            self.backlog.next_due.fetch_min(at, Ordering::SeqCst);
        }
        if behind.is_empty() {
            return false;
        }
        if let Ok(mut threads) = self.backlog.behind.lock() {
            threads.extend(behind);
        }
        self.backlog.finished.load(Ordering::SeqCst) != self.finished
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_worker_looks_after_a_job_only_when_a_look_left_something_for_it() {
        let backlog = Backlog::default();
        assert!(!backlog.finished(b"t1", 100), "nothing waits: no look");
        // A look saw a job of t1 waiting behind t1's claim.
        let look = backlog.look();
        assert!(!look.found(vec![b"t1".to_vec()], None));
        assert!(
            !backlog.finished(b"t2", 100),
            "another thread's job: no look"
        );
        assert!(
            backlog.finished(b"t1", 100),
            "t1's job done: its next job waits"
        );
        assert!(!backlog.finished(b"t1", 100), "told once");
        // A look saw a delayed job, due at 150.
        backlog.look().found(Vec::new(), Some(150));
        assert!(!backlog.finished(b"t3", 149));
        assert!(backlog.finished(b"t3", 150));
        assert_eq!(
            backlog.next_due(),
            Some(150),
            "until a look finds otherwise"
        );
        backlog.look().found(Vec::new(), None);
        assert_eq!(backlog.next_due(), None);
    }

    #[test]
    fn a_look_that_raced_a_finished_job_looks_again() {
        let backlog = Backlog::default();
        let look = backlog.look();
        // t1's job finishes while the look scans (it saw t1 busy): the finishing worker does
        // not know yet that a job of t1 waits, the look tells its own worker to look again.
        assert!(!backlog.finished(b"t1", 0));
        assert!(look.found(vec![b"t1".to_vec()], None));
        // A look with nothing behind any thread has nothing to look again for.
        let look = backlog.look();
        assert!(!backlog.finished(b"t2", 0));
        assert!(!look.found(Vec::new(), Some(5)));
    }
}
