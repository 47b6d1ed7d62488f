//! Approval governance: rules of the policy file that say who must agree before a request is
//! decided — ordered stages, each with its approvers, a quorum, a veto or counted rejections,
//! and a deadline — and the state of one governed request (its open stage, its votes, what is
//! being voted on). The rules are written once here and in `quorum`; the store keeps the state
//! inside the approval record and applies them in the transaction of each vote.

mod file;
pub mod quorum;
pub mod seat;

use arbor_shared::domain::DecisionKind;
use globset::GlobMatcher;
use serde::{Deserialize, Serialize};
use serde_json::Value as Json;

pub use file::{RuleFile, parse_rules};

/// How many approvals a stage needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Required {
    /// Exactly this many (at least 1).
    Count(u32),
    /// Every eligible approver.
    All,
    /// This share of the eligible approvers, rounded up (1..=100).
    Percent(u32),
}

impl Required {
    /// The number of approvals needed out of `eligible`.
    pub fn of(self, eligible: usize) -> usize {
        match self {
            Required::Count(n) => n as usize,
            Required::All => eligible,
            Required::Percent(p) => (eligible * p as usize).div_ceil(100),
        }
    }
}

/// What one REJECT does in a stage.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum OnReject {
    /// One REJECT decides REJECT at once.
    Veto,
    /// REJECT once the approvals still possible can no longer reach the quorum.
    Count,
}

/// What a stage's deadline does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum OnTimeout {
    /// Decide REJECT (fail closed).
    Reject,
    Approve,
    /// Open the next stage, or add `escalate_to` to this one, votes kept.
    Escalate,
    /// Remind (a webhook) and wait one deadline more.
    Remind,
}

/// One stage of a rule, as written in the policy file (approver references unresolved).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StageSpec {
    pub name: String,
    /// `user:NAME`, `group:NAME` or `role:NAME`.
    pub approvers: Vec<String>,
    /// References left out of the eligible set.
    pub exclude: Vec<String>,
    pub required: Required,
    /// With `group:` approvers: this many approvals from each named group (0: no such bound).
    pub per_group: u32,
    pub on_reject: OnReject,
    /// How long the stage waits (ms; 0: no deadline).
    pub deadline_ms: u64,
    pub on_timeout: OnTimeout,
    /// For `escalate` with no next stage: the references added to this stage.
    pub escalate_to: Vec<String>,
}

/// A condition on the arguments (a gate: its context) a rule applies to.
#[derive(Debug, Clone, PartialEq)]
pub struct When {
    /// A JSON pointer (`/amount`).
    pub arg: String,
    pub op: Op,
    pub value: Json,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    Gt,
    Gte,
    Lt,
    Lte,
    Eq,
    Ne,
}

impl When {
    fn holds(&self, args: &Json) -> bool {
        let Some(found) = args.pointer(&self.arg) else {
            return false;
        };
        match self.op {
            Op::Eq => found == &self.value,
            Op::Ne => found != &self.value,
            op => match (found.as_f64(), self.value.as_f64()) {
                (Some(a), Some(b)) => match op {
                    Op::Gt => a > b,
                    Op::Gte => a >= b,
                    Op::Lt => a < b,
                    _ => a <= b,
                },
                _ => false,
            },
        }
    }
}

/// An approval rule: which requests it governs and the stages they go through.
#[derive(Debug, Clone)]
pub struct ApprovalRule {
    pub name: String,
    pub tool: Option<GlobMatcher>,
    pub tree: Option<GlobMatcher>,
    pub node: Option<GlobMatcher>,
    pub when: Vec<When>,
    /// Whether an editor's own vote counts for the arguments they wrote.
    pub editor_counts: bool,
    pub stages: Vec<StageSpec>,
}

/// What a rule looks at in a request.
#[derive(Debug, Clone, Copy)]
pub struct Target<'a> {
    pub tool_name: &'a str,
    pub tree_id: &'a str,
    pub node_name: &'a str,
    /// A tool call's arguments, or a gate's context.
    pub args: &'a Json,
}

