//! The service's own domain types: an approval record with its decision, audit entries and the
//! list filter. They are what the store persists and what the handlers convert to proto.

use arbor_shared::domain::{ApprovalKind, ApprovalRequest, DecisionKind, DecisionSource};
use globset::GlobMatcher;
use serde::{Deserialize, Serialize};
use serde_json::Value as Json;

use crate::lifecycle::ApprovalState;

/// One approval: the runner's request plus everything that happened to it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Approval {
    pub request: ApprovalRequest,
    /// Set when the runner sent a kind this service does not know; `request.kind` is then a
    /// placeholder and the policy rejects the request (fail closed).
    pub unknown_kind: Option<i32>,
    pub state: ApprovalState,
    pub decision: Option<Decision>,
    pub created_at_ms: u64,
    /// Order of arrival at this service (ties within a millisecond keep event order).
    pub arrival: u64,
    pub updated_at_ms: u64,
    /// Bumped by every change, so watchers can drop a change older than one they already sent.
    pub version: u64,
    pub delivery_attempts: u32,
    pub last_delivery_error: String,
    /// When the runner accepted the decision (0: not yet).
    pub delivered_at_ms: u64,
    /// Why it was cancelled, when it was.
    pub cancel_reason: String,
    /// What this release added to the record (kept last: see the sled codec).
    #[serde(default)]
    pub ext: Extras,
}

/// The parts of an approval record added with governance: a record written before has them
/// empty (its digest is then computed from its request).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Extras {
    /// The request's digest when it arrived (see `arbor_shared::digest`).
    pub args_digest: String,
    pub governance: Option<crate::governance::Governance>,
    pub claim: Option<Claim>,
    pub comments: Vec<Comment>,
    /// The decision's voters (governed requests) and the digest it was taken on.
    pub voters: Vec<String>,
    pub decided_digest: String,
}

/// Who holds an approval, and until when (0: until released).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Claim {
    pub by: String,
    pub until_ms: u64,
}

impl Claim {
    pub fn holds(&self, now_ms: u64) -> bool {
        self.until_ms == 0 || now_ms < self.until_ms
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Comment {
    pub author: String,
    pub text: String,
    pub args_digest: String,
    pub at_ms: u64,
}

impl Approval {
    pub fn id(&self) -> &str {
        &self.request.request_id
    }

    /// The kind the policy sees: `None` when the runner sent one this service does not know.
    pub fn kind(&self) -> Option<ApprovalKind> {
        match self.unknown_kind {
            Some(_) => None,
            None => Some(self.request.kind),
        }
    }

    /// A decision is held that the runner still has to accept.
    pub fn needs_delivery(&self) -> bool {
        self.state.awaits_delivery() && self.delivered_at_ms == 0
    }

    /// What a vote is bound to now: the governed proposal's digest, else the request's.
    pub fn args_digest(&self) -> String {
        match (&self.ext.governance, self.ext.args_digest.is_empty()) {
            (Some(g), _) => g.proposal.digest.clone(),
            (None, false) => self.ext.args_digest.clone(),
            (None, true) => self.request.args_digest(),
        }
    }

    /// The digest of what the decision lets the run go on with, which the runner checks and
    /// records: the digest the votes were bound to when governed, else APPROVE the request's,
    /// EDIT the new arguments', RESPOND the result's; empty for REJECT and when undecided.
    pub fn decided_digest(&self) -> String {
        if !self.ext.decided_digest.is_empty() {
            return self.ext.decided_digest.clone();
        }
        let Some(d) = &self.decision else {
            return String::new();
        };
        match d.kind {
            // The digest taken on arrival: it outlives the request's pruned arguments.
            DecisionKind::Approve if !self.ext.args_digest.is_empty() => {
                self.ext.args_digest.clone()
            }
            DecisionKind::Approve => self.request.args_digest(),
            DecisionKind::Edit => arbor_shared::digest::of(&d.args),
            DecisionKind::Respond => arbor_shared::digest::of(&d.result),
            DecisionKind::Reject => String::new(),
        }
    }

    /// The claim that holds at `now_ms`, if any.
    pub fn claim_at(&self, now_ms: u64) -> Option<&Claim> {
        self.ext.claim.as_ref().filter(|c| c.holds(now_ms))
    }

    /// When the approval's next deadline passes (0: none): the open stage's or the request's,
    /// whichever comes first. The expiry timer reads it.
    pub fn deadline_ms(&self) -> u64 {
        let stage = self
            .ext
            .governance
            .as_ref()
            .map_or(0, |g| g.stage_deadline_ms);
        match (stage, self.request.deadline_ms) {
            (0, d) | (d, 0) => d,
            (a, b) => a.min(b),
        }
    }

    /// The governance whose open stage's deadline is the next one (it comes no later than the
    /// request's own), if any: what [`deadline_ms`](Self::deadline_ms) passing carries out.
    pub fn stage_deadline_first(&self) -> Option<&crate::governance::Governance> {
        self.ext.governance.as_ref().filter(|g| {
            let due = g.stage_deadline_ms;
            due > 0 && (self.request.deadline_ms == 0 || due <= self.request.deadline_ms)
        })
    }

    /// Approve and reject are always possible (a person can always refuse); edit and respond
    /// only where the runner said the node supports them.
    pub fn allows(&self, kind: DecisionKind) -> bool {
        matches!(kind, DecisionKind::Approve | DecisionKind::Reject)
            || self.request.allowed_decisions.contains(&kind)
    }
}

/// A stored decision. `decision_id` is generated once, when the decision is stored, and reused
/// on every delivery attempt so the runner can deduplicate.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Decision {
    pub decision_id: String,
    pub kind: DecisionKind,
    pub reason: String,
    /// EDIT: the new tool arguments (null otherwise).
    #[serde(with = "arbor_shared::json::as_text")]
    pub args: Json,
    /// RESPOND: the stand-in result (null otherwise).
    #[serde(with = "arbor_shared::json::as_text")]
    pub result: Json,
    pub decided_by: String,
    pub source: DecisionSource,
    /// The policy rule, when `source` is POLICY.
    pub rule: String,
    pub decided_at_ms: u64,
}

impl Decision {
    /// What the runner's `Resolve.result` carries for this decision.
    pub fn runner_result(&self) -> Json {
        match self.kind {
            DecisionKind::Edit => self.args.clone(),
            DecisionKind::Respond => self.result.clone(),
            DecisionKind::Approve | DecisionKind::Reject => Json::Null,
        }
    }
}

/// A decision someone wants to take; it becomes a `Decision` when the store accepts it.
#[derive(Debug, Clone, PartialEq)]
pub struct NewDecision {
    pub kind: DecisionKind,
    pub reason: String,
    pub args: Json,
    pub result: Json,
    pub decided_by: String,
    pub source: DecisionSource,
    pub rule: String,
    /// Refused (OwnRun) when `decided_by` submitted the run: checked in the decision's
    /// transaction, against the approval it decides.
    pub not_by_submitter: bool,
    /// The args digest the decider saw; when given and no longer current, the decision is
    /// refused (StaleDigest) and nothing changes.
    pub expected_digest: String,
}

impl NewDecision {
    pub fn person(kind: DecisionKind, decided_by: impl Into<String>) -> Self {
        Self {
            kind,
            reason: String::new(),
            args: Json::Null,
            result: Json::Null,
            decided_by: decided_by.into(),
            source: DecisionSource::Person,
            rule: String::new(),
            not_by_submitter: false,
            expected_digest: String::new(),
        }
    }

