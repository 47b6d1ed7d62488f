//! Checkpoints: everything a run needs to continue after a restart. Per-node runtime state is a
//! vector indexed by the node's pre-order index in the spec (a node's path is derivable from the
//! spec, so it is not stored). Encoded with postcard behind a one-byte format version.
//!
//! Version 2 added the run's note of pruned suspensions (`Interaction::past`, see
//! [`super::interaction::store`]); version 3 how each node last finished (`outcomes`, what
//! GetRunNodes shows of a subtree that has finished since). Versions 1 and 2 are still read.

use arbor_shared::json::as_text;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value as Json};

use super::TickStatus;
use super::interaction::store::{Interaction, PastRequest};
use super::interaction::{Decision, SuspensionRecord};
use super::spec::{NodeKind, TreeSpec};

const FORMAT_VERSION: u8 = 3;

/// Status of one node (and of the root, for the run).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub enum NodeStatus {
    /// Not entered yet, reset after completing, or a leaf after a restore.
    #[default]
    Idle,
    Running,
    Success,
    Failure,
}

impl From<TickStatus> for NodeStatus {
    fn from(s: TickStatus) -> Self {
        match s {
            TickStatus::Running => Self::Running,
            TickStatus::Success => Self::Success,
            TickStatus::Failure => Self::Failure,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct NodeState {
    pub status: NodeStatus,
    /// How many times the node finished or was halted: part of its suspension ids and tool call
    /// ids, so a re-entry asks anew while a replay of the same entry finds its old records.
    pub attempt: u32,
    pub data: NodeData,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) enum NodeData {
    /// Leaves; `wait` keeps its absolute deadline here.
    Leaf { deadline: Option<u64> },
    /// sequence, selector, reactive_sequence (cursor = running child), parallel.
    Composite { cursor: u32 },
    /// inverter, force_*, approval (its phase progress lives in the interaction namespace).
    Decorator,
    /// retry (failed attempts), repeat (successes).
    Counter { count: u32 },
    /// timeout: absolute deadline, set on first entry.
    Timer { deadline: Option<u64> },
}

impl NodeData {
    pub fn for_kind(kind: &NodeKind) -> Self {
        match kind {
            NodeKind::Sequence
            | NodeKind::Selector
            | NodeKind::Parallel { .. }
            | NodeKind::ReactiveSequence => Self::Composite { cursor: 0 },
            NodeKind::Inverter
            | NodeKind::ForceSuccess
            | NodeKind::ForceFailure
            | NodeKind::Approval(_) => Self::Decorator,
            NodeKind::Retry { .. } | NodeKind::Repeat { .. } => Self::Counter { count: 0 },
            NodeKind::Timeout { .. } => Self::Timer { deadline: None },
            NodeKind::Condition(_)
            | NodeKind::Set { .. }
            | NodeKind::Wait { .. }
            | NodeKind::Succeed
            | NodeKind::Fail { .. }
            | NodeKind::Log { .. }
            | NodeKind::Tool(_)
            | NodeKind::UserInput(_)
            | NodeKind::External(_) => Self::Leaf { deadline: None },
        }
    }

    pub fn reset(&mut self) {
        match self {
            Self::Leaf { deadline } | Self::Timer { deadline } => *deadline = None,
            Self::Composite { cursor } => *cursor = 0,
            Self::Counter { count } => *count = 0,
            Self::Decorator => {}
        }
    }

    pub fn deadline(&self) -> Option<u64> {
        match self {
            Self::Leaf { deadline } | Self::Timer { deadline } => *deadline,
            _ => None,
        }
    }

    fn same_shape(&self, other: &Self) -> bool {
        std::mem::discriminant(self) == std::mem::discriminant(other)
    }
}

/// A run's runtime state.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Checkpoint {
    pub(crate) tree_id: String,
    pub(crate) tree_version: u32,
    pub(crate) thread_id: String,
    pub(crate) step: u64,
    pub(crate) root_status: NodeStatus,
    /// Why the run failed ("" otherwise).
    pub(crate) error: String,
    pub(crate) nodes: Vec<NodeState>,
    #[serde(with = "as_text")]
    pub(crate) blackboard: Map<String, Json>,
    pub(crate) interaction: Interaction,
    /// How each node last finished (`Success` or `Failure`; `Idle`: not since it was last
    /// halted, or never). A node's status goes back to idle when its parent finishes; this
    /// keeps that it was done. One byte a node; written with the statuses, read by nothing that
    /// ticks. Checkpoints older than version 3 have none (every node `Idle`).
    pub(crate) outcomes: Vec<NodeStatus>,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CheckpointError {
    #[error("checkpoint is empty")]
    Empty,
    #[error(
        "checkpoint format version {0} is not supported (this build reads 1 to {FORMAT_VERSION})"
    )]
    UnsupportedVersion(u8),
    #[error("checkpoint is corrupt: {0}")]
    Corrupt(String),
    #[error("checkpoint belongs to tree {found}, not {expected}")]
    TreeMismatch { expected: String, found: String },
    #[error("checkpoint does not fit the tree: {0}")]
    ShapeMismatch(String),
}

impl Checkpoint {
    pub fn new(spec: &TreeSpec, thread_id: &str, input: Map<String, Json>) -> Self {
        Self {
            tree_id: spec.id.clone(),
            tree_version: spec.version,
            thread_id: thread_id.to_string(),
            step: 0,
            root_status: NodeStatus::Idle,
            error: String::new(),
            nodes: spec
                .nodes
                .iter()
                .map(|n| NodeState {
                    status: NodeStatus::Idle,
                    attempt: 0,
                    data: NodeData::for_kind(&n.kind),
                })
                .collect(),
            blackboard: input,
            interaction: Interaction::default(),
            outcomes: vec![NodeStatus::Idle; spec.nodes.len()],
        }
    }