impl ApprovalRule {
    pub fn matches(&self, t: &Target<'_>) -> bool {
        let glob = |g: &Option<GlobMatcher>, s: &str| g.as_ref().is_none_or(|g| g.is_match(s));
        glob(&self.tool, t.tool_name)
            && glob(&self.tree, t.tree_id)
            && glob(&self.node, t.node_name)
            && self.when.iter().all(|w| w.holds(t.args))
    }
}

/// The approval rules of a policy, in file order: the first that matches governs.
#[derive(Debug, Clone, Default)]
pub struct Rules(pub Vec<ApprovalRule>);

impl Rules {
    pub fn find(&self, t: &Target<'_>) -> Option<&ApprovalRule> {
        self.0.iter().find(|r| r.matches(t))
    }
}

/// One vote, kept for the audit and the count: a seat's live vote is its last one not stale.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Vote {
    /// Whose seat the vote fills: the voter, or the delegator a delegate votes for.
    pub seat: String,
    /// Who cast it (the delegate, when it differs from `seat`).
    pub by: String,
    /// APPROVE or REJECT.
    pub kind: DecisionKind,
    /// The digest it was cast against.
    pub digest: String,
    pub stage: u32,
    pub at_ms: u64,
    pub reason: String,
    /// Superseded: by a later vote of the seat, or (an APPROVE) by an edit.
    pub stale: bool,
}

/// What the votes are about: the request as it came, or an approver's edit or response.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Proposal {
    /// APPROVE (the request as it came), EDIT or RESPOND.
    pub kind: DecisionKind,
    /// EDIT: the new arguments; RESPOND: the result; null for APPROVE.
    #[serde(with = "arbor_shared::json::as_text")]
    pub payload: Json,
    pub digest: String,
    /// The seat that proposed it (empty for the request itself).
    pub by: String,
}

/// A stage's references resolved to principals.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Roster {
    pub approvers: Vec<String>,
    pub excluded: Vec<String>,
    pub escalate_to: Vec<String>,
    /// Each `group:` reference of the stage (approvers and escalation) and its members.
    pub groups: Vec<(String, Vec<String>)>,
}

/// The governance of one request: its rule's stages, the open one and every vote.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Governance {
    pub rule: String,
    pub editor_counts: bool,
    /// The rule's stages as they were when the request arrived.
    pub stages: Vec<StageSpec>,
    /// Each stage's approver references resolved against the tokens file when the request
    /// arrived (the directory of principals changes only with a restart).
    pub rosters: Vec<Roster>,
    /// The open stage (index into `stages`).
    pub current: u32,
    /// The principals who may vote in the open stage, fixed when it opened, sorted.
    pub eligible: Vec<String>,
    /// For `per_group`: each named group and its members among `eligible`.
    pub groups: Vec<(String, Vec<String>)>,
    /// The open stage's quorum, as a number.
    pub required: u32,
    /// When the open stage's deadline passes (epoch ms; 0: none).
    pub stage_deadline_ms: u64,
    pub votes: Vec<Vote>,
    pub proposal: Proposal,
}

impl Governance {
    pub fn stage(&self) -> &StageSpec {
        &self.stages[self.current as usize]
    }

    /// The live votes of the open stage, one per seat.
    pub fn live(&self) -> impl Iterator<Item = &Vote> {
        self.votes
            .iter()
            .filter(move |v| !v.stale && v.stage == self.current)
    }

    /// Seats whose vote counted in an earlier stage: they do not count again.
    pub fn counted_before(&self) -> Vec<&str> {
        self.votes
            .iter()
            .filter(|v| !v.stale && v.stage < self.current)
            .map(|v| v.seat.as_str())
            .collect()
    }

    /// Everyone whose live vote decided: the voters the decision names. A proposer's own
    /// approval of their edit or response is not one unless the rule says `editor_counts`.
    pub fn voters(&self) -> Vec<String> {
        let mut voters: Vec<String> = Vec::new();
        let own_proposal = |v: &Vote| {
            !self.editor_counts
                && v.kind == DecisionKind::Approve
                && v.seat == self.proposal.by
                && v.digest == self.proposal.digest
        };
        for v in self.votes.iter().filter(|v| !v.stale && !own_proposal(v)) {
            let name = match v.by == v.seat {
                true => v.by.clone(),
                false => format!("{} for {}", v.by, v.seat),
            };
            if !voters.contains(&name) {
                voters.push(name);
            }
        }
        voters
    }
}