    pub fn with_reason(mut self, reason: impl Into<String>) -> Self {
        self.reason = reason.into();
        self
    }

    /// The same decision taken again: same kind and payload. Who asked and why do not matter;
    /// the first decision stands either way. A pruned decision lost its payload, so only the
    /// kind can be compared then.
    pub fn repeats(&self, existing: &Decision, pruned: bool) -> bool {
        self.kind == existing.kind
            && (pruned || (self.args == existing.args && self.result == existing.result))
    }

    pub fn into_decision(self, decision_id: String, now_ms: u64) -> Decision {
        Decision {
            decision_id,
            kind: self.kind,
            reason: self.reason,
            args: self.args,
            result: self.result,
            decided_by: self.decided_by,
            source: self.source,
            rule: self.rule,
            decided_at_ms: now_ms,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum AuditAction {
    Requested,
    Decided,
    Delivered,
    Acked,
    Pruned,
    Expired,
    Cancelled,
    Voted,
    StageOpened,
    Escalated,
    Reminded,
    Proposed,
    Claimed,
    Released,
    Reassigned,
    Commented,
}

/// One line of the audit trail; it outlives pruning.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AuditEntry {
    pub id: u64,
    pub request_id: String,
    pub run_id: String,
    pub time_ms: u64,
    pub action: AuditAction,
    /// Principal (person), rule name (policy), "timeout", or "runner" / "approval-svc".
    pub actor: String,
    pub decision: Option<DecisionKind>,
    pub reason: String,
    pub source: Option<DecisionSource>,
    pub rule: String,
    pub decision_id: String,
    /// What this release added (kept last: see the sled codec).
    #[serde(default)]
    pub ext: AuditExtras,
}

/// The parts of an audit entry added with governance.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct AuditExtras {
    /// A delegate's entry: whose seat they acted in.
    pub on_behalf_of: String,
    pub args_digest: String,
    pub stage: String,
}

impl AuditEntry {
    /// An entry about `approval`; the store assigns `id` and `time_ms`.
    pub fn about(approval: &Approval, action: AuditAction, actor: impl Into<String>) -> Self {
        Self {
            id: 0,
            request_id: approval.request.request_id.clone(),
            run_id: approval.request.run_id.clone(),
            time_ms: 0,
            action,
            actor: actor.into(),
            decision: None,
            reason: String::new(),
            source: None,
            rule: String::new(),
            decision_id: String::new(),
            ext: AuditExtras::default(),
        }
    }

