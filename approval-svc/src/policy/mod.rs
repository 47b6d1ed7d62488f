//! Approval policy: a chain of rules that may decide a request before a person sees it.
//!
//! Order, first match wins (an `ask` match stops the chain too):
//! 1. a request whose kind is neither NODE nor TOOL is rejected (fail closed, nothing overrides);
//! 2. explicit request rules, by `request_id` or by `run_id`;
//! 3. tool rules (tool approvals only), by tool-name glob;
//! 4. node rules (any approval), by tree-id glob and node-name glob;
//! 5. `default` (`ask` unless configured).

mod file;

use arbor_shared::domain::{ApprovalKind, DecisionKind};
use globset::GlobMatcher;

pub use file::PolicyError;

use crate::model::{Approval, NewDecision};

/// The rule name reported for requests of an unknown kind.
pub const UNKNOWN_KIND_RULE: &str = "unknown-kind";
/// The rule name reported when nothing matched.
pub const DEFAULT_RULE: &str = "default";

#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Action {
    Allow,
    Deny,
    Ask,
}

/// What the policy says about one request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verdict {
    pub action: Action,
    pub rule: String,
    pub reason: String,
}

impl Verdict {
    /// The decision a policy takes on its own; `None` leaves the request to people.
    pub fn decision(&self) -> Option<NewDecision> {
        let kind = match self.action {
            Action::Allow => DecisionKind::Approve,
            Action::Deny => DecisionKind::Reject,
            Action::Ask => return None,
        };
        Some(NewDecision {
            kind,
            reason: self.reason.clone(),
            args: serde_json::Value::Null,
            result: serde_json::Value::Null,
            decided_by: format!("policy:{}", self.rule),
            source: arbor_shared::domain::DecisionSource::Policy,
            rule: self.rule.clone(),
            not_by_submitter: false,
            expected_digest: String::new(),
        })
    }
}

/// What the policy looks at.
#[derive(Debug, Clone, Copy)]
pub struct Subject<'a> {
    pub request_id: &'a str,
    pub run_id: &'a str,
    /// `None`: a kind this service does not know.
    pub kind: Option<ApprovalKind>,
    pub tool_name: &'a str,
    pub tree_id: &'a str,
    pub node_name: &'a str,
}

impl<'a> From<&'a Approval> for Subject<'a> {
    fn from(a: &'a Approval) -> Self {
        let r = &a.request;
        Self {
            request_id: &r.request_id,
            run_id: &r.run_id,
            kind: a.kind(),
            tool_name: &r.tool_name,
            tree_id: &r.tree_id,
            // Unnamed nodes are known by their locator.
            node_name: if r.node_name.is_empty() {
                &r.node_locator
            } else {
                &r.node_name
            },
        }
    }
}

#[derive(Debug, Clone)]
enum Match {
    Request(String),
    Run(String),
    Tool(GlobMatcher),
    Node {
        tree: GlobMatcher,
        node: GlobMatcher,
    },
}

#[derive(Debug, Clone)]
struct Rule {
    name: String,
    matcher: Match,
    action: Action,
    reason: String,
}

impl Rule {
    fn matches(&self, s: &Subject<'_>) -> bool {
        match &self.matcher {
            Match::Request(id) => id == s.request_id,
            Match::Run(id) => id == s.run_id,
            Match::Tool(g) => s.kind == Some(ApprovalKind::Tool) && g.is_match(s.tool_name),
            Match::Node { tree, node } => tree.is_match(s.tree_id) && node.is_match(s.node_name),
        }
    }
}

/// The loaded policy. The default policy asks a person about everything.
#[derive(Debug, Clone)]
pub struct Policy {
    /// In chain order: request rules, tool rules, node rules.
    rules: Vec<Rule>,
    default: Action,
    /// Who must agree on a request left to people (`[[approval]]`).
    approvals: crate::governance::Rules,
}

impl Default for Policy {
    fn default() -> Self {
        Self {
            rules: Vec::new(),
            default: Action::Ask,
            approvals: crate::governance::Rules::default(),
        }
    }
}

impl Policy {
    pub fn evaluate(&self, s: &Subject<'_>) -> Verdict {
        if s.kind.is_none() {
            return Verdict {
                action: Action::Deny,
                rule: UNKNOWN_KIND_RULE.into(),
                reason: "approval kind is neither NODE nor TOOL".into(),
            };
        }
        if let Some(rule) = self.rules.iter().find(|r| r.matches(s)) {
            return Verdict {
                action: rule.action,
                rule: rule.name.clone(),
                reason: rule.reason.clone(),
            };
        }
        Verdict {
            action: self.default,
            rule: DEFAULT_RULE.into(),
            reason: match self.default {
                Action::Ask => String::new(),
                Action::Allow => "allowed by the policy default".into(),
                Action::Deny => "denied by the policy default".into(),
            },
        }
    }

    /// The approval rule that governs `a`, a request left to people; `None` keeps a single
    /// approver's decision.
    pub fn approval_rule(&self, a: &Approval) -> Option<&crate::governance::ApprovalRule> {
        let r = &a.request;
        let args = match r.kind {
            ApprovalKind::Tool => r.tool_args.clone(),
            ApprovalKind::Node => serde_json::Value::Object(r.context.clone()),
        };
        let subject = Subject::from(a);
        self.approvals.find(&crate::governance::Target {
            tool_name: &r.tool_name,
            tree_id: &r.tree_id,
            node_name: subject.node_name,
            args: &args,
        })
    }

    /// The `[[approval]]` rules, in file order.
    pub fn approval_rules(&self) -> &crate::governance::Rules {
        &self.approvals
    }

    pub fn rule_count(&self) -> usize {
        self.rules.len()
    }
}

#[cfg(test)]
mod tests;
