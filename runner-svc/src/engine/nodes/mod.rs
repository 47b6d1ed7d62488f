//! Node behaviour: one tick context, the dispatch over node kinds, and halting. Each node reads
//! its immutable spec and keeps everything it must remember in the checkpoint.

mod composite;
mod decorator;
mod gate;
mod input;
mod leaf;
mod task;
mod tool;

use std::ops::Range;

use arbor_shared::domain::RunMode;
use serde_json::{Map, Value as Json};

use super::checkpoint::{Checkpoint, NodeData, NodeStatus};
use super::interaction::{Decision, SuspensionRecord, request_id};
use super::spec::{NodeKind, NodeSpec, TreeSpec};
use super::{Effect, TickEnv, TickOutput, TickStatus, blackboard};

/// Node ticks one `tick()` may spend; past it the run yields and asks to be ticked again, so
/// nested repeats can never pin a worker.
const WORK_BUDGET: u32 = 1_000_000;

enum Why {
    Nothing,
    Text(String),
    Node(usize),
    /// A guard refusal that waiting cannot cure (policy deny, budget spent): a `retry` gives up
    /// at once instead of spending its attempts.
    Refused(String),
}

pub(crate) struct Ctx<'t> {
    pub spec: &'t TreeSpec,
    pub ck: &'t mut Checkpoint,
    pub env: &'t TickEnv<'t>,
    pub effects: Vec<Effect>,
    next_wake: Option<u64>,
    /// The most recent failure reason; becomes the run's error if the root fails.
    why: Why,
    /// A suspension became active in this tick (Yield mode stops ticking parallel siblings).
    pub suspended_now: bool,
    work_left: u32,
    /// A failure of the node being ticked would be retried by a `retry` above it (no selector,
    /// inverter, force_* or tolerant parallel in between handles it first).
    pub retried: bool,
}

pub(crate) fn tick_root(
    spec: &TreeSpec,
    ck: &mut Checkpoint,
    env: &TickEnv<'_>,
    effects: Vec<Effect>,
) -> TickOutput {
    let mut cx = Ctx {
        spec,
        ck,
        env,
        effects,
        next_wake: None,
        why: Why::Nothing,
        suspended_now: false,
        work_left: WORK_BUDGET,
        retried: false,
    };
    let status = cx.tick(0);
    cx.ck.root_status = status.into();
    let mut error = String::new();
    match status {
        TickStatus::Running => {}
        TickStatus::Success | TickStatus::Failure => {
            // Composites halt what they leave behind; this only guards that promise.
            cx.ck
                .interaction
                .withdraw(0..u32::MAX, "run finished", &mut cx.effects);
            cx.next_wake = None;
            if status == TickStatus::Failure {
                error = cx.take_error();
                if error.is_empty() {
                    error = "tree failed".to_string();
                }
            }
        }
    }
    cx.ck.error.clone_from(&error);
    TickOutput {
        status,
        effects: cx.effects,
        next_wake_ms: cx.next_wake,
        error,
    }
}

pub(crate) fn halt_all(spec: &TreeSpec, ck: &mut Checkpoint, reason: &str) -> Vec<Effect> {
    let mut effects = Vec::new();
    halt_range(ck, 0..spec.nodes.len(), reason, &mut effects);
    if !matches!(ck.root_status, NodeStatus::Success | NodeStatus::Failure) {
        ck.root_status = NodeStatus::Failure;
        ck.error = format!("halted: {reason}");
    }
    effects
}

/// Halts the nodes that own active suspensions (each with its subtree), withdrawing those
/// suspensions; the rest of the tree keeps its state.
pub(crate) fn halt_suspended(spec: &TreeSpec, ck: &mut Checkpoint, reason: &str) -> Vec<Effect> {
    let mut effects = Vec::new();
    for owner in ck.interaction.active_owners() {
        if let Some(node) = spec.nodes.get(owner as usize) {
            halt_range(ck, owner as usize..node.end, reason, &mut effects);
        }
    }
    effects
}

