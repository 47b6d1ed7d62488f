//! A run's node statuses (`RunnerService.GetRunNodes`): the tree's nodes depth-first with where
//! each stands, read from the run's checkpoint.
//!
//! The checkpoint keeps each node's status (back to idle once its parent finishes), how each node
//! last finished (`outcomes`), a composite's and a gate's RUNNING, and the active suspensions. A
//! leaf that was running comes back IDLE from a decoded checkpoint (so it re-enters cleanly); it
//! is shown as WAITING when it owns an active suspension and as RUNNING while it keeps an
//! in-flight record (an approved tool call, a timer). An idle node that finished before shows
//! how it finished, until it is halted.

use arbor_shared::domain::SuspensionState;

use super::Runner;
use crate::{
    engine::{Checkpoint, NodeStatus, interaction::store::ToolCallState},
    error::RunnerError,
    store::{T, codec},
};

/// Where one node stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NodeState {
    Idle,
    Running,
    Success,
    Failure,
    Waiting,
}

/// One node of a run's tree.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunNode {
    /// As `Suspension.node_locator`: the node's name, else its path.
    pub locator: String,
    pub kind: &'static str,
    pub name: String,
    pub depth: u32,
    pub state: NodeState,
}

impl Runner {
    /// The run's nodes depth-first, root first. NOT_FOUND for an unknown run; a run that has not
    /// taken its first step shows every node IDLE.
    pub fn run_nodes(&self, run_id: &str) -> Result<Vec<RunNode>, RunnerError> {
        super::submit::check_id("run_id", run_id)?;
        let run = self.run_record(run_id)?;
        let spec = self.tree_spec(&run.tree_id, run.tree_version)?;
        let ck = match self.store.tree(T::Checkpoints).get(run_id.as_bytes())? {
            Some(bytes) => Some(Checkpoint::decode(&bytes).map_err(|e| codec::Corrupt {
                what: "checkpoint",
                message: e.to_string(),
            })?),
            None => None,
        };
        let mut depth = vec![0u32; spec.nodes.len()];
        for (i, node) in spec.nodes.iter().enumerate() {
            for &child in &node.children {
                depth[child] = depth[i] + 1;
            }
        }
        let nodes = spec
            .nodes
            .iter()
            .enumerate()
            .map(|(i, node)| RunNode {
                locator: node.locator.clone(),
                kind: node.kind.type_name(),
                name: node.name_or_empty().to_string(),
                depth: depth[i],
                state: ck.as_ref().map_or(NodeState::Idle, |ck| state_of(ck, i)),
            })
            .collect();
        Ok(nodes)
    }
}

fn state_of(ck: &Checkpoint, idx: usize) -> NodeState {
    let me = idx as u32;
    let interaction = &ck.interaction;
    let waiting = interaction
        .suspensions
        .values()
        .any(|o| o.node == me && o.record.state == SuspensionState::Active);
    if waiting {
        return NodeState::Waiting;
    }
    let Some(node) = ck.nodes.get(idx) else {
        return NodeState::Idle;
    };
    match node.status {
        NodeStatus::Running => NodeState::Running,
        NodeStatus::Success => NodeState::Success,
        NodeStatus::Failure => NodeState::Failure,
        NodeStatus::Idle => {
            let in_flight = node.data.deadline().is_some()
                || interaction
                    .tool_calls
                    .values()
                    .any(|c| c.node == me && matches!(c.state, ToolCallState::Approved));
            match ck.outcome(idx) {
                _ if in_flight => NodeState::Running,
                NodeStatus::Success => NodeState::Success,
                NodeStatus::Failure => NodeState::Failure,
                NodeStatus::Idle | NodeStatus::Running => NodeState::Idle,
            }
        }
    }
}
