//! The behaviour-tree engine: a pure library that ticks a validated tree spec against a run's
//! checkpoint and reports what happened as effects. It does no I/O of its own except through
//! tools; persisting checkpoints and publishing effects is the runner's job.
//!
//! Contract details the design leaves open, decided here:
//! - A node's *attempt* counts how often it finished or was halted. Suspension ids hash
//!   `thread_id, run_id, locator, phase, attempt` (phase is `before`/`after` for gates, the
//!   tool call id for tools, `user_input` / `external` for those leaves); tool call ids are
//!   `{locator}#{attempt}`. Replaying a tick from an older checkpoint therefore reproduces ids and
//!   idempotency keys, while a retry or a re-entry after a halt asks anew.
//! - Yield mode: a parallel stops ticking further children once a suspension became active in the
//!   tick, and the output asks for an immediate re-tick (`next_wake_ms == Some(now_ms)`), so the
//!   run persists and publishes the first suspension before the other branches move on.
//! - Approval deadlines are carried in the request; expiring them (and resolving per
//!   `on_timeout`) is approval-svc's job, which delivers the outcome as a decision.
//! - `halt` finishes the run as a Failure (`halted: {reason}`); later ticks return that outcome.
//! - The guard budget counts calls admitted by the guard (asked calls included); the rate limit
//!   is a sliding window per tool name, in memory, per registry (i.e. per process).

mod blackboard;
pub mod checkpoint;
pub mod interaction;
mod nodes;
pub mod spec;
pub mod tools;

#[cfg(test)]
mod tests;

use arbor_shared::domain::RunMode;
use serde::{Deserialize, Serialize};

pub use checkpoint::{Checkpoint, CheckpointError, NodeStatus};
pub use interaction::store::{PAST_KEPT, PastRequest};
pub use interaction::{Decision, DecisionError, SuspensionRecord, validate_decision};
pub use spec::{TreeFormat, TreeSpec, parse_tree};
pub use tools::{GuardConfig, LedgerTool, Tool, ToolCall, ToolError, ToolRegistry};

/// What a tick may know about the world.
#[derive(Debug, Clone, Copy)]
pub struct TickEnv<'a> {
    pub run_id: &'a str,
    pub thread_id: &'a str,
    pub tree_id: &'a str,
    pub tree_version: u32,
    pub submitted_by: &'a str,
    /// Wall clock, epoch ms: durable deadlines are absolute wall-clock times.
    pub now_ms: u64,
    pub mode: RunMode,
    pub tools: &'a ToolRegistry,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum TickStatus {
    Running,
    Success,
    Failure,
}

#[derive(Debug, Clone, PartialEq)]
pub struct TickOutput {
    pub status: TickStatus,
    /// In the order they happened.
    pub effects: Vec<Effect>,
    /// Earliest durable timer still pending while Running. `Some(now_ms)` asks to be ticked again
    /// at once: a Yield-mode tick stopped early, or the tick's work budget ran out.
    pub next_wake_ms: Option<u64>,
    /// Why the run failed ("" otherwise).
    pub error: String,
}

// The record is the public payload of `Suspended`; a handful of effects per tick do not justify
// boxing it.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone, PartialEq)]
pub enum Effect {
    /// A suspension became active in this tick (never emitted twice for one record).
    Suspended { record: SuspensionRecord },
    /// An active suspension was withdrawn because its subtree was halted.
    Withdrawn { request_id: String, reason: String },
    /// The tree popped a delivered decision (inbox → acks).
    Consumed {
        request_id: String,
        decision_id: String,
    },
    /// A decision for a request that is not active was dropped.
    Discarded {
        request_id: String,
        decision_id: String,
    },
    Log {
        node_locator: String,
        message: String,
    },
    /// A node asks task workers for a result: the runner queues the task in the same step as
    /// the suspension it resolves (emitted together with that `Suspended`).
    TaskQueued { order: Box<TaskOrder> },
}

/// A task a node asks for. Its id is the id of the suspension it resolves, so a replayed tick
/// asks for the same task.
#[derive(Debug, Clone, PartialEq)]
pub struct TaskOrder {
    pub task_id: String,
    pub task_type: String,
    /// A remote tool call (fenced to workers) or an `external` node (which `Resolve` may also
    /// answer).
    pub kind: TaskKind,
    pub args: serde_json::Value,
    pub idempotency_key: String,
    pub max_attempts: u32,
    pub backoff_ms: u64,
    pub node_locator: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum TaskKind {
    Tool,
    External,
}

/// Delivers `decisions` into the checkpoint's inbox, then ticks the root once. A checkpoint that
/// does not fit the spec is a Failure (the checkpoint is left untouched); nothing here panics.
pub fn tick(
    spec: &TreeSpec,
    ck: &mut Checkpoint,
    decisions: Vec<Decision>,
    env: &TickEnv<'_>,
) -> TickOutput {
    if let Err(e) = ck.check_matches(spec) {
        return TickOutput {
            status: TickStatus::Failure,
            effects: Vec::new(),
            next_wake_ms: None,
            error: e.to_string(),
        };
    }
    let mut effects = Vec::new();
    for decision in decisions {
        ck.interaction.deliver(decision, &mut effects);
    }
    ck.step += 1;
    match ck.root_status {
        NodeStatus::Success | NodeStatus::Failure => {
            // A finished run keeps its outcome; late decisions were discarded above.
            return TickOutput {
                status: if ck.root_status == NodeStatus::Success {
                    TickStatus::Success
                } else {
                    TickStatus::Failure
                },
                effects,
                next_wake_ms: None,
                error: ck.error.clone(),
            };
        }
        NodeStatus::Idle | NodeStatus::Running => {}
    }
    nodes::tick_root(spec, ck, env, effects)
}

/// Withdraws the suspensions of a run that ends outside a tick (its job dead-lettered). The
/// nodes that own them are halted, so if an operator revives the run (`RequeueJob`) those nodes
/// ask anew, with new request ids, instead of waiting on requests that were withdrawn.
/// Without the spec (or one that no longer matches) the records are withdrawn all the same.
pub fn withdraw_open(spec: Option<&TreeSpec>, ck: &mut Checkpoint, reason: &str) -> Vec<Effect> {
    match spec {
        Some(spec) if ck.check_matches(spec).is_ok() => nodes::halt_suspended(spec, ck, reason),
        _ => {
            let mut effects = Vec::new();
            ck.interaction.withdraw(0..u32::MAX, reason, &mut effects);
            effects
        }
    }
}

/// Halts the whole tree (run cancelled or superseded): every running node is halted, every active
/// suspension withdrawn. The run is then finished as a Failure with `halted: {reason}`.
pub fn halt(spec: &TreeSpec, ck: &mut Checkpoint, reason: &str) -> Vec<Effect> {
    if ck.check_matches(spec).is_err() {
        // Without a matching spec no node can be halted, but the records can still be withdrawn.
        let mut effects = Vec::new();
        ck.interaction.withdraw(0..u32::MAX, reason, &mut effects);
        ck.root_status = NodeStatus::Failure;
        ck.error = format!("halted: {reason}");
        return effects;
    }
    nodes::halt_all(spec, ck, reason)
}
