//! The policy file (TOML): parsing and validation. Every mistake is reported with the rule it is
//! in, at start-up, so a typo never silently turns into "ask" or "allow".

use std::path::Path;

use globset::{Glob, GlobMatcher};
use serde::Deserialize;

use super::{Action, Match, Policy, Rule};

#[derive(Debug, thiserror::Error)]
pub enum PolicyError {
    #[error("cannot read policy file {path}: {source}")]
    Read {
        path: String,
        source: std::io::Error,
    },
    #[error("policy file {path} is invalid: {message}")]
    Invalid { path: String, message: String },
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct PolicyFile {
    #[serde(default = "ask")]
    default: Action,
    #[serde(default, rename = "request")]
    requests: Vec<RequestRule>,
    #[serde(default, rename = "tool")]
    tools: Vec<ToolRule>,
    #[serde(default, rename = "node")]
    nodes: Vec<NodeRule>,
    /// Approval rules (stages, quorum): `crate::governance`.
    #[serde(default, rename = "approval")]
    approvals: Vec<toml::Spanned<crate::governance::RuleFile>>,
}

fn ask() -> Action {
    Action::Ask
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RequestRule {
    name: Option<String>,
    request_id: Option<String>,
    run_id: Option<String>,
    action: Action,
    reason: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ToolRule {
    name: Option<String>,
    tool: String,
    action: Action,
    reason: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct NodeRule {
    name: Option<String>,
    #[serde(default = "star")]
    tree: String,
    #[serde(default = "star")]
    node: String,
    action: Action,
    reason: Option<String>,
}

fn star() -> String {
    "*".into()
}

fn glob(pattern: &str, at: &str) -> Result<GlobMatcher, String> {
    Glob::new(pattern)
        .map(|g| g.compile_matcher())
        .map_err(|e| format!("{at}: bad glob {pattern:?}: {e}"))
}

fn rule(
    at: String,
    name: Option<String>,
    matcher: Match,
    action: Action,
    reason: Option<String>,
) -> Rule {
    let name = name.filter(|n| !n.trim().is_empty()).unwrap_or(at);
    let reason = reason.unwrap_or_else(|| match action {
        Action::Allow => format!("allowed by policy rule {name}"),
        Action::Deny => format!("denied by policy rule {name}"),
        Action::Ask => String::new(),
    });
    Rule {
        name,
        matcher,
        action,
        reason,
    }
}

impl Policy {
    pub fn from_file(path: &Path) -> Result<Self, PolicyError> {
        let text = std::fs::read_to_string(path).map_err(|source| PolicyError::Read {
            path: path.display().to_string(),
            source,
        })?;
        Self::from_toml(&text).map_err(|message| PolicyError::Invalid {
            path: path.display().to_string(),
            message,
        })
    }

    pub fn from_toml(text: &str) -> Result<Self, String> {
        let file: PolicyFile = toml::from_str(text).map_err(|e| e.to_string())?;
        let mut rules = Vec::new();
        for (i, r) in file.requests.into_iter().enumerate() {
            let at = format!("request[{i}]");
            let matcher = match (r.request_id, r.run_id) {
                (Some(id), None) if !id.is_empty() => Match::Request(id),
                (None, Some(id)) if !id.is_empty() => Match::Run(id),
                _ => return Err(format!("{at}: give exactly one of request_id or run_id")),
            };
            rules.push(rule(at, r.name, matcher, r.action, r.reason));
        }
        for (i, r) in file.tools.into_iter().enumerate() {
            let at = format!("tool[{i}]");
            let matcher = Match::Tool(glob(&r.tool, &at)?);
            rules.push(rule(at, r.name, matcher, r.action, r.reason));
        }
        for (i, r) in file.nodes.into_iter().enumerate() {
            let at = format!("node[{i}]");
            let matcher = Match::Node {
                tree: glob(&r.tree, &at)?,
                node: glob(&r.node, &at)?,
            };
            rules.push(rule(at, r.name, matcher, r.action, r.reason));
        }
        let mut names = std::collections::HashSet::new();
        for r in &rules {
            if !names.insert(r.name.as_str()) {
                return Err(format!("two rules are named {:?}", r.name));
            }
        }
        Ok(Self {
            rules,
            default: file.default,
            approvals: crate::governance::parse_rules(text, file.approvals)?,
        })
    }
}