    pub fn with_decision(mut self, d: &Decision) -> Self {
        self.decision = Some(d.kind);
        self.source = Some(d.source);
        self.rule = d.rule.clone();
        self.decision_id = d.decision_id.clone();
        if self.reason.is_empty() {
            self.reason = d.reason.clone();
        }
        self
    }

    pub fn with_reason(mut self, reason: impl Into<String>) -> Self {
        self.reason = reason.into();
        self
    }
}

/// Which approvals a list, watch or bulk decision covers. Empty fields match everything.
#[derive(Debug, Clone, Default)]
pub struct Filter {
    pub states: Vec<ApprovalState>,
    pub run_id: String,
    pub thread_id: String,
    pub tool_glob: Option<GlobMatcher>,
    pub tree_id: String,
    pub min_age_ms: u64,
    /// 0: no bound.
    pub max_age_ms: u64,
    /// Only what this principal may vote on now.
    pub actionable_by: Option<Actionable>,
    /// Only approvals whose open stage has one of these principals eligible (a group's members).
    pub eligible_any: Option<Vec<String>>,
    /// Only PENDING approvals whose next deadline has passed.
    pub overdue: bool,
    /// Only approvals whose open stage has this name.
    pub stage: String,
    pub args_digest: String,
}

/// Who asks for "what may I vote on": their name and the delegations they may act under.
#[derive(Debug, Clone, Default)]
pub struct Actionable {
    pub name: String,
    pub delegations: Vec<crate::governance::seat::Delegation>,
    /// Whether a run's submitter is kept from deciding it (authentication on).
    pub not_submitter: bool,
}

impl Actionable {
    /// Whether `name` may vote on `a` now and has not yet voted on what is proposed.
    pub fn may_act_on(&self, a: &Approval, now_ms: u64) -> bool {
        let r = &a.request;
        if a.state != ApprovalState::Pending
            || (self.not_submitter && r.submitted_by == self.name)
            || a.claim_at(now_ms).is_some_and(|c| c.by != self.name)
        {
            return false;
        }
        match &a.ext.governance {
            None => true,
            Some(g) => crate::governance::seat::actionable(
                g,
                &self.name,
                &self.delegations,
                now_ms,
                &[&r.tool_name, &r.node_name],
            ),
        }
    }
}

impl Filter {
    /// Whether nothing but the states and `overdue` narrows this filter: what a store can count
    /// from the state indexes it keeps, without reading a record.
    pub fn by_state_alone(&self) -> bool {
        self.run_id.is_empty()
            && self.thread_id.is_empty()
            && self.tool_glob.is_none()
            && self.tree_id.is_empty()
            && self.min_age_ms == 0
            && self.max_age_ms == 0
            && self.actionable_by.is_none()
            && self.eligible_any.is_none()
            && self.stage.is_empty()
            && self.args_digest.is_empty()
    }

    pub fn matches(&self, a: &Approval, now_ms: u64) -> bool {
        let r = &a.request;
        let age = now_ms.saturating_sub(a.created_at_ms);
        (self.states.is_empty() || self.states.contains(&a.state))
            && (self.run_id.is_empty() || self.run_id == r.run_id)
            && (self.thread_id.is_empty() || self.thread_id == r.thread_id)
            && (self.tree_id.is_empty() || self.tree_id == r.tree_id)
            && self
                .tool_glob
                .as_ref()
                .is_none_or(|g| !r.tool_name.is_empty() && g.is_match(&r.tool_name))
            && age >= self.min_age_ms
            && (self.max_age_ms == 0 || age <= self.max_age_ms)
            && self.governed_match(a, now_ms)
    }

    fn governed_match(&self, a: &Approval, now_ms: u64) -> bool {
        let g = a.ext.governance.as_ref();
        let deadline = a.deadline_ms();
        self.actionable_by
            .as_ref()
            .is_none_or(|who| who.may_act_on(a, now_ms))
            && self
                .eligible_any
                .as_ref()
                .is_none_or(|names| g.is_some_and(|g| g.eligible.iter().any(|e| names.contains(e))))
            && (!self.overdue
                || (a.state == ApprovalState::Pending && deadline > 0 && deadline <= now_ms))
            && (self.stage.is_empty() || g.is_some_and(|g| g.stage().name == self.stage))
            && (self.args_digest.is_empty() || a.args_digest() == self.args_digest)
    }
}

/// One page of a listing; `next` is the opaque token of the following page.
#[derive(Debug, Clone)]
pub struct Page<T> {
    pub items: Vec<T>,
    pub next: Option<String>,
}

/// Which audit entries to read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AuditQuery {
    Request(String),
    Run(String),
}