    pub fn encode(&self) -> Vec<u8> {
        let mut out = vec![FORMAT_VERSION];
        // Serialising plain data into a Vec cannot fail; an empty body would be refused by decode.
        if let Ok(body) = postcard::to_stdvec(self) {
            out.extend_from_slice(&body);
        }
        out
    }

    /// Decodes and applies restore semantics: composites keep their status and cursors, running
    /// leaves come back idle so they re-enter cleanly (their deadlines, attempts and records stay,
    /// so re-entry picks up where it was).
    pub fn decode(bytes: &[u8]) -> Result<Self, CheckpointError> {
        let (&version, body) = bytes.split_first().ok_or(CheckpointError::Empty)?;
        // Version 1 is version 2 without `Interaction::past`, version 2 is version 3 without
        // `outcomes`, each the body's last field: postcard writes fields one after another
        // without framing, so an older body followed by one empty sequence (one 0 byte) per
        // missing field is a version 3 body.
        let upgraded;
        let body = match version {
            FORMAT_VERSION => body,
            1 => {
                upgraded = [body, &[0, 0]].concat();
                &upgraded[..]
            }
            2 => {
                upgraded = [body, &[0]].concat();
                &upgraded[..]
            }
            _ => return Err(CheckpointError::UnsupportedVersion(version)),
        };
        let (mut ck, rest) = postcard::take_from_bytes::<Self>(body)
            .map_err(|e| CheckpointError::Corrupt(e.to_string()))?;
        if !rest.is_empty() {
            return Err(CheckpointError::Corrupt(format!(
                "{} trailing bytes",
                rest.len()
            )));
        }
        for node in &mut ck.nodes {
            if matches!(node.data, NodeData::Leaf { .. }) && node.status == NodeStatus::Running {
                node.status = NodeStatus::Idle;
            }
        }
        // Older checkpoints know no outcomes; a damaged length must not index out of bounds.
        ck.outcomes.resize(ck.nodes.len(), NodeStatus::Idle);
        if version == 1 {
            // Version 1 kept every call record; a call of an earlier attempt (`LOCATOR#ATTEMPT`)
            // can never come up again. Records naming no node are left for `check_matches`.
            let nodes = &ck.nodes;
            ck.interaction.tool_calls.retain(|id, call| {
                nodes.get(call.node as usize).is_none_or(|n| {
                    id.rsplit_once('#').and_then(|(_, a)| a.parse().ok()) == Some(n.attempt)
                })
            });
        }
        Ok(ck)
    }

