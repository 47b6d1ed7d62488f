//! `runs` (run_id → [`RunRecord`]), `thread_runs` (`{thread_id}\0{run_id}` → (), the runs of a
//! thread), `checkpoints` (run_id → encoded checkpoint) and `inbox` (`{run_id}\0{request_id}` →
//! a delivered decision not yet taken into the checkpoint).
//!
//! The run record lives here, below `runs`, so the state counts and the task transactions can
//! read it without importing the application layer.

use arbor_shared::domain::{RunMode, RunStatus};
use serde::{Deserialize, Serialize};

use crate::store::codec;

/// A run's metadata; its execution state lives in its checkpoint.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunRecord {
    pub run_id: String,
    pub thread_id: String,
    pub tree_id: String,
    pub tree_version: u32,
    pub status: RunStatus,
    pub error: String,
    pub created_at_ms: u64,
    pub updated_at_ms: u64,
    pub submitted_by: String,
    pub priority: i32,
    pub mode: RunMode,
    /// The thread generation the run was submitted at.
    pub generation: u64,
    pub step: u64,
    pub max_attempts: u32,
    /// Whether the first tick happened (RUN_STARTED was emitted).
    pub started: bool,
    /// Set when a cancel was requested; the cancel job reads it.
    pub cancel_reason: String,
}

/// The `runs` and `checkpoints` key of a run.
pub fn key(run_id: &str) -> &[u8] {
    run_id.as_bytes()
}

/// The `thread_runs` key of a run.
pub fn thread_run_key(thread_id: &str, run_id: &str) -> Vec<u8> {
    codec::pair_key(thread_id, run_id)
}

/// The prefix of every `thread_runs` key of a thread.
pub fn thread_runs(thread_id: &str) -> Vec<u8> {
    codec::prefix(thread_id)
}

/// The run id inside a `thread_runs` key.
pub fn run_of_thread_key(key: &[u8]) -> Option<&str> {
    let at = key.iter().position(|b| *b == 0)?;
    std::str::from_utf8(&key[at + 1..]).ok()
}

/// The `inbox` key of a decision delivered to a run.
pub fn inbox_key(run_id: &str, request_id: &str) -> Vec<u8> {
    codec::pair_key(run_id, request_id)
}

/// The prefix of every `inbox` key of a run.
pub fn inbox(run_id: &str) -> Vec<u8> {
    codec::prefix(run_id)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn run_keys_keep_their_layout_and_round_trip() {
        assert_eq!(key("run-1"), b"run-1");
        let t = thread_run_key("thread", "run-1");
        assert_eq!(t, b"thread\0run-1");
        assert!(t.starts_with(&thread_runs("thread")));
        assert!(!thread_run_key("thread-2", "r").starts_with(&thread_runs("thread")));
        assert_eq!(run_of_thread_key(&t), Some("run-1"));
        let i = inbox_key("run-1", "req");
        assert_eq!(i, b"run-1\0req");
        assert!(i.starts_with(&inbox("run-1")));
    }
}