/// Halts the nodes of a pre-order range (whole subtrees): nodes that were in flight count an
/// attempt, all are reset to idle, and their active suspensions are withdrawn.
fn halt_range(ck: &mut Checkpoint, range: Range<usize>, reason: &str, effects: &mut Vec<Effect>) {
    if range.is_empty() {
        return;
    }
    let mut busy = ck.interaction.active_owners();
    busy.extend(ck.interaction.progress.values().map(|p| p.node));
    let mut moved_on = Vec::new();
    for (i, state) in ck
        .nodes
        .iter_mut()
        .enumerate()
        .take(range.end)
        .skip(range.start)
    {
        let in_flight = state.status == NodeStatus::Running
            || state.data.deadline().is_some()
            || matches!(state.data, NodeData::Composite { cursor } if cursor > 0)
            || busy.contains(&(i as u32));
        if in_flight {
            state.attempt = state.attempt.wrapping_add(1);
            moved_on.push(i as u32);
        }
        state.status = NodeStatus::Idle;
        state.data.reset();
    }
    // A halted node did not finish: what it did before is no longer its outcome.
    let end = range.end.min(ck.outcomes.len());
    if let Some(outcomes) = ck.outcomes.get_mut(range.start.min(end)..end) {
        outcomes.fill(NodeStatus::Idle);
    }
    let nodes = range.start as u32..range.end as u32;
    ck.interaction.withdraw(nodes, reason, effects);
    // Pre-order indices, so `moved_on` is sorted.
    if !moved_on.is_empty() {
        ck.interaction
            .prune(|node| moved_on.binary_search(&node).is_ok());
    }
}