    /// Checks that this checkpoint was made for `spec` (id, version and node shapes).
    pub fn check_matches(&self, spec: &TreeSpec) -> Result<(), CheckpointError> {
        if self.tree_id != spec.id || self.tree_version != spec.version {
            return Err(CheckpointError::TreeMismatch {
                expected: format!("{}@{}", spec.id, spec.version),
                found: format!("{}@{}", self.tree_id, self.tree_version),
            });
        }
        if self.nodes.len() != spec.nodes.len() {
            return Err(CheckpointError::ShapeMismatch(format!(
                "{} node states for {} nodes",
                self.nodes.len(),
                spec.nodes.len()
            )));
        }
        let n = spec.nodes.len() as u64;
        let bad_owner = self
            .interaction
            .suspensions
            .values()
            .map(|o| o.node)
            .chain(self.interaction.progress.values().map(|p| p.node))
            .chain(self.interaction.tool_calls.values().map(|c| c.node))
            .any(|node| u64::from(node) >= n);
        if bad_owner {
            return Err(CheckpointError::ShapeMismatch(
                "a record names a node the tree does not have".into(),
            ));
        }
        for (i, (state, node)) in self.nodes.iter().zip(&spec.nodes).enumerate() {
            if !state.data.same_shape(&NodeData::for_kind(&node.kind)) {
                return Err(CheckpointError::ShapeMismatch(format!(
                    "node {i} ({}) has state of another node type",
                    node.locator
                )));
            }
        }
        Ok(())
    }

    pub fn tree_id(&self) -> &str {
        &self.tree_id
    }

    pub fn tree_version(&self) -> u32 {
        self.tree_version
    }

    pub fn blackboard(&self) -> &Map<String, Json> {
        &self.blackboard
    }

    pub fn thread_id(&self) -> &str {
        &self.thread_id
    }

    /// Ticks so far.
    pub fn step(&self) -> u64 {
        self.step
    }

    /// Every suspension record of the run, whatever its state, ordered by request id.
    pub fn suspensions(&self) -> impl Iterator<Item = &SuspensionRecord> {
        self.interaction.suspensions.values().map(|o| &o.record)
    }

    pub fn suspension(&self, request_id: &str) -> Option<&SuspensionRecord> {
        self.interaction
            .suspensions
            .get(request_id)
            .map(|o| &o.record)
    }

    /// A suspension whose node has moved on, as the run remembers it (its last
    /// [`PAST_KEPT`](super::PAST_KEPT) such requests). `suspension` no longer
    /// finds it.
    pub fn past_request(&self, request_id: &str) -> Option<&PastRequest> {
        self.interaction.past(request_id)
    }

    /// A delivered decision its node has not popped yet.
    pub fn pending_decision(&self, request_id: &str) -> Option<&Decision> {
        self.interaction.resolved_approvals.get(request_id)
    }

    /// request_id → decision_id of the decisions the tree has popped, as far as the run remembers
    /// them: those of its current suspensions and of the pruned ones in `past_request`.
    pub fn consumed_decisions(&self) -> impl Iterator<Item = (&str, &str)> {
        let past = self
            .interaction
            .past
            .iter()
            .filter_map(|p| p.decision_id.as_deref().map(|d| (p.request_id.as_str(), d)));
        self.interaction
            .resolved_approval_acks
            .iter()
            .map(|(r, d)| (r.as_str(), d.as_str()))
            .chain(past)
    }

    /// How node `idx` (pre-order) last finished; `Idle` if it has not since it was last halted.
    pub fn outcome(&self, idx: usize) -> NodeStatus {
        self.outcomes.get(idx).copied().unwrap_or_default()
    }

    pub fn root_status(&self) -> NodeStatus {
        self.root_status
    }

    /// Why the run failed ("" unless the root failed).
    pub fn error(&self) -> &str {
        &self.error
    }

    /// Tool calls admitted in this run (what the per-run budget counts).
    pub fn tool_calls_used(&self) -> u32 {
        self.interaction.budget_used
    }
}
