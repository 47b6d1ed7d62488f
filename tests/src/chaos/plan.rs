//! The seeded workload: which tree each run uses, how the simulated people answer it, and what
//! must be true when it has finished.

use arbor_shared::proto::runner::v1::RunStatus;
use serde_json::{Value as Json, json};

/// The workload trees (also the fuzz corpus's trees): a gate around a ledger append, a tool
/// approval with `pass_decision_to_tool`, user input and external work in parallel, and a final
/// ledger append. `chaos-flow` fails on a rejected gate, `chaos-skip` skips the gated step.
pub const FLOW_TREE: &str = include_str!("../../trees/chaos-flow.json");
pub const SKIP_TREE: &str = include_str!("../../trees/chaos-skip.json");

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TreeChoice {
    Flow,
    Skip,
}

impl TreeChoice {
    pub fn id(self) -> &'static str {
        match self {
            Self::Flow => "chaos-flow",
            Self::Skip => "chaos-skip",
        }
    }
}

/// One run of the workload.
#[derive(Debug, Clone)]
pub struct Plan {
    pub index: usize,
    pub run_id: String,
    pub tree: TreeChoice,
    /// Whether the approver approves the gate (else rejects it).
    pub approve_gate: bool,
    pub amount: u64,
}

/// Ledger steps of the trees, by the node that appends.
pub const STEPS: [&str; 3] = ["pay", "notify", "close"];

impl Plan {
    /// `count` runs drawn from `seed`: three in four gates approved, half the runs on each tree.
    pub fn generate(seed: u64, count: usize, prefix: &str) -> Vec<Plan> {
        let mut rng = fastrand::Rng::with_seed(seed);
        (0..count)
            .map(|index| Plan {
                index,
                run_id: format!("{prefix}-{seed:x}-{index:05}"),
                tree: if rng.bool() {
                    TreeChoice::Flow
                } else {
                    TreeChoice::Skip
                },
                approve_gate: rng.u8(0..4) != 0,
                amount: rng.u64(1..10_000),
            })
            .collect()
    }

    pub fn input(&self) -> Json {
        json!({"order": {"id": self.index, "amount": self.amount}})
    }

    pub fn order(&self) -> Json {
        self.input()["order"].clone()
    }

    /// The arguments the approver substitutes for the notify tool's ("edit before approve").
    pub fn edited_args(&self) -> Json {
        json!({"entry": {"step": "notify", "order": self.order(), "edited": true, "by": "alice"}})
    }

    pub fn note(&self) -> String {
        format!("note for order {}", self.index)
    }

    pub fn external_result(&self) -> Json {
        json!({"status": "succeeded", "result": {"tracking": format!("T-{}", self.index)}})
    }

    /// The run stops at a rejected `chaos-flow` gate; everything else reaches the end.
    pub fn reaches_end(&self) -> bool {
        self.approve_gate || self.tree == TreeChoice::Skip
    }

    pub fn expected_status(&self) -> RunStatus {
        if self.reaches_end() {
            RunStatus::Succeeded
        } else {
            RunStatus::Failed
        }
    }

    /// The ledger steps that must have happened exactly once (the others never).
    pub fn expected_steps(&self) -> Vec<&'static str> {
        STEPS
            .iter()
            .copied()
            .filter(|step| match *step {
                "pay" => self.approve_gate,
                _ => self.reaches_end(),
            })
            .collect()
    }

    /// The entry each ledger step must have recorded.
    pub fn expected_entry(&self, step: &str) -> Json {
        match step {
            "notify" => self.edited_args()["entry"].clone(),
            other => json!({"step": other, "order": self.order()}),
        }
    }

    /// Approvals the run asks for: the gate, and the notify tool when the run gets that far.
    pub fn expected_approvals(&self) -> usize {
        if self.reaches_end() { 2 } else { 1 }
    }
}