impl<'t> Ctx<'t> {
    pub fn node(&self, idx: usize) -> &'t NodeSpec {
        let spec: &'t TreeSpec = self.spec;
        &spec.nodes[idx]
    }

    /// Ticks one node and records its status; completing resets its own state and its children's.
    pub fn tick(&mut self, idx: usize) -> TickStatus {
        if self.work_left == 0 {
            self.wake_at(self.env.now_ms);
            return TickStatus::Running;
        }
        self.work_left -= 1;
        let node = self.node(idx);
        let outer = self.retried;
        self.retried = match &node.kind {
            NodeKind::Retry { .. } => true,
            NodeKind::Selector | NodeKind::Inverter | NodeKind::ForceSuccess => false,
            NodeKind::ForceFailure => false,
            NodeKind::Parallel { success_threshold } => {
                outer && *success_threshold >= node.children.len()
            }
            _ => outer,
        };
        let status = match &node.kind {
            NodeKind::Sequence => composite::sequence(self, idx),
            NodeKind::Selector => composite::selector(self, idx),
            NodeKind::Parallel { success_threshold } => {
                composite::parallel(self, idx, *success_threshold)
            }
            NodeKind::ReactiveSequence => composite::reactive_sequence(self, idx),
            NodeKind::Inverter => decorator::inverter(self, idx),
            NodeKind::ForceSuccess => decorator::force(self, idx, TickStatus::Success),
            NodeKind::ForceFailure => decorator::force(self, idx, TickStatus::Failure),
            NodeKind::Retry { max_attempts } => decorator::retry(self, idx, *max_attempts),
            NodeKind::Repeat { count } => decorator::repeat(self, idx, *count),
            NodeKind::Timeout { ms } => decorator::timeout(self, idx, *ms),
            NodeKind::Approval(gate) => gate::approval(self, idx, gate),
            NodeKind::Condition(c) => leaf::condition(self, idx, c),
            NodeKind::Set { key, value } => leaf::set(self, idx, key, value),
            NodeKind::Wait { ms } => leaf::wait(self, idx, *ms),
            NodeKind::Succeed => TickStatus::Success,
            NodeKind::Fail { message } => leaf::fail(self, idx, message),
            NodeKind::Log { message } => leaf::log(self, idx, message),
            NodeKind::Tool(t) => tool::tool(self, idx, t),
            NodeKind::UserInput(u) => input::user_input(self, idx, u),
            NodeKind::External(e) => input::external(self, idx, e),
        };
        self.retried = outer;
        self.record(idx, status);
        status
    }

    fn record(&mut self, idx: usize, status: TickStatus) {
        let state = &mut self.ck.nodes[idx];
        state.status = status.into();
        if status == TickStatus::Running {
            return;
        }
        state.attempt = state.attempt.wrapping_add(1);
        state.data.reset();
        if let Some(outcome) = self.ck.outcomes.get_mut(idx) {
            *outcome = status.into();
        }
        let node = self.node(idx);
        for &child in &node.children {
            self.ck.nodes[child].status = NodeStatus::Idle;
        }
        // The node's next entry asks under new ids: what it recorded under the old ones is done.
        if node.kind.keeps_records() {
            let me = idx as u32;
            self.ck.interaction.prune(|node| node == me);
        }
    }

    /// Halts every node below `idx` (not `idx` itself).
    pub fn halt_children(&mut self, idx: usize, reason: &str) {
        let end = self.node(idx).end;
        self.halt_range(idx + 1..end, reason);
    }

    /// Halts whole subtrees given as a pre-order range.
    pub fn halt_range(&mut self, range: Range<usize>, reason: &str) {
        halt_range(self.ck, range, reason, &mut self.effects);
    }

    pub fn fail(&mut self, message: impl Into<String>) -> TickStatus {
        self.why = Why::Text(message.into());
        TickStatus::Failure
    }

    /// Fails with a guard refusal that time cannot cure: an enclosing `retry` fails at once.
    pub fn refuse(&mut self, message: String) -> TickStatus {
        self.why = Why::Refused(message);
        TickStatus::Failure
    }

    /// Whether the most recent failure was [`Ctx::refuse`]d.
    pub fn refused(&self) -> bool {
        matches!(self.why, Why::Refused(_))
    }

    /// Fails with a reason derived from the node's spec, formatted only if it is ever reported:
    /// failing conditions and selectors are ordinary control flow.
    pub fn fail_quietly(&mut self, idx: usize) -> TickStatus {
        self.why = Why::Node(idx);
        TickStatus::Failure
    }

    /// The most recent failure reason ("" if none), consumed.
    pub fn take_error(&mut self) -> String {
        match std::mem::replace(&mut self.why, Why::Nothing) {
            Why::Nothing => String::new(),
            Why::Text(text) | Why::Refused(text) => text,
            Why::Node(idx) => {
                let node = self.node(idx);
                let loc = &node.locator;
                match &node.kind {
                    NodeKind::Condition(c) => format!(
                        "condition '{loc}' ({} {} {}) is false",
                        c.key,
                        c.op.as_str(),
                        c.value
                    ),
                    NodeKind::Selector => format!("selector '{loc}': every child failed"),
                    _ => format!("'{loc}' failed"),
                }
            }
        }
    }

    pub fn wake_at(&mut self, at_ms: u64) {
        self.next_wake = Some(self.next_wake.map_or(at_ms, |w| w.min(at_ms)));
    }

    pub fn locator(&self, idx: usize) -> &'t str {
        &self.node(idx).locator
    }

    pub fn attempt(&self, idx: usize) -> u32 {
        self.ck.nodes[idx].attempt
    }

    pub fn request_id(&self, idx: usize, phase: &str) -> String {
        request_id(
            self.env.thread_id,
            self.env.run_id,
            self.locator(idx),
            phase,
            self.attempt(idx),
        )
    }

    /// Records a suspension; `Effect::Suspended` only the first time.
    pub fn suspend(&mut self, idx: usize, record: SuspensionRecord) {
        if self
            .ck
            .interaction
            .suspend(idx as u32, record, &mut self.effects)
        {
            self.suspended_now = true;
        }
    }

    /// Pops the delivered decision for an active request.
    pub fn take_decision(&mut self, request_id: &str) -> Option<Decision> {
        self.ck.interaction.take(request_id, &mut self.effects)
    }

    pub fn board(&self) -> &Map<String, Json> {
        &self.ck.blackboard
    }

    pub fn resolve(&self, value: &Json) -> Result<Json, String> {
        blackboard::resolve(&self.ck.blackboard, value)
    }

    pub fn write(&mut self, key: &str, value: Json) -> Result<(), String> {
        blackboard::set(&mut self.ck.blackboard, key, value)
    }

    pub fn stop_siblings(&self) -> bool {
        self.suspended_now && self.env.mode == RunMode::Yield
    }

    /// A tick stopped early with work left: ask to be ticked again at once.
    pub fn yield_now(&mut self) {
        self.wake_at(self.env.now_ms);
    }
}
